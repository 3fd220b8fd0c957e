//! Generating text: prefill the prompt, then decode token by token through the key/value cache.

use std::time::Instant;

use crate::error::{invalid, Result};

use super::model::LlamaModel;
use super::sample::Sampler;

/// What one generation produced and how long it took.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The generated ids (the stop token, if one ended it, included).
    pub tokens: Vec<u32>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Seconds from the start to the first generated token (the prompt's forward pass).
    pub prefill_seconds: f64,
    /// Seconds from the second generated token to the last. The first one-token step is left
    /// out: on a GPU it compiles the kernels of one activation row, which a decoding rate
    /// should not count.
    pub decode_seconds: f64,
}

impl Generation {
    /// Prompt tokens per second of the prefill.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_seconds
    }

    /// Generated tokens per second over the steps [`decode_seconds`](Self::decode_seconds)
    /// times (none when fewer than three tokens were generated: 0).
    pub fn decode_tokens_per_second(&self) -> f64 {
        let steps = self.tokens.len().saturating_sub(2);
        if steps == 0 || self.decode_seconds <= 0.0 {
            return 0.0;
        }
        steps as f64 / self.decode_seconds
    }
}

/// Generates up to `max_tokens` after `prompt`, stopping after any token of `stop`; `on_token`
/// sees each token as it is chosen (for streaming output).
pub fn generate(
    model: &LlamaModel,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    stop: &[u32],
    on_token: &mut dyn FnMut(u32) -> Result<()>,
) -> Result<Generation> {
    if prompt.is_empty() || max_tokens == 0 {
        invalid!("generation needs a prompt of at least one token and max_tokens of at least 1");
    }
    let mut cache = model.new_cache();
    let mut tokens = Vec::new();
    let start = Instant::now();
    let mut prefill_seconds = 0.0;
    let mut decode_start = None;
    let mut input = prompt.to_vec();
    while tokens.len() < max_tokens {
        let logits = model.forward(&input, &mut cache)?;
        let last =
            logits.slice(&[input.len() as i32 - 1, 0], &[input.len() as i32, logits.shape()[1] as i32], &[1, 1])?;
        let token = sampler.sample(&last.reshape(&[logits.shape()[1]])?)?;
        if tokens.is_empty() {
            prefill_seconds = start.elapsed().as_secs_f64();
        } else if decode_start.is_none() {
            decode_start = Some(Instant::now());
        }
        tokens.push(token);
        on_token(token)?;
        if stop.contains(&token) || cache.len() + 1 > model.config().context {
            break;
        }
        input = vec![token];
    }
    let decode_seconds = decode_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    Ok(Generation { tokens, prompt_tokens: prompt.len(), prefill_seconds, decode_seconds })
}

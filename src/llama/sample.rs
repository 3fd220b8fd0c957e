//! Choosing the next token from logits: greedy, or temperature and nucleus (top-p) sampling with
//! a seed.

use crate::array::MlxArray;
use crate::error::{invalid, Result};
use crate::nn::select::{argmax, argsort, categorical, cumsum, less, log, softmax, take_along_axis};

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The most likely token.
    Greedy,
    /// A token drawn from `softmax(logits / temperature)` restricted to the smallest set of most
    /// likely tokens whose probabilities sum to at least `top_p`; reproducible for a given seed.
    TopP {
        /// Divides the logits (> 0).
        temperature: f32,
        /// Probability mass kept, in (0, 1].
        top_p: f32,
        /// Seed of the draws.
        seed: u64,
    },
}

/// A [`Sampling`] rule and the count of draws made (each draw gets its own key).
#[derive(Debug, Clone)]
pub struct Sampler {
    sampling: Sampling,
    draws: u64,
}

impl Sampler {
    /// A sampler, its parameters checked.
    pub fn new(sampling: Sampling) -> Result<Sampler> {
        if let Sampling::TopP { temperature, top_p, .. } = sampling {
            if !(temperature.is_finite() && temperature > 0.0) {
                invalid!("temperature must be finite and positive, got {temperature}");
            }
            if !(top_p > 0.0 && top_p <= 1.0) {
                invalid!("top-p must be in (0, 1], got {top_p}");
            }
        }
        Ok(Sampler { sampling, draws: 0 })
    }

    /// The next token given `logits` (`[vocab]`).
    pub fn sample(&mut self, logits: &MlxArray) -> Result<u32> {
        if logits.ndim() != 1 {
            invalid!("sampling takes one row of logits, got shape {:?}", logits.shape());
        }
        let token = match self.sampling {
            Sampling::Greedy => argmax(logits, 0, false)?,
            Sampling::TopP { temperature, top_p, seed } => {
                let probs = softmax(&logits.divide(&MlxArray::scalar(temperature)?)?, 0)?;
                // Most likely first; a token is kept while the mass before it is below top_p, so
                // the most likely one always is.
                let order = argsort(&probs.negative()?, 0)?;
                let sorted = take_along_axis(&probs, &order, 0)?;
                let before = cumsum(&sorted, 0, false, false)?;
                let keep = less(&before, &MlxArray::scalar(top_p)?)?;
                let masked = log(&sorted)?.where_(&keep, &MlxArray::scalar(f32::NEG_INFINITY)?)?;
                let pick = categorical(&masked, 0, seed.wrapping_add(self.draws))?;
                self.draws += 1;
                order.take(&pick.reshape(&[1])?, 0)?
            }
        };
        let id = token.item_f64()?;
        if !(id >= 0.0 && id < logits.shape()[0] as f64) {
            invalid!("sampling chose {id}, outside the vocabulary");
        }
        Ok(id as u32)
    }
}

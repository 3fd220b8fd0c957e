//! The decoder's hyperparameters, from a GGUF file's `llama.*` metadata.

use crate::error::{Error, Result};
use crate::io::gguf::Gguf;

/// The hyperparameters of a Llama-architecture decoder.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaConfig {
    /// Decoder blocks.
    pub layers: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Width of the MLP's hidden layer.
    pub intermediate: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention: `heads` is a multiple).
    pub kv_heads: usize,
    /// Width of one head (`hidden / heads`).
    pub head_dim: usize,
    /// RMSNorm's epsilon.
    pub rms_eps: f32,
    /// RoPE's frequency base.
    pub rope_base: f32,
    /// Context length the model was trained for.
    pub context: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab: usize,
}

/// Dimensions beyond this are refused as implausible (and would overflow MLX's `int` in products).
const MAX_DIM: u64 = 1 << 20;

impl LlamaConfig {
    /// Reads and checks the `llama.*` metadata of `gguf` (architecture `llama`).
    pub fn from_gguf(gguf: &Gguf) -> Result<LlamaConfig> {
        let bad = |key: &str, message: String| Error::artifact(gguf.path(), Some(key), message);
        let arch = gguf.metadata_string("general.architecture")?;
        if arch != "llama" {
            return Err(bad("general.architecture", format!("is {arch:?}; only \"llama\" is served")));
        }
        let dim = |key: &str| -> Result<usize> {
            let v = gguf.metadata_u64(key)?;
            if v == 0 || v > MAX_DIM {
                return Err(bad(key, format!("is {v}, outside 1..={MAX_DIM}")));
            }
            Ok(v as usize)
        };
        let layers = dim("llama.block_count")?;
        let hidden = dim("llama.embedding_length")?;
        let intermediate = dim("llama.feed_forward_length")?;
        let heads = dim("llama.attention.head_count")?;
        let kv_heads = dim("llama.attention.head_count_kv")?;
        let context = dim("llama.context_length")?;
        if hidden % heads != 0 || heads % kv_heads != 0 {
            let message =
                format!("{heads} query heads and {kv_heads} key/value heads do not divide a width of {hidden}");
            return Err(bad("llama.attention.head_count", message));
        }
        let head_dim = hidden / heads;
        if head_dim % 2 != 0 {
            return Err(bad("llama.attention.head_count", format!("heads of {head_dim} are odd; RoPE rotates pairs")));
        }
        if gguf.has_metadata("llama.rope.dimension_count") {
            let rope_dims = dim("llama.rope.dimension_count")?;
            if rope_dims != head_dim {
                let message = format!("is {rope_dims}; partial rotary embeddings are not served (heads of {head_dim})");
                return Err(bad("llama.rope.dimension_count", message));
            }
        }
        let positive = |key: &str| -> Result<f32> {
            let v = gguf.metadata_f64(key)? as f32;
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(key, format!("is {v}, not a finite positive number")));
            }
            Ok(v)
        };
        let rms_eps = positive("llama.attention.layer_norm_rms_epsilon")?;
        // llama.cpp's default where a file does not say.
        let rope_base =
            if gguf.has_metadata("llama.rope.freq_base") { positive("llama.rope.freq_base")? } else { 10_000.0 };
        let embd = gguf.tensor_shape("token_embd.weight")?;
        if embd.len() != 2 || embd[1] != hidden {
            return Err(bad("token_embd.weight", format!("has shape {embd:?}, expected [vocab, {hidden}]")));
        }
        let vocab = embd[0];
        Ok(LlamaConfig { layers, hidden, intermediate, heads, kv_heads, head_dim, rms_eps, rope_base, context, vocab })
    }
}

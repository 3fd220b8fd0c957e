//! The trellis kernels of MLX's CUDA back-end, one folder per kernel family with one concern per
//! file: the down projection ([`down`]: the calls in `mod.rs`, `launch.rs`, `config.rs`,
//! `plan.rs`, and the warp-specialized GEMM in `ws.rs`), the axis-1 projections and the fused
//! gate·up·SwiGLU ([`gate_up`]: the same four files), the expand kernel and the decode-once
//! dense path ([`expand`]), the activations pre-pass both kernel families use (`prescale.rs`),
//! the fold counters that fed down calls share ([`FoldCounters`], `counters.rs`), the coded
//! axis's rotation in one launch ([`rotate`]), the SwiGLU between the projections with the
//! rotations on either side of it in one launch (`swiglu_rotate.rs`) and the encoder's block
//! search ([`viterbi`]). The kernel texts come from the crate's one table of `kernels/` files
//! (`src/kernel/sources.rs`).
//!
//! With the `tuning` feature the families' configuration and plan modules are public (declared
//! with `crate::tuning_mods!`, as Metal's families are), and `tuning` gathers their knobs with the
//! calls that take an explicit configuration.

mod counters;
pub mod down;
pub mod expand;
pub mod gate_up;
pub(crate) mod prescale;
pub mod rotate;
pub(crate) mod swiglu_rotate;
pub mod viterbi;

pub use counters::FoldCounters;

#[cfg(feature = "tuning")]
pub mod tuning;

/// Whether the CUDA kernels that decode along stored rows (the down kernel and the expand
/// kernel) serve coded blocks of `t` positions: 256, or a shorter block that is a multiple of 64
/// (a block row then streams in whole 8-byte words, and every warp tile of 32 or 64 positions
/// lies in one block). The encoder codes an axis that 256 does not divide in such blocks
/// (`EncoderConfig::t`, `quantize_model --fit-blocks`: 576 in blocks of 192).
pub fn serves_block_len(t: u32) -> bool {
    t.is_multiple_of(64) && (64..=256).contains(&t)
}

/// The environment variable through which MLX's CUDA back-end bounds the operations it records
/// into one CUDA graph before it launches the graph.
pub const MAX_OPS_PER_GRAPH_VAR: &str = "MLX_MAX_OPS_PER_BUFFER";

/// The value of [`MAX_OPS_PER_GRAPH_VAR`] a runner of coded models should start MLX's CUDA
/// back-end with (MLX's Metal back-end reads the same variable for its command buffers: leave it
/// to MLX there).
///
/// MLX launches a graph once it holds 100 operations (its default on sm_90 and sm_100) or once
/// its inputs reach 1,000 MB. Coded weights are about a fifth of bf16's, so the second bound
/// rarely applies, and the GPU idles until the host has recorded 100 operations. That is about
/// 20 of our MLP layers (4–5 launches each). With 24 operations to a graph, the host records the
/// next graph while the GPU runs this one. On an H200 Qwen3-14B's coded MLP chain was faster at
/// 1 and 16 rows with it, and MLX's bf16 MLP held its time (docs/cuda-mlp.md, "CUDA graphs").
///
/// MLX reads the variable once, when it first uses the GPU. Set it in the environment, or at
/// the start of `main` before any other thread runs:
///
/// ```no_run
/// use mlx_trellis::trellis::cuda::{MAX_OPS_PER_GRAPH, MAX_OPS_PER_GRAPH_VAR};
/// if std::env::var_os(MAX_OPS_PER_GRAPH_VAR).is_none() {
///     std::env::set_var(MAX_OPS_PER_GRAPH_VAR, MAX_OPS_PER_GRAPH.to_string());
/// }
/// ```
pub const MAX_OPS_PER_GRAPH: usize = 24;

/// The expand module under its former name (`trellis::cuda::dense`).
pub use expand as dense;

//! The trellis kernels of MLX's CUDA back-end, one folder per kernel family with one concern per
//! file: the down projection's launch, configuration and plan ([`down`]: `mod.rs`, `config.rs`,
//! `plan.rs`), the axis-1 projections and the fused gate·up·SwiGLU with their plan ([`gate_up`]:
//! `mod.rs`, `plan.rs`), the expand kernel and the decode-once dense path ([`expand`]), the
//! activations pre-pass both kernel families use (`prescale.rs`), the coded axis's rotation in
//! one launch ([`rotate`]), the SwiGLU between the projections with the rotations on either side
//! of it in one launch (`swiglu_rotate.rs`) and the encoder's block search ([`viterbi`]). The kernel texts come
//! from the crate's one table of `kernels/` files (`src/kernel/sources.rs`).
//!
//! With the `tuning` feature the families' configuration and plan modules are public (declared
//! with `crate::tuning_mods!`, as Metal's families are), and `tuning` gathers their knobs with the
//! calls that take an explicit configuration.

pub mod down;
pub mod expand;
pub mod gate_up;
pub(crate) mod prescale;
pub mod rotate;
pub(crate) mod swiglu_rotate;
pub mod viterbi;

#[cfg(feature = "tuning")]
pub mod tuning;

/// The expand module under its former name (`trellis::cuda::dense`).
pub use expand as dense;

//! The trellis kernels of MLX's CUDA back-end, one concern per file: the down projection's
//! configuration, plan and launch ([`down`]), the axis-1 projections and the fused
//! gate·up·SwiGLU ([`gate_up`]), the decode-once dense path ([`dense`]) and the
//! encoder's block search ([`viterbi`]).

pub mod dense;
pub mod down;
pub(crate) mod down_config;
pub(crate) mod down_plan;
pub mod gate_up;
pub mod viterbi;

/// The down kernel's configurations and plan, a call with an explicit configuration, its
/// partial sums before the fold, and the dense path (the `tuning` feature): for benchmark sweeps
/// and tests.
#[cfg(feature = "tuning")]
pub mod tuning {
    pub use super::down::{down_cuda_partials, down_cuda_with};
    pub use super::down_config::CudaDownConfig;
    pub use super::down_plan::{plan, plan_for};
    pub use super::gate_up::{linear_with as axis_one_with, plan as axis_one_plan, swiglu_with, AxisOneConfig};
}

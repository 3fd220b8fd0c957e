//! The trellis kernels of MLX's CUDA back-end, one concern per file: the down projection's
//! configuration, plan and launch ([`down`]), the decode-once dense path ([`dense`]) and the
//! encoder's block search ([`viterbi`]).

pub mod dense;
pub mod down;
mod down_config;
mod down_plan;
pub mod viterbi;

//! Launch constants shared by the trellis kernels (the seed's `launch`).

/// Threads per threadgroup (Metal) of the trellis kernels.
pub const TRELLIS_THREADS: usize = 128;

/// SIMD groups of 32 lanes per threadgroup.
pub const TRELLIS_SG_PER_TG: usize = 4;

//! [`AxisOneConfig`]: how one call of the CUDA axis-1 kernel (`kernels/cuda/gate_up.cu`) is
//! shaped, its checks, and the plan that picks it for a row count.

use crate::dtype::Dtype;
use crate::error::{invalid, Result};

use crate::trellis::cuda::down::plan::pass_tiles;

/// The static shared memory a thread block may take (the warps' sums for warp 0 to add).
const STATIC_SHARED_LIMIT: usize = 48 * 1024;

/// How one call of the axis-1 kernel is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AxisOneConfig {
    /// 8-row MMA tiles of activation rows per pass (1 to 8).
    pub mt: u32,
    /// 16-row tiles of output rows per thread block (1 to 4); every tile of a block reuses its
    /// activation fragments.
    pub rt: u32,
    /// Warps per thread block (1 to 8); they split each row's blocks and add their sums at the end.
    pub warps: u32,
    /// Carry y + 1534 in the fragments and subtract the bias at the end (16-bit activations).
    pub bias_fold: bool,
    /// Pack half of the code pairs with an IMAD instead of a PRMT (needs `bias_fold`).
    pub pack_fma: bool,
}

impl AxisOneConfig {
    /// An error naming the first reason this shape cannot run `dtype` activations in the single
    /// projection or (`fused`) the gate·up·SwiGLU kernel.
    pub fn check(&self, dtype: Dtype, fused: bool) -> Result<()> {
        if !(1..=8).contains(&self.mt) || !(1..=4).contains(&self.rt) || !(1..=8).contains(&self.warps) {
            invalid!(
                "CUDA axis-1 kernel: mt = {} (1..=8), rt = {} (1..=4), warps = {} (1..=8) out of range",
                self.mt,
                self.rt,
                self.warps
            );
        }
        if self.pack_fma && !self.bias_fold {
            invalid!("CUDA axis-1 kernel: pack_fma packs the bias fold's pairs (needs bias_fold)");
        }
        if self.bias_fold && dtype == Dtype::Float32 {
            invalid!("CUDA axis-1 kernel: the bias fold is for 16-bit activations");
        }
        let shared = self.shared_bytes(fused);
        if shared > STATIC_SHARED_LIMIT {
            invalid!(
                "CUDA axis-1 kernel: the sums of {} warps (rt = {}, mt = {}{}) take {shared} bytes of static shared memory (at most {STATIC_SHARED_LIMIT}; use fewer warps, row tiles or 8-row tiles)",
                self.warps,
                self.rt,
                self.mt,
                if fused { ", fused" } else { "" }
            );
        }
        Ok(())
    }

    /// The kernel's static shared memory: `partial[max(WARPS - 1, 1)][SLOTS][32]` f32, SLOTS
    /// being a lane's accumulators (one set per matrix) and bias sums, and each pass row's
    /// exponent and largest |x| (4 bytes each).
    fn shared_bytes(&self, fused: bool) -> usize {
        let (mt, rt) = (self.mt as usize, self.rt as usize);
        let matrices = if fused { 2 } else { 1 };
        let slots = matrices * rt * mt * 4 + if self.bias_fold { mt * 4 } else { 0 };
        (self.warps as usize).saturating_sub(1).max(1) * slots * 32 * 4 + 2 * 8 * mt * 4
    }
}

/// The shape for `m` rows of `dtype` activations (`fused`: the gate·up·SwiGLU kernel, which
/// holds two accumulator sets and so takes one row tile a block); docs/cuda-mlp.md says how the
/// work is split and holds the kernel's measurements.
pub fn plan(m: usize, dtype: Dtype, fused: bool) -> AxisOneConfig {
    let mt = pass_tiles(m);
    let sixteen_bit = dtype != Dtype::Float32;
    AxisOneConfig {
        mt,
        rt: if fused || mt > 2 { 1 } else { 2 },
        warps: 4,
        bias_fold: sixteen_bit && mt <= 2,
        pack_fma: sixteen_bit && m == 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_planned_shape_is_valid_and_passes_share_the_rows() {
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            for fused in [false, true] {
                for m in 1..=300 {
                    let cfg = plan(m, dtype, fused);
                    cfg.check(dtype, fused).unwrap_or_else(|e| panic!("M {m} {dtype}: {e}"));
                    let passes = m.div_ceil(8 * cfg.mt as usize);
                    // Passes of up to 64 rows, as few as that allows, whose tiles exceed the
                    // call's 8-row tiles by less than one per pass.
                    assert_eq!(passes, m.div_ceil(64), "M {m}: {cfg:?}");
                    assert!((cfg.mt as usize) * passes < m.div_ceil(8) + passes, "M {m}: {cfg:?}");
                }
            }
        }
        assert_eq!(plan(72, Dtype::Bfloat16, true).mt, 5);
        assert!(plan(1, Dtype::Bfloat16, false).pack_fma && !plan(1, Dtype::Float32, false).bias_fold);
    }

    #[test]
    fn too_much_static_shared_memory_is_an_error_that_says_so() {
        // 7 warps' sums of 2 matrices x 4 row tiles x 8 tiles (256 a lane) and the bias (32).
        let big = AxisOneConfig { mt: 8, rt: 4, warps: 8, bias_fold: true, pack_fma: false };
        let err = big.check(Dtype::Bfloat16, true).unwrap_err().to_string();
        assert!(err.contains("258560 bytes of static shared memory") && err.contains("at most 49152"), "{err}");
        // The single projection holds one set (160 sums a lane): 3 warps (two warps' sums) fit,
        // 4 do not.
        let single = AxisOneConfig { warps: 3, ..big };
        single.check(Dtype::Bfloat16, false).unwrap();
        assert!(single.check(Dtype::Bfloat16, true).is_err());
        assert!(AxisOneConfig { warps: 4, ..big }.check(Dtype::Bfloat16, false).is_err());
    }
}

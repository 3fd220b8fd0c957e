//! The SwiGLU between an MLP's projections with the coded axes' rotations on either side of it,
//! in one launch (`kernels/cuda/swiglu_rotate.cu`): `silu(g · Qgᵀ) ⊙ (u · Quᵀ)` from the gate's
//! and the up projection's stored outputs, rotated by the down projection's `Qd` and padded to its
//! stored columns. On SmolLM2's layout (gate and up on axis 0, down on axis 1) it takes the place
//! of five launches per layer: two inverse rotations, MLX's SiLU and product, and the forward
//! rotation (docs/real-models.md, "Speed").

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::kernel::registry::{self, KernelKey, KernelText, LaunchCache};
use crate::kernel::sources;
use crate::kernel::{CudaKernel, CudaLaunch, LaunchConfig};
use crate::trellis::checks::int;
use crate::trellis::rotation::MAX_ROTATION_BLOCK;

// The join serves the activations and rotation blocks the rotation kernel serves.
use super::rotate::serves;

/// One side of the SwiGLU: a row width and the rotation applied there.
#[derive(Clone, Copy)]
pub(crate) struct Side<'a> {
    /// The stored row width: read for gate and up (their first `n` columns), written for down
    /// (zeros past `n`); at least `n`.
    pub stored: usize,
    /// The rotation's signs (f32 `[n]` on the device) and block, or `None`.
    pub rotation: Option<(&'a MlxArray, usize)>,
}

impl Side<'_> {
    /// The rotation's block, 0 for none.
    fn block(&self) -> usize {
        self.rotation.map_or(0, |(_, b)| b)
    }
}

/// The kernel, registered once.
fn kernel() -> Result<&'static CudaKernel> {
    registry::cuda(KernelKey::of("swiglu_rotate"), || {
        Ok(KernelText {
            inputs: &["g", "u", "signs_g", "signs_u", "signs_d"],
            outputs: &["y"],
            body: sources::CUDA_SWIGLU_ROTATE.into(),
            header: sources::CUDA_HADAMARD.into(),
        })
    })
}

/// `silu(g[:, :n] · Qgᵀ) ⊙ (u[:, :n] · Quᵀ) · Qd`, `[m, down.stored]` with zeros past `n`, in
/// `g`'s dtype (f32, f16 or bf16; `u` of the same), computed in f32 and rounded once.
pub(crate) fn swiglu_rotated(
    g: &MlxArray,
    u: &MlxArray,
    n: usize,
    gate: Side<'_>,
    up: Side<'_>,
    down: Side<'_>,
) -> Result<MlxArray> {
    let what = "CUDA SwiGLU with rotations";
    let m = match (&g.shape()[..], &u.shape()[..]) {
        (&[m, gc], &[mu, uc]) if m == mu && gc == gate.stored && uc == up.stored => m,
        (gs, us) => invalid!(
            "{what}: gate output {gs:?} and up output {us:?}, expected [M, {}] and [M, {}]",
            gate.stored,
            up.stored
        ),
    };
    let dtype = g.dtype();
    if u.dtype() != dtype || !serves(dtype, 1) {
        invalid!("{what}: gate output of {dtype} and up output of {} (f32, f16 or bf16, the same)", u.dtype());
    }
    if n == 0 {
        invalid!("{what}: no columns");
    }
    for (side, s) in [("gate", &gate), ("up", &up), ("down", &down)] {
        if s.stored < n {
            invalid!("{what}: the {side} side stores {} columns, fewer than the {n} it carries", s.stored);
        }
        if let Some((signs, block)) = s.rotation {
            if !serves(dtype, block)
                || !n.is_multiple_of(block)
                || signs.shape() != [n]
                || signs.dtype() != Dtype::Float32
            {
                invalid!(
                    "{what}: the {side} side's rotation of block {block} with signs {:?} {} over {n} columns (f32 [{n}], a power-of-two block of at most {MAX_ROTATION_BLOCK} dividing {n})",
                    signs.shape(),
                    signs.dtype()
                );
            }
        }
    }
    if m == 0 {
        return MlxArray::zeros(&[0, down.stored], dtype);
    }
    let blocks = [gate.block(), up.block(), down.block()];
    let stored = [gate.stored, up.stored, down.stored];
    let key = (m, dtype, n, blocks, stored);
    type Key = (usize, Dtype, usize, [usize; 3], [usize; 3]);
    static LAUNCHES: LaunchCache<Key, CudaLaunch> = LaunchCache::new(1024);
    let launch = LAUNCHES.get_or_build(key, || prepare(m, dtype, n, blocks, stored))?;
    // A side without a rotation reads no signs: any array stands in.
    let [sg, su, sd] = [gate.rotation, up.rotation, down.rotation].map(|r| r.map_or(g, |(signs, _)| signs));
    Ok(kernel()?.apply_prepared(&[g, u, sg, su, sd], &launch)?.remove(0))
}

/// The chunk a thread block transforms: the largest power of two that divides `n`, at most the
/// largest rotation block the kernels take (so a multiple of every block that divides `n`).
fn chunk(n: usize) -> usize {
    (1usize << n.trailing_zeros().min(usize::BITS - 1)).min(MAX_ROTATION_BLOCK)
}

/// The launch of [`swiglu_rotated`] for `m` rows (the grid is in the kernel file).
fn prepare(m: usize, dtype: Dtype, n: usize, blocks: [usize; 3], stored: [usize; 3]) -> Result<CudaLaunch> {
    let what = "CUDA SwiGLU with rotations";
    let c = chunk(n);
    let threads = (c / 2).max(1);
    let Some(grid_x) = stored[2].div_ceil(c).checked_mul(threads).filter(|&g| i32::try_from(g).is_ok()) else {
        invalid!("{what}: {} columns in chunks of {c} are too many for one launch grid", stored[2]);
    };
    // The host's scale, as the rotation kernel and MLX's `hadamard_transform` take it.
    let scale = |b: usize| if b == 0 { 0 } else { (1.0 / (b as f32).sqrt()).to_bits() as i32 };
    let launch = LaunchConfig::new([grid_x, m.min(65535), 1], [threads, 1, 1])
        .output(&[m, stored[2]], dtype)
        .template_dtype("T", dtype)
        .template_int("N", int(what, n)?)
        .template_int("C", int(what, c)?)
        .template_int("BG", int(what, blocks[0])?)
        .template_int("BU", int(what, blocks[1])?)
        .template_int("BD", int(what, blocks[2])?)
        .template_int("SG", int(what, stored[0])?)
        .template_int("SU", int(what, stored[1])?)
        .template_int("SD", int(what, stored[2])?)
        .template_int("SCALE_G", scale(blocks[0]))
        .template_int("SCALE_U", scale(blocks[1]))
        .template_int("SCALE_D", scale(blocks[2]));
    kernel()?.prepare(&launch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rotating_kernels_are_registered_compacted() {
        // Text outside the compactor's plain subset would go as written.
        for (text, file) in [
            (sources::CUDA_HADAMARD, "hadamard.cuh"),
            (sources::CUDA_ROTATE, "rotate.cu"),
            (sources::CUDA_SWIGLU_ROTATE, "swiglu_rotate.cu"),
        ] {
            let compact = crate::kernel::compact::compact_plain_cpp(text).unwrap_or_else(|| panic!("{file}"));
            assert!(compact.len() < text.len(), "{file}");
        }
    }

    #[test]
    fn the_chunk_divides_the_columns_and_holds_every_block() {
        assert_eq!(chunk(1536), 256);
        assert_eq!(chunk(320), 64);
        assert_eq!(chunk(192), 64);
        assert_eq!(chunk(7), 1);
        assert_eq!(chunk(17408), 256);
        for n in 1..2000usize {
            let c = chunk(n);
            assert!(n % c == 0 && c <= MAX_ROTATION_BLOCK && c.is_power_of_two(), "{n}");
            // Every power-of-two block of at most 256 that divides n divides the chunk.
            for b in (0..=8).map(|e| 1usize << e).filter(|b| n % b == 0) {
                assert_eq!(c % b, 0, "n {n} block {b}");
            }
        }
    }

    /// Bad operands are refused before any kernel is made (so on every back-end).
    #[test]
    fn bad_operands_are_refused_naming_them() {
        let plain = |stored| Side { stored, rotation: None };
        let g = MlxArray::zeros(&[2, 256], Dtype::Bfloat16).unwrap();
        let u = MlxArray::zeros(&[2, 256], Dtype::Bfloat16).unwrap();
        let err = |r: Result<MlxArray>| r.expect_err("refused").to_string();
        let e = err(swiglu_rotated(&g, &u, 256, plain(512), plain(256), plain(256)));
        assert!(e.contains("expected [M, 512] and [M, 256]"), "{e}");
        let u16 = MlxArray::zeros(&[2, 256], Dtype::Float16).unwrap();
        let e = err(swiglu_rotated(&g, &u16, 256, plain(256), plain(256), plain(256)));
        assert!(e.contains("the same"), "{e}");
        let e = err(swiglu_rotated(&g, &u, 300, plain(256), plain(256), plain(512)));
        assert!(e.contains("stores 256 columns, fewer than the 300"), "{e}");
        let signs = MlxArray::zeros(&[256], Dtype::Float32).unwrap();
        for (block, shape) in [(512, 256), (96, 256), (128, 200)] {
            let s = MlxArray::zeros(&[shape], Dtype::Float32).unwrap();
            let e = err(swiglu_rotated(
                &g,
                &u,
                256,
                plain(256),
                plain(256),
                Side { stored: 256, rotation: Some((&s, block)) },
            ));
            assert!(e.contains("the down side's rotation"), "{e}");
        }
        let half = signs.astype(Dtype::Float16).unwrap();
        let e = err(swiglu_rotated(
            &g,
            &u,
            256,
            Side { stored: 256, rotation: Some((&half, 128)) },
            plain(256),
            plain(256),
        ));
        assert!(e.contains("the gate side's rotation"), "{e}");
        let ints = MlxArray::zeros(&[2, 256], Dtype::Int32).unwrap();
        assert!(swiglu_rotated(&ints, &ints, 256, plain(256), plain(256), plain(256)).is_err());
    }
}

//! The CUDA rotation kernel (`kernels/cuda/rotate.cu`) against the f64 rotation, and against the
//! MLX operations it replaces, bit for bit. Ignored without MLX's CUDA back-end (`scripts/gpu.sh
//! test` runs them on a CUDA machine); the layers that use it are checked end to end by
//! `tests/rotation.rs`'s CUDA tests.

mod common;

use common::{require_cuda, to_f64};
use mlx_trellis::trellis::cuda::rotate::{rotate, Direction};
use mlx_trellis::trellis::reference::rel_err;
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::transform;
use mlx_trellis::trellis::Rotation;
use mlx_trellis::{Dtype, MlxArray};

/// Axis lengths whose rotation blocks are 1 (odd), 2, 16, 64 and 256, and 256 over several
/// blocks.
const LENGTHS: [usize; 6] = [3, 6, 48, 192, 256, 1536];

/// The relErr gate of one rotation: f32 sums of at most 256 terms in 8 butterfly stages (about
/// 8 · 2^-24 of the largest output) under 1e-5; in 16 bits the output's rounding, half a unit
/// in the last place of the largest output (2^-12 f16, 2^-9 bf16), allowed twice.
fn rotation_gate(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::Float32 => 1e-5,
        Dtype::Float16 => 2.0 * 2f64.powi(-12),
        _ => 2.0 * 2f64.powi(-9),
    }
}

/// Seeded activations `[m, width]` in `dtype` and their values.
fn x(m: usize, width: usize, dtype: Dtype, seed: u64) -> (MlxArray, Vec<f64>) {
    let v = gaussian(m * width, seed).unwrap();
    let x = MlxArray::from_slice(&v, &[m, width]).unwrap().astype(dtype).unwrap();
    let xr = to_f64(&x);
    (x, xr)
}

/// Forward into rows padded by `pad` zero columns, and inverse from rows with `pad` extra columns
/// (not read), at every row count and dtype, against the f64 rotation.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn the_rotation_kernel_matches_the_f64_rotation() {
    require_cuda();
    for n in LENGTHS {
        let r = Rotation::seeded(n, 11 + n as u64).unwrap();
        for pad in [0, 40] {
            let stored = n + pad;
            for m in [1, 3, 17, 130] {
                for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                    let what = format!("n {n} (block {}) stored {stored} M {m} {dtype}", r.block());
                    // Forward: x [m, n] -> [m, stored].
                    let (xa, xr) = x(m, n, dtype, 5 * n as u64 + m as u64);
                    let y = rotate(&xa, &r, Direction::Forward { stored }).unwrap();
                    assert_eq!((y.shape(), y.dtype()), (vec![m, stored], dtype), "{what}");
                    let got = to_f64(&y);
                    let mut want = Vec::with_capacity(m * n);
                    for row in xr.chunks_exact(n) {
                        let mut row = row.to_vec();
                        r.rotate_f64(&mut row).unwrap();
                        want.extend(row);
                    }
                    let (rotated, padding): (Vec<f64>, Vec<f64>) = (
                        got.chunks_exact(stored).flat_map(|row| row[..n].to_vec()).collect(),
                        got.chunks_exact(stored).flat_map(|row| row[n..].to_vec()).collect(),
                    );
                    assert!(padding.iter().all(|&v| v == 0.0), "{what}: padding not zero");
                    let err = rel_err(&rotated, &want).unwrap();
                    assert!(err < rotation_gate(dtype), "{what} forward: relErr {err:.3e}");
                    // Inverse: x [m, stored] -> [m, n], the first n columns.
                    let (xa, xr) = x(m, stored, dtype, 7 * n as u64 + m as u64);
                    let y = rotate(&xa, &r, Direction::Inverse { stored }).unwrap();
                    assert_eq!((y.shape(), y.dtype()), (vec![m, n], dtype), "{what}");
                    let mut want = Vec::with_capacity(m * n);
                    for row in xr.chunks_exact(stored) {
                        let mut row = row[..n].to_vec();
                        r.inverse_f64(&mut row).unwrap();
                        want.extend(row);
                    }
                    let err = rel_err(&to_f64(&y), &want).unwrap();
                    assert!(err < rotation_gate(dtype), "{what} inverse: relErr {err:.3e}");
                }
            }
        }
    }
}

/// More rows than one launch grid's y holds (65535): rows past it are transformed too.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn rows_past_the_grid_are_rotated() {
    require_cuda();
    let (n, m) = (16, 65537);
    let r = Rotation::seeded(n, 3).unwrap();
    let (xa, xr) = x(m, n, Dtype::Float32, 9);
    let y = to_f64(&rotate(&xa, &r, Direction::Forward { stored: n }).unwrap());
    for row in [0, 65534, 65535, 65536] {
        let mut want = xr[row * n..(row + 1) * n].to_vec();
        r.rotate_f64(&mut want).unwrap();
        let err = rel_err(&y[row * n..(row + 1) * n], &want).unwrap();
        assert!(err < rotation_gate(Dtype::Float32), "row {row}: relErr {err:.3e}");
    }
}

/// The kernel gives the bits of the MLX operations it replaces (a copy to f32, the signs'
/// product, `hadamard_transform`, a copy back), both ways, in every dtype.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn the_rotation_kernel_gives_the_bits_of_mlx_operations() {
    require_cuda();
    for n in LENGTHS {
        let r = Rotation::seeded(n, 29 + n as u64).unwrap();
        for m in [1, 17] {
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                let (xa, _) = x(m, n, dtype, 13 * n as u64 + m as u64);
                let what = format!("n {n} M {m} {dtype}");
                let kernel = to_f64(&rotate(&xa, &r, Direction::Forward { stored: n }).unwrap());
                let ops = to_f64(&transform::rotate(&xa, &r).unwrap());
                assert_eq!(kernel, ops, "{what}: forward");
                let kernel = to_f64(&rotate(&xa, &r, Direction::Inverse { stored: n }).unwrap());
                let ops = to_f64(&transform::inverse_rotate(&xa, &r).unwrap());
                assert_eq!(kernel, ops, "{what}: inverse");
            }
        }
    }
}

/// Shapes the kernel does not take are errors, not launches.
#[test]
fn bad_shapes_are_refused_before_any_launch() {
    let r = Rotation::seeded(48, 1).unwrap();
    let x = MlxArray::zeros(&[2, 40], Dtype::Float32).unwrap();
    assert!(rotate(&x, &r, Direction::Forward { stored: 48 }).is_err(), "40 columns for a rotation of 48");
    let x = MlxArray::zeros(&[2, 48], Dtype::Float32).unwrap();
    assert!(rotate(&x, &r, Direction::Forward { stored: 40 }).is_err(), "stored narrower than the rotation");
    assert!(rotate(&x, &r, Direction::Inverse { stored: 64 }).is_err(), "rows of 48 read as rows of 64");
    let x = MlxArray::zeros(&[2, 48], Dtype::Int32).unwrap();
    assert!(rotate(&x, &r, Direction::Forward { stored: 48 }).is_err(), "int32 activations");
    let x = MlxArray::zeros(&[48], Dtype::Float32).unwrap();
    assert!(rotate(&x, &r, Direction::Forward { stored: 48 }).is_err(), "a vector");
}

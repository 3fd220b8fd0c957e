//! Activations of every magnitude an f32 or a bf16 holds, against the f64 reference: x ~ N(0, σ²)
//! for σ from 1e-8 to 1e8, and rows of σ 1 with a few 1e4 outliers (the massive activations of
//! real models), through the down projection (both layouts), one axis-1 projection, the fused
//! gate·up·SwiGLU and the whole MLP. The CUDA kernels multiply in f16 (range 6e-8 ... 65504), so
//! they bring each activation row into that range by a power of two first; the generic path
//! multiplies in f32 and needs nothing. Gates: relErr 1e-4 for f32 activations, 1e-2 for 16-bit
//! ones, every output finite. f16 activations run only where their magnitudes, and the
//! outputs', are f16 numbers (the SwiGLU squares them: only σ 1 there).
//!
//! The generic path runs here on every machine; the CUDA kernels' tests are ignored without
//! MLX's CUDA back-end (`scripts/gpu.sh test activation_range` runs them).

mod common;

use common::{require_cuda, to_f64};
use mlx_trellis::trellis::reference::{forward_f64, mlp_forward_f64, rel_err, swiglu_f64};
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{synthetic_mlp, CodeLayout, ForwardPath, HostLayer, TrellisLinear, TrellisMlp};
use mlx_trellis::{Dtype, MlxArray};

const HIDDEN: usize = 512;
const INTER: usize = 256;

/// Row counts: one row, a few, the f16 hand-over and prescaled B tiles (20), a full pass (64),
/// two passes and, for 16-bit activations, the dense path (130).
const ROWS: [usize; 5] = [1, 3, 20, 64, 130];

/// Activation scales σ, and `None` for σ 1 with outliers.
const SIGMAS: [Option<f32>; 9] =
    [Some(1e-8), Some(1e-5), Some(1e-3), Some(1.0), Some(1e3), Some(1e5), Some(1e7), Some(1e8), None];

/// The gate: 1e-4 for f32 activations, 1e-2 for 16-bit ones; for the generic path's f32 on a
/// back-end that multiplies f32 matrices in TF32 (CUDA by default), TF32's gate
/// ([`common::f32_matmul_gate`]).
fn gate(dtype: Dtype, path: ForwardPath) -> f64 {
    match (dtype, path) {
        (Dtype::Float32, ForwardPath::Generic) => common::f32_matmul_gate().max(1e-4),
        (Dtype::Float32, _) => 1e-4,
        _ => 1e-2,
    }
}

/// The dtypes whose range holds activations of `sigma` (about five σ at most): f32 and bf16
/// always, f16 from σ 1e-5 (its subnormals are still f16 numbers) up to σ 1e3.
fn dtypes(sigma: Option<f32>) -> Vec<Dtype> {
    let f16_fits = sigma.is_none_or(|s| (1e-5..=1e3).contains(&s));
    [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16].into_iter().filter(|&d| d != Dtype::Float16 || f16_fits).collect()
}

/// Seeded activations `[m, width]` in `dtype`: N(0, σ²), or N(0, 1) with three entries of ±1e4
/// in every other row; and their values as the kernels see them.
fn x(m: usize, width: usize, dtype: Dtype, sigma: Option<f32>) -> (MlxArray, Vec<f64>) {
    let mut v: Vec<f32> = gaussian(m * width, 31 * m as u64 + width as u64).unwrap();
    match sigma {
        Some(s) => v.iter_mut().for_each(|x| *x *= s),
        None => {
            for row in (0..m).step_by(2) {
                for (j, at) in [7, width / 3, width - 5].into_iter().enumerate() {
                    v[row * width + at] = if (row + j) % 2 == 0 { 1e4 } else { -1e4 };
                }
            }
        }
    }
    let x = MlxArray::from_slice(&v, &[m, width]).unwrap().astype(dtype).unwrap();
    let xr = to_f64(&x);
    (x, xr)
}

fn label(sigma: Option<f32>) -> String {
    sigma.map_or("σ 1 with 1e4 outliers".to_string(), |s| format!("σ {s:e}"))
}

/// Checks `got` `[m, width]` in `dtype` against `want`: finite, relErr under `path`'s gate.
fn check(what: &str, got: &MlxArray, want: &[f64], m: usize, width: usize, dtype: Dtype, path: ForwardPath) -> f64 {
    assert_eq!((got.shape(), got.dtype()), (vec![m, width], dtype), "{what}");
    let got = to_f64(got);
    assert!(got.iter().all(|v| v.is_finite()), "{what} M {m} {dtype}: non-finite output");
    let err = rel_err(&got, want).unwrap();
    let gate = gate(dtype, path);
    assert!(err < gate, "{what} M {m} {dtype}: relErr {err:.3e} (gate {gate:.0e})");
    err
}

/// A seeded MLP `HIDDEN -> INTER -> HIDDEN` of k-bit codes, its down projection in `layout`.
fn mlp(k: u32, layout: CodeLayout) -> ((HostLayer, HostLayer, HostLayer), TrellisMlp) {
    let h = synthetic_mlp(HIDDEN, INTER, k, layout, 5 + k as u64).unwrap();
    let lin = |name: &str, l: &HostLayer| TrellisLinear::from_host(name, l).unwrap();
    let mlp = TrellisMlp::new(lin("gate_proj", &h.0), lin("up_proj", &h.1), lin("down_proj", &h.2)).unwrap();
    (h, mlp)
}

/// Every magnitude, row count and dtype through `path`: the down projection (of the MLP's
/// intermediate width, row-major k 2 and the 3-bit interleave), the up projection alone, the
/// fused gate·up·SwiGLU and the MLP. Prints the worst relErr per part and dtype.
fn sweep(path: ForwardPath) {
    let mut worst: Vec<(String, Dtype, f64)> = Vec::new();
    let mut note =
        |what: &str, dtype: Dtype, err: f64| match worst.iter_mut().find(|(w, d, _)| w == what && *d == dtype) {
            Some(e) => e.2 = e.2.max(err),
            None => worst.push((what.to_string(), dtype, err)),
        };
    for (k, layout) in [(2, CodeLayout::RowMajor), (3, CodeLayout::K3Interleaved)] {
        let (h, mlp) = mlp(k, layout);
        for sigma in SIGMAS {
            for dtype in dtypes(sigma) {
                for m in ROWS {
                    let what = |part: &str| format!("{part} k{k} {} {path}", label(sigma));
                    // The down projection on its own input width.
                    let (xd, xdr) = x(m, INTER, dtype, sigma);
                    let want = forward_f64(&xdr, m, &h.2.codes, &h.2.scales, &h.2.geometry).unwrap();
                    let y = mlp.down().forward_with(&xd, path).unwrap();
                    let down = format!("down ({layout:?})");
                    note(&down, dtype, check(&what(&down), &y, &want, m, HIDDEN, dtype, path));
                    let (x, xr) = x(m, HIDDEN, dtype, sigma);
                    // silu(g) ⊙ u is about σ² times the weights' own size: f16 holds it at σ 1 only.
                    let squared_fits = dtype != Dtype::Float16 || sigma == Some(1.0);
                    if k == 2 && squared_fits {
                        // One axis-1 projection, and the fused gate·up·SwiGLU.
                        let want = forward_f64(&xr, m, &h.1.codes, &h.1.scales, &h.1.geometry).unwrap();
                        let y = mlp.up().forward_with(&x, path).unwrap();
                        note("up", dtype, check(&what("up"), &y, &want, m, INTER, dtype, path));
                        let want = swiglu_f64(&xr, m, &h.0, &h.1).unwrap();
                        let s = mlp.swiglu_with(&x, path).unwrap();
                        note("gate·up·SwiGLU", dtype, check(&what("gate·up·SwiGLU"), &s, &want, m, INTER, dtype, path));
                    }
                    if [1, 20].contains(&m) && squared_fits {
                        let want = mlp_forward_f64(&xr, m, &h.0, &h.1, &h.2).unwrap();
                        let y = mlp.forward_with(&x, path).unwrap();
                        note("MLP", dtype, check(&what("MLP"), &y, &want, m, HIDDEN, dtype, path));
                    }
                }
            }
        }
    }
    for (what, dtype, err) in worst {
        println!("{path} {what} {dtype}: worst relErr {err:.2e} over every magnitude and row count");
    }
}

#[test]
fn the_generic_path_holds_every_activation_magnitude() {
    sweep(ForwardPath::Generic);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn the_cuda_kernels_hold_every_activation_magnitude() {
    require_cuda();
    sweep(ForwardPath::Cuda);
}

//! The CUDA axis-1 kernels (one projection stored `[out, in]`, and the fused gate·up·SwiGLU) and
//! the CUDA MLP against the f64 reference. Ignored without MLX's CUDA back-end (`scripts/gpu.sh test`
//! runs them on a CUDA machine).

mod common;

use common::{gate, largest_abs, plus, require_cuda, seeded, to_f64};
use mlx_trellis::trellis::cuda::gate_up::linear_residual;
use mlx_trellis::trellis::cuda::tuning::{
    axis_one_plan, axis_one_residual_with, axis_one_with, swiglu_with, AxisOneConfig, AxisOneKernel,
};
use mlx_trellis::trellis::reference::{forward_f64, mlp_forward_f64, rel_err, swiglu_f64};
use mlx_trellis::trellis::{
    synthetic_layer, synthetic_mlp, CodeLayout, ForwardPath, HostLayer, TrellisLinear, TrellisMlp,
};
use mlx_trellis::{Dtype, ErrorKind, MlxArray};

/// Row counts of every kind of call: one row, 2-8 rows, one short of and past 8-row tiles, the
/// f16 hand-over (17), passes of up to 64 rows that share the rows (65, 100), the dense path.
const ROWS: [usize; 10] = [1, 2, 5, 9, 16, 17, 40, 64, 65, 128];

/// Seeded activations `[m, width]` in `dtype` (standard normal times `scale`) and their values.
fn x(m: usize, width: usize, dtype: Dtype, scale: f32) -> (MlxArray, Vec<f64>) {
    seeded(m, width, dtype, scale, 7 * m as u64 + width as u64)
}

/// A seeded residual stream `[m, width]` in `dtype` (standard normal times `scale`, seeds apart
/// from [`x`]'s) and its values.
fn residual(m: usize, width: usize, dtype: Dtype, scale: f64) -> (MlxArray, Vec<f64>) {
    seeded(m, width, dtype, scale as f32, 9_000_011 + 13 * m as u64 + width as u64)
}

fn up_layer(out: usize, inp: usize, k: u32, l: u32) -> (HostLayer, TrellisLinear) {
    let host = synthetic_layer(
        out,
        inp,
        k,
        l,
        1,
        CodeLayout::RowMajor,
        (1.0 / (inp as f64).sqrt()) as f32,
        (out * 7 + inp) as u64 + k as u64,
    )
    .unwrap();
    let lin = TrellisLinear::from_host("up_proj", &host).unwrap();
    (host, lin)
}

fn check(what: &str, got: &MlxArray, want: &[f64], m: usize, width: usize, dtype: Dtype, bound: f64) {
    assert_eq!((got.shape(), got.dtype()), (vec![m, width], dtype), "{what}");
    let got = to_f64(got);
    assert!(got.iter().all(|v| v.is_finite()), "{what} M {m} {dtype}: non-finite output");
    let err = rel_err(&got, want).unwrap();
    println!("{what} M {m} {dtype}: relErr {err:.2e}");
    assert!(err < bound, "{what} M {m} {dtype}: relErr {err:.3e} (gate {bound:.0e})");
}

/// One projection stored [out, in] by the planned kernel at every kind of row count and dtype.
fn axis_one_projection_matches_the_reference(out: usize, inp: usize, k: u32, l: u32) {
    require_cuda();
    let (host, lin) = up_layer(out, inp, k, l);
    for &m in &ROWS {
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            let (x, xr) = x(m, inp, dtype, 1.0);
            let want = forward_f64(&xr, m, &host.codes, &host.scales, &host.geometry).unwrap();
            let y = lin.forward_with(&x, ForwardPath::Cuda).unwrap();
            check(&format!("axis 1 {}", host.geometry), &y, &want, m, out, dtype, gate(dtype));
        }
    }
}

// k 2/3/4, L 8/12/16, inputs of one and of several blocks (not a multiple of the block's warps),
// outputs not a multiple of the tile; one test per layer, so that their kernels compile side by
// side.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn axis_one_k3_l12_matches_the_reference() {
    axis_one_projection_matches_the_reference(200, 768, 3, 12);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn axis_one_k2_one_block_matches_the_reference() {
    axis_one_projection_matches_the_reference(64, 256, 2, 12);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn axis_one_k4_l16_matches_the_reference() {
    axis_one_projection_matches_the_reference(136, 1280, 4, 16);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn axis_one_k2_l8_matches_the_reference() {
    axis_one_projection_matches_the_reference(48, 512, 2, 8);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn axis_one_k3_l16_matches_the_reference() {
    axis_one_projection_matches_the_reference(40, 1024, 3, 16);
}

/// One projection plus a residual in one launch (`linear_residual`, a model's down projection
/// and its residual add) against the f64 `residual + x W`, at every kind of row count and dtype
/// (from 65 rows of 16-bit activations, the dense path's matmul and add).
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn axis_one_with_a_residual_matches_the_reference() {
    require_cuda();
    for (out, inp, k, l) in [(72, 768, 3, 12), (40, 256, 2, 8), (88, 512, 4, 16)] {
        let (host, lin) = up_layer(out, inp, k, l);
        let g = *lin.geometry();
        for &m in &ROWS {
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                let (r, rr) = x(m, out, dtype, 0.5);
                let (x, xr) = x(m, inp, dtype, 1.0);
                let xw = forward_f64(&xr, m, &host.codes, &host.scales, &g).unwrap();
                let want = plus(&xw, &rr);
                let y = linear_residual(&x, lin.codes(), lin.scales(), &g, &r).unwrap();
                check(&format!("axis 1 {g} plus a residual"), &y, &want, m, out, dtype, gate(dtype));
            }
        }
    }
}

/// Every kernel shape (rows per pass, row tiles, warps, the bias fold and IMAD pack) on one
/// layer, not only the planned ones.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn every_axis_one_shape_matches_the_reference() {
    require_cuda();
    let (host, lin) = up_layer(88, 768, 3, 12);
    let g = *lin.geometry();
    // Rows per pass, row tiles, warps (one, a count that does not divide the 3 blocks, more
    // than the blocks), the bias fold and the IMAD pack.
    let shapes = [
        (1, 2, 4, true, true),
        (1, 1, 1, true, false),
        (2, 4, 3, true, false),
        (3, 1, 8, false, false),
        (8, 1, 4, false, false),
        (4, 2, 2, false, false),
    ];
    // Each with the rows staged in shared memory (16-bit activations; every pass of these fits,
    // the last one of 3 rows where m = 8 mt + 3) and read from global memory.
    let shapes = shapes.into_iter().flat_map(|s| [(s, false), (s, true)]);
    for ((mt, rt, warps, bias_fold, pack_fma), stage) in shapes {
        let fragment = AxisOneKernel::Fragment;
        let cfg = AxisOneConfig {
            mt,
            rt,
            warps,
            bias_fold,
            pack_fma,
            kernel: fragment,
            prefetch: false,
            split_k: 1,
            row_split: 1,
            stage,
            ..AxisOneConfig::plain(fragment)
        };
        for dtype in [Dtype::Bfloat16, Dtype::Float16, Dtype::Float32] {
            if cfg.check(dtype, false).is_err() {
                assert!(dtype == Dtype::Float32 && (bias_fold || stage), "{cfg:?} {dtype}");
                continue;
            }
            for m in [1, 8 * mt as usize - 1, 8 * mt as usize + 3] {
                let (x, xr) = x(m, 768, dtype, 1.0);
                let want = forward_f64(&xr, m, &host.codes, &host.scales, &g).unwrap();
                let y = axis_one_with(&x, lin.codes(), lin.scales(), &g, cfg).unwrap();
                check(&format!("{cfg:?}"), &y, &want, m, 88, dtype, gate(dtype));
            }
        }
    }
    // Activations in a view that starts 2 bytes into its buffer: no 16-byte loads, staged or not.
    let (flat, flat_r) = x(1, 3 * 768 + 8, Dtype::Bfloat16, 1.0);
    let shifted = flat.reshape(&[3 * 768 + 8]).unwrap().slice(&[1], &[1 + 3 * 768], &[1]).unwrap();
    let view = shifted.reshape(&[3, 768]).unwrap();
    let want = forward_f64(&flat_r[1..1 + 3 * 768], 3, &host.codes, &host.scales, &g).unwrap();
    for stage in [false, true] {
        let cfg = AxisOneConfig { stage, bias_fold: true, ..AxisOneConfig::plain(AxisOneKernel::Fragment) };
        let y = axis_one_with(&view, lin.codes(), lin.scales(), &g, cfg).unwrap();
        let what = format!("{cfg:?}, a view 2 bytes into its buffer");
        check(&what, &y, &want, 3, 88, Dtype::Bfloat16, gate(Dtype::Bfloat16));
    }
}

/// The int8 kernel (`gate_up_int8.cu`: 16-bit activations as two int8 terms per 256-input block,
/// multiplied on u8 x s8 MMAs; not planned, taken by an explicit shape) against the f64 reference under
/// each dtype's gate: row counts from 1 to its 8, k 2/3/4 and L 8/12/16, several row tiles and
/// warp counts, activation magnitudes 1e-8 to 1e8, rows whose every 64 inputs hold an outlier of
/// 30 times the rest, zero rows, and non-finite activations.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn int8_activations_match_the_reference() {
    require_cuda();
    let int8 = |rt, warps| AxisOneConfig { rt, warps, ..AxisOneConfig::plain(AxisOneKernel::Int8) };
    let layers = [(200, 768, 3, 12), (64, 256, 2, 12), (136, 1280, 4, 16), (48, 512, 2, 8), (40, 1024, 3, 16)];
    for (i, &(out, inp, k, l)) in layers.iter().enumerate() {
        let (host, lin) = up_layer(out, inp, k, l);
        let g = *lin.geometry();
        let run = |x: &MlxArray, cfg| axis_one_with(x, lin.codes(), lin.scales(), &g, cfg).unwrap();
        for dtype in [Dtype::Bfloat16, Dtype::Float16] {
            for m in [1, 2, 3, 8] {
                let scales: &[f32] = if m == 1 && dtype == Dtype::Bfloat16 { &[1e-8, 1.0, 1e8] } else { &[1.0] };
                for &scale in scales {
                    let (x, xr) = x(m, inp, dtype, scale);
                    let want = forward_f64(&xr, m, &host.codes, &host.scales, &g).unwrap();
                    check(&format!("int8 {g} x{scale:e}"), &run(&x, int8(2, 4)), &want, m, out, dtype, gate(dtype));
                }
            }
        }
        // Other shapes on one layer: one warp, warps that do not divide the blocks, more warps
        // than blocks, one and four row tiles.
        if i == 2 {
            for (rt, warps) in [(1, 1), (1, 3), (4, 8)] {
                for m in [1, 5] {
                    let (x, xr) = x(m, inp, Dtype::Bfloat16, 1.0);
                    let want = forward_f64(&xr, m, &host.codes, &host.scales, &g).unwrap();
                    let y = run(&x, int8(rt, warps));
                    check(
                        &format!("int8 {g} rt {rt} warps {warps}"),
                        &y,
                        &want,
                        m,
                        out,
                        Dtype::Bfloat16,
                        gate(Dtype::Bfloat16),
                    );
                }
            }
        }
        // Every 64 inputs with an outlier of 30 times the rest.
        for m in [1, 2] {
            let (x, _) = x(m, inp, Dtype::Float32, 1.0);
            let spikes: Vec<f32> = (0..m * inp).map(|j| if j % 64 == (j / 64) % 64 { 30.0 } else { 1.0 }).collect();
            let x = x
                .multiply(&MlxArray::from_slice(&spikes, &[m, inp]).unwrap())
                .unwrap()
                .astype(Dtype::Bfloat16)
                .unwrap();
            let xr = to_f64(&x);
            let want = forward_f64(&xr, m, &host.codes, &host.scales, &g).unwrap();
            let y = run(&x, int8(2, 4));
            check(&format!("int8 {g} with outliers"), &y, &want, m, out, Dtype::Bfloat16, gate(Dtype::Bfloat16));
        }
    }
    zero_and_poisoned_rows(2, int8(2, 4));
}

/// The fused int8 kernel (gate and up of the same or different k) and its residual variant at row
/// counts it takes, against the reference.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn fused_and_residual_int8_match_the_reference() {
    require_cuda();
    for (kg, ku) in [(3, 3), (2, 4), (4, 2)] {
        let (h, mlp) = mixed_mlp(kg, ku);
        for dtype in [Dtype::Bfloat16, Dtype::Float16] {
            for m in [1, 2, 4, 7] {
                let (x, xr) = x(m, 768, dtype, 1.0);
                let want = swiglu_f64(&xr, m, &h.0, &h.1).unwrap();
                let cfg = AxisOneConfig::plain(AxisOneKernel::Int8);
                let s = swiglu_with(&x, mlp.gate(), mlp.up(), cfg).unwrap();
                check(&format!("int8 SwiGLU gate k{kg} up k{ku}"), &s, &want, m, 200, dtype, gate(dtype));
            }
        }
    }
    let (host, lin) = up_layer(72, 768, 3, 12);
    let g = *lin.geometry();
    let cfg = AxisOneConfig { rt: 2, ..AxisOneConfig::plain(AxisOneKernel::Int8) };
    for dtype in [Dtype::Bfloat16, Dtype::Float16] {
        for m in [1, 3] {
            let (r, rr) = x(m, 72, dtype, 0.5);
            let (x, xr) = x(m, 768, dtype, 1.0);
            let xw = forward_f64(&xr, m, &host.codes, &host.scales, &g).unwrap();
            let want = plus(&xw, &rr);
            let y = axis_one_residual_with(&x, lin.codes(), lin.scales(), &g, &r, cfg).unwrap();
            check(&format!("int8 {g} plus a residual"), &y, &want, m, 72, dtype, gate(dtype));
        }
    }
}

/// A 64 x 512 layer through `cfg` at `m` rows (at least 2) of bf16 activations: zero rows give
/// zeros, and a NaN or an infinity in row 1 reaches every output of its row and no other row's.
fn zero_and_poisoned_rows(m: usize, cfg: AxisOneConfig) {
    let (_, lin) = up_layer(64, 512, 3, 12);
    let g = *lin.geometry();
    let run = |x: &MlxArray| to_f64(&axis_one_with(x, lin.codes(), lin.scales(), &g, cfg).unwrap());
    let zeros = MlxArray::zeros(&[m, 512], Dtype::Bfloat16).unwrap();
    assert!(run(&zeros).iter().all(|&v| v == 0.0), "zero rows");
    for bad in [f32::NAN, f32::INFINITY] {
        let mut v = vec![0.5f32; m * 512];
        v[512 + 300] = bad;
        let y = run(&MlxArray::from_slice(&v, &[m, 512]).unwrap().astype(Dtype::Bfloat16).unwrap());
        let (row0, row1, rest) = (&y[..64], &y[64..128], &y[128..]);
        assert!(row0.iter().chain(rest).all(|v| v.is_finite()), "{bad}: other rows");
        assert!(row1.iter().all(|v| !v.is_finite()), "{bad}: its row {row1:?}");
    }
}

/// One layer's checks of a decode-once GEMM's shapes against the f64 reference under each dtype's
/// gate: each of `sweep` at row counts that fill its passes, leave them short and spill into
/// another pass (and with a row split, that reach only the first row of its second warp's), bf16
/// and f16; activation magnitudes 1e-8 and 1e8 in `magnitudes(bias_fold)`'s
/// shape, with and without the bias fold; and the residual variant in each of `residual`.
fn gemm_shapes_of_one_layer(
    name: &str,
    (out, inp, k, l): (usize, usize, u32, u32),
    sweep: &[AxisOneConfig],
    magnitudes: impl Fn(bool) -> AxisOneConfig,
    residual: &[AxisOneConfig],
) {
    require_cuda();
    let (host, lin) = up_layer(out, inp, k, l);
    let g = *lin.geometry();
    for &cfg in sweep {
        let rows = cfg.pass_rows();
        let second_warp = (cfg.row_split > 1).then_some(8 * cfg.mt as usize + 1);
        for dtype in [Dtype::Bfloat16, Dtype::Float16] {
            for m in [1, rows - 1, rows, rows + 3].into_iter().chain(second_warp) {
                let (x, xr) = x(m, inp, dtype, 1.0);
                let want = forward_f64(&xr, m, &host.codes, &host.scales, &g).unwrap();
                let y = axis_one_with(&x, lin.codes(), lin.scales(), &g, cfg).unwrap();
                check(&format!("{name} {g} {cfg:?}"), &y, &want, m, out, dtype, gate(dtype));
            }
        }
    }
    for (scale, bias_fold) in [1e-8, 1e8].into_iter().flat_map(|s| [(s, false), (s, true)]) {
        let (x, xr) = x(20, inp, Dtype::Bfloat16, scale);
        let want = forward_f64(&xr, 20, &host.codes, &host.scales, &g).unwrap();
        let y = axis_one_with(&x, lin.codes(), lin.scales(), &g, magnitudes(bias_fold)).unwrap();
        let what = format!("{name} {g} x{scale:e} bias fold {bias_fold}");
        check(&what, &y, &want, 20, out, Dtype::Bfloat16, gate(Dtype::Bfloat16));
    }
    for dtype in [Dtype::Bfloat16, Dtype::Float16] {
        let m = 19;
        let (r, rr) = x(m, out, dtype, 0.5);
        let (x, xr) = x(m, inp, dtype, 1.0);
        let want = plus(&forward_f64(&xr, m, &host.codes, &host.scales, &g).unwrap(), &rr);
        for &cfg in residual {
            let y = axis_one_residual_with(&x, lin.codes(), lin.scales(), &g, &r, cfg).unwrap();
            check(&format!("{name} {g} plus a residual {cfg:?}"), &y, &want, m, out, dtype, gate(dtype));
        }
    }
}

/// A decode-once GEMM's fused SwiGLU against the f64 reference: gate and up of k 3/3, 2/4 and
/// 4/3 in each of `shapes` (rows, shape), bf16 and f16; then zero rows, and a non-finite
/// activation kept to its own row, in each of `poisoned`.
fn gemm_swiglu_shapes(name: &str, shapes: &[(usize, AxisOneConfig)], poisoned: &[AxisOneConfig]) {
    require_cuda();
    for (kg, ku) in [(3, 3), (2, 4), (4, 3)] {
        let (h, mlp) = mixed_mlp(kg, ku);
        for dtype in [Dtype::Bfloat16, Dtype::Float16] {
            for &(m, cfg) in shapes {
                let (x, xr) = x(m, 768, dtype, 1.0);
                let want = swiglu_f64(&xr, m, &h.0, &h.1).unwrap();
                let s = swiglu_with(&x, mlp.gate(), mlp.up(), cfg).unwrap();
                check(&format!("{name} SwiGLU gate k{kg} up k{ku} {cfg:?}"), &s, &want, m, 200, dtype, gate(dtype));
            }
        }
    }
    for &cfg in poisoned {
        zero_and_poisoned_rows(18, cfg);
    }
}

/// The decode-once GEMM (`gate_up_gemm.cu`) in a shape with the prefetch (`prefetch`) and the
/// bias fold (`bias_fold`) as given.
fn gemm(mt: u32, warps: u32, (prefetch, bias_fold): (bool, bool)) -> AxisOneConfig {
    AxisOneConfig { mt, warps, prefetch, bias_fold, ..AxisOneConfig::plain(AxisOneKernel::Gemm) }
}

/// [`gemm`] with `split_k` warps a tile, each over every `split_k`-th block of inputs.
fn gemm_split(mt: u32, warps: u32, split_k: u32, load: (bool, bool)) -> AxisOneConfig {
    AxisOneConfig { split_k, ..gemm(mt, warps, load) }
}

/// Every (prefetch, bias fold) pair of the GEMM's code-word loads and fragments.
const GEMM_LOADS: [(bool, bool); 4] = [(false, false), (true, false), (false, true), (true, true)];

/// The GEMM's shapes the plan does not take, on one layer: passes of 1, 3 and 8 tiles of 8 rows;
/// 1, 3, 4 and 8 warps (output tiles a block) over outputs that are not a multiple of a block's;
/// each with every (prefetch, bias fold) pair; one and several input blocks.
fn every_gemm_shape_of(layer: (usize, usize, u32, u32)) {
    let sweep: Vec<_> = [(1, 3), (3, 1), (8, 8), (8, 4)]
        .into_iter()
        .flat_map(|(mt, warps)| GEMM_LOADS.map(|load| gemm(mt, warps, load)))
        .collect();
    let residual = GEMM_LOADS.map(|load| gemm(3, 3, load));
    gemm_shapes_of_one_layer("GEMM", layer, &sweep, |bias_fold| gemm(3, 4, (false, bias_fold)), &residual);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn every_gemm_shape_k3_l12_matches_the_reference() {
    every_gemm_shape_of((200, 768, 3, 12));
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn every_gemm_shape_k2_l8_one_block_matches_the_reference() {
    every_gemm_shape_of((64, 256, 2, 8));
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn every_gemm_shape_k4_l16_matches_the_reference() {
    every_gemm_shape_of((136, 1280, 4, 16));
}

/// The GEMM's fused SwiGLU of equal and mixed widths at 1, 21, 64 and 70 rows in shapes the plan
/// does not take, each with every (prefetch, bias fold) pair; zero and poisoned rows with and
/// without the prefetch and the bias fold.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn every_gemm_swiglu_shape_matches_the_reference() {
    let shapes: Vec<_> = [(1, (1, 4)), (21, (3, 3)), (64, (8, 4)), (70, (8, 2))]
        .into_iter()
        .flat_map(|(m, (mt, warps))| GEMM_LOADS.map(|load| (m, gemm(mt, warps, load))))
        .collect();
    gemm_swiglu_shapes("GEMM", &shapes, &[gemm(3, 4, (true, false)), gemm(3, 4, (false, true))]);
}

/// The GEMM's shapes with its warps split over the inputs (`split_k` warps a tile), on one layer:
/// 2, 3 and 4 warps a tile over 1, 3 and 5 input blocks (so that some splits have fewer blocks
/// than others, or none), passes of 1, 2, 3 and 8 tiles, one to three tiles a block; each with
/// every (prefetch, bias fold) pair.
fn every_split_gemm_shape_of(layer: (usize, usize, u32, u32)) {
    let sweep: Vec<_> = [(1, 2, 2), (3, 6, 2), (2, 4, 4), (3, 3, 3), (8, 4, 2)]
        .into_iter()
        .flat_map(|(mt, warps, split_k)| GEMM_LOADS.map(|load| gemm_split(mt, warps, split_k, load)))
        .collect();
    let residual = GEMM_LOADS.map(|load| gemm_split(3, 4, 2, load));
    let magnitudes = |bias_fold| gemm_split(3, 4, 2, (false, bias_fold));
    gemm_shapes_of_one_layer("split GEMM", layer, &sweep, magnitudes, &residual);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn every_split_gemm_shape_k3_l12_matches_the_reference() {
    every_split_gemm_shape_of((200, 768, 3, 12));
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn every_split_gemm_shape_k2_l8_one_block_matches_the_reference() {
    every_split_gemm_shape_of((64, 256, 2, 8));
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn every_split_gemm_shape_k4_l16_matches_the_reference() {
    every_split_gemm_shape_of((136, 1280, 4, 16));
}

/// The split GEMM's fused SwiGLU of equal and mixed widths at 1, 21, 40 and 64 rows, each with
/// every (prefetch, bias fold) pair; zero and poisoned rows.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn every_split_gemm_swiglu_shape_matches_the_reference() {
    let shapes: Vec<_> = [(1, (1, 2, 2)), (21, (3, 6, 2)), (40, (5, 8, 4)), (64, (8, 4, 2))]
        .into_iter()
        .flat_map(|(m, (mt, warps, split_k))| GEMM_LOADS.map(|load| (m, gemm_split(mt, warps, split_k, load))))
        .collect();
    let poisoned = [gemm_split(3, 6, 2, (true, false)), gemm_split(2, 4, 4, (false, true))];
    gemm_swiglu_shapes("split GEMM", &shapes, &poisoned);
}

/// [`gemm`] with `row_split` warps a tile, each over its own `8 mt` rows of a pass, sharing the
/// tile's decode.
fn gemm_rows(mt: u32, warps: u32, row_split: u32, load: (bool, bool)) -> AxisOneConfig {
    AxisOneConfig { row_split, ..gemm(mt, warps, load) }
}

/// The GEMM's shapes with a row split (`row_split` warps a tile, each its own rows), on one
/// layer: 2 and 4 warps a tile, passes of 1 to 8 tiles a warp (16 to 128 rows), one to four tiles
/// a block; each with every (prefetch, bias fold) pair.
fn every_row_split_gemm_shape_of(layer: (usize, usize, u32, u32)) {
    let sweep: Vec<_> = [(1, 2, 2), (3, 6, 2), (5, 4, 2), (8, 6, 2), (2, 8, 4), (4, 12, 4), (1, 16, 4)]
        .into_iter()
        .flat_map(|(mt, warps, row_split)| GEMM_LOADS.map(|load| gemm_rows(mt, warps, row_split, load)))
        .collect();
    let residual = GEMM_LOADS.map(|load| gemm_rows(3, 4, 2, load));
    let magnitudes = |bias_fold| gemm_rows(3, 6, 2, (false, bias_fold));
    gemm_shapes_of_one_layer("row-split GEMM", layer, &sweep, magnitudes, &residual);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn every_row_split_gemm_shape_k3_l12_matches_the_reference() {
    every_row_split_gemm_shape_of((200, 768, 3, 12));
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn every_row_split_gemm_shape_k2_l8_one_block_matches_the_reference() {
    every_row_split_gemm_shape_of((64, 256, 2, 8));
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn every_row_split_gemm_shape_k4_l16_matches_the_reference() {
    every_row_split_gemm_shape_of((136, 1280, 4, 16));
}

/// The row-split GEMM's fused SwiGLU of equal and mixed widths at 1, 40, 100 and 128 rows (two and
/// four warps a tile), each with every (prefetch, bias fold) pair; zero and poisoned rows.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn every_row_split_gemm_swiglu_shape_matches_the_reference() {
    let shapes: Vec<_> = [(1, (1, 2, 2)), (40, (5, 8, 4)), (100, (4, 12, 4)), (128, (8, 6, 2))]
        .into_iter()
        .flat_map(|(m, (mt, warps, row_split))| GEMM_LOADS.map(|load| (m, gemm_rows(mt, warps, row_split, load))))
        .collect();
    let poisoned = [gemm_rows(3, 6, 2, (true, false)), gemm_rows(2, 8, 4, (false, true))];
    gemm_swiglu_shapes("row-split GEMM", &shapes, &poisoned);
}

/// The warp-specialized GEMM (`gate_up_ws.cu`) of one projection (`fused` false) or the fused
/// gate·up·SwiGLU in a shape: `mt` 8-row tiles a pass, `stages` steps in its ring, `ctas` thread
/// blocks a pass, with or without the bias fold.
fn ws(mt: u32, stages: u32, ctas: u32, bias_fold: bool, fused: bool) -> AxisOneConfig {
    let base = AxisOneConfig::plain(AxisOneKernel::Specialized);
    AxisOneConfig { mt, stages, ctas, bias_fold, warps: if fused { 12 } else { 8 }, ..base }
}

/// The warp-specialized GEMM's shapes on one layer: passes of 1, 3, 8, 9, 13 and 16 tiles of 8
/// rows (one wgmma of N 8–64 or 128, two between), 4 to 7 stages, and grids of 1, 5, 7 and 132
/// thread blocks a pass, so that tiles are whole in one block, split between two, or between
/// many (every block holding under a tile: the fold of many parts), over outputs that are not a
/// multiple of 64; with and without the bias fold; one and several input blocks.
fn every_ws_shape_of(layer: (usize, usize, u32, u32)) {
    let sweep: Vec<_> = [(1, 4, 132), (3, 5, 5), (8, 4, 1), (9, 7, 7), (13, 6, 132), (16, 4, 5)]
        .into_iter()
        .flat_map(|(mt, stages, ctas)| [false, true].map(|bias_fold| ws(mt, stages, ctas, bias_fold, false)))
        .collect();
    let residual = [ws(3, 4, 7, false, false), ws(16, 4, 132, true, false)];
    gemm_shapes_of_one_layer("ws", layer, &sweep, |bias_fold| ws(3, 4, 7, bias_fold, false), &residual);
}

#[test]
#[ignore = "needs MLX's CUDA back-end on an sm_90 GPU (wgmma)"]
fn every_ws_shape_k3_l12_matches_the_reference() {
    every_ws_shape_of((200, 768, 3, 12));
}

#[test]
#[ignore = "needs MLX's CUDA back-end on an sm_90 GPU (wgmma)"]
fn every_ws_shape_k2_l8_one_block_matches_the_reference() {
    every_ws_shape_of((64, 256, 2, 8));
}

#[test]
#[ignore = "needs MLX's CUDA back-end on an sm_90 GPU (wgmma)"]
fn every_ws_shape_k4_l16_matches_the_reference() {
    every_ws_shape_of((136, 1280, 4, 16));
}

/// The warp-specialized GEMM's fused SwiGLU of equal and mixed widths at 1–200 rows (one and two
/// passes), whole, split and many-part tiles, with and without the bias fold; zero and poisoned
/// rows.
#[test]
#[ignore = "needs MLX's CUDA back-end on an sm_90 GPU (wgmma)"]
fn every_ws_swiglu_shape_matches_the_reference() {
    let shapes: Vec<_> = [(1, (1, 132)), (21, (3, 5)), (64, (8, 132)), (70, (9, 7)), (128, (16, 132)), (200, (13, 3))]
        .into_iter()
        .flat_map(|(m, (mt, ctas))| [false, true].map(|bias_fold| (m, ws(mt, 4, ctas, bias_fold, true))))
        .collect();
    gemm_swiglu_shapes("ws", &shapes, &[ws(3, 4, 132, false, false), ws(3, 5, 5, true, false)]);
}

/// The warpgroup GEMM (`gate_up_wgmma.cu`) in a shape, with or without the bias fold.
fn wgmma(mt: u32, warps: u32, bias_fold: bool) -> AxisOneConfig {
    AxisOneConfig { mt, warps, bias_fold, ..AxisOneConfig::plain(AxisOneKernel::Wgmma) }
}

/// The warpgroup GEMM's shapes on one layer: passes of 1, 3, 5 and 8 tiles of 8 rows (wgmma's N
/// of 8 to 64), one and two warpgroups a block over outputs that are not a multiple of a
/// warpgroup's 64 rows, with and without the bias fold; one and several input blocks.
fn every_wgmma_shape_of(layer: (usize, usize, u32, u32)) {
    let sweep: Vec<_> = [(1, 4), (3, 8), (5, 4), (8, 4), (8, 8)]
        .into_iter()
        .flat_map(|(mt, warps)| [false, true].map(|bias_fold| wgmma(mt, warps, bias_fold)))
        .collect();
    let residual = [wgmma(3, 4, false), wgmma(3, 4, true)];
    gemm_shapes_of_one_layer("wgmma", layer, &sweep, |bias_fold| wgmma(3, 4, bias_fold), &residual);
}

#[test]
#[ignore = "needs MLX's CUDA back-end on an sm_90 GPU (wgmma)"]
fn every_wgmma_shape_k3_l12_matches_the_reference() {
    every_wgmma_shape_of((200, 768, 3, 12));
}

#[test]
#[ignore = "needs MLX's CUDA back-end on an sm_90 GPU (wgmma)"]
fn every_wgmma_shape_k2_l8_one_block_matches_the_reference() {
    every_wgmma_shape_of((64, 256, 2, 8));
}

#[test]
#[ignore = "needs MLX's CUDA back-end on an sm_90 GPU (wgmma)"]
fn every_wgmma_shape_k4_l16_matches_the_reference() {
    every_wgmma_shape_of((136, 1280, 4, 16));
}

/// The warpgroup GEMM's fused SwiGLU of equal and mixed widths at 1–128 rows, one and two
/// warpgroups, with and without the bias fold; zero and poisoned rows.
#[test]
#[ignore = "needs MLX's CUDA back-end on an sm_90 GPU (wgmma)"]
fn every_wgmma_swiglu_shape_matches_the_reference() {
    let shapes: Vec<_> = [(1, (1, 4)), (21, (3, 8)), (64, (8, 4)), (70, (8, 4)), (128, (8, 4))]
        .into_iter()
        .flat_map(|(m, (mt, warps))| [false, true].map(|bias_fold| (m, wgmma(mt, warps, bias_fold))))
        .collect();
    gemm_swiglu_shapes("wgmma", &shapes, &[wgmma(3, 4, false), wgmma(3, 8, true)]);
}

/// The fused gate·up·SwiGLU against the reference's two projections, and the whole MLP (fused
/// gate·up, then the down kernel) against the reference MLP: bf16 at every kind of row count,
/// f32 and f16 at a few.
fn fused_swiglu_and_mlp_match_the_reference(hidden: usize, inter: usize, k: u32, down: CodeLayout) {
    require_cuda();
    let h = synthetic_mlp(hidden, inter, k, down, 11).unwrap();
    let lin = |name: &str, l: &HostLayer| TrellisLinear::from_host(name, l).unwrap();
    let mlp = TrellisMlp::new(lin("gate", &h.0), lin("up", &h.1), lin("down", &h.2)).unwrap();
    let cases = ROWS
        .iter()
        .map(|&m| (m, Dtype::Bfloat16))
        .chain([1, 17, 40].into_iter().flat_map(|m| [(m, Dtype::Float32), (m, Dtype::Float16)]));
    for (m, dtype) in cases {
        let (x, xr) = x(m, hidden, dtype, 1.0);
        let want = swiglu_f64(&xr, m, &h.0, &h.1).unwrap();
        let s = mlp.swiglu_with(&x, ForwardPath::Cuda).unwrap();
        check(&format!("SwiGLU {hidden}->{inter} k{k}"), &s, &want, m, inter, dtype, gate(dtype));
        let want = mlp_forward_f64(&xr, m, &h.0, &h.1, &h.2).unwrap();
        let y = mlp.forward_with(&x, ForwardPath::Cuda).unwrap();
        check(&format!("MLP {hidden}->{inter} k{k}"), &y, &want, m, hidden, dtype, gate(dtype));
        // The residual stream after the MLP: the add in the down kernel's fold (the dense path's
        // add from 129 rows), by the CUDA path and by Auto.
        let (r, rr) = residual(m, hidden, dtype, largest_abs(&want) / 2.0);
        let want = plus(&want, &rr);
        for path in [ForwardPath::Cuda, ForwardPath::Auto] {
            let y = mlp.forward_residual_with(&x, &r, path).unwrap();
            check(
                &format!("MLP {hidden}->{inter} k{k} plus a residual ({path})"),
                &y,
                &want,
                m,
                hidden,
                dtype,
                gate(dtype),
            );
        }
    }
    // Activations of 1e-8 and 1e8 (bf16 and f32: the SwiGLU of f16 ones of 1e-8, about 1e-16,
    // is below f16's range): up to 8 rows the down kernel's blocks find the powers of two over
    // their splits (the fused launch zeroes its counters; no pre-pass), from 9 the pre-pass.
    for (m, dtype) in [(3, Dtype::Bfloat16), (1, Dtype::Float32), (8, Dtype::Bfloat16), (12, Dtype::Bfloat16)] {
        for scale in [1e-8f32, 1e8] {
            let (x, xr) = x(m, hidden, dtype, scale);
            let want = mlp_forward_f64(&xr, m, &h.0, &h.1, &h.2).unwrap();
            let y = mlp.forward(&x).unwrap();
            let what = format!("MLP {hidden}->{inter} k{k}, activations x {scale:e}");
            check(&what, &y, &want, m, hidden, dtype, gate(dtype));
        }
    }
    // Other fused shapes at a few rows.
    for cfg in [
        AxisOneConfig {
            mt: 2,
            rt: 2,
            warps: 3,
            bias_fold: true,
            pack_fma: false,
            kernel: AxisOneKernel::Fragment,
            prefetch: false,
            split_k: 1,
            row_split: 1,
            stage: true,
            ..AxisOneConfig::plain(AxisOneKernel::Fragment)
        },
        axis_one_plan(40, Dtype::Bfloat16, true, inter),
    ] {
        for m in [1, 13, 40] {
            let (x, xr) = x(m, hidden, Dtype::Bfloat16, 1.0);
            let want = swiglu_f64(&xr, m, &h.0, &h.1).unwrap();
            let s = swiglu_with(&x, mlp.gate(), mlp.up(), cfg).unwrap();
            check(&format!("SwiGLU {cfg:?}"), &s, &want, m, inter, Dtype::Bfloat16, gate(Dtype::Bfloat16));
        }
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn fused_mlp_k3_interleaved_matches_the_reference() {
    fused_swiglu_and_mlp_match_the_reference(512, 1024, 3, CodeLayout::K3Interleaved);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn fused_mlp_k2_matches_the_reference() {
    fused_swiglu_and_mlp_match_the_reference(768, 520, 2, CodeLayout::RowMajor);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn fused_mlp_k4_matches_the_reference() {
    fused_swiglu_and_mlp_match_the_reference(256, 1024, 4, CodeLayout::RowMajor);
}

/// Qwen3-14B's intermediate width: a grid of 4-warp GEMM blocks that fills an H200, as the
/// plan's choices for large layers see it.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn fused_mlp_of_qwen_width_matches_the_reference() {
    fused_swiglu_and_mlp_match_the_reference(512, 17408, 3, CodeLayout::K3Interleaved);
}

/// Row counts of the mixed-width tests: every planned pass shape (1..8 tiles of 8 rows, one
/// and two passes), the IMAD pack (1), the f16 hand-over (17), the dense path's start (65), and
/// counts that are not multiples of 8 or 16.
const MIXED_ROWS: [usize; 22] = [1, 2, 3, 5, 7, 8, 9, 13, 16, 17, 23, 24, 31, 33, 40, 47, 57, 64, 65, 72, 100, 127];

/// A gate of `kg` bits and an up of `ku` bits over the same 200 output rows (not a multiple of
/// 16) and 768 inputs (3 blocks, not a multiple of the 4 warps), L 12, and a down projection.
fn mixed_mlp(kg: u32, ku: u32) -> ((HostLayer, HostLayer, HostLayer), TrellisMlp) {
    let (hidden, inter) = (768, 200);
    let scale = (1.0 / (hidden as f64).sqrt()) as f32;
    let gate = synthetic_layer(inter, hidden, kg, 12, 1, CodeLayout::RowMajor, scale, 90 + kg as u64).unwrap();
    let up = synthetic_layer(inter, hidden, ku, 12, 1, CodeLayout::RowMajor, scale, 95 + ku as u64).unwrap();
    let down = synthetic_layer(inter, hidden, 3, 12, 0, CodeLayout::RowMajor, 0.07, 99).unwrap();
    let lin = |name: &str, l: &HostLayer| TrellisLinear::from_host(name, l).unwrap();
    let mlp = TrellisMlp::new(lin("gate", &gate), lin("up", &up), lin("down", &down)).unwrap();
    ((gate, up, down), mlp)
}

/// Gate and up of bits `kg` and `ku` (artifacts that allocate bits per tensor): the fused kernel
/// (one launch, `ForwardPath::Cuda`) at every kind of row count and dtype against the reference,
/// the planned fused shape forced where the plan takes the dense path (16-bit, 65+ rows), and
/// the whole MLP (the fed fragment kernel at 1 row, the fed GEMM at 3 and 5, the GEMM and the
/// down pre-pass at 17, the dense path at 65).
fn mixed_widths_match_the_reference(kg: u32, ku: u32) {
    require_cuda();
    let (h, mlp) = mixed_mlp(kg, ku);
    for &m in &MIXED_ROWS {
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            let (x, xr) = x(m, 768, dtype, 1.0);
            let want = swiglu_f64(&xr, m, &h.0, &h.1).unwrap();
            let what = format!("SwiGLU gate k{kg} up k{ku}");
            let s = mlp.swiglu_with(&x, ForwardPath::Cuda).unwrap();
            check(&what, &s, &want, m, 200, dtype, gate(dtype));
            let cfg = axis_one_plan(m, dtype, true, 200);
            let s = swiglu_with(&x, mlp.gate(), mlp.up(), cfg).unwrap();
            check(&format!("{what} {cfg:?}"), &s, &want, m, 200, dtype, gate(dtype));
            if [1, 3, 5, 17, 65].contains(&m) {
                let want = mlp_forward_f64(&xr, m, &h.0, &h.1, &h.2).unwrap();
                let y = mlp.forward_with(&x, ForwardPath::Cuda).unwrap();
                check(&format!("MLP gate k{kg} up k{ku}"), &y, &want, m, 768, dtype, gate(dtype));
                let y = mlp.forward(&x).unwrap();
                check(&format!("MLP (Auto) gate k{kg} up k{ku}"), &y, &want, m, 768, dtype, gate(dtype));
            }
        }
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn mixed_widths_k2_k3_match_the_reference() {
    mixed_widths_match_the_reference(2, 3);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn mixed_widths_k3_k2_match_the_reference() {
    mixed_widths_match_the_reference(3, 2);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn mixed_widths_k2_k4_match_the_reference() {
    mixed_widths_match_the_reference(2, 4);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn mixed_widths_k4_k2_match_the_reference() {
    mixed_widths_match_the_reference(4, 2);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn mixed_widths_k3_k4_match_the_reference() {
    mixed_widths_match_the_reference(3, 4);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn mixed_widths_k4_k3_match_the_reference() {
    mixed_widths_match_the_reference(4, 3);
}

/// The same-width pairs through the same sweep (the kernel's KU = K instances).
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn equal_widths_through_the_mixed_sweep_match_the_reference() {
    for k in [2, 3, 4] {
        mixed_widths_match_the_reference(k, k);
    }
}

/// Four fused calls of one mixed-width MLP evaluated together (MLX may run independent kernels
/// of one evaluation concurrently) give the bits of the same calls run one at a time.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn concurrent_mixed_width_calls_equal_sequential_calls() {
    require_cuda();
    let (_, mlp) = mixed_mlp(2, 4);
    for m in [1, 9, 40, 100] {
        for dtype in [Dtype::Bfloat16, Dtype::Float32] {
            let xs: Vec<MlxArray> = (0..4)
                .map(|i| {
                    x(m, 768, dtype, 1.0).0.multiply(&MlxArray::full(&[1], 1.0 + i as f64, dtype).unwrap()).unwrap()
                })
                .collect();
            let cfg = axis_one_plan(m, dtype, true, 200);
            let call = |x: &MlxArray| swiglu_with(x, mlp.gate(), mlp.up(), cfg).unwrap();
            let alone: Vec<Vec<f64>> = xs
                .iter()
                .map(|x| {
                    let y = call(x);
                    y.eval().unwrap();
                    to_f64(&y)
                })
                .collect();
            let together: Vec<MlxArray> = xs.iter().map(call).collect();
            mlx_trellis::eval_all(&together.iter().collect::<Vec<_>>()).unwrap();
            for (i, (y, want)) in together.iter().zip(&alone).enumerate() {
                assert_eq!(&to_f64(y), want, "M {m} {dtype}: call {i} in flight with three others");
            }
        }
    }
}

/// Activations at the edges of f16's range (the kernel multiplies them as f16): |x| near 6e4,
/// and values near f16's smallest normal numbers.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn activations_at_the_edges_of_the_f16_range() {
    require_cuda();
    let (host, lin) = up_layer(64, 512, 3, 12);
    for (scale, dtype) in
        [(1.2e4f32, Dtype::Bfloat16), (1.2e4, Dtype::Float32), (2e-4, Dtype::Bfloat16), (2e-4, Dtype::Float16)]
    {
        for m in [1, 9, 40] {
            let (x, xr) = x(m, 512, dtype, scale);
            let want = forward_f64(&xr, m, &host.codes, &host.scales, &host.geometry).unwrap();
            let y = lin.forward_with(&x, ForwardPath::Cuda).unwrap();
            check(&format!("x * {scale:e}"), &y, &want, m, 64, dtype, gate(dtype));
        }
    }
}

#[test]
fn bad_mlp_inputs_give_typed_errors() {
    // Off CUDA these reach the kernels' checks first (no kernel is created for a refused call).
    let (_, lin) = up_layer(64, 512, 2, 12);
    let wrong = MlxArray::zeros(&[2, 256], Dtype::Bfloat16).unwrap();
    let err = lin.forward_with(&wrong, ForwardPath::Cuda).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let (_, other) = up_layer(64, 768, 2, 12);
    let x = MlxArray::zeros(&[2, 512], Dtype::Bfloat16).unwrap();
    let err = mlx_trellis::trellis::cuda::gate_up::swiglu(&x, &lin, &other).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unserved, "{err}");
    // Gate and up of different L have no fused kernel; of different k they do.
    let (_, l16) = up_layer(64, 512, 2, 16);
    let err = mlx_trellis::trellis::cuda::gate_up::swiglu(&x, &lin, &l16).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unserved, "{err}");
    assert!(err.to_string().contains("differ in more than their bit widths"), "{err}");
    let (_, k4) = up_layer(64, 512, 4, 12);
    assert!(mlx_trellis::trellis::cuda::gate_up::fuses(lin.geometry(), k4.geometry()));
    assert!(!mlx_trellis::trellis::cuda::gate_up::fuses(lin.geometry(), l16.geometry()));
    // k 3 L 12 interleaved is an axis-0 layout: no axis-1 kernel serves it.
    let host = synthetic_layer(512, 1024, 3, 12, 0, CodeLayout::K3Interleaved, 0.02, 3).unwrap();
    let down = TrellisLinear::from_host("down", &host).unwrap();
    let x = MlxArray::zeros(&[2, 512], Dtype::Bfloat16).unwrap();
    let err =
        mlx_trellis::trellis::cuda::gate_up::linear(&x, down.codes(), down.scales(), down.geometry()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unserved, "{err}");
    // A residual of another shape or dtype than the output's.
    let (_, up) = up_layer(64, 512, 3, 12);
    for (shape, dtype) in [([2, 63], Dtype::Bfloat16), ([3, 64], Dtype::Bfloat16), ([2, 64], Dtype::Float32)] {
        let r = MlxArray::zeros(&shape, dtype).unwrap();
        let err = linear_residual(&x, up.codes(), up.scales(), up.geometry(), &r).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(err.to_string().contains("must be bfloat16 [2, 64]"), "{err}");
    }
}

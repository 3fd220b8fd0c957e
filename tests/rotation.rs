//! The coded axis (docs/format.md §10): the rotation's round trip on the host and on MLX, rotated and
//! padded layers on every CPU path against an independent f64 reference of the equivalent
//! unrotated dense weights, MLPs of mixed axes and bit widths, and the artifact keys (written,
//! read back, and refused when wrong).

mod common;

use std::path::Path;

use common::mlp_artifact::temp_dir;
use common::{f32_matmul_gate, gate, require_cuda, to_f64};
use mlx_trellis::trellis::cuda::FoldCounters;
use mlx_trellis::trellis::encoder::{code_linear, CodedLinear, EncoderConfig, RotationSpec};
use mlx_trellis::trellis::reference::{expand, rel_err};
use mlx_trellis::trellis::synthetic::{gaussian, SplitMix64};
use mlx_trellis::trellis::transform::{inverse_rotate, rotate};
use mlx_trellis::trellis::{write_artifact, Artifact, ForwardPath, Rotation, TrellisLinear, TrellisMlp};
use mlx_trellis::{eval_all, load_safetensors, save_safetensors, Dtype, ErrorKind, MlxArray};

/// The explicit `Q` `[n, n]` of a rotation, from the definition alone: `Q[i][j] = s_i ·
/// H_b[i mod b][j mod b] / √b` inside a diagonal block, 0 elsewhere, with
/// `H_b[p][q] = (−1)^popcount(p & q)`.
fn q_matrix(r: &Rotation) -> Vec<f64> {
    let (n, b) = (r.len(), r.block());
    let norm = 1.0 / (b as f64).sqrt();
    let mut q = vec![0f64; n * n];
    for i in 0..n {
        for j in (i / b) * b..(i / b + 1) * b {
            let h = if ((i % b) & (j % b)).count_ones() % 2 == 0 { 1.0 } else { -1.0 };
            q[i * n + j] = f64::from(r.signs()[i]) * h * norm;
        }
    }
    q
}

/// `a [m, n] · Q` (or `· Qᵀ`) in f64.
fn times_q(a: &[f64], m: usize, q: &[f64], n: usize, transpose: bool) -> Vec<f64> {
    let mut out = vec![0f64; m * n];
    for r in 0..m {
        for i in 0..n {
            let v = a[r * n + i];
            for j in 0..n {
                out[r * n + j] += v * if transpose { q[j * n + i] } else { q[i * n + j] };
            }
        }
    }
    out
}

/// The logical dense weight `W [out, in]` a coded layer stands for, from its codes alone:
/// the decoded stored matrix, its logical columns, times `Qᵀ` along them, transposed back for
/// axis 0.
fn dense_weight(c: &CodedLinear) -> (Vec<f64>, usize, usize) {
    let g = c.layer.geometry;
    let n = c.coded_axis.logical;
    let stored = expand(&c.layer.codes, &c.layer.scales, &g).unwrap();
    let mut logical = vec![0f64; g.rows * n];
    for (dst, src) in logical.chunks_exact_mut(n).zip(stored.chunks_exact(g.cols)) {
        dst.iter_mut().zip(&src[..n]).for_each(|(d, &s)| *d = f64::from(s));
    }
    if let Some(r) = &c.coded_axis.rotation {
        logical = times_q(&logical, g.rows, &q_matrix(r), n, true);
    }
    if g.axis == 1 {
        (logical, g.rows, n)
    } else {
        let mut w = vec![0f64; n * g.rows];
        for i in 0..g.rows {
            for o in 0..n {
                w[o * g.rows + i] = logical[i * n + o];
            }
        }
        (w, n, g.rows)
    }
}

/// `x [m, in] · Wᵀ` in f64 for `W [out, in]`.
fn dense_forward(x: &[f64], m: usize, w: &[f64], out: usize, inf: usize) -> Vec<f64> {
    let mut y = vec![0f64; m * out];
    for r in 0..m {
        for o in 0..out {
            y[r * out + o] = (0..inf).map(|i| x[r * inf + i] * w[o * inf + i]).sum();
        }
    }
    y
}

/// A seeded dense `W [out, in]` with a few large outliers, as real layers have.
fn dense(out: usize, inf: usize, seed: u64) -> Vec<f32> {
    let mut w = gaussian(out * inf, seed).unwrap();
    let mut rng = SplitMix64::new(seed ^ 0x5EED);
    for _ in 0..(out * inf / 97).max(1) {
        let i = (rng.next_u64() % (out * inf) as u64) as usize;
        w[i] *= 12.0;
    }
    w.iter_mut().for_each(|v| *v *= 0.05);
    w
}

fn coded(out: usize, inf: usize, conventional_axis: u32, k: u32, rotation: Option<u64>, seed: u64) -> CodedLinear {
    coded_in_blocks(out, inf, conventional_axis, k, rotation, seed, 256)
}

/// [`coded`] in blocks of `t` weights.
fn coded_in_blocks(
    out: usize,
    inf: usize,
    conventional_axis: u32,
    k: u32,
    rotation: Option<u64>,
    seed: u64,
    t: u32,
) -> CodedLinear {
    let cfg = EncoderConfig {
        axis: conventional_axis,
        rotation: rotation.map(|seed| RotationSpec { seed }),
        t,
        ..EncoderConfig::new(k, 12)
    };
    code_linear(&dense(out, inf, seed), out, inf, &cfg, &mut |_, _| {}).unwrap()
}

fn activations(m: usize, n: usize, seed: u64, dtype: Dtype) -> (MlxArray, Vec<f64>) {
    let x = MlxArray::from_slice(&gaussian(m * n, seed).unwrap(), &[m, n]).unwrap().astype(dtype).unwrap();
    let xr = to_f64(&x);
    (x, xr)
}

/// The CPU paths to check, with their f32 gate.
fn cpu_paths() -> Vec<(ForwardPath, f64)> {
    let mut paths =
        vec![(ForwardPath::Generic, f32_matmul_gate()), (ForwardPath::Host, 1e-5), (ForwardPath::Reference, 1e-6)];
    if cfg!(feature = "metal-sim") {
        paths.push((ForwardPath::MetalSim, gate(Dtype::Float32)));
    }
    paths
}

#[test]
fn the_host_rotation_is_the_defined_orthonormal_matrix() {
    for (n, seed) in [(576usize, 1u64), (192, 2), (1536, 3), (320, 4), (6, 5)] {
        let r = Rotation::seeded(n, seed).unwrap();
        let q = q_matrix(&r);
        // Q · Qᵀ = I.
        let qqt = times_q(&q, n, &q, n, true);
        for i in 0..n {
            for j in 0..n {
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((qqt[i * n + j] - want).abs() < 1e-12, "n {n}: (Q Qᵀ)[{i}][{j}] = {}", qqt[i * n + j]);
            }
        }
        // The library's rotation of a row is the row times the defined Q, and inverts.
        let x: Vec<f64> = gaussian(2 * n, seed).unwrap().into_iter().map(f64::from).collect();
        let mut y = x.clone();
        r.rotate_f64(&mut y).unwrap();
        let want = times_q(&x, 2, &q, n, false);
        assert!(rel_err(&y, &want).unwrap() < 1e-13, "n {n}: rotate differs from x · Q");
        r.inverse_f64(&mut y).unwrap();
        assert!(rel_err(&y, &x).unwrap() < 1e-13, "n {n}: inverse(rotate(x)) differs from x");
        let signs_ok = r.signs().iter().all(|&s| s == 1.0 || s == -1.0);
        assert!(signs_ok && r.signs().iter().any(|&s| s < 0.0) == (n > 6 || r.signs().contains(&-1.0)));
    }
    // Seeds give different signs; the same seed the same ones.
    let (a, b) = (Rotation::seeded(576, 1).unwrap(), Rotation::seeded(576, 2).unwrap());
    assert_ne!(a.signs(), b.signs());
    assert_eq!(a, Rotation::seeded(576, 1).unwrap());
}

#[test]
fn the_mlx_rotation_matches_the_host_and_inverts() {
    for (n, m) in [(576usize, 3usize), (192, 1), (1536, 17), (512, 2)] {
        let r = Rotation::seeded(n, n as u64).unwrap();
        let q = q_matrix(&r);
        let (x, xr) = activations(m, n, 9 + n as u64, Dtype::Float32);
        let y = rotate(&x, &r).unwrap();
        assert_eq!((y.shape(), y.dtype()), (vec![m, n], Dtype::Float32));
        let err = rel_err(&to_f64(&y), &times_q(&xr, m, &q, n, false)).unwrap();
        // log2(b) f32 butterflies and one scale: a few units of 2^-24.
        assert!(err < 1e-6, "n {n} M {m}: x · Q relErr {err:.2e}");
        let back = inverse_rotate(&y, &r).unwrap();
        let err = rel_err(&to_f64(&back), &xr).unwrap();
        assert!(err < 1e-6, "n {n} M {m}: round trip relErr {err:.2e}");
        let err = rel_err(&to_f64(&inverse_rotate(&x, &r).unwrap()), &times_q(&xr, m, &q, n, true)).unwrap();
        assert!(err < 1e-6, "n {n} M {m}: x · Qᵀ relErr {err:.2e}");
        // 16-bit activations come back in their dtype.
        let xb = x.astype(Dtype::Bfloat16).unwrap();
        assert_eq!(rotate(&xb, &r).unwrap().dtype(), Dtype::Bfloat16);
    }
    let r = Rotation::seeded(64, 0).unwrap();
    let wrong = MlxArray::zeros(&[2, 63], Dtype::Float32).unwrap();
    assert_eq!(rotate(&wrong, &r).unwrap_err().kind(), ErrorKind::InvalidArgument);
}

/// Rotated (and plain) layers, padded and unpadded, on both axes, at k 2/3/4, in blocks of 256
/// and shorter (576-wide axes in blocks of 192, padded ones in blocks of 64, 192 outputs in
/// blocks of 96): every CPU path against the dense reference of the weights the codes stand for.
/// The kernels serve T 256 (and Metal's factored down kernel any T on axis 0 at 1-3 rows, the
/// Metal MMA and CUDA down kernels axis 0 in blocks of a multiple of 64): a forced kernel path
/// refuses the other shorter blocks as unserved, and `Auto` runs them.
#[test]
fn rotated_and_padded_layers_match_the_dense_reference_on_every_cpu_path() {
    check_layers(&cpu_paths(), &[1, 3, 17]);
}

/// The same on the CUDA kernels (and Auto, which takes them), up to the dense path's row counts.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn rotated_and_padded_layers_match_the_dense_reference_on_cuda() {
    require_cuda();
    let paths =
        [(ForwardPath::Cuda, gate(Dtype::Float32)), (ForwardPath::Auto, gate(Dtype::Float32).max(f32_matmul_gate()))];
    check_layers(&paths, &[1, 3, 17, 80]);
}

/// Whether `path` forces a GPU kernel (which serve T 256, and some shorter blocks:
/// [`serves_shorter_blocks`]).
fn kernel_path(path: ForwardPath) -> bool {
    matches!(path, ForwardPath::MetalSim | ForwardPath::Metal | ForwardPath::Cuda)
}

/// Whether the kernel `path` forces serves a layer coded along `axis` in blocks of `t` (not 256)
/// at `m` rows: the seed's factored down kernel takes T as a template int and serves axis 0 at
/// any T (1-3 rows), and the Metal MMA kernels (4-8 rows; the wide one above, for `rows` a
/// multiple of 8) and the CUDA down kernel (and from DENSE_MIN_ROWS its expand kernel) axis 0 in
/// blocks of a multiple of 64; the other kernels T 256 only.
fn serves_shorter_blocks(path: ForwardPath, axis: u32, t: u32, rows: usize, m: usize) -> bool {
    let mma_block = axis == 0 && t.is_multiple_of(64);
    match path {
        ForwardPath::MetalSim => axis == 0 && (m <= 3 || (mma_block && (m <= 8 || rows.is_multiple_of(8)))),
        ForwardPath::Cuda => mma_block,
        _ => false,
    }
}

/// Every layer case by `paths` (with their f32 gates) at `ms` activation rows.
fn check_layers(paths: &[(ForwardPath, f64)], ms: &[usize]) {
    // (out, in, conventional axis, block length) -> the coded axis and padding the rule gives.
    let shapes = [
        (48usize, 512usize, 1u32, 256u32, 1u32, false),
        (40, 320, 1, 256, 1, true),
        (512, 48, 0, 256, 0, false),
        (320, 40, 0, 256, 0, true),
        (24, 576, 1, 192, 1, false),
        (24, 600, 1, 64, 1, true),
        (192, 40, 0, 96, 0, false),
        (576, 48, 0, 192, 0, false),
        (600, 40, 0, 64, 0, true),
    ];
    let (mut checked, mut unserved) = (0, 0);
    for (si, &(out, inf, conv, t, want_axis, padded)) in shapes.iter().enumerate() {
        for k in [2u32, 3, 4] {
            for rotation in [Some(11 + si as u64), None] {
                let c = coded_in_blocks(out, inf, conv, k, rotation, 100 * si as u64 + k as u64, t);
                let g = c.layer.geometry;
                assert_eq!(g.axis, want_axis);
                assert_eq!(g.cols != c.coded_axis.logical, padded, "{out}x{inf}");
                assert_eq!(c.coded_axis.rotation.is_some(), rotation.is_some());
                let lin = c.to_linear("layer").unwrap();
                assert_eq!((lin.in_features(), lin.out_features()), (inf, out));
                let (w, wo, wi) = dense_weight(&c);
                assert_eq!((wo, wi), (out, inf));
                // The coder's reported error is that of these weights.
                let orig = dense(out, inf, 100 * si as u64 + k as u64);
                let sq: f64 = w.iter().zip(&orig).map(|(a, &b)| (a - f64::from(b)).powi(2)).sum();
                let mse = sq / (out * inf) as f64;
                assert!((mse - c.mse).abs() <= 1e-9 * c.mse, "reported mse {} vs {mse}", c.mse);
                for &m in ms {
                    for dtype in [Dtype::Float32, Dtype::Bfloat16] {
                        let (x, xr) = activations(m, inf, (m * 7 + k as usize) as u64, dtype);
                        let want = dense_forward(&xr, m, &w, out, inf);
                        for &(path, f32_gate) in paths {
                            let y = match lin.forward_with(&x, path) {
                                Err(e)
                                    if t != 256
                                        && kernel_path(path)
                                        && !serves_shorter_blocks(path, g.axis, t, g.rows, m) =>
                                {
                                    assert_eq!(e.kind(), ErrorKind::Unserved, "{path} T {t}: {e}");
                                    unserved += 1;
                                    continue;
                                }
                                y => y.unwrap(),
                            };
                            assert_eq!((y.shape(), y.dtype()), (vec![m, out], dtype));
                            let err = rel_err(&to_f64(&y), &want).unwrap();
                            let bound = if dtype == Dtype::Float32 { f32_gate } else { gate(dtype) };
                            assert!(
                                err < bound,
                                "{path} {out}x{inf} axis {} k {k} rotation {rotation:?} {dtype} M {m}: relErr {err:.2e} (gate {bound:.0e})",
                                g.axis
                            );
                            checked += 1;
                        }
                    }
                }
                // Leading dimensions are kept; Auto takes the best path.
                let (x, xr) = activations(6, inf, 5, Dtype::Float32);
                let y = lin.forward(&x.reshape(&[2, 3, inf]).unwrap()).unwrap();
                assert_eq!(y.shape(), vec![2, 3, out]);
                let err = rel_err(&to_f64(&y), &dense_forward(&xr, 6, &w, out, inf)).unwrap();
                assert!(err < gate(Dtype::Float32).max(f32_matmul_gate()), "Auto: relErr {err:.2e}");
            }
        }
    }
    println!("{checked} path/shape/dtype/row-count cases checked, {unserved} refused as unserved");
}

#[test]
fn rotation_lowers_the_error_of_weights_with_outliers() {
    // A layer with outliers (max/std about 12): rotation spreads them over the block, so the
    // codebook's range no longer clips them.
    for k in [2u32, 4] {
        let plain = coded(64, 512, 1, k, None, 7);
        let rotated = coded(64, 512, 1, k, Some(3), 7);
        println!("k {k}: relative mse plain {:.4} rotated {:.4}", plain.relative_mse(), rotated.relative_mse());
        assert!(rotated.relative_mse() < plain.relative_mse(), "k {k}");
    }
}

/// The MLP `hidden -> inter -> hidden` from dense weights coded by the rule.
fn coded_mlp(hidden: usize, inter: usize, ks: [u32; 3], seeds: [Option<u64>; 3]) -> (TrellisMlp, [CodedLinear; 3]) {
    let g = coded(inter, hidden, 1, ks[0], seeds[0], 1);
    let u = coded(inter, hidden, 1, ks[1], seeds[1], 2);
    let d = coded(hidden, inter, 0, ks[2], seeds[2], 3);
    let mlp = TrellisMlp::new(g.to_linear("gate").unwrap(), u.to_linear("up").unwrap(), d.to_linear("down").unwrap())
        .unwrap();
    (mlp, [g, u, d])
}

fn dense_mlp(x: &[f64], m: usize, layers: &[CodedLinear; 3]) -> Vec<f64> {
    let [g, u, d] = layers.each_ref().map(dense_weight);
    let hg = dense_forward(x, m, &g.0, g.1, g.2);
    let hu = dense_forward(x, m, &u.0, u.1, u.2);
    let h: Vec<f64> = hg.iter().zip(&hu).map(|(&a, &b)| a / (1.0 + (-a).exp()) * b).collect();
    dense_forward(&h, m, &d.0, d.1, d.2)
}

#[test]
fn mlps_of_any_axes_and_bit_widths_run_on_every_cpu_path() {
    let mut paths = cpu_paths();
    paths.insert(0, (ForwardPath::Auto, f32_matmul_gate()));
    check_mlps(&paths);
}

/// MLPs whose every projection is coded in blocks of 192 (a 192-wide hidden, a 576-wide
/// intermediate: no side a whole number of 256-weight blocks), gate and up along their inputs and
/// down along its outputs, and the other way round (SmolLM2's rule: gate and up along their
/// outputs, the CUDA down kernel's pair variant): `Auto` and every CPU path against the f64
/// reference; a forced kernel path serves it within its gate or refuses it as unserved.
#[test]
fn an_mlp_in_shorter_blocks_runs_on_auto_and_every_cpu_path() {
    let mut paths = cpu_paths();
    paths.insert(0, (ForwardPath::Auto, f32_matmul_gate()));
    check_short_block_mlp(&paths);
}

/// The same on a CUDA machine, where the CUDA down kernel serves the projections coded along
/// their outputs and the generic path the others.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn an_mlp_in_shorter_blocks_runs_on_auto_on_cuda() {
    require_cuda();
    check_short_block_mlp(&[
        (ForwardPath::Cuda, gate(Dtype::Float32)),
        (ForwardPath::Auto, gate(Dtype::Float32).max(f32_matmul_gate())),
    ]);
}

fn check_short_block_mlp(paths: &[(ForwardPath, f64)]) {
    let (hidden, inter) = (192usize, 576usize);
    // (gate/up conventional axis, down's): the coded axes the rule gives, and each layer's
    // stored columns.
    for (gate_up_axis, down_axis, cols) in [(1u32, 0u32, [192usize, 192, 192]), (0, 1, [576, 576, 576])] {
        let layers = [
            coded_in_blocks(inter, hidden, gate_up_axis, 3, Some(31), 1, 192),
            coded_in_blocks(inter, hidden, gate_up_axis, 2, Some(31), 2, 192),
            coded_in_blocks(hidden, inter, down_axis, 4, Some(32), 3, 192),
        ];
        for (c, cols) in layers.iter().zip(cols) {
            assert_eq!((c.layer.geometry.t, c.layer.geometry.cols), (192, cols), "unpadded blocks of 192");
        }
        let [g, u, d] = layers.each_ref().map(|c| c.to_linear("p").unwrap());
        let mlp = TrellisMlp::new(g, u, d).unwrap();
        for m in [1usize, 3, 17] {
            let (x, xr) = activations(m, hidden, 70 + m as u64, Dtype::Float32);
            let want = dense_mlp(&xr, m, &layers);
            for &(path, f32_gate) in paths {
                let y = match mlp.forward_with(&x, path) {
                    Err(e) if kernel_path(path) => {
                        assert_eq!(e.kind(), ErrorKind::Unserved, "{path} M {m}: {e}");
                        continue;
                    }
                    y => y.unwrap(),
                };
                assert_eq!((y.shape(), y.dtype()), (vec![m, hidden], Dtype::Float32));
                let err = rel_err(&to_f64(&y), &want).unwrap();
                // Two products in a row, each within its gate.
                assert!(err < 2.0 * f32_gate, "gate/up axis {gate_up_axis} {path} M {m}: relErr {err:.2e}");
            }
        }
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn mlps_of_any_axes_and_bit_widths_run_on_cuda() {
    require_cuda();
    check_mlps(&[
        (ForwardPath::Cuda, gate(Dtype::Float32)),
        (ForwardPath::Auto, gate(Dtype::Float32).max(f32_matmul_gate())),
    ]);
}

/// A joined MLP's case: what, hidden, intermediate, the three k and rotation seeds. Gate and up
/// are coded along their outputs (axis 0), down along its inputs (axis 1), as SmolLM2's rule puts
/// them.
type JoinedCase = (&'static str, usize, usize, [u32; 3], [Option<u64>; 3]);

const JOINED_CASES: [JoinedCase; 5] = [
    ("SmolLM2's layout", 192, 512, [3, 3, 3], [Some(1), Some(2), Some(3)]),
    ("padded, blocks of 64, mixed k", 192, 320, [2, 4, 3], [Some(4), Some(5), Some(6)]),
    ("gate rotated, up and down plain", 192, 512, [4, 2, 2], [Some(7), None, None]),
    ("768 wide, mixed k", 256, 768, [3, 2, 4], [Some(8), Some(9), Some(10)]),
    ("nothing rotated, padded", 192, 320, [3, 3, 2], [None, None, None]),
];

/// On CUDA, gate and up that do not fuse are joined by one launch (the rotations turned back, the
/// SwiGLU, the down projection's input rotation and padding): that join against the f64
/// reference in every dtype, at row counts around the kernels' tiles and dense paths, on
/// SmolLM2's layout, padded mixed k and a partly rotated MLP (the next test has the others: the
/// cases are split so that each test's kernel compiles fit one run).
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn mlps_joined_on_cuda_match_the_reference_in_every_dtype() {
    check_joined(&JOINED_CASES[..3], false);
}

/// [`mlps_joined_on_cuda_match_the_reference_in_every_dtype`]'s other layouts.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn wide_and_unrotated_mlps_joined_on_cuda_match_the_reference_in_every_dtype() {
    check_joined(&JOINED_CASES[3..], false);
}

/// The join with the residual stream added in the down projection's launch
/// ([`TrellisMlp::forward_residual`]) against the f64 `residual + mlp(x)`.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn mlps_joined_on_cuda_add_the_residual_in_every_dtype() {
    check_joined(&JOINED_CASES[..2], true);
}

/// The join fed from a fill of fold counters ([`TrellisMlp::forward_residual_fed`], as the
/// model's decode runs it on CUDA): gate and up's pair launch with no pre-pass, at 1-8 rows of
/// SmolLM2's layout and an unrotated padded one, each dtype, against the f64 `residual +
/// mlp(x)`; the counters all taken. From 9 rows, and for gate and up of different k (no pair
/// launch), none are asked for and a fed call is an error before anything runs.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn mlps_joined_on_cuda_run_fed_on_one_fill() {
    require_cuda();
    // SmolLM2's layout, the unrotated padded one, and gate k 2 / up k 4 (two geometries: no
    // pair launch, so never fed).
    for case in [&JOINED_CASES[0], &JOINED_CASES[4], &JOINED_CASES[1]] {
        let (what, hidden, pairs) = (case.0, case.1, case.3[0] == case.3[1]);
        let (layers, mlp) = joined_mlp(case);
        for m in [1usize, 2, 5, 8, 9] {
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                let (x, xr) = activations(m, hidden, 260 + m as u64, dtype);
                let (r, rr) = activations(m, hidden, 360 + m as u64, dtype);
                let Some(n) = mlp.fed_counters(m, dtype) else {
                    assert!(m == 9 || !pairs, "{what} {dtype} M {m}: fed at 1-8 rows");
                    let mut counters = FoldCounters::zeroed(16).unwrap();
                    let err = mlp.forward_residual_fed(&x, &r, &mut counters).unwrap_err();
                    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
                    assert_eq!(counters.remaining(), 16);
                    continue;
                };
                assert!(m <= 8 && pairs, "{what} {dtype} M {m}");
                let mut counters = FoldCounters::zeroed(n).unwrap();
                let y = mlp.forward_residual_fed(&x, &r, &mut counters).unwrap();
                assert_eq!(counters.remaining(), 0);
                assert_eq!((y.shape(), y.dtype()), (vec![m, hidden], dtype));
                let mut want = dense_mlp(&xr, m, &layers);
                want.iter_mut().zip(&rr).for_each(|(w, r)| *w += r);
                let err = rel_err(&to_f64(&y), &want).unwrap();
                let bound = 2.0 * gate(dtype);
                assert!(err < bound, "{what} fed {dtype} M {m}: relErr {err:.2e} (gate {bound:.0e})");
                println!("{what} fed {dtype} M {m}: relErr {err:.2e}");
            }
        }
    }
}

/// The case's coded layers and its MLP.
fn joined_mlp(&(what, hidden, inter, ks, seeds): &JoinedCase) -> ([CodedLinear; 3], TrellisMlp) {
    let layers = [
        coded(inter, hidden, 0, ks[0], seeds[0], 1),
        coded(inter, hidden, 0, ks[1], seeds[1], 2),
        coded(hidden, inter, 1, ks[2], seeds[2], 3),
    ];
    assert_eq!(layers.each_ref().map(|c| c.layer.geometry.axis), [0, 0, 1], "{what}");
    let [g, u, d] = layers.each_ref().map(|c| c.to_linear("p").unwrap());
    (layers, TrellisMlp::new(g, u, d).unwrap())
}

/// Each case's MLP on CUDA (and `Auto`, at one row) against the f64 reference; with `residual`,
/// `forward_residual` against the f64 `residual + mlp(x)`.
fn check_joined(cases: &[JoinedCase], residual: bool) {
    require_cuda();
    let mut checked = 0;
    for case in cases {
        let (what, hidden) = (case.0, case.1);
        let (layers, mlp) = joined_mlp(case);
        // One row of each down plan's row bucket (1, 2-8, 17+ prescaled), and the dense paths of
        // 16-bit activations (axis 1 from 65 rows, axis 0 from 129). The compiles of each row
        // bucket's kernels bound this test's time.
        for m in [1usize, 7, 17, 65, 130] {
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                assert!(mlp.joins_on_cuda(dtype), "{what}");
                let (x, xr) = activations(m, hidden, 60 + m as u64, dtype);
                let mut want = dense_mlp(&xr, m, &layers);
                let r = residual.then(|| activations(m, hidden, 160 + m as u64, dtype));
                if let Some((_, rr)) = &r {
                    want.iter_mut().zip(rr).for_each(|(w, r)| *w += r);
                }
                // Auto takes the same join (checked at one row).
                let paths: &[ForwardPath] =
                    if m == 1 { &[ForwardPath::Cuda, ForwardPath::Auto] } else { &[ForwardPath::Cuda] };
                for &path in paths {
                    let y = match &r {
                        Some((r, _)) => mlp.forward_residual_with(&x, r, path).unwrap(),
                        None => mlp.forward_with(&x, path).unwrap(),
                    };
                    assert_eq!((y.shape(), y.dtype()), (vec![m, hidden], dtype));
                    let err = rel_err(&to_f64(&y), &want).unwrap();
                    // Two products in a row, each within its gate (f32 never takes MLX's TF32
                    // matmul; from 65 rows of 16-bit activations the down projection runs as
                    // MLX's matmul of its decoded weights, within the same gates).
                    let bound = 2.0 * gate(dtype);
                    let plus = if residual { " plus a residual" } else { "" };
                    assert!(err < bound, "{what}{plus} {path} {dtype} M {m}: relErr {err:.2e} (gate {bound:.0e})");
                    println!("{what}{plus} {path} {dtype} M {m}: relErr {err:.2e}");
                    checked += 1;
                }
            }
        }
    }
    println!("{checked} joined MLP cases checked");
}

fn check_mlps(paths: &[(ForwardPath, f64)]) {
    // SmolLM2's rule at a small width: gate and up [512, 192] go on axis 0 (along their 512
    // outputs), down [192, 512] on axis 1 (along its 512 inputs); then gate k 3 / up k 2 on axis
    // 1 sharing one rotation of x (fused: one geometry but for the bit widths, x rotated once);
    // then gate and up of one geometry and one rotation, padded (fused likewise).
    let cases = [
        ("gate/up axis 0, down axis 1", 192, 512, [3, 3, 3], [Some(1), Some(2), Some(3)], [0, 0, 1], false),
        ("gate k 3 / up k 2", 512, 256, [3, 2, 4], [Some(5), Some(5), Some(6)], [1, 1, 0], true),
        ("fused, padded", 320, 192, [2, 2, 3], [Some(8), Some(8), Some(9)], [1, 1, 0], true),
    ];
    for (what, hidden, inter, ks, seeds, axes, fuses) in cases {
        let (mlp, layers) = coded_mlp(hidden, inter, ks, seeds);
        let got_axes = layers.each_ref().map(|c| c.layer.geometry.axis);
        assert_eq!(got_axes, axes, "{what}");
        assert_eq!(mlp.fuses_gate_up(), fuses, "{what}");
        assert_eq!((mlp.hidden(), mlp.intermediate()), (hidden, inter));
        for m in [1usize, 3, 17] {
            let (x, xr) = activations(m, hidden, 40 + m as u64, Dtype::Float32);
            let want = dense_mlp(&xr, m, &layers);
            let (r, rr) = activations(m, hidden, 90 + m as u64, Dtype::Float32);
            let want_plus: Vec<f64> = want.iter().zip(&rr).map(|(a, b)| a + b).collect();
            for &(path, f32_gate) in paths {
                let y = mlp.forward_with(&x, path).unwrap();
                assert_eq!(y.shape(), vec![m, hidden]);
                let err = rel_err(&to_f64(&y), &want).unwrap();
                // Two products in a row, each within its gate.
                assert!(err < 2.0 * f32_gate, "{what} {path} M {m}: relErr {err:.2e}");
                // The residual stream after the MLP (on CUDA's join, added in the down launch).
                let y = mlp.forward_residual_with(&x, &r, path).unwrap();
                assert_eq!((y.shape(), y.dtype()), (vec![m, hidden], Dtype::Float32));
                let err = rel_err(&to_f64(&y), &want_plus).unwrap();
                assert!(err < 2.0 * f32_gate, "{what} {path} M {m} plus a residual: relErr {err:.2e}");
            }
            // A residual of another shape is refused, naming both shapes.
            let err = mlp.forward_residual(&x, &r.reshape(&[m * hidden]).unwrap()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
            assert!(err.to_string().contains(&format!("[{m}, {hidden}]")), "{err}");
        }
    }
}

fn write(dir: &Path, layers: &[(&str, &TrellisLinear)]) {
    write_artifact(dir, layers, &[]).unwrap();
}

#[test]
fn rotated_artifacts_round_trip_and_plain_ones_are_unchanged() {
    let dir = temp_dir("rotation-artifact");
    let a = coded(40, 320, 1, 3, Some(21), 1).to_linear("a").unwrap();
    let b = coded(320, 40, 0, 2, Some(22), 2).to_linear("b").unwrap();
    let c = coded(48, 512, 1, 4, None, 3).to_linear("c").unwrap();
    let d = coded_in_blocks(24, 576, 1, 3, Some(23), 4, 192).to_linear("d").unwrap();
    write(&dir, &[("m.a", &a), ("m.b", &b), ("m.c", &c), ("m.d", &d)]);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let ta = &config["quantization"]["m.a"]["trellis"];
    assert_eq!(ta["rotation"], serde_json::json!({"kind": "hadamard", "block": 64, "seed": 21}));
    assert_eq!(ta["logical_cols"], serde_json::json!(320));
    // A plain module's entry has no new keys and no signs tensor.
    // Blocks of 192 are the module's group size.
    assert_eq!(config["quantization"]["m.d"]["group_size"], serde_json::json!(192));
    assert_eq!(config["quantization"]["m.a"]["group_size"], serde_json::json!(256));
    let tc = config["quantization"]["m.c"]["trellis"].as_object().unwrap();
    assert_eq!(tc.keys().collect::<Vec<_>>(), ["L", "axis", "code"]);
    let st = load_safetensors(dir.join("model.safetensors")).unwrap();
    assert!(st.tensors.contains_key("m.a.rotation_signs") && !st.tensors.contains_key("m.c.rotation_signs"));

    let art = Artifact::open(&dir).unwrap();
    let x = MlxArray::from_slice(&gaussian(3 * 320, 4).unwrap(), &[3, 320]).unwrap();
    let x40 = MlxArray::from_slice(&gaussian(3 * 40, 5).unwrap(), &[3, 40]).unwrap();
    let x512 = MlxArray::from_slice(&gaussian(3 * 512, 6).unwrap(), &[3, 512]).unwrap();
    let x576 = MlxArray::from_slice(&gaussian(3 * 576, 7).unwrap(), &[3, 576]).unwrap();
    for (name, orig, x) in [("m.a", &a, &x), ("m.b", &b, &x40), ("m.c", &c, &x512), ("m.d", &d, &x576)] {
        let loaded = art.module(name).unwrap();
        assert_eq!(loaded.coded_axis(), orig.coded_axis(), "{name}");
        assert_eq!((loaded.in_features(), loaded.out_features()), (orig.in_features(), orig.out_features()));
        let (p, q) = (
            orig.forward_with(x, ForwardPath::Generic).unwrap(),
            loaded.forward_with(x, ForwardPath::Generic).unwrap(),
        );
        assert_eq!(to_f64(&p), to_f64(&q), "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Rewrites `dir`'s config with `edit` applied to module `m.a`'s `trellis` object.
fn edit_trellis(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let t = config["quantization"]["m.a"]["trellis"].as_object_mut().unwrap();
    edit(t);
    let edited = serde_json::Value::Object(t.clone());
    config["quantization_config"]["m.a"]["trellis"] = edited;
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
}

/// Rewrites `dir`'s safetensors with the signs of `m.a` replaced by `signs` (or removed).
fn edit_signs(dir: &Path, signs: Option<MlxArray>, extra: Option<(&str, MlxArray)>) {
    let path = dir.join("model.safetensors");
    let mut st = load_safetensors(&path).unwrap();
    st.tensors.remove("m.a.rotation_signs");
    if let Some(s) = signs {
        st.tensors.insert("m.a.rotation_signs".into(), s);
    }
    if let Some((n, t)) = extra {
        st.tensors.insert(n.into(), t);
    }
    save_safetensors(&path, st.tensors.iter().map(|(n, t)| (n.as_str(), t)), &st.metadata).unwrap();
}

#[test]
fn bad_rotation_keys_and_tensors_are_refused() {
    fn signs(v: Vec<f32>, dtype: Dtype) -> MlxArray {
        MlxArray::from_slice(&v, &[v.len()]).unwrap().astype(dtype).unwrap()
    }
    use serde_json::json;
    let a = coded(40, 320, 1, 3, Some(21), 1).to_linear("a").unwrap();
    let plain = coded(48, 512, 1, 2, None, 2).to_linear("p").unwrap();
    let good: Vec<f32> = a.rotation().unwrap().signs().to_vec();
    let mut half = good.clone();
    half[7] = 0.5;
    type Case = (&'static str, Box<dyn Fn(&Path)>, &'static str);
    let cases: Vec<Case> = vec![
        (
            "unknown kind",
            Box::new(|d| {
                edit_trellis(d, |t| {
                    t["rotation"]["kind"] = json!("givens");
                })
            }),
            "only \"hadamard\"",
        ),
        (
            "block 3",
            Box::new(|d| {
                edit_trellis(d, |t| {
                    t["rotation"]["block"] = json!(3);
                })
            }),
            "power of two",
        ),
        (
            "block 512",
            Box::new(|d| {
                edit_trellis(d, |t| {
                    t["rotation"]["block"] = json!(512);
                })
            }),
            "power of two",
        ),
        (
            "block 128 does not divide 320",
            Box::new(|d| {
                edit_trellis(d, |t| {
                    t["rotation"]["block"] = json!(128);
                })
            }),
            "does not divide",
        ),
        (
            "negative seed",
            Box::new(|d| {
                edit_trellis(d, |t| {
                    t["rotation"]["seed"] = json!(-1);
                })
            }),
            "seed",
        ),
        (
            "unknown key",
            Box::new(|d| {
                edit_trellis(d, |t| {
                    t["rotation"]["order"] = json!("walsh");
                })
            }),
            "\"order\" is not known",
        ),
        (
            "not an object",
            Box::new(|d| {
                edit_trellis(d, |t| {
                    t["rotation"] = json!(true);
                })
            }),
            "expected an object",
        ),
        (
            "logical_cols too small",
            Box::new(|d| {
                edit_trellis(d, |t| {
                    t["logical_cols"] = json!(200);
                })
            }),
            "logical_cols",
        ),
        (
            "logical_cols too large",
            Box::new(|d| {
                edit_trellis(d, |t| {
                    t["logical_cols"] = json!(600);
                })
            }),
            "logical_cols",
        ),
        (
            "logical_cols a string",
            Box::new(|d| {
                edit_trellis(d, |t| {
                    t["logical_cols"] = json!("320");
                })
            }),
            "logical_cols",
        ),
        ("signs missing", Box::new(|d| edit_signs(d, None, None)), "rotation_signs"),
        (
            "a sign of 0.5",
            Box::new(move |d| edit_signs(d, Some(signs(half.clone(), Dtype::Float32)), None)),
            "sign 7 is 0.5",
        ),
        (
            "NaN sign",
            Box::new(|d| edit_signs(d, Some(signs(vec![f32::NAN; 320], Dtype::Float16)), None)),
            "sign 0 is NaN",
        ),
        (
            "signs too short",
            Box::new(|d| edit_signs(d, Some(signs(vec![1.0; 256], Dtype::Float16)), None)),
            "expected [320]",
        ),
        (
            "signs as uint32",
            Box::new(|d| edit_signs(d, Some(MlxArray::from_slice(&[1u32; 320], &[320]).unwrap()), None)),
            "expected float16",
        ),
        (
            "stray signs on a plain module",
            Box::new(|d| {
                edit_signs(
                    d,
                    Some(signs(vec![1.0; 320], Dtype::Float16)),
                    Some(("m.p.rotation_signs", signs(vec![1.0; 512], Dtype::Float16))),
                )
            }),
            "no \"rotation\" key",
        ),
    ];
    let dir = temp_dir("rotation-bad");
    for (what, corrupt, want) in &cases {
        write(&dir, &[("m.a", &a), ("m.p", &plain)]);
        // int8 signs are accepted as well as float16.
        if *what == "signs missing" {
            edit_signs(&dir, Some(signs(good.clone(), Dtype::Int8)), None);
            let art = Artifact::open(&dir).unwrap();
            assert_eq!(art.module("m.a").unwrap().coded_axis(), a.coded_axis());
        }
        corrupt(&dir);
        let art = Artifact::open(&dir).unwrap();
        let module = if what.starts_with("stray") { "m.p" } else { "m.a" };
        let e = art.module(module).expect_err(what);
        assert_eq!(e.kind(), ErrorKind::Artifact, "{what}: {e}");
        assert!(e.to_string().contains(want), "{what}: expected {want:?} in {e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
    println!("{} refused artifacts checked", cases.len());
}

/// A block's attention projections as SmolLM2's 3-bit model codes them (along their rotated
/// outputs in blocks of 192): on CUDA `forward_shared_input` runs k and v as one launch of the
/// pair variant and each layer's rotation turns back in the kernel's fold; every output has the
/// bits of its layer's own `forward`, within the gate of the dense reference; `forward_residual`
/// (the output projection's add in the same launch) against the f64 sum. At row counts of each
/// band of the plan and the dense path's first.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn attention_projections_run_paired_and_rotate_in_the_fold_on_cuda() {
    require_cuda();
    check_attention_projections(&[1, 3, 9, 17, 80, 129]);
}

/// The same calls on this machine's back-end (on the CPU: the host path's shared evaluation of
/// the input, and the residual added after the product).
#[test]
fn attention_projections_share_their_input_on_the_default_back_end() {
    check_attention_projections(&[1, 3, 17]);
}

/// A block's q, k·v and o projections (coded along their rotated outputs in blocks of 192, as
/// SmolLM2's) on one fill of fold counters at 1-8 rows, as `Attention` runs them on CUDA: q alone,
/// k and v as one pair launch, o with the residual added in its fold, all queued before one
/// evaluation (three launches counting into one fill). Each output against the dense f64
/// reference within the dtype's gate; the pair's outputs with the bits of each layer's fed call
/// alone; the counters all taken. At 9 rows the plan runs pre-passes: no fed call, and one asked
/// for is an error before anything runs.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn attention_projections_run_fed_on_one_fill_on_cuda() {
    require_cuda();
    let coded = [(576, 3, 51), (192, 3, 52), (192, 3, 53), (576, 3, 54)]
        .map(|(out, k, seed)| coded_in_blocks(out, 576, 0, k, Some(seed), seed, 192));
    let lins: Vec<TrellisLinear> = coded.iter().map(|c| c.to_linear("proj").unwrap()).collect();
    let [q, k, v, o] = [&lins[0], &lins[1], &lins[2], &lins[3]];
    let dense: Vec<Vec<f64>> = coded.iter().map(|c| dense_weight(c).0).collect();
    for m in 1..=9 {
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            let bound = if dtype == Dtype::Float32 { gate(dtype).max(f32_matmul_gate()) } else { gate(dtype) };
            let (x, xr) = activations(m, 576, 1900 + m as u64, dtype);
            let x3 = x.reshape(&[1, m, 576]).unwrap();
            let (qkv, alone) =
                (TrellisLinear::fed_counters(&[q, k, v], m, dtype), TrellisLinear::fed_counters(&[o], m, dtype));
            if m == 9 {
                assert_eq!((qkv, alone), (None, None), "{dtype}");
                let mut counters = FoldCounters::zeroed(64).unwrap();
                let err = TrellisLinear::forward_shared_input_fed(&[q, k, v], &x3, &mut counters).unwrap_err();
                assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
                assert_eq!(counters.remaining(), 64, "nothing taken");
                continue;
            }
            let (qkv, alone) = (qkv.expect("q, k·v fed"), alone.expect("o fed"));
            let mut counters = FoldCounters::zeroed(qkv + alone).unwrap();
            let ys = TrellisLinear::forward_shared_input_fed(&[q, k, v], &x3, &mut counters).unwrap();
            let (r, rr) = activations(m, 576, 2900 + m as u64, dtype);
            let r3 = r.reshape(&[1, m, 576]).unwrap();
            let yo = o.forward_residual_fed(&x3, &r3, &mut counters).unwrap();
            assert_eq!(counters.remaining(), 0, "M {m} {dtype}");
            eval_all(&[&ys[0], &ys[1], &ys[2], &yo]).unwrap();
            for (i, y) in ys.iter().chain([&yo]).enumerate() {
                let out = lins[i].out_features();
                assert_eq!((y.shape(), y.dtype()), (vec![1, m, out], dtype), "layer {i} M {m}");
                let mut want = dense_forward(&xr, m, &dense[i], out, 576);
                if i == 3 {
                    want.iter_mut().zip(&rr).for_each(|(a, b)| *a += b);
                }
                let err = rel_err(&to_f64(y), &want).unwrap();
                assert!(err < bound, "layer {i} M {m} {dtype}: relErr {err:.2e}");
            }
            // k and v of the pair launch: each its own fed call's bits.
            for (i, lin) in [(1, k), (2, v)] {
                let n = TrellisLinear::fed_counters(&[lin], m, dtype).unwrap();
                let mut own = FoldCounters::zeroed(n).unwrap();
                let y = TrellisLinear::forward_shared_input_fed(&[lin], &x3, &mut own).unwrap();
                assert!(to_f64(&y[0]) == to_f64(&ys[i]), "layer {i} M {m} {dtype}: the pair's bits differ");
            }
        }
    }
}

/// Off CUDA nothing runs fed: no counters are asked for, and a fed call (of layers or of a
/// joined MLP) is an error.
#[test]
fn fed_calls_run_only_on_cuda() {
    if mlx_trellis::backend() == mlx_trellis::Backend::Cuda {
        return;
    }
    let coded = coded_in_blocks(192, 576, 0, 3, Some(61), 61, 192);
    let lin = coded.to_linear("proj").unwrap();
    assert_eq!(TrellisLinear::fed_counters(&[&lin], 1, Dtype::Float32), None);
    let (x, _) = activations(1, 576, 5, Dtype::Float32);
    let mut counters = FoldCounters::zeroed(8).unwrap();
    let err = TrellisLinear::forward_shared_input_fed(&[&lin], &x, &mut counters).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("CUDA back-end"), "{err}");
    assert_eq!(counters.remaining(), 8);
    let (_, mlp) = joined_mlp(&JOINED_CASES[0]);
    assert_eq!(mlp.fed_counters(1, Dtype::Float32), None);
    let (x, _) = activations(1, 192, 6, Dtype::Float32);
    let err = mlp.forward_residual_fed(&x, &x, &mut counters).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert_eq!(counters.remaining(), 8);
}

/// [`attention_projections_run_paired_and_rotate_in_the_fold_on_cuda`] at `ms` rows.
fn check_attention_projections(ms: &[usize]) {
    let coded = [(576, 3, 41), (192, 2, 42), (192, 2, 43)]
        .map(|(out, k, seed)| coded_in_blocks(out, 576, 0, k, Some(seed), seed, 192));
    let lins: Vec<TrellisLinear> = coded.iter().map(|c| c.to_linear("proj").unwrap()).collect();
    let refs: Vec<&TrellisLinear> = lins.iter().collect();
    for &m in ms {
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            let (x, xr) = activations(m, 576, 900 + m as u64, dtype);
            let x3 = x.reshape(&[1, m, 576]).unwrap();
            let ys = TrellisLinear::forward_shared_input(&refs, &x3).unwrap();
            assert_eq!(ys.len(), 3);
            for (i, ((y, lin), c)) in ys.iter().zip(&lins).zip(&coded).enumerate() {
                let out = lin.out_features();
                assert_eq!((y.shape(), y.dtype()), (vec![1, m, out], dtype), "layer {i} M {m}");
                let alone = lin.forward(&x3).unwrap();
                assert!(to_f64(y) == to_f64(&alone), "layer {i} M {m} {dtype}: differs from its own forward");
                let (w, _, _) = dense_weight(c);
                let want = dense_forward(&xr, m, &w, out, 576);
                let err = rel_err(&to_f64(y), &want).unwrap();
                let bound = if dtype == Dtype::Float32 { gate(dtype).max(f32_matmul_gate()) } else { gate(dtype) };
                assert!(err < bound, "layer {i} M {m} {dtype}: relErr {err:.2e}");
                if i == 0 {
                    let (r, rr) = activations(m, out, 77 + m as u64, dtype);
                    let y = lin.forward_residual(&x, &r).unwrap();
                    assert_eq!((y.shape(), y.dtype()), (vec![m, out], dtype));
                    let want: Vec<f64> = want.iter().zip(&rr).map(|(a, b)| a + b).collect();
                    let err = rel_err(&to_f64(&y), &want).unwrap();
                    assert!(err < bound, "forward_residual M {m} {dtype}: relErr {err:.2e}");
                }
            }
        }
    }
}

//! The Hessian-weighted encoder (LDLQ / BlockLDLQ) and the bit allocator: `H = I` and diagonal
//! `H` give the plain codes bit for bit; the targets are the LDLQ recursion of an independently
//! factored `H` and every block is the plain Viterbi code of its target; the proxy error drops on
//! an ill-conditioned `H`; unusable `H` and blow-up fall back with warnings; the codes decode
//! through the reference decoder to the reported reconstruction; the allocator keeps its budget,
//! is deterministic and refuses a budget below its minimum; a rotation is refused by name; a
//! coded axis that is not whole blocks is padded (with `H = I` exactly as the plain encoder pads
//! it, and otherwise the same recursion over the logical features with the padding free in the
//! search); problems (and whole projections) coded in lockstep get, bit for bit, what each gets
//! coded alone.

use mlx_trellis::trellis::encoder::allocate::{
    allocate_bits, kl_weighted_candidates, stored_bits, tie_tensors, BitCandidate, TensorOptions,
};
use mlx_trellis::trellis::encoder::{
    block_path, block_path_weighted, encode_linear, encode_linear_ldlq, encode_linear_ldlq_lockstep,
    encode_linear_ldlq_with_targets, encode_padded, lut_rms, proxy_error, BlockSearch, EncoderBackend, EncoderConfig,
    LdlqConfig, LdlqEncoded, LdlqOutcome, LdlqProblem, RotationSpec,
};
use mlx_trellis::trellis::reference::{block_state, block_words, expand};
use mlx_trellis::trellis::synthetic::{gaussian, SplitMix64};
use mlx_trellis::trellis::CodeLayout;
mod common;
use common::require_cuda;

const T: usize = 256;

fn config(k: u32, axis: u32) -> EncoderConfig {
    EncoderConfig { axis, backend: EncoderBackend::Cpu, ..EncoderConfig::new(k, 12) }
}

/// The reference decoder's weights equal the reported reconstruction bit for bit.
fn assert_decodes(result: &LdlqEncoded, what: &str) {
    let enc = &result.encoded;
    let decoded = expand(&enc.layer.codes, &enc.layer.scales, &enc.layer.geometry).unwrap();
    assert_eq!(decoded.len(), enc.reconstruction.len(), "{what}");
    let same = decoded.iter().zip(&enc.reconstruction).all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "{what}: reference decode differs from the reported reconstruction");
}

fn identity(n: usize, value: f64) -> Vec<f64> {
    let mut h = vec![0f64; n * n];
    (0..n).for_each(|i| h[i * n + i] = value);
    h
}

/// The stored matrix of `w` `[out, in]` coded along `axis` (`W` itself on axis 1, `Wᵀ` on axis
/// 0), its rows and its logical columns.
fn stored_of(w: &[f32], out: usize, inp: usize, axis: u32) -> (Vec<f32>, usize, usize) {
    if axis == 1 {
        (w.to_vec(), out, inp)
    } else {
        ((0..inp).flat_map(|i| (0..out).map(move |o| w[o * inp + i])).collect(), inp, out)
    }
}

/// `H = Xᵀ X` of `2n` samples of an AR(1) process along the features (neighbouring inputs
/// correlated 0.95) plus four directions of 30x the standard deviation: far from the identity,
/// condition number in the thousands.
fn ill_conditioned(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix64::new(seed);
    let spikes: Vec<Vec<f64>> =
        (0..4).map(|_| (0..n).map(|_| rng.next_gaussian() / (n as f64).sqrt()).collect()).collect();
    let mut h = vec![0f64; n * n];
    let mut x = vec![0f64; n];
    for _ in 0..2 * n {
        let mut prev = 0.0;
        for v in x.iter_mut() {
            prev = 0.95 * prev + (1.0f64 - 0.95 * 0.95).sqrt() * rng.next_gaussian();
            *v = prev;
        }
        for s in &spikes {
            let a = 30.0 * rng.next_gaussian();
            x.iter_mut().zip(s).for_each(|(v, d)| *v += a * d);
        }
        for a in 0..n {
            for b in a..n {
                h[a * n + b] += x[a] * x[b];
            }
        }
    }
    for a in 0..n {
        for b in 0..a {
            h[a * n + b] = h[b * n + a];
        }
    }
    h
}

#[test]
fn identity_and_diagonal_h_give_the_plain_codes_bit_for_bit() {
    // Axis 1: W [8, 768] (three input blocks per row); axis 0: W [512, 12] (stored [12, 512]),
    // row-major and, at k 3, the 3-bit interleaved layout.
    for (axis, out, inp) in [(1u32, 8usize, 768usize), (0, 512, 12)] {
        let w = gaussian(out * inp, 100 + axis as u64).unwrap();
        let mut rng = SplitMix64::new(7);
        let diagonal: Vec<f64> = (0..inp).map(|_| 0.1 + rng.next_f64() * 10.0).collect();
        let mut diag_h = identity(inp, 0.0);
        (0..inp).for_each(|i| diag_h[i * inp + i] = diagonal[i]);
        for k in [2u32, 3, 4] {
            let mut layouts = vec![CodeLayout::RowMajor];
            if axis == 0 && k == 3 {
                layouts.push(CodeLayout::K3Interleaved);
            }
            for layout in layouts {
                let cfg = EncoderConfig { layout, ..config(k, axis) };
                let plain = encode_linear(&w, out, inp, &cfg).unwrap();
                for (name, h) in [("I", identity(inp, 1.0)), ("diagonal", diag_h.clone())] {
                    let what = format!("axis {axis} k {k} {layout:?} H = {name}");
                    let got = encode_linear_ldlq(&w, out, inp, Some(&h), &cfg, &LdlqConfig::default()).unwrap();
                    assert_eq!(got.outcome, LdlqOutcome::Weighted { damping: 0.01 }, "{what}");
                    assert!(got.warnings.is_empty(), "{what}: {:?}", got.warnings);
                    assert_eq!(got.encoded.layer.codes, plain.layer.codes, "{what}: codes");
                    assert_eq!(got.encoded.layer.scales, plain.layer.scales, "{what}: scales");
                    assert_eq!(got.encoded.layer.geometry, plain.layer.geometry, "{what}: geometry");
                    assert_eq!(got.encoded.mse, plain.mse, "{what}: mse");
                    assert_decodes(&got, &what);
                }
            }
        }
    }
}

/// `U` with `H' = U D Uᵀ` (`U` unit upper triangular, `D` diagonal) by the textbook recursion
/// from the last index, then `U B⁻¹` for the unit upper blocks `B = blockdiag(U_kk)` of `group`
/// indices: the feedback coefficients of block LDLQ in forward order.
fn reference_factor(h: &[f64], n: usize, damping: f64, group: usize) -> Vec<f64> {
    let shift = damping * (0..n).map(|i| h[i * n + i]).sum::<f64>() / n as f64;
    let mut u = identity(n, 1.0);
    let mut d = vec![0f64; n];
    for j in (0..n).rev() {
        d[j] = h[j * n + j] + shift - (j + 1..n).map(|m| u[j * n + m] * u[j * n + m] * d[m]).sum::<f64>();
        assert!(d[j] > 0.0, "the test's H is positive definite");
        for i in 0..j {
            u[i * n + j] = (h[i * n + j] - (j + 1..n).map(|m| u[i * n + m] * u[j * n + m] * d[m]).sum::<f64>()) / d[j];
        }
    }
    let mut start = 0;
    while start < n {
        let end = (start + group).min(n);
        // Rows above the block: x B_kk = y by forward substitution (B_kk unit upper).
        for i in 0..start {
            for c in start..end {
                let s: f64 = (start..c).map(|m| u[i * n + m] * u[m * n + c]).sum();
                u[i * n + c] -= s;
            }
        }
        for i in start..end {
            for c in start..end {
                u[i * n + c] = (i == c) as u8 as f64;
            }
        }
        start = end;
    }
    u
}

/// The targets and codes are LDLQ's: every target equals `W + (W − Ŵ) A` with the test's own
/// factor (A = U − I, only earlier groups), and every block's states are the plain Viterbi path
/// of its target divided by its row's scale.
fn assert_exact_ldlq(w: &[f32], out: usize, inp: usize, h: &[f64], k: u32, axis: u32, row_group: usize) -> LdlqEncoded {
    assert_exact_ldlq_in_blocks(w, out, inp, h, k, axis, row_group, T)
}

/// [`assert_exact_ldlq`] with blocks of `t` weights.
#[allow(clippy::too_many_arguments)]
fn assert_exact_ldlq_in_blocks(
    w: &[f32],
    out: usize,
    inp: usize,
    h: &[f64],
    k: u32,
    axis: u32,
    row_group: usize,
    t: usize,
) -> LdlqEncoded {
    let cfg = EncoderConfig { t: t as u32, ..config(k, axis) };
    let ldlq = LdlqConfig { stored_row_group: row_group, ..LdlqConfig::default() };
    let (got, targets) = encode_linear_ldlq_with_targets(w, out, inp, Some(h), &cfg, &ldlq).unwrap();
    let what = format!("axis {axis} k {k} t {t} [{out}, {inp}] group {row_group}");
    assert_eq!(got.outcome, LdlqOutcome::Weighted { damping: 0.01 }, "{what}: {:?}", got.warnings);
    let group = if axis == 1 { t } else { row_group };
    let u = reference_factor(h, inp, 0.01, group);
    let rec = &got.encoded.reconstruction;
    // The stored matrix [rows, cols]: the coded axis padded to whole blocks, `logical` of them real.
    let (rows, logical) = if axis == 1 { (out, inp) } else { (inp, out) };
    let cols = logical.div_ceil(t) * t;
    assert_eq!(got.encoded.logical_cols, logical, "{what}");
    assert_eq!(targets.len(), rows * cols, "{what}");
    // Stored-orientation index of (o, i).
    let at = |o: usize, i: usize| if axis == 1 { o * cols + i } else { i * cols + o };
    let mut worst = 0f64;
    for o in 0..out {
        for i in 0..inp {
            let first_of_group = i / group * group;
            let feedback: f64 =
                (0..first_of_group).map(|j| (w[o * inp + j] as f64 - rec[at(o, j)] as f64) * u[j * inp + i]).sum();
            let want = w[o * inp + i] as f64 + feedback;
            worst = worst.max((targets[at(o, i)] as f64 - want).abs());
        }
    }
    let w_rms = (w.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / w.len() as f64).sqrt();
    assert!(worst <= 1e-6 * w_rms, "{what}: a target is {worst:e} away from the LDLQ recursion (weights' RMS {w_rms})");
    // Padding is no weight: its targets are exactly zero.
    for r in 0..rows {
        assert!(targets[r * cols + logical..(r + 1) * cols].iter().all(|&v| v == 0.0), "{what}: padded targets");
    }
    // Every block is the Viterbi path of its target, the padding free in the search.
    let g = got.encoded.layer.geometry;
    let lut_rms = lut_rms(12).unwrap();
    for r in 0..rows {
        let scale = got.encoded.layer.scales[r];
        if axis == 0 {
            // Axis 0 takes the scale from the target row's logical part, as the plain encoder would.
            let row = &targets[r * cols..r * cols + logical];
            let rms = (row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / logical as f64).sqrt();
            assert_eq!(scale, half::f16::from_f64(rms / lut_rms), "{what}: scale of stored row {r}");
        }
        for b in 0..cols / t {
            let x: Vec<f32> =
                targets[r * cols + b * t..r * cols + (b + 1) * t].iter().map(|&v| v / scale.to_f32()).collect();
            let path = if (b + 1) * t <= logical {
                block_path(&x, k, 12, BlockSearch::Viterbi).unwrap()
            } else {
                let mask: Vec<f32> = (b * t..(b + 1) * t).map(|c| if c < logical { 1.0 } else { 0.0 }).collect();
                block_path_weighted(&x, &mask, k, 12).unwrap()
            };
            let words = block_words(&got.encoded.layer.codes, &g, r, b).unwrap();
            let decoded: Vec<u32> = (0..t).map(|t| block_state(words, t, k, 12).unwrap()).collect();
            assert_eq!(decoded, path, "{what}: stored row {r}, block {b} is not the Viterbi code of its target");
        }
    }
    assert_decodes(&got, &what);
    got
}

#[test]
fn the_codes_follow_the_ldlq_recursion_of_an_independent_factor() {
    // Axis 1: BlockLDLQ over input blocks of T (four blocks); axis 0: exact LDLQ (one stored row
    // per step) and groups of 5 rows (not dividing the 48 rows, so the last group is short).
    let (out, inp) = (6, 1024);
    let w = gaussian(out * inp, 11).unwrap();
    assert_exact_ldlq(&w, out, inp, &ill_conditioned(inp, 3), 2, 1, 1);
    let (out, inp) = (512, 48);
    let w = gaussian(out * inp, 12).unwrap();
    let h = ill_conditioned(inp, 4);
    for group in [1, 5] {
        assert_exact_ldlq(&w, out, inp, &h, 3, 0, group);
    }
}

#[test]
fn a_padded_axis_follows_the_recursion_over_its_logical_features() {
    // Axis 1: 600 inputs padded to 768 (the last input block 88 real of 256); axis 0: 200
    // outputs padded to 256, one stored row per step and groups of 5; k 2, 3 and 4.
    let (out, inp) = (5, 600);
    let w = gaussian(out * inp, 13).unwrap();
    let h = ill_conditioned(inp, 5);
    for k in [2u32, 3, 4] {
        assert_exact_ldlq(&w, out, inp, &h, k, 1, 1);
    }
    let (out, inp) = (200, 24);
    let w = gaussian(out * inp, 14).unwrap();
    let h = ill_conditioned(inp, 6);
    for (k, group) in [(2u32, 1usize), (3, 1), (4, 5)] {
        assert_exact_ldlq(&w, out, inp, &h, k, 0, group);
    }
}

#[test]
fn shorter_blocks_follow_the_recursion_unpadded_and_padded() {
    // Axis 1: SmolLM2's 576 inputs in blocks of 192 (no padding) at k 2, 3 and 4, and 600 inputs
    // in blocks of 64 (padded to 640); axis 0: 192 outputs in blocks of 96, exact and in groups of 5.
    let (out, inp) = (5, 576);
    let w = gaussian(out * inp, 16).unwrap();
    let h = ill_conditioned(inp, 7);
    for k in [2u32, 3, 4] {
        assert_exact_ldlq_in_blocks(&w, out, inp, &h, k, 1, 1, 192);
    }
    let (out, inp) = (4, 600);
    let w = gaussian(out * inp, 17).unwrap();
    assert_exact_ldlq_in_blocks(&w, out, inp, &ill_conditioned(inp, 8), 3, 1, 1, 64);
    let (out, inp) = (192, 20);
    let w = gaussian(out * inp, 18).unwrap();
    let h = ill_conditioned(inp, 9);
    for group in [1, 5] {
        assert_exact_ldlq_in_blocks(&w, out, inp, &h, 3, 0, group, 96);
    }
}

#[test]
fn the_weighted_block_path_takes_all_ones_as_the_plain_search_and_refuses_bad_weights() {
    let x: Vec<f32> = gaussian(T, 15).unwrap();
    for k in [2u32, 3, 4] {
        let plain = block_path(&x, k, 12, BlockSearch::Viterbi).unwrap();
        assert_eq!(block_path_weighted(&x, &[1.0; T], k, 12).unwrap(), plain, "k {k}: all ones");
    }
    for bad in [f32::NAN, f32::INFINITY, -1.0] {
        let mut w = vec![1.0f32; T];
        w[7] = bad;
        let err = block_path_weighted(&x, &w, 3, 12).unwrap_err().to_string();
        assert!(err.contains("finite and at least 0"), "{bad}: {err}");
    }
    assert!(block_path_weighted(&x, &[1.0; 10], 3, 12).is_err(), "a short weight vector");
}

#[test]
fn a_padded_axis_with_an_identity_or_diagonal_h_gives_the_plain_padded_codes() {
    // Axis 1: W [8, 600] (stored [8, 768]); axis 0: W [200, 12] (stored [12, 256]); with H = I
    // and a diagonal H the feedback is zero, so the code is encode_padded's, bit for bit.
    for (axis, out, inp) in [(1u32, 8usize, 600usize), (0, 200, 12)] {
        let w = gaussian(out * inp, 110 + axis as u64).unwrap();
        let (stored, rows, logical) = stored_of(&w, out, inp, axis);
        let mut rng = SplitMix64::new(8);
        let mut diag_h = identity(inp, 0.0);
        (0..inp).for_each(|i| diag_h[i * inp + i] = 0.1 + rng.next_f64() * 10.0);
        for k in [2u32, 3, 4] {
            let cfg = config(k, axis);
            let plain = encode_padded(&stored, rows, logical, &cfg, &mut |_, _| {}).unwrap();
            for (name, h) in [("I", identity(inp, 1.0)), ("diagonal", diag_h.clone())] {
                let what = format!("axis {axis} k {k} H = {name}");
                let got = encode_linear_ldlq(&w, out, inp, Some(&h), &cfg, &LdlqConfig::default()).unwrap();
                assert_eq!(got.outcome, LdlqOutcome::Weighted { damping: 0.01 }, "{what}: {:?}", got.warnings);
                assert_eq!(got.encoded.layer.codes, plain.layer.codes, "{what}: codes");
                assert_eq!(got.encoded.layer.scales, plain.layer.scales, "{what}: scales");
                assert_eq!(got.encoded.layer.geometry, plain.layer.geometry, "{what}: geometry");
                assert_eq!(got.encoded.mse.to_bits(), plain.mse.to_bits(), "{what}: mse");
                assert_eq!(got.encoded.logical_cols, plain.logical_cols, "{what}: logical columns");
                assert_decodes(&got, &what);
            }
        }
    }
}

#[test]
fn ldlq_lowers_the_proxy_error_of_an_ill_conditioned_h() {
    // Axis 1 W [64, 1024]; axis 0 W [512, 256] (stored [256, 512]); padded: axis 1 W [32, 600]
    // (inputs padded to 768), axis 0 W [300, 64] (outputs padded to 512); at k 2, 3, 4.
    for (axis, out, inp) in [(1u32, 64usize, 1024usize), (0, 512, 256), (1, 32, 600), (0, 300, 64)] {
        let w = gaussian(out * inp, 20 + axis as u64 + inp as u64).unwrap();
        let h = ill_conditioned(inp, 30 + axis as u64 + inp as u64);
        let (stored, rows, logical) = stored_of(&w, out, inp, axis);
        for k in [2u32, 3, 4] {
            let cfg = config(k, axis);
            let plain = encode_padded(&stored, rows, logical, &cfg, &mut |_, _| {}).unwrap();
            let cols = plain.layer.geometry.cols;
            let plain_rec: Vec<f32> =
                plain.reconstruction.chunks_exact(cols).flat_map(|r| r[..logical].to_vec()).collect();
            let plain_proxy = proxy_error(&w, &plain_rec, out, inp, axis, &h, None).unwrap();
            let got = encode_linear_ldlq(&w, out, inp, Some(&h), &cfg, &LdlqConfig::default()).unwrap();
            let what = format!("axis {axis} [{out}, {inp}] k {k}");
            assert!(matches!(got.outcome, LdlqOutcome::Weighted { .. }), "{what}: {:?}", got.warnings);
            let proxy = got.proxy.unwrap();
            assert_eq!(proxy.reference, plain_proxy.reference, "{what}: the same weights");
            let ratio = proxy.error / plain_proxy.error;
            println!(
                "{what}: relative proxy error plain {:.4e}, LDLQ {:.4e}, ratio {ratio:.3}; mse plain {:.4e}, LDLQ {:.4e}",
                plain_proxy.relative(),
                proxy.relative(),
                plain.mse,
                got.encoded.mse
            );
            assert!(ratio < 0.7, "{what}: LDLQ's proxy error is {ratio:.3} of the plain code's");
            assert_decodes(&got, &what);
        }
    }
}

#[test]
fn the_result_does_not_depend_on_the_thread_count() {
    // Whole blocks and padded axes (600 inputs, 200 outputs).
    let shapes = [(1u32, 5usize, 768usize, 1usize), (0, 512, 40, 1), (0, 512, 40, 3), (1, 5, 600, 1), (0, 200, 40, 3)];
    for (axis, out, inp, group) in shapes {
        let w = gaussian(out * inp, 50).unwrap();
        let h = ill_conditioned(inp, 51);
        let ldlq = LdlqConfig { stored_row_group: group, ..LdlqConfig::default() };
        let run = |threads| {
            let cfg = EncoderConfig { threads: Some(threads), ..config(3, axis) };
            encode_linear_ldlq(&w, out, inp, Some(&h), &cfg, &ldlq).unwrap()
        };
        let (one, three) = (run(1), run(3));
        assert_eq!(one.encoded.layer.codes, three.encoded.layer.codes, "axis {axis} group {group}");
        assert_eq!(one.encoded.layer.scales, three.encoded.layer.scales, "axis {axis} group {group}");
        assert_eq!(one.proxy, three.proxy, "axis {axis} group {group}");
    }
}

#[test]
fn unusable_h_falls_back_to_the_plain_codes_with_a_warning() {
    for (axis, out, inp) in [(1u32, 4usize, 512usize), (0, 256, 8)] {
        let w = gaussian(out * inp, 60).unwrap();
        let cfg = config(2, axis);
        let plain = encode_linear(&w, out, inp, &cfg).unwrap();
        let mut nan = identity(inp, 1.0);
        nan[inp + 1] = f64::NAN;
        let mut infinite = identity(inp, 1.0);
        infinite[1] = f64::INFINITY;
        let cases: [(&str, Option<Vec<f64>>, &str); 5] = [
            ("missing", None, "no H"),
            ("zero (singular)", Some(identity(inp, 0.0)), "singular"),
            ("NaN", Some(nan), "not finite"),
            ("infinite", Some(infinite), "not finite"),
            ("negative diagonal", Some(identity(inp, -1.0)), "negative"),
        ];
        for (name, h, says) in cases {
            let what = format!("axis {axis} H {name}");
            let got = encode_linear_ldlq(&w, out, inp, h.as_deref(), &cfg, &LdlqConfig::default()).unwrap();
            assert_eq!(got.outcome, LdlqOutcome::Unweighted, "{what}");
            assert_eq!(got.warnings.len(), 1, "{what}: {:?}", got.warnings);
            assert!(got.warnings[0].contains(says), "{what}: {:?}", got.warnings);
            assert_eq!(got.encoded.layer.codes, plain.layer.codes, "{what}");
            assert_eq!(got.encoded.layer.scales, plain.layer.scales, "{what}");
            let finite = h.as_ref().is_some_and(|h| h.iter().all(|v| v.is_finite()));
            assert_eq!(got.proxy.is_some(), finite, "{what}: a proxy error exactly when H is finite");
            assert_decodes(&got, &what);
        }
        // A wrong size is the caller's error, not a fallback.
        let err = encode_linear_ldlq(&w, out, inp, Some(&identity(inp + 1, 1.0)), &cfg, &LdlqConfig::default());
        assert!(err.is_err(), "axis {axis}: H of the wrong size");
    }
}

#[test]
fn an_indefinite_h_is_retried_with_more_damping() {
    // H = I except H[0, 1] = H[1, 0] = 10: eigenvalues -9 and 11 there, mean diagonal 1. Damping
    // 0.01, 0.1 and 1 leave it indefinite; 10 makes it positive definite.
    let (out, inp) = (4, 512);
    let w = gaussian(out * inp, 70).unwrap();
    let mut h = identity(inp, 1.0);
    h[1] = 10.0;
    h[inp] = 10.0;
    let got = encode_linear_ldlq(&w, out, inp, Some(&h), &config(2, 1), &LdlqConfig::default()).unwrap();
    let LdlqOutcome::Weighted { damping } = got.outcome else { panic!("fell back: {:?}", got.warnings) };
    assert!((damping - 10.0).abs() <= 1e-12, "damping {damping}");
    assert_eq!(got.warnings.len(), 3, "{:?}", got.warnings);
    assert!(got.warnings.iter().all(|w| w.contains("not positive definite")), "{:?}", got.warnings);
    assert_decodes(&got, "indefinite H, retried");
    // With no retries the same H falls back.
    let once = LdlqConfig { retries: 0, ..LdlqConfig::default() };
    let got = encode_linear_ldlq(&w, out, inp, Some(&h), &config(2, 1), &once).unwrap();
    assert_eq!(got.outcome, LdlqOutcome::Unweighted);
    assert_eq!(got.warnings.len(), 2, "{:?}", got.warnings);
    assert_eq!(got.encoded.layer.codes, encode_linear(&w, out, inp, &config(2, 1)).unwrap().layer.codes);
}

#[test]
fn targets_beyond_the_growth_limit_are_refused() {
    // Axis 0 on the ill-conditioned H: the feedback makes some target rows larger than their
    // originals; a limit barely above 1 refuses them at every damping, so the code falls back.
    let (out, inp) = (256, 64);
    let w = gaussian(out * inp, 80).unwrap();
    let h = ill_conditioned(inp, 81);
    let tight = LdlqConfig { growth_limit: 1.000001, retries: 1, ..LdlqConfig::default() };
    let got = encode_linear_ldlq(&w, out, inp, Some(&h), &config(2, 0), &tight).unwrap();
    assert_eq!(got.outcome, LdlqOutcome::Unweighted, "{:?}", got.warnings);
    assert_eq!(got.warnings.len(), 3, "{:?}", got.warnings);
    assert!(got.warnings[..2].iter().all(|w| w.contains("RMS")), "{:?}", got.warnings);
    // The default limit accepts the same H.
    let fine = encode_linear_ldlq(&w, out, inp, Some(&h), &config(2, 0), &LdlqConfig::default()).unwrap();
    assert_eq!(fine.outcome, LdlqOutcome::Weighted { damping: 0.01 }, "{:?}", fine.warnings);
}

#[test]
fn invalid_ldlq_settings_are_refused_by_name() {
    let w = gaussian(4 * 256, 90).unwrap();
    let h = identity(256, 1.0);
    let cases = [
        (LdlqConfig { damping: -1.0, ..LdlqConfig::default() }, "damping"),
        (LdlqConfig { damping: f64::NAN, ..LdlqConfig::default() }, "damping"),
        (LdlqConfig { retries: 11, ..LdlqConfig::default() }, "retries"),
        (LdlqConfig { growth_limit: 1.0, ..LdlqConfig::default() }, "growth_limit"),
        (LdlqConfig { stored_row_group: 0, ..LdlqConfig::default() }, "stored_row_group"),
    ];
    for (ldlq, name) in cases {
        let err = encode_linear_ldlq(&w, 4, 256, Some(&h), &config(2, 1), &ldlq).unwrap_err().to_string();
        assert!(err.contains(name), "{name}: {err}");
    }
    let mut bad = w.clone();
    bad[3] = f32::NAN;
    assert!(encode_linear_ldlq(&bad, 4, 256, Some(&h), &config(2, 1), &LdlqConfig::default()).is_err());
}

#[test]
fn a_rotation_is_refused_by_name() {
    let ldlq = LdlqConfig::default();
    // A rotation: the result could not record it (code_linear rotates; LDLQ takes the rotated
    // weights and the rotated H).
    let w = gaussian(4 * 256, 91).unwrap();
    let h = identity(256, 1.0);
    let rotated = EncoderConfig { rotation: Some(RotationSpec { seed: 7 }), ..config(2, 1) };
    let err = encode_linear_ldlq(&w, 4, 256, Some(&h), &rotated, &ldlq).unwrap_err().to_string();
    assert!(err.contains("rotation"), "{err}");
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn ldlq_on_the_cuda_search_gives_the_cpu_bytes() {
    require_cuda();
    // Axis 1 (one block per row per step), axis 0 one stored row per step and 16 per step, and
    // the 3-bit interleaved layout; padded axes (the padded blocks search on the CPU, the others
    // on CUDA where axis 1 has them).
    let cases = [
        (1u32, 64usize, 1024usize, 1usize, CodeLayout::RowMajor),
        (0, 512, 256, 1, CodeLayout::RowMajor),
        (0, 512, 256, 16, CodeLayout::RowMajor),
        (0, 512, 256, 1, CodeLayout::K3Interleaved),
        (1, 48, 600, 1, CodeLayout::RowMajor),
        (0, 300, 64, 4, CodeLayout::RowMajor),
    ];
    for (axis, out, inp, group, layout) in cases {
        let w = gaussian(out * inp, 200 + axis as u64).unwrap();
        let h = ill_conditioned(inp, 201);
        let ldlq = LdlqConfig { stored_row_group: group, ..LdlqConfig::default() };
        let ks: &[u32] = if layout == CodeLayout::K3Interleaved { &[3] } else { &[2, 3, 4] };
        for &k in ks {
            let what = format!("axis {axis} k {k} group {group} {layout:?}");
            let on = |backend| EncoderConfig { backend, layout, ..config(k, axis) };
            let cpu = encode_linear_ldlq(&w, out, inp, Some(&h), &on(EncoderBackend::Cpu), &ldlq).unwrap();
            let gpu = encode_linear_ldlq(&w, out, inp, Some(&h), &on(EncoderBackend::Cuda), &ldlq).unwrap();
            assert_eq!(gpu.outcome, cpu.outcome, "{what}: {:?}", gpu.warnings);
            assert_eq!(gpu.encoded.layer.scales, cpu.encoded.layer.scales, "{what}: scales");
            if let Some(i) = cpu.encoded.layer.codes.iter().zip(&gpu.encoded.layer.codes).position(|(a, b)| a != b) {
                panic!("{what}: code word {i} differs between the CPU and CUDA searches");
            }
            assert_eq!(gpu.encoded.layer.codes.len(), cpu.encoded.layer.codes.len(), "{what}");
            assert_eq!(gpu.proxy, cpu.proxy, "{what}: proxy error");
            assert_decodes(&gpu, &what);
            println!("{what}: same bytes, relative proxy error {:.4e}", gpu.proxy.unwrap().relative());
        }
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn lockstep_on_the_cuda_search_gives_the_cpu_bytes() {
    require_cuda();
    // At k 3: axis 1, axis 0 row-major and interleaved, each also coded alone on the CPU.
    let cases = [
        (1u32, 64usize, 1024usize, CodeLayout::RowMajor),
        (0, 512, 256, CodeLayout::RowMajor),
        (0, 512, 256, CodeLayout::K3Interleaved),
    ];
    let weights: Vec<Vec<f32>> = cases.iter().map(|c| gaussian(c.1 * c.2, 700 + c.0 as u64).unwrap()).collect();
    let hs: Vec<Vec<f64>> = cases.iter().map(|c| ill_conditioned(c.2, 701)).collect();
    let on = |backend, axis, layout| EncoderConfig { backend, layout, ..config(3, axis) };
    let problems: Vec<LdlqProblem<'_>> = cases
        .iter()
        .zip(weights.iter().zip(&hs))
        .map(|(&(axis, out, inp, layout), (w, h))| LdlqProblem {
            w,
            out_features: out,
            in_features: inp,
            hessian: Some(h),
            cfg: on(EncoderBackend::Cuda, axis, layout),
        })
        .collect();
    let ldlq = LdlqConfig::default();
    let gpu = encode_linear_ldlq_lockstep(&problems, &ldlq, &mut |_, _| {}).unwrap();
    for (i, (p, c)) in problems.iter().zip(&cases).enumerate() {
        let cpu_cfg = on(EncoderBackend::Cpu, c.0, c.3);
        let cpu = encode_linear_ldlq(p.w, p.out_features, p.in_features, p.hessian, &cpu_cfg, &ldlq).unwrap();
        assert_same(&gpu[i], &cpu, &format!("problem {i}: axis {} {:?}", c.0, c.3));
    }
}

fn tensor(name: &str, rows: usize, cols: usize, errors: [f64; 3]) -> TensorOptions {
    let candidates = [2u32, 3, 4]
        .iter()
        .zip(errors)
        .map(|(&k, error)| BitCandidate { k, stored_bits: stored_bits(rows, cols, k).unwrap(), error })
        .collect();
    TensorOptions { name: name.into(), weights: (rows * cols) as u64, candidates }
}

#[test]
fn stored_bits_count_codes_and_scales() {
    assert_eq!(stored_bits(576, 1536, 3).unwrap(), 576 * 1536 * 3 + 576 * 16);
    assert!(stored_bits(usize::MAX, 2, 4).is_err());
}

#[test]
fn the_allocator_keeps_the_budget_and_takes_the_best_ratio_first() {
    // Three tensors of the same size: "b" gains most from its first upgrade, "a" next.
    let tensors = vec![
        tensor("c", 256, 512, [4.0, 3.5, 3.4]),
        tensor("b", 256, 512, [10.0, 2.0, 1.0]),
        tensor("a", 256, 512, [6.0, 3.0, 2.9]),
    ];
    let per_k = |k: u64| (256 * 512 * k + 256 * 16) as f64 / (256.0 * 512.0);
    let minimum = per_k(2);
    let low = allocate_bits(&tensors, minimum).unwrap();
    assert!(low.choices.iter().all(|c| c.k == 2), "{low:?}");
    assert_eq!(low.bits_per_weight, minimum);
    // One upgrade's worth: "b" to 3.
    let one = allocate_bits(&tensors, (2.0 * per_k(2) + per_k(3)) / 3.0).unwrap();
    let ks: Vec<(String, u32)> = one.choices.iter().map(|c| (c.name.clone(), c.k)).collect();
    assert_eq!(ks, [("c".to_string(), 2), ("b".to_string(), 3), ("a".to_string(), 2)]);
    assert_eq!(one.error, 4.0 + 2.0 + 6.0);
    // Two: then "a" to 3 (ratio 3 per 1 bit/weight against b's 1 and c's 0.5).
    let two = allocate_bits(&tensors, (per_k(2) + 2.0 * per_k(3)) / 3.0).unwrap();
    assert_eq!(two.choices.iter().map(|c| c.k).collect::<Vec<_>>(), [2, 3, 3]);
    // Everything at k 4 when the budget allows it.
    let all = allocate_bits(&tensors, 4.5).unwrap();
    assert!(all.choices.iter().all(|c| c.k == 4), "{all:?}");
    assert!(all.bits_per_weight <= 4.5);
}

/// Tensors joined to share one k: weights, stored bits and errors summed per shared k (checked by
/// hand), k's a part lacks dropped, and an allocation of the joined tensor spends the parts' bits.
#[test]
fn joined_tensors_sum_their_parts_at_each_shared_k() {
    let gate = tensor("gate", 576, 1536, [6.0, 2.0, 0.5]);
    let up = tensor("up", 576, 1536, [4.0, 1.0, 0.25]);
    let joined = TensorOptions::joined("gate+up", &[gate.clone(), up.clone()]).unwrap();
    assert_eq!(joined.name, "gate+up");
    assert_eq!(joined.weights, 2 * 576 * 1536);
    let sums: Vec<(u32, u64, f64)> = joined.candidates.iter().map(|c| (c.k, c.stored_bits, c.error)).collect();
    let bits = |k: u64| 2 * (576 * 1536 * k + 576 * 16);
    assert_eq!(sums, [(2, bits(2), 10.0), (3, bits(3), 3.0), (4, bits(4), 0.75)]);
    // A part without k 4: the joined tensor has only k 2 and 3.
    let mut short = up.clone();
    short.candidates.retain(|c| c.k != 4);
    let two: Vec<u32> =
        TensorOptions::joined("j", &[gate.clone(), short]).unwrap().candidates.iter().map(|c| c.k).collect();
    assert_eq!(two, [2, 3]);
    // The joined tensor beside another: the budget counts both parts' bits (it fits the joined
    // tensor at k 3 or down at k 4, and k 3 gains more a bit; 1e-9 for the rounding of the
    // budget times the weights).
    let other = tensor("down", 1536, 576, [3.0, 1.5, 1.0]);
    let per_weight = |k: u64| (576 * 1536 * k + 576 * 16) as f64 / (576.0 * 1536.0);
    let budget = (2.0 * per_weight(3) + (1536 * 576 * 2 + 1536 * 16) as f64 / (576.0 * 1536.0)) / 3.0 + 1e-9;
    let got = allocate_bits(&[joined, other], budget).unwrap();
    assert_eq!(got.choices.iter().map(|c| c.k).collect::<Vec<_>>(), [3, 2]);
    assert!(got.bits_per_weight <= budget);
    // Nothing to join, parts without a shared k, and an invalid part are refused.
    assert!(TensorOptions::joined("none", &[]).is_err());
    let mut only4 = up.clone();
    only4.candidates.retain(|c| c.k == 4);
    let mut only2 = gate.clone();
    only2.candidates.retain(|c| c.k == 2);
    assert!(TensorOptions::joined("j", &[only2, only4]).unwrap_err().to_string().contains("share no k"));
    let mut bad = up;
    bad.candidates[0].error = f64::NAN;
    assert!(TensorOptions::joined("j", &[gate, bad]).is_err());
}

/// Ties by the last part of the names: each block's gate and up become one tensor, in the order
/// of their first member, the rest stay; partial or repeated ties and bad tie lists are refused.
#[test]
fn ties_join_each_blocks_named_tensors_and_refuse_partial_blocks() {
    let names = ["b0.mlp.gate_proj", "b0.attn.q_proj", "b0.mlp.up_proj", "b1.mlp.up_proj", "b1.mlp.gate_proj"];
    let tensors: Vec<TensorOptions> =
        names.iter().enumerate().map(|(i, n)| tensor(n, 64, 128, [3.0 + i as f64, 2.0, 1.0])).collect();
    let ties = vec![vec!["gate_proj".to_string(), "up_proj".to_string()]];
    let tied = tie_tensors(&tensors, &ties).unwrap();
    let got: Vec<&str> = tied.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(got, ["b0.mlp.gate_proj+up_proj", "b0.attn.q_proj", "b1.mlp.gate_proj+up_proj"]);
    assert_eq!(tied.members, [vec![0, 2], vec![1], vec![3, 4]]);
    assert_eq!(
        tied.tensors[0],
        TensorOptions::joined("b0.mlp.gate_proj+up_proj", &[tensors[0].clone(), tensors[2].clone()]).unwrap()
    );
    assert_eq!(tied.tensors[1], tensors[1]);
    // No ties: every tensor its own.
    let none = tie_tensors(&tensors, &[]).unwrap();
    assert_eq!(none.tensors, tensors);
    assert_eq!(none.members, (0..5).map(|i| vec![i]).collect::<Vec<_>>());
    // A block with only one of a tie's names, or one twice.
    let partial = tie_tensors(&tensors[..4], &ties).unwrap_err().to_string();
    assert!(partial.contains("\"b1.mlp\""), "{partial}");
    let mut twice = tensors.clone();
    twice[2].name = "b0.mlp.gate_proj".into();
    assert!(tie_tensors(&twice, &ties).is_err());
    // Bad tie lists.
    let tie = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert!(tie_tensors(&tensors, &[tie(&["gate_proj"])]).is_err());
    assert!(tie_tensors(&tensors, &[tie(&["gate_proj", "gate_proj"])]).is_err());
    assert!(tie_tensors(&tensors, &[tie(&["mlp.gate_proj", "up_proj"])]).is_err());
    assert!(tie_tensors(&tensors, &[tie(&["gate_proj", "up_proj"]), tie(&["up_proj", "q_proj"])]).is_err());
}

/// Candidates weighted by measured cost: measured widths take the cost itself, the others the
/// proxy error scaled at the nearest measured width (the lower on a tie), checked in f64 by hand.
#[test]
fn kl_weighted_candidates_take_measured_costs_and_scale_the_rest() {
    use std::collections::BTreeMap;
    let at = [(2u32, 200u64, 8.0f64), (3, 300, 2.0), (4, 400, 0.5)];
    let errors = |kl: &[(u32, f64)]| -> Vec<f64> {
        let kl: BTreeMap<u32, f64> = kl.iter().copied().collect();
        let c = kl_weighted_candidates(&at, &kl).unwrap();
        assert_eq!(c.iter().map(|c| (c.k, c.stored_bits)).collect::<Vec<_>>(), [(2, 200), (3, 300), (4, 400)]);
        c.iter().map(|c| c.error).collect()
    };
    // Every width measured: the costs themselves.
    assert_eq!(errors(&[(2, 0.04), (3, 0.01), (4, 0.003)]), [0.04, 0.01, 0.003]);
    // k 2 only: 0.04 per 8 of proxy error.
    assert_eq!(errors(&[(2, 0.04)]), [0.04, 0.04 * 2.0 / 8.0, 0.04 * 0.5 / 8.0]);
    // k 4 only, then k 2 and 4 (k 3 is as near to both: the lower, k 2, scales it).
    assert_eq!(errors(&[(4, 0.001)]), [0.001 * 8.0 / 0.5, 0.001 * 2.0 / 0.5, 0.001]);
    assert_eq!(errors(&[(2, 0.04), (4, 0.001)]), [0.04, 0.04 * 2.0 / 8.0, 0.001]);
    // A cost of 0 still orders the widths by their proxy errors.
    let zero = errors(&[(2, 0.0)]);
    assert!(zero[0] == 0.0 && zero[1] > zero[2] && zero[2] > 0.0, "{zero:?}");
    // Refused: nothing measured, a width that is not a candidate, a bad cost or proxy error.
    let refused =
        |at: &[(u32, u64, f64)], kl: &[(u32, f64)]| kl_weighted_candidates(at, &kl.iter().copied().collect()).is_err();
    assert!(refused(&at, &[]));
    assert!(refused(&at[..2], &[(4, 0.01)]));
    assert!(refused(&at, &[(2, f64::NAN)]));
    assert!(refused(&at, &[(2, -1e-3)]));
    assert!(refused(&[(2, 200, 8.0), (3, 300, f64::INFINITY)], &[(2, 0.04)]));
}

#[test]
fn the_allocator_is_deterministic_and_never_leaves_a_fitting_improvement() {
    let mut rng = SplitMix64::new(5);
    let mut tensors: Vec<TensorOptions> = (0..40)
        .map(|i| {
            let (rows, cols) = ([256usize, 512, 1536][i % 3], [256usize, 768][i % 2]);
            let e2 = 1.0 + rng.next_f64() * 10.0;
            // Mostly falling errors, some uneven (k 3 no better than k 2).
            let e3 = if i % 7 == 0 { e2 * 1.01 } else { e2 * (0.2 + 0.2 * rng.next_f64()) };
            let e4 = e2 * 0.05 * rng.next_f64();
            tensor(&format!("t{i:02}"), rows, cols, [e2, e3, e4])
        })
        .collect();
    // Identical candidates on two tensors force ties, broken by name.
    tensors.push(tensor("tie-b", 256, 256, [5.0, 1.0, 0.5]));
    tensors.push(tensor("tie-a", 256, 256, [5.0, 1.0, 0.5]));
    for budget in [2.1, 2.5, 3.0, 3.25, 3.7] {
        let got = allocate_bits(&tensors, budget).unwrap();
        assert!(got.stored_bits as f64 <= budget * got.weights as f64, "budget {budget}: {}", got.bits_per_weight);
        let sum: u64 = got.choices.iter().map(|c| c.stored_bits).sum();
        assert_eq!(sum, got.stored_bits);
        // No single upgrade that fits the rest of the budget lowers the error.
        let allowed = budget * got.weights as f64;
        for (t, c) in tensors.iter().zip(&got.choices) {
            for cand in &t.candidates {
                let fits = (got.stored_bits - c.stored_bits + cand.stored_bits) as f64 <= allowed;
                assert!(!(fits && cand.error < c.error), "budget {budget}: {} could move to k {}", t.name, cand.k);
            }
        }
        // The same choices for the tensors in reverse order.
        let mut reversed = tensors.clone();
        reversed.reverse();
        let again = allocate_bits(&reversed, budget).unwrap();
        let mut a: Vec<_> = got.choices.clone();
        let mut b: Vec<_> = again.choices.clone();
        a.sort_by(|x, y| x.name.cmp(&y.name));
        b.sort_by(|x, y| x.name.cmp(&y.name));
        assert_eq!(a, b, "budget {budget}");
        assert_eq!(got.error, again.error);
    }
    // The tie: with exactly one upgrade of the tied pair affordable, "tie-a" gets it.
    let pair = [tensor("tie-b", 256, 256, [5.0, 1.0, 0.5]), tensor("tie-a", 256, 256, [5.0, 1.0, 0.5])];
    let bits = (stored_bits(256, 256, 2).unwrap() + stored_bits(256, 256, 3).unwrap()) as f64 / (2.0 * 65536.0);
    let got = allocate_bits(&pair, bits).unwrap();
    assert_eq!((got.choices[0].k, got.choices[1].k), (2, 3), "{got:?}");
}

#[test]
fn the_allocator_refuses_a_budget_below_its_minimum_and_bad_input() {
    let tensors = vec![tensor("a", 256, 512, [3.0, 2.0, 1.0])];
    let minimum = (256.0 * 512.0 * 2.0 + 256.0 * 16.0) / (256.0 * 512.0);
    let err = allocate_bits(&tensors, 2.0).unwrap_err().to_string();
    assert!(err.contains(&format!("{minimum:.6}")), "{err}");
    assert!(allocate_bits(&tensors, minimum).is_ok());
    assert!(allocate_bits(&[], 3.0).is_err());
    assert!(allocate_bits(&tensors, f64::NAN).is_err());
    let twice = vec![tensors[0].clone(), tensors[0].clone()];
    assert!(allocate_bits(&twice, 3.0).unwrap_err().to_string().contains("twice"));
    let mut bad = tensors[0].clone();
    bad.candidates[1].error = f64::INFINITY;
    assert!(allocate_bits(&[bad], 3.0).is_err());
    let mut repeated = tensors[0].clone();
    repeated.candidates[2].k = 2;
    assert!(allocate_bits(&[repeated], 3.0).is_err());
}

/// Every field of two results is the same, bit for bit.
fn assert_same(got: &LdlqEncoded, want: &LdlqEncoded, what: &str) {
    let (g, w) = (&got.encoded, &want.encoded);
    assert_eq!(g.layer.codes, w.layer.codes, "{what}: codes");
    assert_eq!(g.layer.scales, w.layer.scales, "{what}: scales");
    assert_eq!(g.layer.geometry, w.layer.geometry, "{what}: geometry");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(bits(&g.reconstruction) == bits(&w.reconstruction), "{what}: reconstruction");
    assert_eq!(g.mse.to_bits(), w.mse.to_bits(), "{what}: mse");
    assert_eq!(g.logical_cols, w.logical_cols, "{what}: logical columns");
    assert_eq!(got.outcome, want.outcome, "{what}: outcome");
    assert_eq!(got.proxy, want.proxy, "{what}: proxy error");
    assert_eq!(got.warnings, want.warnings, "{what}: warnings");
}

#[test]
fn lockstep_coding_gives_each_problem_its_own_result_bit_for_bit() {
    let ill = |n: usize, seed: u64| Some(ill_conditioned(n, seed));
    let mut nan = identity(512, 1.0);
    nan[513] = f64::NAN;
    // H = I but H[0, 1] = H[1, 0] = 10: indefinite until damping 10 (three retries).
    let mut indefinite = identity(512, 1.0);
    indefinite[1] = 10.0;
    indefinite[512] = 10.0;
    // (axis, out, in, H, layout, expected outcome: weighted at the first damping or not).
    type Case = (u32, usize, usize, Option<Vec<f64>>, CodeLayout, bool);
    let cases = |k: u32| -> Vec<Case> {
        let interleaved = if k == 3 { CodeLayout::K3Interleaved } else { CodeLayout::RowMajor };
        vec![
            (1, 6, 768, ill(768, 301), CodeLayout::RowMajor, true),
            (0, 512, 48, ill(48, 302), interleaved, true),
            (0, 256, 20, ill(20, 303), CodeLayout::RowMajor, true),
            (0, 256, 12, None, CodeLayout::RowMajor, false),
            (1, 4, 512, Some(nan.clone()), CodeLayout::RowMajor, false),
            (1, 4, 512, Some(indefinite.clone()), CodeLayout::RowMajor, false),
            (1, 3, 256, Some(identity(256, 2.0)), CodeLayout::RowMajor, true),
            // Padded (coded alone): 300 inputs, 200 outputs.
            (1, 4, 300, ill(300, 304), CodeLayout::RowMajor, true),
            (0, 200, 16, ill(16, 305), CodeLayout::RowMajor, true),
        ]
    };
    // k 2 at L 8; k 3 at L 12 (the interleaved layout); axis 0 one stored row per step and 3.
    for (k, l, group) in [(2u32, 8u32, 1usize), (3, 12, 1), (2, 8, 3)] {
        let start = std::time::Instant::now();
        let ldlq = LdlqConfig { stored_row_group: group, ..LdlqConfig::default() };
        let cases = cases(k);
        let weights: Vec<Vec<f32>> =
            cases.iter().enumerate().map(|(i, c)| gaussian(c.1 * c.2, 310 + i as u64).unwrap()).collect();
        let problems: Vec<LdlqProblem<'_>> = cases
            .iter()
            .zip(&weights)
            .map(|((axis, out, inp, h, layout, _), w)| LdlqProblem {
                w,
                out_features: *out,
                in_features: *inp,
                hessian: h.as_deref(),
                cfg: EncoderConfig { axis: *axis, layout: *layout, l, threads: Some(2), ..config(k, *axis) },
            })
            .collect();
        let mut seen = Vec::new();
        let got = encode_linear_ldlq_lockstep(&problems, &ldlq, &mut |done, total| seen.push((done, total))).unwrap();
        assert_eq!(got.len(), problems.len());
        let blocks = |p: &LdlqProblem<'_>| {
            let (rows, logical) =
                if p.cfg.axis == 1 { (p.out_features, p.in_features) } else { (p.in_features, p.out_features) };
            rows * logical.div_ceil(T)
        };
        let total: usize = problems.iter().map(blocks).sum();
        assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "k {k}: progress goes forward");
        assert_eq!(seen.last(), Some(&(total, total)), "k {k}: progress ends at every block");
        for (i, (p, c)) in problems.iter().zip(&cases).enumerate() {
            let what = format!("k {k} L {l} group {group} problem {i} (axis {}, [{}, {}])", c.0, c.1, c.2);
            let alone = encode_linear_ldlq(p.w, p.out_features, p.in_features, p.hessian, &p.cfg, &ldlq).unwrap();
            assert_same(&got[i], &alone, &what);
            let first = got[i].outcome == LdlqOutcome::Weighted { damping: 0.01 };
            assert_eq!(first, c.5, "{what}: {:?} {:?}", got[i].outcome, got[i].warnings);
            assert_decodes(&got[i], &what);
        }
        println!("k {k} L {l} group {group}: {} problems in {:.2} s", problems.len(), start.elapsed().as_secs_f64());
    }
}

#[test]
fn lockstep_problems_abandoned_mid_way_are_coded_alone() {
    // A growth limit barely above 1: the problems on an ill-conditioned H are abandoned after
    // some steps (the first target has no feedback), and so is axis 1 on H = I (a block's RMS
    // above its row's); axis 0 on H = I never is (its targets are its rows).
    let tight = LdlqConfig { growth_limit: 1.000001, retries: 1, ..LdlqConfig::default() };
    let shapes = [(0u32, 256usize, 40usize, true), (1, 4, 768, true), (0, 512, 16, false), (1, 5, 512, false)];
    let weights: Vec<Vec<f32>> = shapes.iter().map(|s| gaussian(s.1 * s.2, 400 + s.2 as u64).unwrap()).collect();
    let hs: Vec<Vec<f64>> =
        shapes.iter().map(|s| if s.3 { ill_conditioned(s.2, 401) } else { identity(s.2, 1.0) }).collect();
    let problems: Vec<LdlqProblem<'_>> = shapes
        .iter()
        .zip(weights.iter().zip(&hs))
        .map(|(s, (w, h))| LdlqProblem {
            w,
            out_features: s.1,
            in_features: s.2,
            hessian: Some(h),
            cfg: EncoderConfig { l: 8, ..config(2, s.0) },
        })
        .collect();
    let got = encode_linear_ldlq_lockstep(&problems, &tight, &mut |_, _| {}).unwrap();
    for (i, (p, s)) in problems.iter().zip(&shapes).enumerate() {
        let what = format!("problem {i} (axis {}, [{}, {}])", s.0, s.1, s.2);
        let alone = encode_linear_ldlq(p.w, p.out_features, p.in_features, p.hessian, &p.cfg, &tight).unwrap();
        assert_same(&got[i], &alone, &what);
        if s.3 || s.0 == 1 {
            assert!(got[i].warnings.iter().any(|w| w.contains("RMS")), "{what}: {:?}", got[i].warnings);
        } else {
            assert_eq!(got[i].outcome, LdlqOutcome::Weighted { damping: 0.01 }, "{what}: {:?}", got[i].warnings);
        }
    }
}

#[test]
fn lockstep_refuses_mixed_searches_and_names_a_bad_problem() {
    let w = gaussian(4 * 256, 500).unwrap();
    let h = identity(256, 1.0);
    let problem = |cfg| LdlqProblem { w: &w, out_features: 4, in_features: 256, hessian: Some(&h), cfg };
    let ldlq = LdlqConfig::default();
    let mixed = [problem(config(2, 1)), problem(config(3, 1))];
    let err = encode_linear_ldlq_lockstep(&mixed, &ldlq, &mut |_, _| {}).unwrap_err().to_string();
    assert!(err.contains("problem 1") && err.contains("one search"), "{err}");
    let rotated = EncoderConfig { rotation: Some(RotationSpec { seed: 1 }), ..config(2, 1) };
    let bad = [problem(config(2, 1)), problem(rotated)];
    let err = format!("{:#}", encode_linear_ldlq_lockstep(&bad, &ldlq, &mut |_, _| {}).unwrap_err());
    assert!(err.contains("problem 1") && err.contains("rotation"), "{err}");
    assert!(encode_linear_ldlq_lockstep(&[], &ldlq, &mut |_, _| {}).unwrap().is_empty());
}

/// The 3-bit block interleave holds 256-weight blocks: an axis-0 projection at k 3, L 12 is
/// interleaved in blocks of 256 and row-major in blocks of 192, and the reference path reads both
/// at the coder's reported error.
#[test]
fn the_3_bit_interleave_is_chosen_for_256_weight_blocks_only() {
    use mlx_trellis::llama::coding::{code_projection, ProjectionCoding};
    use mlx_trellis::trellis::CodeLayout;
    let (out, inp) = (1536usize, 8usize);
    let w = gaussian(out * inp, 620).unwrap();
    for (t, layout) in [(256u32, CodeLayout::K3Interleaved), (192, CodeLayout::RowMajor)] {
        let coding = ProjectionCoding {
            encoder: EncoderConfig { t, threads: Some(2), ..config(3, 0) },
            rotation_seed: Some(9),
            ldlq: None,
            baseline: false,
            match_norms: false,
        };
        let got = code_projection("p", &w, out, inp, None, &coding).unwrap();
        let g = got.coded.layer.geometry;
        assert_eq!((g.t, g.axis, g.layout(), g.cols), (t, 0, layout, 1536), "T {t}");
        // The layer's weights by the reference path (x = I gives Wᵀ): their error is the coder's.
        let linear = got.coded.to_linear("p").unwrap();
        let eye: Vec<f32> = (0..inp * inp).map(|i| f32::from(u8::from(i % (inp + 1) == 0))).collect();
        let x = mlx_trellis::MlxArray::from_slice(&eye, &[inp, inp]).unwrap();
        let wt = linear.forward_with(&x, mlx_trellis::trellis::ForwardPath::Reference).unwrap();
        let wt = wt.to_vec::<f32>().unwrap();
        let sq: f64 = (0..out)
            .flat_map(|o| (0..inp).map(move |i| (o, i)))
            .map(|(o, i)| (f64::from(wt[i * out + o]) - f64::from(w[o * inp + i])).powi(2))
            .sum();
        let mse = sq / (out * inp) as f64;
        assert!((mse - got.coded.mse).abs() <= 1e-6 * got.coded.mse, "T {t}: mse {mse}, the coder's {}", got.coded.mse);
    }
}

#[test]
fn projections_coded_together_are_each_coded_as_alone() {
    use mlx_trellis::llama::calibrate::Hessian;
    use mlx_trellis::llama::coding::{code_projection, code_projections, ProjectionCoding, ProjectionJob};
    // Two axis-0 projections sharing H (gate and up), one along the inputs, one padded, one whose
    // H has the wrong width; rotated but one; a baseline on one. L 8, k 2.
    let shared = Hessian { n: 48, data: ill_conditioned(48, 600) };
    let wide = Hessian { n: 512, data: ill_conditioned(512, 601) };
    let small = Hessian { n: 300, data: identity(300, 1.0) };
    // (out, in, conventional axis, H, rotation seed, baseline).
    type Case<'a> = (usize, usize, u32, Option<&'a Hessian>, Option<u64>, bool);
    let cases: [Case<'_>; 6] = [
        (512, 48, 1, Some(&shared), Some(1), false),
        (512, 48, 1, Some(&shared), Some(2), true),
        (4, 512, 1, Some(&wide), Some(3), false),
        (200, 300, 1, Some(&small), Some(4), false),
        (256, 20, 0, Some(&shared), None, false),
        (512, 48, 1, None, Some(5), false),
    ];
    let weights: Vec<Vec<f32>> =
        cases.iter().map(|c| gaussian(c.0 * c.1, 610 + c.0 as u64 + c.1 as u64).unwrap()).collect();
    let names: Vec<String> = (0..cases.len()).map(|i| format!("p{i}")).collect();
    let jobs: Vec<ProjectionJob<'_>> = cases
        .iter()
        .zip(&weights)
        .zip(&names)
        .map(|((&(out, inp, axis, hessian, rotation_seed, baseline), w), module)| ProjectionJob {
            module,
            w,
            out_features: out,
            in_features: inp,
            hessian,
            coding: ProjectionCoding {
                encoder: EncoderConfig { l: 8, threads: Some(2), ..config(2, axis) },
                rotation_seed,
                ldlq: Some(LdlqConfig::default()),
                baseline,
                match_norms: false,
            },
        })
        .collect();
    let together = code_projections(&jobs, &mut |_, _| {}).unwrap();
    assert_eq!(together.len(), jobs.len());
    for (j, got) in jobs.iter().zip(&together) {
        let alone = code_projection(j.module, j.w, j.out_features, j.in_features, j.hessian, &j.coding).unwrap();
        let what = j.module;
        assert_eq!(got.coded.layer.codes, alone.coded.layer.codes, "{what}: codes");
        assert_eq!(got.coded.layer.scales, alone.coded.layer.scales, "{what}: scales");
        assert_eq!(got.coded.layer.geometry, alone.coded.layer.geometry, "{what}: geometry");
        assert_eq!(got.coded.mse.to_bits(), alone.coded.mse.to_bits(), "{what}: mse");
        assert_eq!(got.coded.mean_square.to_bits(), alone.coded.mean_square.to_bits(), "{what}: mean square");
        assert_eq!(got.choice, alone.choice, "{what}: axis");
        assert_eq!(got.proxy, alone.proxy, "{what}: proxy");
        assert_eq!(got.baseline_proxy, alone.baseline_proxy, "{what}: baseline proxy");
        assert_eq!(got.ldlq, alone.ldlq, "{what}: outcome");
        assert_eq!(got.warnings, alone.warnings, "{what}: warnings");
    }
    // The weighted ones are weighted, the others say why not.
    let weighted: Vec<bool> = together.iter().map(|c| matches!(c.ldlq, Some(LdlqOutcome::Weighted { .. }))).collect();
    assert_eq!(
        weighted,
        [true, true, true, true, false, false],
        "{:?}",
        together.iter().map(|c| &c.warnings).collect::<Vec<_>>()
    );
    assert!(together[1].baseline_proxy.is_some());
}

/// `match_norms`: the same codes, only the scales changed, so that every stored row of the
/// layer's logical weights (by the f64 reference path, x = I) has the dense row's norm to f16's
/// precision; the reported error is that of the rescaled weights. Plain and LDLQ codes, both
/// axes, rotated, with a Gaussian `W` whose rows differ in scale.
#[test]
fn matched_norms_keep_the_codes_and_give_each_stored_row_its_dense_norm() {
    use mlx_trellis::llama::calibrate::Hessian;
    use mlx_trellis::llama::coding::{code_projection, ProjectionCoding};
    use mlx_trellis::trellis::ForwardPath;
    let (out, inp) = (256usize, 512usize);
    let mut w = gaussian(out * inp, 630).unwrap();
    for (i, v) in w.iter_mut().enumerate() {
        *v *= 0.01 * (1.0 + (i / inp) as f32 / 64.0);
    }
    let h = Hessian { n: inp, data: ill_conditioned(inp, 631) };
    for axis in [0u32, 1] {
        for ldlq in [None, Some(LdlqConfig::default())] {
            let what = format!("axis {axis}, LDLQ {}", ldlq.is_some());
            let coding = |match_norms| ProjectionCoding {
                encoder: EncoderConfig { threads: Some(2), ..config(3, axis) },
                rotation_seed: Some(17),
                ldlq,
                baseline: false,
                match_norms,
            };
            let plain = code_projection("p", &w, out, inp, Some(&h), &coding(false)).unwrap();
            let matched = code_projection("p", &w, out, inp, Some(&h), &coding(true)).unwrap();
            assert_eq!(matched.choice.axis, axis, "{what}: both axes are whole blocks");
            assert_eq!(plain.coded.layer.codes, matched.coded.layer.codes, "{what}: the codes");
            assert_ne!(plain.coded.layer.scales, matched.coded.layer.scales, "{what}: the scales");
            let linear = matched.coded.to_linear("p").unwrap();
            let eye: Vec<f32> = (0..inp * inp).map(|i| f32::from(u8::from(i % (inp + 1) == 0))).collect();
            let x = mlx_trellis::MlxArray::from_slice(&eye, &[inp, inp]).unwrap();
            let wt = linear.forward_with(&x, ForwardPath::Reference).unwrap().to_vec::<f32>().unwrap(); // [in, out]
                                                                                                        // Stored row r: output r over the inputs (axis 1), input r over the outputs (axis 0).
            let (rows, n) = if axis == 1 { (out, inp) } else { (inp, out) };
            let at = |r: usize, c: usize| if axis == 1 { (r, c) } else { (c, r) }; // (output, input)
            let mut sq = 0f64;
            for r in 0..rows {
                let (mut have, mut want) = (0f64, 0f64);
                for c in 0..n {
                    let (o, i) = at(r, c);
                    let (d, v) = (f64::from(wt[i * out + o]), f64::from(w[o * inp + i]));
                    have += d * d;
                    want += v * v;
                    sq += (d - v).powi(2);
                }
                // One f16 rounding of the scale, and the f32 reference output.
                assert!((have.sqrt() / want.sqrt() - 1.0).abs() < 6e-4, "{what} row {r}: {have} against {want}");
            }
            let mse = sq / (out * inp) as f64;
            assert!(
                (matched.coded.mse / mse - 1.0).abs() < 1e-3,
                "{what}: reported {} against {mse}",
                matched.coded.mse
            );
            // Rescaling moves the squared error little, either way (the coder's scale is the
            // row's RMS over the codebook's, not the least-squares one).
            let ratio = matched.coded.mse / plain.coded.mse;
            assert!((0.9..1.1).contains(&ratio), "{what}: mse ratio {ratio}");
            println!("{what}: mse ratio {ratio:.4}");
        }
    }
}

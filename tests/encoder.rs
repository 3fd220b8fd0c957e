//! The encoder: cyclic paths, decode consistency, quality thresholds with teeth, determinism,
//! layouts, axes and parameter errors.

use half::f16;
use mlx_trellis::trellis::encoder::{
    block_path, encode, encode_linear, encode_with_progress, encode_with_search, fitting_block_len, lut_rms, quality,
    stored_from_linear, BlockSearch, Encoded, EncoderBackend, EncoderConfig, RELATIVE_MSE_BOUND,
};
use mlx_trellis::trellis::format::row_major_to_interleaved;
use mlx_trellis::trellis::reference::{block_state, block_words, expand, forward_f64, rel_err};
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::CodeLayout;

const T: usize = 256;

fn config(k: u32, l: u32) -> EncoderConfig {
    EncoderConfig::new(k, l)
}

/// The decoded weights equal the reported reconstruction bit for bit, and the reported mse is the
/// mean squared error recomputed from them (same summation order, so exactly equal).
fn assert_decode_matches(enc: &Encoded, input: &[f32], what: &str) {
    let decoded = expand(&enc.layer.codes, &enc.layer.scales, &enc.layer.geometry).unwrap();
    assert_eq!(decoded.len(), enc.reconstruction.len(), "{what}");
    let same = decoded.iter().zip(&enc.reconstruction).all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "{what}: reference decode differs from the encoder's reconstruction");
    let sq: f64 = input.iter().zip(&decoded).map(|(&w, &q)| (w as f64 - q as f64).powi(2)).sum();
    assert_eq!(sq / input.len() as f64, enc.mse, "{what}: reported mse");
}

/// The states block `b` of stored row `r` decodes to, after checking that they close the cycle:
/// the format's shift relation holds at every position, the wrap T-1 -> 0 included.
fn cyclic_states(enc: &Encoded, r: usize, b: usize, k: u32, l: u32) -> Vec<u32> {
    let g = enc.layer.geometry;
    let t = g.t as usize;
    let words = block_words(&enc.layer.codes, &g, r, b).unwrap();
    let decoded: Vec<u32> = (0..t).map(|p| block_state(words, p, k, l).unwrap()).collect();
    let low_mask = (1u32 << (l - k)) - 1;
    for p in 0..t {
        let prev = (p + t - 1) % t;
        assert_eq!(decoded[p] >> k, decoded[prev] & low_mask, "k {k} L {l} T {t} row {r} block {b} position {p}");
    }
    decoded
}

#[test]
fn viterbi_paths_close_the_cycle_and_are_what_the_codes_hold() {
    // Shipped widths, L - k not a multiple of k (3/10, 3/16, 5/11), and the extremes k = 1, 8.
    for (k, l) in [(2u32, 8u32), (3, 10), (4, 12), (3, 12), (1, 8), (5, 11), (8, 9), (3, 16)] {
        let (rows, cols) = (3, 512);
        let w = gaussian(rows * cols, 40 + k as u64 * 17 + l as u64).unwrap();
        let enc = encode(&w, rows, cols, &config(k, l)).unwrap();
        let low_mask = (1u32 << (l - k)) - 1;
        for r in 0..rows {
            let scale = enc.layer.scales[r].to_f32();
            for b in 0..cols / T {
                let decoded = cyclic_states(&enc, r, b, k, l);
                // The path the search chose is cyclic and is exactly what the packed codes hold.
                let x: Vec<f32> = w[r * cols + b * T..r * cols + (b + 1) * T].iter().map(|&v| v / scale).collect();
                let path = block_path(&x, k, l, BlockSearch::Viterbi).unwrap();
                assert_eq!(path[0] >> k, path[T - 1] & low_mask, "k {k} L {l}: the search's path does not close");
                assert_eq!(path, decoded, "k {k} L {l} row {r} block {b}: decoded states differ from the search's");
            }
        }
        assert_decode_matches(&enc, &w, &format!("k {k} L {l}"));
    }
}

#[test]
fn decoding_the_codes_gives_the_reported_reconstruction_and_mse() {
    let (rows, cols) = (6, 768);
    let mut w = gaussian(rows * cols, 3).unwrap();
    for v in &mut w[cols..2 * cols] {
        *v = 0.0; // an all-zero row: scale 0
    }
    for v in &mut w[2 * cols..3 * cols] {
        *v *= 0.013; // a row at a real model's scale
    }
    for v in &mut w[3 * cols..4 * cols] {
        *v *= 1e-9; // a row whose scale would underflow f16: scale 0
    }
    for (k, l) in [(2u32, 10u32), (3, 12), (4, 9)] {
        let enc = encode(&w, rows, cols, &config(k, l)).unwrap();
        assert_eq!(enc.layer.scales[1], f16::ZERO, "zero row");
        assert_eq!(enc.layer.scales[3], f16::ZERO, "tiny row");
        let others = [0, 2, 4, 5].map(|r| enc.layer.scales[r]);
        assert!(others.iter().all(|s| s.to_f32() > 0.0 && s.is_finite()), "{others:?}");
        let rms_ratio = enc.layer.scales[2].to_f32() / enc.layer.scales[0].to_f32();
        assert!((rms_ratio / 0.013 - 1.0).abs() < 0.1, "scales follow the row RMS: {rms_ratio}");
        assert_decode_matches(&enc, &w, &format!("k {k} L {l}"));
    }
}

#[test]
fn mse_thresholds_on_gaussian_data_pass_and_broken_searches_miss_them() {
    // 64 blocks of i.i.d. N(0, 1) at L = 8. Thresholds sit about 6 % above what the Viterbi
    // reaches on this data, and above the distortion-rate bound 2^(-2k) by construction.
    let (rows, cols, l) = (16, 1024, 8);
    for (k, threshold) in [(2u32, 0.092), (3, 0.0275), (4, 0.0085)] {
        let w = gaussian(rows * cols, 100 + k as u64).unwrap();
        let cfg = config(k, l);
        let mse = |search| encode_with_search(&w, rows, cols, &cfg, search).unwrap().mse;
        let viterbi = encode(&w, rows, cols, &cfg).unwrap();
        let bound = 0.25f64.powi(k as i32);
        assert!(
            viterbi.mse < threshold && viterbi.mse > bound,
            "k {k}: Viterbi mse {} vs threshold {threshold}",
            viterbi.mse
        );
        // The fast search reaches the textbook f64 Viterbi's distortion.
        let reference = mse(BlockSearch::ReferenceViterbi);
        assert!(
            (viterbi.mse - reference).abs() <= 1e-3 * reference,
            "k {k}: fast {} vs reference {reference}",
            viterbi.mse
        );
        for broken in
            [BlockSearch::Greedy, BlockSearch::NoTraceback, BlockSearch::WrongSuccessor, BlockSearch::NoTailBiting]
        {
            let m = mse(broken);
            assert!(
                m > threshold,
                "k {k}: the broken search {broken:?} reached mse {m}, under the threshold {threshold}"
            );
        }
    }
}

/// Blocks shorter (and longer) than 256: every block is the reference f64 Viterbi's cyclic path
/// (same cost to 1e-6), the codes decode to the reported reconstruction, and the distortion
/// stays within 3 % of T 256's on the same Gaussian data from 64 weights on (shorter blocks are
/// measurably worse: k 2 at T 16 and k 4 at T 8 by a third and more).
#[test]
fn shorter_blocks_code_to_the_reference_paths_and_keep_the_distortion() {
    let (rows, l) = (4usize, 10u32);
    for (k, t) in [(2u32, 64usize), (2, 16), (3, 96), (3, 192), (4, 8), (4, 192), (3, 32), (2, 512)] {
        // 1536 is whole blocks of every T here and of 256, so the T 256 coding of the same weights
        // is the comparison.
        let cols = 1536;
        let w = gaussian(rows * cols, 900 + k as u64 * 31 + t as u64).unwrap();
        let cfg = EncoderConfig { t: t as u32, ..config(k, l) };
        let enc = encode(&w, rows, cols, &cfg).unwrap();
        let g = enc.layer.geometry;
        assert_eq!((g.t as usize, g.cols, g.words_per_block()), (t, cols, t * k as usize / 32), "k {k} T {t}");
        assert_decode_matches(&enc, &w, &format!("k {k} T {t}"));
        let lut = mlx_trellis::trellis::format::codebook::lut1mad(l).unwrap();
        let cost = |x: &[f32], path: &[u32]| -> f64 {
            x.iter().zip(path).map(|(&v, &s)| (f64::from(v) - f64::from(lut[s as usize])).powi(2)).sum()
        };
        for r in 0..rows {
            let scale = enc.layer.scales[r].to_f32();
            for b in 0..cols / t {
                let decoded = cyclic_states(&enc, r, b, k, l);
                let x: Vec<f32> = w[r * cols + b * t..][..t].iter().map(|&v| v / scale).collect();
                assert_eq!(block_path(&x, k, l, BlockSearch::Viterbi).unwrap(), decoded, "k {k} T {t} r {r} b {b}");
                let reference = block_path(&x, k, l, BlockSearch::ReferenceViterbi).unwrap();
                let (fast, slow) = (cost(&x, &decoded), cost(&x, &reference));
                assert!((fast - slow).abs() <= 1e-6 * slow.max(1e-12), "k {k} T {t}: cost {fast} vs reference {slow}");
            }
        }
        let long = encode(&w, rows, cols, &config(k, l)).unwrap();
        println!("k {k} T {t}: mse {:.5} against T 256's {:.5}", enc.mse, long.mse);
        if t >= 64 {
            assert!(enc.mse < 1.03 * long.mse, "k {k} T {t}: mse {} against T 256's {}", enc.mse, long.mse);
        } else {
            // Blocks under 64 weights pay for their tail-biting: a measurably worse code.
            assert!(enc.mse > long.mse, "k {k} T {t}: mse {} against T 256's {}", enc.mse, long.mse);
        }
    }
}

#[test]
fn the_fitting_block_length_divides_an_axis_or_leaves_t_256() {
    // SmolLM2: attention 576 / 192 wide, MLP 1536 along one side.
    assert_eq!(fitting_block_len(576, 576, 1).unwrap(), 192);
    assert_eq!(fitting_block_len(192, 576, 1).unwrap(), 192);
    assert_eq!(fitting_block_len(1536, 576, 0).unwrap(), 256);
    assert_eq!(fitting_block_len(576, 1536, 1).unwrap(), 256);
    // The longest multiple of 32 under 256 that divides either side, the conventional one first.
    assert_eq!(fitting_block_len(640, 640, 1).unwrap(), 160);
    assert_eq!(fitting_block_len(96, 224, 1).unwrap(), 224);
    assert_eq!(fitting_block_len(96, 100, 1).unwrap(), 96);
    // Nothing divides: padded to 256.
    assert_eq!(fitting_block_len(100, 100, 0).unwrap(), 256);
    assert!(fitting_block_len(0, 576, 1).is_err());
}

/// The relative mean squared error of stored row `r` of `enc` against `w`.
fn row_relative_error(enc: &Encoded, w: &[f32], r: usize, cols: usize) -> f64 {
    let (row, rec) = (&w[r * cols..(r + 1) * cols], &enc.reconstruction[r * cols..(r + 1) * cols]);
    let sq: f64 = row.iter().zip(rec).map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2)).sum();
    sq / row.iter().map(|&a| f64::from(a).powi(2)).sum::<f64>()
}

#[test]
fn zero_and_tiny_rows_decode_to_exact_zeros_and_small_rows_keep_their_relative_error() {
    let (k, l, cols) = (3u32, 12u32, 512usize);
    let g = gaussian(4 * cols, 21).unwrap();
    // Row 0 all zeros, row 1 of RMS 0.02, row 2 of RMS 1e-9 (its scale would underflow f16),
    // row 3 of RMS 1e-4 · RMS(lut) (just inside f16's normal range).
    let rms = [0.0, 0.02, 1e-9, 1e-4 * lut_rms(l).unwrap()];
    let w: Vec<f32> = g.iter().enumerate().map(|(i, &v)| v * rms[i / cols] as f32).collect();
    let enc = encode(&w, 4, cols, &config(k, l)).unwrap();
    assert_decode_matches(&enc, &w, "zero and tiny rows");
    for r in [0, 2] {
        assert_eq!(enc.layer.scales[r].to_f32(), 0.0, "row {r}: scale");
        assert!(enc.reconstruction[r * cols..(r + 1) * cols].iter().all(|&v| v == 0.0), "row {r} decodes to zeros");
    }
    // The tiny row loses its energy and nothing more (relative error exactly 1, never noise).
    assert_eq!(row_relative_error(&enc, &w, 2, cols), 1.0);
    // The small row codes as well as the ordinary one.
    let (ordinary, small) = (row_relative_error(&enc, &w, 1, cols), row_relative_error(&enc, &w, 3, cols));
    assert!(ordinary < 0.03 && small < 1.5 * ordinary, "ordinary {ordinary}, small {small}");
    let q = quality(&w, &enc).unwrap();
    assert_eq!((q.zero_rows, q.flushed_rows), (1, 1));
    assert!(q.passes() && q.relative_mse > 0.0, "{q:?}");

    // A matrix of tiny rows only decodes to zeros: relative error 1, which misses the gate.
    let tiny: Vec<f32> = g.iter().map(|&v| v * 1e-9).collect();
    let enc = encode(&tiny, 4, cols, &config(k, l)).unwrap();
    let q = quality(&tiny, &enc).unwrap();
    assert!((q.relative_mse - 1.0).abs() < 1e-12 && q.flushed_rows == 4 && !q.passes(), "{q:?}");
    // An all-zero matrix codes exactly.
    let zeros = vec![0f32; 4 * cols];
    let enc = encode(&zeros, 4, cols, &config(k, l)).unwrap();
    assert!(enc.reconstruction.iter().all(|&v| v == 0.0) && enc.mse == 0.0);
    let q = quality(&zeros, &enc).unwrap();
    assert!(q.relative_mse == 0.0 && q.zero_rows == 4 && q.passes(), "{q:?}");
}

#[test]
fn the_relative_error_bound_holds_for_gaussian_and_heavy_tailed_rows_and_has_teeth() {
    // Every k at the smallest L the encoder takes for it and at L = 12, on Gaussian rows and on
    // the cubes of Gaussian values (heavy tails the code clips).
    let (rows, cols) = (4, 512);
    assert_eq!(RELATIVE_MSE_BOUND, 0.5);
    for k in 1u32..=8 {
        for (l, cube) in [((k + 1).max(8), false), (12, false), (12, true)] {
            let g = gaussian(rows * cols, 300 + k as u64).unwrap();
            let w: Vec<f32> = if cube { g.iter().map(|&v| v * v * v).collect() } else { g };
            let enc = encode(&w, rows, cols, &config(k, l)).unwrap();
            let q = quality(&w, &enc).unwrap();
            assert!(q.passes(), "k {k} L {l} cube {cube}: {q:?}");
            // The same codes with every scale negated (a broken coder) miss it.
            let negated: Vec<f32> = enc.reconstruction.iter().map(|&v| -v).collect();
            let broken = Encoded { reconstruction: negated.clone(), mse: mse_of(&w, &negated), ..enc.clone() };
            assert!(!quality(&w, &broken).unwrap().passes(), "k {k} L {l} cube {cube}: negated scales pass");
        }
    }
}

fn mse_of(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2)).sum::<f64>() / a.len() as f64
}

#[test]
fn the_same_input_gives_the_same_bytes_for_any_thread_count() {
    let (rows, cols) = (7, 512);
    let w = gaussian(rows * cols, 9).unwrap();
    let run = |threads| encode(&w, rows, cols, &EncoderConfig { threads, ..config(3, 10) }).unwrap();
    let one = run(Some(1));
    for threads in [Some(2), Some(3), Some(16), None] {
        let other = run(threads);
        assert_eq!(one.layer.codes, other.layer.codes, "{threads:?}");
        assert_eq!(one.layer.scales, other.layer.scales, "{threads:?}");
        assert!(one.reconstruction.iter().zip(&other.reconstruction).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert_eq!(one.mse.to_bits(), other.mse.to_bits());
    }
}

#[test]
fn both_layouts_hold_the_same_codes() {
    let (rows, cols) = (5, 1024);
    let w = gaussian(rows * cols, 21).unwrap();
    let row_major = encode(&w, rows, cols, &config(3, 12)).unwrap();
    let interleaved =
        encode(&w, rows, cols, &EncoderConfig { layout: CodeLayout::K3Interleaved, ..config(3, 12) }).unwrap();
    assert_eq!(row_major.layer.geometry.codes_shape(), vec![rows, cols * 3 / 32]);
    assert_eq!(interleaved.layer.geometry.codes_shape(), vec![cols / 512, rows, 48]);
    assert_eq!(interleaved.layer.geometry.layout(), CodeLayout::K3Interleaved);
    assert_eq!(interleaved.layer.codes, row_major_to_interleaved(&row_major.layer.codes, rows, cols).unwrap());
    assert_eq!(interleaved.layer.scales, row_major.layer.scales);
    assert_eq!(interleaved.reconstruction, row_major.reconstruction);
    assert_decode_matches(&interleaved, &w, "interleaved");
    assert_decode_matches(&row_major, &w, "row-major");
}

#[test]
fn axis_zero_and_one_through_the_linear_helper() {
    // W [out, in] = [256, 512]: axis 0 stores Wᵀ [512, 256], axis 1 stores W [256, 512].
    let (out_f, in_f) = (256, 512);
    let w = gaussian(out_f * in_f, 31).unwrap();
    let x = gaussian(2 * in_f, 32).unwrap();
    let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let dense: Vec<f64> = (0..2)
        .flat_map(|m| (0..out_f).map(move |o| (m, o)))
        .map(|(m, o)| (0..in_f).map(|i| x64[m * in_f + i] * w[o * in_f + i] as f64).sum())
        .collect();
    for axis in [0u32, 1] {
        let cfg = EncoderConfig { axis, ..config(4, 10) };
        let enc = encode_linear(&w, out_f, in_f, &cfg).unwrap();
        let g = enc.layer.geometry;
        assert_eq!((g.axis, g.in_features(), g.out_features()), (axis, in_f, out_f));
        let (stored, rows, cols) = stored_from_linear(&w, out_f, in_f, axis).unwrap();
        assert_eq!((rows, cols), if axis == 0 { (in_f, out_f) } else { (out_f, in_f) });
        assert_eq!(stored[3 * cols + 5], if axis == 0 { w[5 * in_f + 3] } else { w[3 * in_f + 5] });
        assert_eq!(enc.layer.codes, encode(&stored, rows, cols, &cfg).unwrap().layer.codes);
        assert_decode_matches(&enc, &stored, &format!("axis {axis}"));
        // The coded layer computes x · Wᵀ up to the quantization error.
        let y = forward_f64(&x64, 2, &enc.layer.codes, &enc.layer.scales, &g).unwrap();
        let err = rel_err(&y, &dense).unwrap();
        assert!(err < 0.2, "axis {axis}: relErr {err} against the dense layer");
    }
}

#[test]
fn progress_is_reported_for_every_row() {
    let (rows, cols) = (5, 256);
    let w = gaussian(rows * cols, 4).unwrap();
    let mut seen = Vec::new();
    encode_with_progress(&w, rows, cols, &config(2, 8), &mut |done, total| seen.push((done, total))).unwrap();
    assert_eq!(seen, (1..=rows).map(|d| (d, rows)).collect::<Vec<_>>());
}

#[test]
fn bad_parameters_are_refused_with_clear_errors() {
    let w = gaussian(2 * 512, 1).unwrap();
    let err =
        |cfg: EncoderConfig, w: &[f32], rows: usize, cols: usize| encode(w, rows, cols, &cfg).unwrap_err().to_string();
    let expect = |msg: String, needle: &str| assert!(msg.contains(needle), "{msg:?} should mention {needle:?}");
    expect(err(config(0, 12), &w, 2, 512), "k = 0 bits per weight is outside 1..=8");
    expect(err(config(9, 12), &w, 2, 512), "k = 9 bits per weight is outside 1..=8");
    expect(err(EncoderConfig { t: 0, ..config(3, 12) }, &w, 2, 512), "block length T = 0 is outside");
    expect(err(EncoderConfig { t: 2048, ..config(3, 12) }, &w, 2, 512), "block length T = 2048 is outside");
    expect(err(EncoderConfig { t: 16, ..config(3, 12) }, &w, 2, 512), "T*k % 32 != 0 with T = 16");
    expect(
        err(EncoderConfig { t: 192, backend: EncoderBackend::Cuda, ..config(3, 12) }, &w, 2, 576),
        "the CUDA search serves T = 256",
    );
    expect(err(EncoderConfig { t: 192, ..config(3, 12) }, &w, 2, 512), "cols % T != 0");
    expect(
        err(EncoderConfig { t: 128, layout: CodeLayout::K3Interleaved, ..config(3, 12) }, &w, 2, 512),
        "T = 256 (got k = 3, L = 12, axis = 0, T = 128)",
    );
    expect(err(config(3, 7), &w, 2, 512), "L = 7 state bits is outside 8..=16");
    expect(err(config(3, 17), &w, 2, 512), "L = 17 state bits is outside 8..=16");
    expect(err(config(8, 8), &w, 2, 512), "L = 8 state bits must be greater than k = 8");
    expect(err(EncoderConfig { axis: 2, ..config(3, 12) }, &w, 2, 512), "axis = 2");
    expect(
        err(EncoderConfig { layout: CodeLayout::K3Interleaved, ..config(2, 12) }, &w, 2, 512),
        "K3Interleaved needs k = 3",
    );
    expect(err(EncoderConfig { layout: CodeLayout::K3Interleaved, axis: 1, ..config(3, 12) }, &w, 2, 512), "axis = 1");
    expect(err(EncoderConfig { layout: CodeLayout::K3Interleaved, ..config(3, 12) }, &w, 4, 256), "cols % 512 == 0");
    expect(err(EncoderConfig { threads: Some(0), ..config(3, 12) }, &w, 2, 512), "threads = 0");
    expect(err(config(3, 12), &w, 3, 512), "1024 weights given for 3 rows x 512 columns");
    expect(err(config(3, 12), &w[..2 * 300], 2, 300), "cols % T != 0");
    expect(err(config(3, 12), &[], 0, 512), "empty");
    let mut bad = w.clone();
    bad[512 + 7] = f32::NAN;
    expect(err(config(3, 12), &bad, 2, 512), "row 1, column 7 is NaN");
    bad[0] = f32::INFINITY;
    expect(err(config(3, 12), &bad, 2, 512), "row 0, column 0 is inf");
    let huge = vec![1e6f32; 512];
    expect(err(config(3, 12), &huge, 1, 512), "too large for an f16 scale");
    let msg = encode_linear(&w, 3, 512, &config(3, 12)).unwrap_err().to_string();
    expect(msg, "the linear weight has 1024 values, expected [out 3, in 512]");
    expect(block_path(&w[..100], 3, 12, BlockSearch::Viterbi).unwrap_err().to_string(), "T*k % 32 != 0 with T = 100");
    expect(block_path(&[0.0; 1025], 3, 12, BlockSearch::Viterbi).unwrap_err().to_string(), "longer than T = 1024");
}

/// The quality table of the README: mean squared error on i.i.d. N(0, 1) data, 1024 blocks per
/// entry. Slow at L = 16 (seconds per entry); run by hand:
/// `cargo test --release --test encoder -- --ignored --nocapture`.
#[test]
#[ignore = "docs/encoder.md's quality table: minutes at L = 16; run by hand"]
fn quality_table() {
    let (rows, cols) = (256, 1024);
    println!("| L | k | mse | weights/s |\n|---|---|---|---|");
    for l in [16u32, 12] {
        for k in [2u32, 3, 4] {
            let w = gaussian(rows * cols, 1000 + k as u64).unwrap();
            let start = std::time::Instant::now();
            let enc = encode(&w, rows, cols, &config(k, l)).unwrap();
            let rate = (rows * cols) as f64 / start.elapsed().as_secs_f64();
            println!("| {l} | {k} | {:.5} | {rate:.3e} |", enc.mse);
        }
    }
}

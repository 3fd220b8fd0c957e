//! A real kernel body of the project (the factored trellis row kernel) run
//! through the simulator and checked against an independent Rust reference.

mod common;

use common::Rng;
use msl_sim::{run_with_report, HostTensor, KernelDesc, Launch, ScalarType, TemplateArg};

const HEADER: &str = r#"
constant constexpr float TRELLIS_RCP = 1.0f / 147.800537109375f;
inline float trellis_y_f32(uint s) {
  uint x = s * 34038481u + 76625530u;
  uint bs = (x & 0xffu) + ((x >> 8) & 0xffu) + ((x >> 16) & 0xffu) + (x >> 24);
  return as_type<float>(0x4B000000u | bs) - 8389118.0f;
}
"#;

const ROW_KERNEL: &str = r#"
  const uint lane = thread_index_in_simdgroup;
  const uint sg = simdgroup_index_in_threadgroup;
  const uint wpb = (uint)(BT * K / 32);
  const uint nb = 32u / wpb;
  const uint nBlocks = (uint)C / (uint)BT;
  const uint groups = (nBlocks + nb - 1u) / nb;
  const uint group = thread_position_in_grid.y * (uint)SG_TG + sg;
  const uint split = thread_position_in_grid.z;
  const uint bi = lane / wpb;
  const uint wi = lane - bi * wpb;
  const uint blk = group * nb + bi;
  const bool active = (group < groups) && (bi < nb) && (blk < nBlocks);
  const uint nbrLane = bi * wpb + ((wi + 1u == wpb) ? 0u : wi + 1u);
  const uint pBase = 32u * wi;
  const uint p0 = ((pBase + (uint)K - 1u) / (uint)K) * (uint)K;
  uint offs[NP];
  bool valid[NP];
  bool spill[NP];
  uint cols[NP];
  #pragma clang loop unroll(full)
  for (uint i = 0; i < (uint)NP; ++i) {
    const uint p = p0 + i * (uint)K;
    valid[i] = active && (p < pBase + 32u);
    offs[i] = p - pBase;
    spill[i] = offs[i] + (uint)L > 32u;
    const uint t = (uint)BT - 1u - p / (uint)K;
    cols[i] = blk * (uint)BT + t;
  }
  const ulong rowWords = (ulong)nBlocks * wpb;
  const uint rowsPer = ((uint)R + (uint)SPLITS - 1u) / (uint)SPLITS;
  const uint r0 = split * rowsPer;
  const uint r1 = metal::min((uint)R, r0 + rowsPer);
  const device uint32_t* col0 = codes + (ulong)blk * wpb + wi;
  const uint mask = (1u << (uint)L) - 1u;
  float acc[NP];
  #pragma clang loop unroll(full)
  for (uint i = 0; i < (uint)NP; ++i) acc[i] = 0.0f;
  for (uint r = r0; r < r1; ++r) {
    const uint word = active ? col0[(ulong)r * rowWords] : 0u;
    const uint nxt = metal::simd_shuffle(word, (ushort)nbrLane);
    const float xr = float(x[r]);
    const float sr = float(scales[r]);
    #pragma clang loop unroll(full)
    for (uint i = 0; i < (uint)NP; ++i) {
      uint win = word >> offs[i];
      if (spill[i]) win |= nxt << (32u - offs[i]);
      win &= mask;
      acc[i] = metal::fma(trellis_y_f32(win), xr * (sr * TRELLIS_RCP), acc[i]);
    }
  }
  const ulong outBase = (ulong)split * (ulong)C;
  #pragma clang loop unroll(full)
  for (uint i = 0; i < (uint)NP; ++i)
    if (valid[i]) partial[outBase + cols[i]] = acc[i];
"#;

const T_BLOCK: usize = 256;

/// The trellis decoder value of an L-bit state (independent of the header).
fn trellis_y(s: u32) -> f64 {
    let x = s.wrapping_mul(34038481).wrapping_add(76625530);
    let bytes: u32 = x.to_le_bytes().iter().map(|&b| u32::from(b)).sum();
    f64::from(bytes) - 510.0
}

/// Bit `bit` of a block of `T*k` bits stored LSB-first in u32 words.
fn block_bit(words: &[u32], bit: usize) -> u32 {
    (words[bit / 32] >> (bit % 32)) & 1
}

/// The state of position t: the L-bit window starting at bit (T-1-t)*k,
/// wrapping around the end of the block.
fn state(words: &[u32], k: usize, l: usize, t: usize) -> u32 {
    let nbits = T_BLOCK * k;
    let start = (T_BLOCK - 1 - t) * k;
    (0..l).fold(0u32, |s, j| s | block_bit(words, (start + j) % nbits) << j)
}

/// Output column c of row r weighted by x and the scale, summed over rows.
fn reference(x: &[f32], scales: &[f32], codes: &[u32], r_rows: usize, c_cols: usize, k: usize, l: usize) -> Vec<f64> {
    let row_words = c_cols * k / 32;
    let wpb = T_BLOCK * k / 32;
    let rcp = 1.0 / 147.800537109375f64;
    let mut out = vec![0.0f64; c_cols];
    for r in 0..r_rows {
        let row = &codes[r * row_words..(r + 1) * row_words];
        for (c, o) in out.iter_mut().enumerate() {
            let (b, t) = (c / T_BLOCK, c % T_BLOCK);
            let words = &row[b * wpb..(b + 1) * wpb];
            *o += f64::from(x[r]) * f64::from(scales[r]) * rcp * trellis_y(state(words, k, l, t));
        }
    }
    out
}

#[test]
fn factored_row_kernel_matches_reference() {
    let (r_rows, c_cols, l, splits, sg_tg) = (200usize, 512usize, 12i32, 128usize, 4usize);
    for k in [2usize, 3, 4] {
        let mut rng = Rng::new(100 + k as u64);
        let x: Vec<f32> = (0..r_rows).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let scales = HostTensor::from_f32_as(
            ScalarType::F16,
            &[r_rows],
            &(0..r_rows).map(|_| rng.uniform(0.5, 2.0)).collect::<Vec<_>>(),
        );
        let row_words = c_cols * k / 32;
        let codes: Vec<u32> = (0..r_rows * row_words).map(|_| rng.next_u32()).collect();

        let wpb = T_BLOCK * k / 32;
        let nb = 32 / wpb;
        let groups = (c_cols / T_BLOCK).div_ceil(nb);
        let np = 32usize.div_ceil(k);
        let desc =
            KernelDesc::new("trellis_row", &["x", "codes", "scales"], &["partial"], ROW_KERNEL).with_header(HEADER);
        let mut launch = Launch::new(
            vec![(vec![1, splits, c_cols], ScalarType::F32)],
            [128, groups.div_ceil(sg_tg), splits],
            [128, 1, 1],
        );
        for (name, v) in [
            ("M", 1),
            ("R", r_rows as i32),
            ("C", c_cols as i32),
            ("BT", T_BLOCK as i32),
            ("K", k as i32),
            ("L", l),
            ("SG_TG", sg_tg as i32),
            ("SPLITS", splits as i32),
            ("NP", np as i32),
        ] {
            launch = launch.template(name, TemplateArg::Int(v));
        }
        launch = launch.template("T", TemplateArg::Dtype(ScalarType::F32));

        let report = run_with_report(
            &desc,
            &[
                HostTensor::from_f32(&[1, r_rows], &x),
                HostTensor::from_u32(&[r_rows, row_words], &codes),
                scales.clone(),
            ],
            &launch,
        )
        .unwrap();
        eprintln!(
            "trellis row kernel K={k}: compile {:.2} s{}, run {:.3} s",
            report.compile_seconds,
            if report.cached { " (cached)" } else { "" },
            report.run_seconds
        );
        let partial = &report.outputs[0];
        assert!(partial.poison_indices().is_empty(), "K={k}: some partial outputs were never written");
        let partial = partial.to_f32_vec();
        let mut summed = vec![0.0f64; c_cols];
        for s in 0..splits {
            for c in 0..c_cols {
                summed[c] += f64::from(partial[s * c_cols + c]);
            }
        }
        let want = reference(&x, &scales.to_f32_vec(), &codes, r_rows, c_cols, k, l as usize);
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let worst = summed.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-5 * scale, "K={k}: max error {worst} vs max |ref| {scale}");
    }
}

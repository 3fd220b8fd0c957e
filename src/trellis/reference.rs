//! The reference decoder: plain Rust, independent of MLX and of every kernel.
//!
//! It follows the format's definition literally (spec §3): the state of position `t` of a block
//! is the `L`-bit window starting at bit `(T-1-t)*k`, wrapping cyclically inside the block; the
//! weight is `value(state) * scale[row]`. [`forward_f64`] decodes and accumulates in f64 and is
//! what every kernel is checked against.

use half::f16;

use crate::error::{invalid, Result};

use super::format::codebook::{value, value_f64};
use super::format::{HostLayer, TrellisGeometry};

/// The state of position `t` of one block given as its words (`block.len() * 32 / k` positions).
pub fn block_state(block: &[u32], t: usize, k: u32, l: u32) -> u32 {
    let bits = block.len() * 32;
    let positions = bits / k as usize;
    debug_assert!(t < positions);
    let p = (positions - 1 - t) * k as usize;
    let mut state = 0u32;
    // Bit by bit, the definition as written: bit i of the window is bit (p + i) mod (T*k) of the
    // block, and bit q of the block is bit (q & 31) of word (q >> 5).
    for i in 0..l as usize {
        let q = (p + i) % bits;
        state |= ((block[q >> 5] >> (q & 31)) & 1) << i;
    }
    state
}

/// The words of block `b` of stored row `r` (contiguous in both layouts).
pub fn block_words<'a>(codes: &'a [u32], g: &TrellisGeometry, r: usize, b: usize) -> &'a [u32] {
    let start = g.word_index(r, b, 0);
    &codes[start..start + g.words_per_block()]
}

/// The state of stored row `r`, column `c`.
pub fn state_at(codes: &[u32], g: &TrellisGeometry, r: usize, c: usize) -> u32 {
    let t = g.t as usize;
    block_state(block_words(codes, g, r, c / t), c % t, g.k, g.l)
}

/// The f32 weight of stored row `r`, column `c`: `value(state) * f32(scale[r])`, the value the
/// dense expansion on MLX must reproduce bit for bit.
pub fn weight_at(codes: &[u32], scales: &[f16], g: &TrellisGeometry, r: usize, c: usize) -> f32 {
    value(state_at(codes, g, r, c)) * scales[r].to_f32()
}

fn check_sizes(codes: &[u32], scales: &[f16], g: &TrellisGeometry) -> Result<()> {
    let words: usize = g.codes_shape().iter().product();
    if codes.len() != words {
        invalid!("reference decoder: {} code words for geometry {g} (expected {words})", codes.len());
    }
    if scales.len() != g.rows {
        invalid!(
            "reference decoder: {} scales for geometry {g} (expected one per stored row, {})",
            scales.len(),
            g.rows
        );
    }
    Ok(())
}

/// Calls `f(c, state)` for every column of stored row `r`, decoding each block once (fast path of
/// [`state_at`]: the window read from a 64-bit pair of words, the last word followed by the first).
fn for_each_state(codes: &[u32], g: &TrellisGeometry, r: usize, mut f: impl FnMut(usize, u32)) {
    let (t, k, wpb) = (g.t as usize, g.k as usize, g.words_per_block());
    let mask = (1u64 << g.l) - 1;
    let mut ext = vec![0u32; wpb + 1];
    for b in 0..g.blocks_per_row() {
        let words = block_words(codes, g, r, b);
        ext[..wpb].copy_from_slice(words);
        ext[wpb] = words[0];
        for pos in 0..t {
            let p = (t - 1 - pos) * k;
            let (wi, off) = (p >> 5, p & 31);
            let pair = (ext[wi] as u64) | ((ext[wi + 1] as u64) << 32);
            f(b * t + pos, ((pair >> off) & mask) as u32);
        }
    }
}

/// The whole stored matrix `[rows, cols]` as f32 weights (row-major).
pub fn expand(codes: &[u32], scales: &[f16], g: &TrellisGeometry) -> Result<Vec<f32>> {
    check_sizes(codes, scales, g)?;
    let mut out = vec![0f32; g.rows * g.cols];
    for (r, row) in out.chunks_mut(g.cols).enumerate() {
        let s = scales[r].to_f32();
        for_each_state(codes, g, r, |c, state| row[c] = value(state) * s);
    }
    Ok(out)
}

/// `y = x · W` for `m` activation rows `x` `[m, in]`, decoded and accumulated in f64; returns
/// `[m, out]`. Weights are `value_f64(state) * scale` (no f32 rounding anywhere).
pub fn forward_f64(x: &[f64], m: usize, codes: &[u32], scales: &[f16], g: &TrellisGeometry) -> Result<Vec<f64>> {
    check_sizes(codes, scales, g)?;
    let (inf, outf) = (g.in_features(), g.out_features());
    if x.len() != m * inf {
        invalid!("reference forward: x has {} values, expected [{m}, {inf}]", x.len());
    }
    let table: Vec<f64> = (0..1u32 << g.l).map(value_f64).collect();
    // Split the stored rows over the machine's threads; each accumulates its own [m, out].
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(g.rows).max(1);
    let per = g.rows.div_ceil(threads);
    let partials: Vec<Vec<f64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let table = &table;
                scope.spawn(move || {
                    let mut y = vec![0f64; m * outf];
                    // With more threads than rows per thread fill, the last ranges are empty.
                    let rows = (i * per).min(g.rows)..((i + 1) * per).min(g.rows);
                    for (r, scale) in rows.clone().zip(&scales[rows]) {
                        let s = scale.to_f64();
                        for_each_state(codes, g, r, |c, state| {
                            let w = table[state as usize] * s;
                            // axis 0: stored [in, out] (r = input, c = output); axis 1: [out, in].
                            let (input, output) = if g.axis == 0 { (r, c) } else { (c, r) };
                            for mi in 0..m {
                                y[mi * outf + output] += x[mi * inf + input] * w;
                            }
                        });
                    }
                    y
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("reference worker panicked")).collect()
    });
    let mut y = vec![0f64; m * outf];
    for p in partials {
        for (a, b) in y.iter_mut().zip(p) {
            *a += b;
        }
    }
    Ok(y)
}

/// `silu(x · Wg) ⊙ (x · Wu)` for `m` activation rows, in f64 (the gate and up projections of a
/// coded MLP, spec §9): `[m, intermediate]`.
pub fn swiglu_f64(x: &[f64], m: usize, gate: &HostLayer, up: &HostLayer) -> Result<Vec<f64>> {
    let g = forward_f64(x, m, &gate.codes, &gate.scales, &gate.geometry)?;
    let u = forward_f64(x, m, &up.codes, &up.scales, &up.geometry)?;
    if g.len() != u.len() {
        invalid!("reference SwiGLU: gate gives {} values and up {}", g.len(), u.len());
    }
    Ok(g.iter().zip(&u).map(|(&g, &u)| g / (1.0 + (-g).exp()) * u).collect())
}

/// `down(silu(x · Wg) ⊙ (x · Wu))` for `m` activation rows, in f64 with no rounding anywhere.
pub fn mlp_forward_f64(x: &[f64], m: usize, gate: &HostLayer, up: &HostLayer, down: &HostLayer) -> Result<Vec<f64>> {
    let h = swiglu_f64(x, m, gate, up)?;
    forward_f64(&h, m, &down.codes, &down.scales, &down.geometry)
}

/// `relErr = max|a - b| / max|b|`, the gate every kernel is held to.
pub fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "rel_err of slices of different lengths");
    let num = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    let den = b.iter().map(|y| y.abs()).fold(0.0, f64::max);
    if a.iter().any(|v| v.is_nan()) {
        return f64::INFINITY;
    }
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sets bits `[from, from + len)` of a block (cyclically) to the low bits of `v`.
    fn put(block: &mut [u32], from: usize, len: usize, v: u32) {
        let bits = block.len() * 32;
        for i in 0..len {
            let q = (from + i) % bits;
            let bit = (v >> i) & 1;
            block[q >> 5] = (block[q >> 5] & !(1 << (q & 31))) | (bit << (q & 31));
        }
    }

    #[test]
    fn hand_built_blocks_decode_at_every_position_including_the_wrap() {
        for (k, l) in [(2u32, 12u32), (3, 12), (4, 12), (2, 8), (3, 9), (4, 16)] {
            let t = 256usize;
            let wpb = t * k as usize / 32;
            for pos in [0usize, 1, 2, 100, t - 3, t - 2, t - 1] {
                // Plant a distinctive L-bit pattern at position `pos`'s window on a zero block.
                let mut block = vec![0u32; wpb];
                let pattern = 0b1011_0110_1101_0111u32 & ((1 << l) - 1);
                let p = (t - 1 - pos) * k as usize;
                put(&mut block, p, l as usize, pattern);
                assert_eq!(block_state(&block, pos, k, l), pattern, "k {k} L {l} position {pos}");
                // The window of position 0 starts at the block's last symbol and wraps to bit 0.
                if pos == 0 {
                    assert!(p + l as usize > t * k as usize, "position 0 wraps (k {k} L {l})");
                    let low_bits = (t * k as usize) - p; // bits before the end of the block
                    assert_eq!(block[0] & ((1 << (l as usize - low_bits)) - 1), pattern >> low_bits);
                }
            }
            // A block of all ones decodes to the all-ones state everywhere.
            let ones = vec![u32::MAX; wpb];
            assert!((0..t).all(|pos| block_state(&ones, pos, k, l) == (1 << l) - 1));
        }
    }

    #[test]
    fn consecutive_states_satisfy_the_cyclic_shift_relation() {
        let mut rng = super::super::synthetic::SplitMix64::new(5);
        for k in [2u32, 3, 4] {
            let l = 12;
            let block: Vec<u32> = (0..256 * k as usize / 32).map(|_| rng.next_u32()).collect();
            for t in 0..256usize {
                let prev = (t + 255) % 256;
                let (s, sp) = (block_state(&block, t, k, l), block_state(&block, prev, k, l));
                assert_eq!(s >> k, sp & ((1 << (l - k)) - 1), "k {k} t {t}");
            }
        }
    }

    #[test]
    fn fast_decode_equals_the_bitwise_definition() {
        let mut rng = super::super::synthetic::SplitMix64::new(9);
        for (k, l) in [(2u32, 12u32), (3, 12), (4, 12), (3, 16), (2, 9)] {
            let g = TrellisGeometry::row_major(3, 512, k, 256, l, 0).unwrap();
            let codes: Vec<u32> = (0..3 * 512 * k as usize / 32).map(|_| rng.next_u32()).collect();
            for r in 0..3 {
                for_each_state(&codes, &g, r, |c, s| assert_eq!(s, state_at(&codes, &g, r, c)));
            }
        }
    }

    #[test]
    fn rel_err_is_max_abs_over_max_abs() {
        assert_eq!(rel_err(&[1.0, 2.5], &[1.0, 2.0]), 0.25);
        assert_eq!(rel_err(&[f64::NAN], &[1.0]), f64::INFINITY);
    }
}

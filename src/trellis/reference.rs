//! The reference decoder: plain Rust, independent of MLX and of every kernel.
//!
//! It follows the format's definition literally (docs/format.md §3): the state of position `t` of a block
//! is the `L`-bit window starting at bit `(T-1-t)*k`, wrapping cyclically inside the block; the
//! weight is `value(state) * scale[row]`. [`forward_f64`] decodes and accumulates in f64 and is
//! what every kernel is checked against.

use std::ops::Range;

use half::f16;

use crate::alloc::try_filled;
use crate::error::{invalid, Error, Result};

use super::format::codebook::{value, value_f64};
use super::format::{HostLayer, TrellisGeometry};

/// The state of position `t` of one block given as its words (`block.len() * 32 / k` positions,
/// `L <= 32` state bits).
pub fn block_state(block: &[u32], t: usize, k: u32, l: u32) -> Result<u32> {
    let bits = block.len() * 32;
    if k == 0 || l == 0 || l > 32 {
        invalid!("block_state: k = {k} and L = {l} must be positive, with L at most 32");
    }
    let positions = bits / k as usize;
    if t >= positions {
        invalid!(
            "block_state: position {t} is outside the {positions} positions of a {}-word block at k = {k}",
            block.len()
        );
    }
    let p = (positions - 1 - t) * k as usize;
    let mut state = 0u32;
    // Bit by bit, the definition as written: bit i of the window is bit (p + i) mod (T*k) of the
    // block, and bit q of the block is bit (q & 31) of word (q >> 5).
    for i in 0..l as usize {
        let q = (p + i) % bits;
        state |= ((block[q >> 5] >> (q & 31)) & 1) << i;
    }
    Ok(state)
}

/// The words of block `b` of stored row `r` (contiguous in both layouts).
pub fn block_words<'a>(codes: &'a [u32], g: &TrellisGeometry, r: usize, b: usize) -> Result<&'a [u32]> {
    if r >= g.rows || b >= g.blocks_per_row() {
        invalid!("block_words: block {b} of stored row {r} is outside {g} ({} blocks per row)", g.blocks_per_row());
    }
    let start = g.word_index(r, b, 0);
    match start.checked_add(g.words_per_block()).and_then(|end| codes.get(start..end)) {
        Some(words) => Ok(words),
        None => invalid!("block_words: {} code words are too few for {g}", codes.len()),
    }
}

/// The state of stored row `r`, column `c`.
pub fn state_at(codes: &[u32], g: &TrellisGeometry, r: usize, c: usize) -> Result<u32> {
    if c >= g.cols {
        invalid!("state_at: column {c} is outside the {} columns of {g}", g.cols);
    }
    let t = g.t as usize;
    block_state(block_words(codes, g, r, c / t)?, c % t, g.k, g.l)
}

/// The f32 weight of stored row `r`, column `c`: `value(state) * f32(scale[r])`, the value the
/// dense expansion on MLX must reproduce bit for bit.
pub fn weight_at(codes: &[u32], scales: &[f16], g: &TrellisGeometry, r: usize, c: usize) -> Result<f32> {
    let state = state_at(codes, g, r, c)?;
    match scales.get(r) {
        Some(s) => Ok(value(state) * s.to_f32()),
        None => invalid!("weight_at: no scale for stored row {r} ({} scales)", scales.len()),
    }
}

/// Checks a layer for the decoder: a consistent geometry, exactly its code words, one finite
/// scale per stored row.
fn check_sizes(codes: &[u32], scales: &[f16], g: &TrellisGeometry) -> Result<()> {
    g.validate().map_err(|e| e.context("reference decoder"))?;
    let words = g.code_words();
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
    if let Some((row, s)) = scales.iter().enumerate().find(|(_, s)| !s.is_finite()) {
        invalid!("reference decoder: the scale of stored row {row} is {s}; scales must be finite");
    }
    Ok(())
}

/// Calls `f(c, state)` for every column of blocks `blocks` of stored row `r` of a checked layer,
/// decoding each block once (fast path of [`state_at`]: the window read from a 64-bit pair of
/// words, the last word followed by the first). `ext` is scratch of `wpb + 1` words.
fn for_each_state(
    codes: &[u32],
    g: &TrellisGeometry,
    r: usize,
    blocks: Range<usize>,
    ext: &mut [u32],
    mut f: impl FnMut(usize, u32),
) {
    let (t, k, wpb) = (g.t as usize, g.k as usize, g.words_per_block());
    let mask = (1u64 << g.l) - 1;
    for b in blocks {
        let start = g.word_index(r, b, 0);
        let words = &codes[start..start + wpb];
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
    let mut out = try_filled(g.rows * g.cols, 0f32, || format!("the dense weights of {g}"))?;
    let mut ext = vec![0u32; g.words_per_block() + 1];
    for (r, row) in out.chunks_mut(g.cols).enumerate() {
        let s = scales[r].to_f32();
        for_each_state(codes, g, r, 0..g.blocks_per_row(), &mut ext, |c, state| row[c] = value(state) * s);
    }
    Ok(out)
}

/// `y = x · W` for `m` activation rows `x` `[m, in]`, decoded and accumulated in f64; returns
/// `[m, out]`. Weights are `value_f64(state) * scale` (no f32 rounding anywhere).
///
/// The output features are split over the machine's threads, each accumulating its own outputs
/// in input order straight into the result: the only buffer is the result itself, and the
/// sums do not depend on the thread count.
pub fn forward_f64(x: &[f64], m: usize, codes: &[u32], scales: &[f16], g: &TrellisGeometry) -> Result<Vec<f64>> {
    check_sizes(codes, scales, g)?;
    let (inf, outf) = (g.in_features(), g.out_features());
    if m.checked_mul(inf) != Some(x.len()) {
        invalid!("reference forward: x has {} values, expected [{m}, {inf}]", x.len());
    }
    let Some(out_len) = m.checked_mul(outf) else {
        invalid!("reference forward: an output of [{m}, {outf}] values overflows");
    };
    let mut y = try_filled(out_len, 0f64, || format!("the reference output [{m}, {outf}]"))?;
    if out_len == 0 {
        return Ok(y);
    }
    let table: Vec<f64> = (0..1u32 << g.l).map(value_f64).collect();
    // Axis 0 (stored [in, out]): a thread takes whole blocks of columns; axis 1 (stored
    // [out, in]): whole stored rows.
    let t = g.t as usize;
    let (units, unit_width) = if g.axis == 0 { (g.blocks_per_row(), t) } else { (g.rows, 1) };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(units).max(1);
    let per = units.div_ceil(threads);
    // Each thread's outputs: in every activation row, the columns of its units.
    let mut parts: Vec<Vec<&mut [f64]>> = (0..threads).map(|_| Vec::with_capacity(m)).collect();
    for row in y.chunks_mut(outf) {
        let mut rest = row;
        for part in parts.iter_mut() {
            let (mine, tail) = rest.split_at_mut((per * unit_width).min(rest.len()));
            part.push(mine);
            rest = tail;
        }
    }
    let table = &table;
    let joined: Vec<std::thread::Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = parts
            .into_iter()
            .enumerate()
            .map(|(i, mut out)| {
                scope.spawn(move || {
                    let units = (i * per).min(units)..((i + 1) * per).min(units);
                    let mut ext = vec![0u32; g.words_per_block() + 1];
                    if g.axis == 0 {
                        let first_col = units.start * t;
                        for (r, scale) in scales.iter().enumerate() {
                            let s = scale.to_f64();
                            for_each_state(codes, g, r, units.clone(), &mut ext, |c, state| {
                                let w = table[state as usize] * s;
                                for (mi, out_row) in out.iter_mut().enumerate() {
                                    out_row[c - first_col] += x[mi * inf + r] * w;
                                }
                            });
                        }
                    } else {
                        for r in units.clone() {
                            let s = scales[r].to_f64();
                            for_each_state(codes, g, r, 0..g.blocks_per_row(), &mut ext, |c, state| {
                                let w = table[state as usize] * s;
                                for (mi, out_row) in out.iter_mut().enumerate() {
                                    out_row[r - units.start] += x[mi * inf + c] * w;
                                }
                            });
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    if joined.iter().any(|j| j.is_err()) {
        return Err(Error::invalid("reference forward: a worker thread panicked (internal error)"));
    }
    Ok(y)
}

/// `silu(x · Wg) ⊙ (x · Wu)` for `m` activation rows, in f64 (the gate and up projections of a
/// coded MLP, docs/format.md §9): `[m, intermediate]`.
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

/// `relErr = max|a - b| / max|b|`, the gate every kernel is held to (`max|a - b|` alone where
/// `b` is all zeros). A NaN or infinity anywhere in either slice gives `f64::INFINITY`: no
/// comparison that involves one passes a gate. Slices of different lengths are an error.
pub fn rel_err(a: &[f64], b: &[f64]) -> Result<f64> {
    if a.len() != b.len() {
        invalid!("rel_err: slices of different lengths ({} and {})", a.len(), b.len());
    }
    if !a.iter().chain(b).all(|v| v.is_finite()) {
        return Ok(f64::INFINITY);
    }
    let num = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    let den = b.iter().map(|y| y.abs()).fold(0.0, f64::max);
    // Finite inputs can still overflow the difference (f64::MAX - -f64::MAX).
    let err = if den == 0.0 { num } else { num / den };
    Ok(if err.is_finite() { err } else { f64::INFINITY })
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
                assert_eq!(block_state(&block, pos, k, l).unwrap(), pattern, "k {k} L {l} position {pos}");
                // The window of position 0 starts at the block's last symbol and wraps to bit 0.
                if pos == 0 {
                    assert!(p + l as usize > t * k as usize, "position 0 wraps (k {k} L {l})");
                    let low_bits = (t * k as usize) - p; // bits before the end of the block
                    assert_eq!(block[0] & ((1 << (l as usize - low_bits)) - 1), pattern >> low_bits);
                }
            }
            // A block of all ones decodes to the all-ones state everywhere.
            let ones = vec![u32::MAX; wpb];
            assert!((0..t).all(|pos| block_state(&ones, pos, k, l).unwrap() == (1 << l) - 1));
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
                let (s, sp) = (block_state(&block, t, k, l).unwrap(), block_state(&block, prev, k, l).unwrap());
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
            let mut ext = vec![0u32; g.words_per_block() + 1];
            for r in 0..3 {
                for_each_state(&codes, &g, r, 0..2, &mut ext, |c, s| {
                    assert_eq!(s, state_at(&codes, &g, r, c).unwrap())
                });
            }
        }
    }

    #[test]
    fn rel_err_is_max_abs_over_max_abs() {
        assert_eq!(rel_err(&[1.0, 2.5], &[1.0, 2.0]).unwrap(), 0.25);
        assert_eq!(rel_err(&[3.0], &[0.0]).unwrap(), 3.0);
    }

    #[test]
    fn rel_err_never_passes_a_non_finite_value() {
        let (inf, nan) = (f64::INFINITY, f64::NAN);
        // inf - inf is NaN, which a max fold would drop, reporting 0.
        for (a, b) in [
            (vec![inf, 1.0], vec![inf, 1.0]),
            (vec![nan], vec![1.0]),
            (vec![1.0], vec![nan]),
            (vec![1.0, 2.0], vec![1.0, -inf]),
            (vec![f64::MAX], vec![-f64::MAX]),
        ] {
            assert_eq!(rel_err(&a, &b).unwrap(), f64::INFINITY, "{a:?} {b:?}");
        }
        assert!(rel_err(&[1.0], &[1.0, 2.0]).unwrap_err().to_string().contains("different lengths"));
    }

    #[test]
    fn out_of_range_positions_are_errors() {
        let g = TrellisGeometry::row_major(2, 256, 2, 256, 12, 0).unwrap();
        let codes = vec![0u32; 32];
        let scales = vec![f16::ONE; 2];
        assert!(weight_at(&codes, &scales, &g, 1, 255).is_ok());
        for (r, c) in [(2, 0), (0, 256), (usize::MAX, usize::MAX)] {
            let e = weight_at(&codes, &scales, &g, r, c).unwrap_err();
            assert!(e.to_string().contains("outside"), "{e}");
        }
        assert!(weight_at(&codes, &scales[..1], &g, 1, 0).unwrap_err().to_string().contains("no scale"));
        assert!(block_words(&codes[..31], &g, 1, 0).unwrap_err().to_string().contains("too few"));
        assert!(block_state(&[], 0, 2, 12).is_err());
        assert!(block_state(&[0; 16], 0, 0, 12).is_err());
        assert!(block_state(&[0; 16], 0, 2, 33).is_err());
        assert!(block_state(&[0; 16], 256, 2, 12).is_err());
    }

    #[test]
    fn the_forward_does_not_depend_on_the_thread_split_and_checks_its_inputs() {
        // Each checked output, on both axes, is bit for bit a plain serial sum over the inputs in
        // order: the split over threads changes no sum.
        for axis in [0u32, 1] {
            let h = super::super::synthetic::synthetic_layer(
                24,
                1024,
                3,
                12,
                axis,
                super::super::CodeLayout::RowMajor,
                0.02,
                3,
            )
            .unwrap();
            let g = h.geometry;
            let x: Vec<f64> = (0..3 * g.in_features()).map(|i| ((i * 7919) % 97) as f64 / 48.0 - 1.0).collect();
            let y = forward_f64(&x, 3, &h.codes, &h.scales, &g).unwrap();
            for mi in 0..3 {
                for o in [0, g.out_features() / 2, g.out_features() - 1] {
                    let mut want = 0f64;
                    for i in 0..g.in_features() {
                        let (r, c) = if axis == 0 { (i, o) } else { (o, i) };
                        let w = value_f64(state_at(&h.codes, &g, r, c).unwrap()) * h.scales[r].to_f64();
                        want += x[mi * g.in_features() + i] * w;
                    }
                    assert_eq!(y[mi * g.out_features() + o].to_bits(), want.to_bits(), "axis {axis} m {mi} o {o}");
                }
            }
        }
        let h = super::super::synthetic::synthetic_layer(4, 256, 2, 12, 0, super::super::CodeLayout::RowMajor, 0.02, 1)
            .unwrap();
        let mut bad = h.scales.clone();
        bad[2] = f16::INFINITY;
        let e = forward_f64(&[0.0; 4], 1, &h.codes, &bad, &h.geometry).unwrap_err();
        assert!(e.to_string().contains("stored row 2 is inf"), "{e}");
        let e = forward_f64(&[], usize::MAX, &h.codes, &h.scales, &h.geometry).unwrap_err();
        assert!(e.to_string().contains("expected ["), "{e}");
        let mut g = h.geometry;
        g.rows = usize::MAX;
        assert!(forward_f64(&[0.0; 4], 1, &h.codes, &h.scales, &g).is_err());
    }
}

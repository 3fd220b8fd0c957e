//! The decode of one block of [`LANES`] stored rows at a time.
//!
//! Position `t` of every block reads its window at the same word and bit offset (docs/format.md
//! §3), so the same position of eight rows is one uniform shift of eight words: the rows are
//! the SIMD lanes. A block's words are first gathered lane-major (`words[j][lane]`, with the
//! first word again after the last for the cyclic wrap); each position is then two word loads,
//! two shifts, an or and a mask, and the 1MAD value's multiply-add and byte sum, all lane-wise,
//! which the compiler vectorizes for whatever vector width the target has.

use crate::trellis::format::TrellisGeometry;

/// Stored rows decoded together, one per SIMD lane.
pub(super) const LANES: usize = 8;

/// One value per lane, as stored in the gathered words.
pub(super) type Lanes<T> = [T; LANES];

/// The 1MAD code's multiplier and increment (docs/format.md §3).
const MAD_MUL: u32 = 34_038_481;
const MAD_ADD: u32 = 76_625_530;

/// The integer code value of a state (`codebook::y`) as f32 (exact: `|y| <= 510`): the byte
/// sum of the 1MAD hash minus 510, as two 16-bit lanes of byte pairs and one add, which
/// vectorizes across lanes.
#[inline(always)]
fn code_value(state: u32) -> f32 {
    let x = state.wrapping_mul(MAD_MUL).wrapping_add(MAD_ADD);
    let pairs = (x & 0x00FF_00FF) + ((x >> 8) & 0x00FF_00FF);
    (((pairs & 0xFFFF) + (pairs >> 16)) as i32 - 510) as f32
}

/// The window of every position of a geometry's blocks: its first word and bit offset.
pub(super) struct Windows {
    word: Vec<usize>,
    shift: Vec<u32>,
    /// The low `L` bits.
    mask: u32,
    /// Words per block.
    wpb: usize,
}

impl Windows {
    /// The windows of `g` (a validated geometry: `t * k` is a whole number of words, `L <= 32`).
    pub(super) fn new(g: &TrellisGeometry) -> Windows {
        let (t, k) = (g.t as usize, g.k as usize);
        let (word, shift) = (0..t)
            .map(|pos| {
                let p = (t - 1 - pos) * k;
                (p >> 5, (p & 31) as u32)
            })
            .unzip();
        let mask = if g.l >= 32 { u32::MAX } else { (1u32 << g.l) - 1 };
        Windows { word, shift, mask, wpb: g.words_per_block() }
    }

    /// Positions per block.
    pub(super) fn positions(&self) -> usize {
        self.word.len()
    }

    /// Scratch for [`Windows::gather`]: the block's words lane-major, and the wrap word.
    pub(super) fn word_scratch(&self) -> Vec<Lanes<u32>> {
        vec![[0; LANES]; self.wpb + 1]
    }

    /// Gathers block `b` of stored rows `r0..r0 + LANES` lane-major into `words`; lanes past the
    /// last stored row read zero words.
    #[inline(always)]
    pub(super) fn gather(&self, codes: &[u32], g: &TrellisGeometry, r0: usize, b: usize, words: &mut [Lanes<u32>]) {
        for lane in 0..LANES {
            let r = r0 + lane;
            if r < g.rows {
                let start = g.word_index(r, b, 0);
                for (j, w) in codes[start..start + self.wpb].iter().enumerate() {
                    words[j][lane] = *w;
                }
            } else {
                words[..self.wpb].iter_mut().for_each(|w| w[lane] = 0);
            }
        }
        words[self.wpb] = words[0];
    }

    /// The integer code value (`y`, exact in f32) of every position of the gathered block,
    /// lane-major: `out[pos][lane]`.
    #[inline(always)]
    pub(super) fn decode(&self, words: &[Lanes<u32>], out: &mut [Lanes<f32>]) {
        let mask = self.mask;
        for ((&w, &shift), o) in self.word.iter().zip(&self.shift).zip(out.iter_mut()) {
            let (lo, hi) = (words[w], words[w + 1]);
            // Built in a local and stored whole: stores lane by lane into `out` stay scalar.
            let mut values = [0f32; LANES];
            for lane in 0..LANES {
                // The 64-bit pair (lo, hi) shifted right by `shift` (0..=31): `hi << 32 - shift`
                // as two shifts, so that `shift == 0` shifts it out instead of overflowing.
                let state = ((lo[lane] >> shift) | ((hi[lane] << 1) << (31 - shift))) & mask;
                values[lane] = code_value(state);
            }
            *o = values;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trellis::format::codebook::y;
    use crate::trellis::host::test_layers::{random_layer, LAYER_CASES};
    use crate::trellis::reference::state_at;

    #[test]
    fn the_code_value_is_the_codebooks() {
        let mut s = 0x9E37_79B9u32;
        for state in (0..1u32 << 16).chain((0..100_000).map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            s
        })) {
            assert_eq!(code_value(state), y(state) as f32, "state {state:#x}");
        }
        assert_eq!(code_value(u32::MAX), y(u32::MAX) as f32);
    }

    #[test]
    fn lanes_decode_every_state_as_the_reference() {
        for (i, case) in LAYER_CASES.iter().enumerate() {
            // 13 rows: a full lane group and a partial one.
            let layer = random_layer(13, case, 0, i as u64);
            let g = layer.geometry;
            let win = Windows::new(&g);
            let (mut words, mut out) = (win.word_scratch(), vec![[0f32; LANES]; win.positions()]);
            for r0 in (0..g.rows).step_by(LANES) {
                for b in 0..g.blocks_per_row() {
                    win.gather(&layer.codes, &g, r0, b, &mut words);
                    win.decode(&words, &mut out);
                    for (pos, o) in out.iter().enumerate() {
                        for (lane, &v) in o.iter().enumerate() {
                            let want = if r0 + lane < g.rows {
                                y(state_at(&layer.codes, &g, r0 + lane, b * g.t as usize + pos).unwrap())
                            } else {
                                y(0) // a missing row's zero words
                            };
                            assert_eq!(v, want as f32, "{g}: row {}, block {b}, position {pos}", r0 + lane);
                        }
                    }
                }
            }
        }
    }
}

//! One block coded at a time: the per-thread [`BlockCoder`] (scratch buffers reused for every
//! block, the tail-biting two-pass search, the packing and the decode-back check).

use crate::error::{invalid, Result};
use crate::trellis::reference::block_state;

use super::search::{broken, Trellis};
use super::BlockSearch;

/// Per-thread state: the search's scratch buffers, allocated once and reused for every block.
pub(super) struct BlockCoder<'a> {
    k: u32,
    l: u32,
    t: usize,
    lut: &'a [f32],
    search: BlockSearch,
    trellis: Trellis,
    /// The block to code, divided by the row's scale.
    pub(super) x: Vec<f32>,
    /// The same block rotated by `T/2` (the first tail-biting pass).
    rotated: Vec<f32>,
    /// Per-column weights of the squared error for every row (`None`: all 1), for example 0 on
    /// padded columns.
    column_weights: Option<&'a [f32]>,
    /// The current block's weights, and rotated by `T/2`, when they are not all 1.
    w: Vec<f32>,
    rotated_w: Vec<f32>,
    weighted: bool,
    /// One state per position.
    pub(super) states: Vec<u32>,
}

impl<'a> BlockCoder<'a> {
    /// A coder for blocks of `t` weights; `searches` is false when the states come from
    /// elsewhere (then the trellis buffers are not allocated).
    pub(super) fn new(k: u32, l: u32, t: u32, lut: &'a [f32], search: BlockSearch, searches: bool) -> BlockCoder<'a> {
        let t = t as usize;
        let fast = searches && search == BlockSearch::Viterbi;
        let trellis = Trellis::new(k, l, if fast { t } else { 0 });
        BlockCoder {
            k,
            l,
            t,
            lut,
            search,
            trellis,
            x: vec![0.0; t],
            rotated: vec![0.0; t],
            column_weights: None,
            w: vec![1.0; t],
            rotated_w: vec![1.0; t],
            weighted: false,
            states: vec![0; t],
        }
    }

    /// Weights the squared error of every row's column `c` by `weights[c]` (finite,
    /// non-negative; one per column of the rows this coder codes). Only the Viterbi search
    /// takes weights.
    pub(super) fn with_column_weights(mut self, weights: Option<&'a [f32]>) -> BlockCoder<'a> {
        self.column_weights = weights;
        self
    }

    /// Weights the next block's squared error at each position by `weights` (`t` of them); all
    /// 1 is the unweighted search.
    pub(super) fn weigh_block(&mut self, weights: &[f32]) {
        self.weighted = weights.iter().any(|&v| v != 1.0);
        if self.weighted {
            self.w.copy_from_slice(weights);
        }
    }

    /// Runs the configured search on the normalised block in `self.x`, leaving the path in
    /// `self.states`.
    pub(super) fn search_block(&mut self) {
        let (t, k) = (self.t, self.k);
        let half = t / 2;
        self.rotated[..t - half].copy_from_slice(&self.x[half..]);
        self.rotated[t - half..].copy_from_slice(&self.x[..half]);
        match self.search {
            BlockSearch::Viterbi if self.weighted => {
                self.rotated_w[..t - half].copy_from_slice(&self.w[half..]);
                self.rotated_w[t - half..].copy_from_slice(&self.w[..half]);
                let (w, rw) = (Some(&self.w[..]), Some(&self.rotated_w[..]));
                self.trellis.search_weighted(k, &self.rotated, rw, self.lut, None, &mut self.states);
                let pinned = self.states[t - half] >> k;
                self.trellis.search_weighted(k, &self.x, w, self.lut, Some(pinned), &mut self.states);
            }
            BlockSearch::Viterbi => {
                // Tail-biting: the rotated pass picks the state of original position 0 (rotated
                // index T/2); the second pass keeps its top L-k bits at both ends of the cycle.
                self.trellis.search(k, &self.rotated, self.lut, None, &mut self.states);
                let pinned = self.states[t - half] >> k;
                self.trellis.search(k, &self.x, self.lut, Some(pinned), &mut self.states);
            }
            other => broken::search(other, &self.x, &self.rotated, self.lut, k, self.l, &mut self.states),
        }
    }

    /// Codes one stored row: fills its code words (row-major) and its reconstruction. With
    /// `given`, the row's states come from there instead of the search.
    pub(super) fn code_row(
        &mut self,
        row: &[f32],
        scale: f32,
        given: Option<&[u16]>,
        codes: &mut [u32],
        reconstruction: &mut [f32],
    ) -> Result<()> {
        let (t, k, l) = (self.t, self.k, self.l);
        let wpb = codes.len() / (row.len() / t);
        let must_agree = matches!(self.search, BlockSearch::Viterbi | BlockSearch::ReferenceViterbi);
        for (b, ((block, words), rec)) in
            row.chunks_exact(t).zip(codes.chunks_exact_mut(wpb)).zip(reconstruction.chunks_exact_mut(t)).enumerate()
        {
            match given {
                Some(states) => {
                    for (s, &g) in self.states.iter_mut().zip(&states[b * t..(b + 1) * t]) {
                        *s = u32::from(g);
                    }
                }
                None => {
                    for (xi, &w) in self.x.iter_mut().zip(block) {
                        *xi = super::normalised(w, scale);
                    }
                    match self.column_weights {
                        Some(cw) => self.weigh_block(&cw[b * t..(b + 1) * t]),
                        None => self.weighted = false,
                    }
                    self.search_block();
                }
            }
            pack_symbols(&self.states, k, words);
            for (pos, (out, &state)) in rec.iter_mut().zip(&self.states).enumerate() {
                let decoded = block_state(words, pos, k, l)?;
                if must_agree && decoded != state {
                    invalid!(
                        "block {b}, position {pos}: the packed codes decode to state {decoded:#x} but the search chose {state:#x} (internal error: the path is not cyclic)"
                    );
                }
                *out = self.lut[decoded as usize] * scale;
            }
        }
        Ok(())
    }
}

/// Packs symbol `states[t] & (2^k - 1)` at bit `(T-1-t)*k` of the block's words.
fn pack_symbols(states: &[u32], k: u32, words: &mut [u32]) {
    words.fill(0);
    let t_len = states.len();
    let symbol_mask = (1u32 << k) - 1;
    for (t, &state) in states.iter().enumerate() {
        let symbol = state & symbol_mask;
        let bit = (t_len - 1 - t) * k as usize;
        let (word, offset) = (bit >> 5, bit & 31);
        words[word] |= symbol << offset;
        if offset + k as usize > 32 {
            words[word + 1] |= symbol >> (32 - offset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_symbols_decode_to_a_cyclic_path() {
        // A hand-made cyclic path: any symbol string read as windows.
        let (k, l, t) = (3u32, 12u32, 256usize);
        let symbols: Vec<u32> = (0..t as u32).map(|i| (i * 5 + 1) % 8).collect();
        let states: Vec<u32> =
            (0..t).map(|pos| (0..4).fold(0u32, |s, i| s | (symbols[(pos + t - i) % t] << (3 * i))) & 0xFFF).collect();
        let mut words = vec![0u32; 24];
        pack_symbols(&states, k, &mut words);
        for (pos, &s) in states.iter().enumerate() {
            assert_eq!(block_state(&words, pos, k, l).unwrap(), s, "position {pos}");
        }
    }
}

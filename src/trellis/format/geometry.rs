//! [`TrellisGeometry`]: the shape of a coded matrix, derived from its code tensor and checked.

use std::fmt;

use crate::error::{invalid, Error, Result};

use super::codebook::words_per_block;

/// Which code layout a tensor uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodeLayout {
    /// `u32 [rows, cols * k / 32]`: each stored row's blocks back to back.
    RowMajor,
    /// `u32 [cols / 512, rows, 48]`: 3-bit codes, blocks `2g` and `2g + 1` of each row side by side
    /// (the upstream `blockInterleave = 2`).
    K3Interleaved,
}

/// The geometry of one trellis-coded matrix (the upstream `TrellisGeometry`).
///
/// The stored matrix has `rows x cols` weights; each stored row is coded along its columns in
/// blocks of `t` weights at `k` bits with an `l`-bit state. For `axis == 0` (down projections)
/// the stored matrix is `Wᵀ [in, out]`; for `axis == 1` it is `W [out, in]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TrellisGeometry {
    /// Stored rows (one f16 scale each).
    pub rows: usize,
    /// Stored columns (the coded axis).
    pub cols: usize,
    /// Block length in weights (`T`, 256 in shipped models).
    pub t: u32,
    /// Bits per weight.
    pub k: u32,
    /// Trellis state bits.
    pub l: u32,
    /// 0: stored `[in, out]` (down projections); 1: stored `[out, in]`.
    pub axis: u32,
    /// 0 for row-major codes, 2 for the 3-bit block interleave.
    pub block_interleave: u32,
}

/// The most weights a coded matrix may hold: its f64 expansion must stay addressable.
const MAX_WEIGHTS: usize = isize::MAX as usize / 8;

impl TrellisGeometry {
    /// Derives and checks the geometry of the code tensor `tensor` of shape `shape` (docs/format.md §4).
    /// Every broken rule is an error that names the tensor and the rule; every size derived from
    /// the shape (columns, weights, code words) is checked not to overflow.
    pub fn from_codes_shape(
        tensor: &str,
        shape: &[usize],
        k: u32,
        t: u32,
        l: u32,
        axis: u32,
    ) -> Result<TrellisGeometry> {
        let at = || format!("trellis codes {tensor:?} of shape {shape:?}");
        if !(1..=8).contains(&k) {
            invalid!("{}: k = {k} bits per weight is outside 1..=8", at());
        }
        let block_bits = t as u64 * k as u64;
        if t == 0 || !block_bits.is_multiple_of(32) {
            invalid!(
                "{}: a block of T = {t} weights at k = {k} bits is not a whole number of 32-bit words (T*k % 32 != 0)",
                at()
            );
        }
        if l < k || l > 16 {
            invalid!("{}: L = {l} state bits must be at least k = {k} and at most 16", at());
        }
        if l as u64 > block_bits {
            invalid!("{}: L = {l} state bits exceed the T*k = {block_bits} bits of a block", at());
        }
        if axis > 1 {
            invalid!("{}: axis = {axis} must be 0 (stored [in, out]) or 1 (stored [out, in])", at());
        }
        let overflow = |what: &str| Error::invalid(format!("{}: {what} overflows", at()));
        let geometry = match *shape {
            [rows, words] => {
                let bits = words.checked_mul(32).ok_or_else(|| overflow("the bits per row (words*32)"))?;
                if bits % k as usize != 0 {
                    invalid!(
                        "{}: {words} words per row are not a whole number of {k}-bit weights (words*32 % k != 0)",
                        at()
                    );
                }
                let cols = bits / k as usize;
                if !cols.is_multiple_of(t as usize) {
                    invalid!(
                        "{}: {cols} columns per row are not a whole number of {t}-weight blocks (cols % T != 0)",
                        at()
                    );
                }
                TrellisGeometry { rows, cols, t, k, l, axis, block_interleave: 0 }
            }
            [groups, rows, words] => {
                if k != 3 || t != 256 || l != 12 || axis != 0 {
                    invalid!(
                        "{}: the 3-D block-interleaved layout needs k = 3, T = 256, L = 12, axis = 0 (got k = {k}, T = {t}, L = {l}, axis = {axis})",
                        at()
                    );
                }
                if words != 48 {
                    invalid!(
                        "{}: the block-interleaved layout holds 48 words (two 24-word blocks) per slot, not {words}",
                        at()
                    );
                }
                let cols = groups.checked_mul(512).ok_or_else(|| overflow("the column count (groups*512)"))?;
                TrellisGeometry { rows, cols, t, k, l, axis, block_interleave: 2 }
            }
            _ => invalid!(
                "{}: codes must be 2-D [rows, words] (row-major) or 3-D [cols/512, rows, 48] (3-bit interleave)",
                at()
            ),
        };
        if geometry.rows == 0 || geometry.cols == 0 {
            invalid!("{}: the coded matrix is empty", at());
        }
        match geometry.rows.checked_mul(geometry.cols) {
            Some(n) if n <= MAX_WEIGHTS => {}
            _ => invalid!(
                "{}: {} x {} weights are more than can be addressed (at most {MAX_WEIGHTS})",
                at(),
                geometry.rows,
                geometry.cols
            ),
        }
        Ok(geometry)
    }

    /// Checks a geometry built by hand (its fields are public): it must be exactly what
    /// [`from_codes_shape`](TrellisGeometry::from_codes_shape) derives from its code shape.
    /// Every constructor's result passes; the decoders check their geometry with this.
    pub fn validate(&self) -> Result<()> {
        let shape = match self.block_interleave {
            0 => match self.cols.checked_mul(self.k as usize) {
                Some(bits) if bits % 32 == 0 => vec![self.rows, bits / 32],
                _ => invalid!("geometry {self}: {} columns at k = {} are not whole 32-bit words", self.cols, self.k),
            },
            2 if self.cols.is_multiple_of(512) => vec![self.cols / 512, self.rows, 48],
            2 => invalid!("geometry {self}: the block interleave needs cols % 512 == 0"),
            b => invalid!("geometry {self}: block_interleave = {b} must be 0 (row-major) or 2 (3-bit interleave)"),
        };
        let derived = TrellisGeometry::from_codes_shape("(geometry)", &shape, self.k, self.t, self.l, self.axis)?;
        if derived != *self {
            invalid!("geometry {self:?} is inconsistent: its code shape {shape:?} gives {derived:?}");
        }
        Ok(())
    }

    /// The geometry of a row-major coded matrix of `rows x cols` weights (checked).
    pub fn row_major(rows: usize, cols: usize, k: u32, t: u32, l: u32, axis: u32) -> Result<TrellisGeometry> {
        match cols.checked_mul(k as usize) {
            Some(bits) if bits % 32 == 0 => {
                TrellisGeometry::from_codes_shape("(row-major codes)", &[rows, bits / 32], k, t, l, axis)
            }
            _ => invalid!("a row of {cols} weights at k = {k} bits is not a whole number of 32-bit words"),
        }
    }

    /// The same matrix in the 3-bit block-interleaved layout (checked: k 3, T 256, L 12, axis 0,
    /// cols a multiple of 512).
    pub fn interleaved(&self) -> Result<TrellisGeometry> {
        if !self.cols.is_multiple_of(512) {
            invalid!("the 3-bit block interleave needs cols % 512 == 0, got {} columns", self.cols);
        }
        TrellisGeometry::from_codes_shape(
            "(interleaved codes)",
            &[self.cols / 512, self.rows, 48],
            self.k,
            self.t,
            self.l,
            self.axis,
        )
    }

    /// The same matrix in the row-major layout.
    pub fn row_major_equivalent(&self) -> TrellisGeometry {
        TrellisGeometry { block_interleave: 0, ..*self }
    }

    /// Which layout the codes use.
    pub fn layout(&self) -> CodeLayout {
        if self.block_interleave == 2 {
            CodeLayout::K3Interleaved
        } else {
            CodeLayout::RowMajor
        }
    }

    /// 32-bit words per block.
    pub fn words_per_block(&self) -> usize {
        words_per_block(self.t, self.k) as usize
    }

    /// Blocks per stored row (0 for a hand-built geometry with `t = 0`).
    pub fn blocks_per_row(&self) -> usize {
        self.cols.checked_div(self.t as usize).unwrap_or(0)
    }

    /// The shape of the code tensor in this geometry's layout. The sizes below are exact for a
    /// geometry that passes [`validate`](TrellisGeometry::validate) (every constructor's does);
    /// for an inconsistent hand-built one they saturate instead of overflowing.
    pub fn codes_shape(&self) -> Vec<usize> {
        match self.layout() {
            CodeLayout::RowMajor => vec![self.rows, self.cols.saturating_mul(self.k as usize) / 32],
            CodeLayout::K3Interleaved => vec![self.cols / 512, self.rows, 48],
        }
    }

    /// The number of code words (the product of [`codes_shape`](TrellisGeometry::codes_shape)).
    pub fn code_words(&self) -> usize {
        self.codes_shape().iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }

    /// Input features of the linear map.
    pub fn in_features(&self) -> usize {
        if self.axis == 0 {
            self.rows
        } else {
            self.cols
        }
    }

    /// Output features of the linear map.
    pub fn out_features(&self) -> usize {
        if self.axis == 0 {
            self.cols
        } else {
            self.rows
        }
    }

    /// Flat index in the code tensor of word `j` of block `b` of stored row `r`, for `r < rows`,
    /// `b < blocks_per_row()` and `j < words_per_block()` of a valid geometry (outside that the
    /// index is meaningless, though computing it never panics).
    pub fn word_index(&self, r: usize, b: usize, j: usize) -> usize {
        let wpb = self.words_per_block();
        match self.layout() {
            CodeLayout::RowMajor => {
                r.wrapping_mul(self.blocks_per_row()).wrapping_add(b).wrapping_mul(wpb).wrapping_add(j)
            }
            CodeLayout::K3Interleaved => (b >> 1)
                .wrapping_mul(self.rows)
                .wrapping_add(r)
                .wrapping_mul(48)
                .wrapping_add((b & 1) * 24)
                .wrapping_add(j),
        }
    }
}

impl fmt::Display for TrellisGeometry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}x{} k{} T{} L{} axis {} {}",
            self.rows,
            self.cols,
            self.k,
            self.t,
            self.l,
            self.axis,
            match self.layout() {
                CodeLayout::RowMajor => "row-major",
                CodeLayout::K3Interleaved => "3-bit interleaved",
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(shape: &[usize], k: u32, t: u32, l: u32, axis: u32) -> String {
        TrellisGeometry::from_codes_shape("w", shape, k, t, l, axis).unwrap_err().to_string()
    }

    #[test]
    fn derives_the_qwen_down_shapes() {
        let g = TrellisGeometry::from_codes_shape("w", &[17408, 480], 3, 256, 12, 0).unwrap();
        assert_eq!((g.rows, g.cols, g.layout()), (17408, 5120, CodeLayout::RowMajor));
        assert_eq!((g.in_features(), g.out_features(), g.words_per_block(), g.blocks_per_row()), (17408, 5120, 24, 20));
        let i = TrellisGeometry::from_codes_shape("w", &[10, 17408, 48], 3, 256, 12, 0).unwrap();
        assert_eq!((i.rows, i.cols, i.block_interleave), (17408, 5120, 2));
        assert_eq!(g.interleaved().unwrap(), i);
        assert_eq!(i.codes_shape(), vec![10, 17408, 48]);
        let g2 = TrellisGeometry::from_codes_shape("w", &[17408, 320], 2, 256, 12, 0).unwrap();
        assert_eq!(g2.cols, 5120);
    }

    #[test]
    fn every_rule_has_its_message() {
        assert!(err(&[4, 24], 0, 256, 12, 0).contains("outside 1..=8"));
        assert!(err(&[4, 24], 3, 100, 12, 0).contains("T*k % 32 != 0"));
        assert!(err(&[4, 24], 3, 256, 2, 0).contains("at least k"));
        assert!(err(&[4, 24], 3, 256, 17, 0).contains("at most 16"));
        assert!(err(&[4, 24], 3, 256, 12, 2).contains("axis = 2"));
        assert!(err(&[4, 25], 3, 256, 12, 0).contains("words*32 % k != 0"));
        assert!(err(&[4, 12], 3, 256, 12, 0).contains("cols % T != 0"));
        assert!(err(&[1, 4, 48], 2, 256, 12, 0).contains("needs k = 3"));
        assert!(err(&[1, 4, 48], 3, 256, 12, 1).contains("axis = 0"));
        assert!(err(&[1, 4, 24], 3, 256, 12, 0).contains("48 words"));
        assert!(err(&[4], 3, 256, 12, 0).contains("must be 2-D"));
        assert!(err(&[0, 24], 3, 256, 12, 0).contains("empty"));
        let e = err(&[4, 12], 3, 256, 12, 0);
        assert!(e.starts_with("trellis codes \"w\" of shape [4, 12]"), "{e}");
        // Sizes that overflow: T*k past 32 bits, words*32, groups*512, rows*cols.
        // T = 2147483664 at k = 2: T*k = 2^32 + 32 does not wrap, one block of 134_217_729 words.
        let g = TrellisGeometry::from_codes_shape("w", &[1, 134_217_729], 2, 2_147_483_664, 12, 0).unwrap();
        assert_eq!((g.cols, g.blocks_per_row(), g.words_per_block()), (2_147_483_664, 1, 134_217_729));
        assert!(err(&[1, 2], 2, 2_147_483_664, 12, 0).contains("cols % T != 0"));
        assert!(err(&[1, usize::MAX / 16], 3, 256, 12, 0).contains("overflows"));
        assert!(err(&[usize::MAX / 256, 4, 48], 3, 256, 12, 0).contains("overflows"));
        assert!(err(&[1 << 40, 1 << 20], 2, 256, 12, 0).contains("more than can be addressed"));
        assert!(TrellisGeometry::row_major(4, usize::MAX, 3, 256, 12, 0).is_err());
        assert!(TrellisGeometry::row_major(4, 256, 3, 256, 12, 0)
            .unwrap()
            .interleaved()
            .unwrap_err()
            .to_string()
            .contains("512"));
    }

    #[test]
    fn hand_built_geometries_are_validated() {
        let g = TrellisGeometry::row_major(3, 1024, 3, 256, 12, 0).unwrap();
        g.validate().unwrap();
        g.interleaved().unwrap().validate().unwrap();
        for bad in [
            TrellisGeometry { rows: usize::MAX, ..g },
            TrellisGeometry { cols: 1000, ..g },
            TrellisGeometry { t: 0, ..g },
            TrellisGeometry { k: 9, ..g },
            TrellisGeometry { block_interleave: 1, ..g },
            TrellisGeometry { block_interleave: 2, k: 2, ..g },
            TrellisGeometry { cols: usize::MAX, k: 8, ..g },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
            // The accessors stay total on them.
            let _ = (bad.codes_shape(), bad.code_words(), bad.blocks_per_row(), bad.word_index(usize::MAX, 7, 3));
        }
    }

    #[test]
    fn word_indices_follow_the_layouts() {
        let g = TrellisGeometry::row_major(3, 1024, 3, 256, 12, 0).unwrap();
        assert_eq!(g.word_index(1, 2, 5), (4 + 2) * 24 + 5);
        let i = g.interleaved().unwrap();
        // Block 3 of row 1 is the odd block of slot 1: ((1 * 3) + 1) * 48 + 24 + j.
        assert_eq!(i.word_index(1, 3, 5), (3 + 1) * 48 + 24 + 5);
    }
}

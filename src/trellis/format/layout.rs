//! Conversions between the two code layouts of a 3-bit matrix (docs/format.md §4): row-major
//! `[rows, cols*3/32]` and the block interleave `[cols/512, rows, 48]`.

use crate::error::{invalid, Result};

use super::geometry::TrellisGeometry;

/// Row-major codes `[rows, cols*3/32]` to the 3-bit block interleave `[cols/512, rows, 48]`.
pub fn row_major_to_interleaved(codes: &[u32], rows: usize, cols: usize) -> Result<Vec<u32>> {
    relayout(codes, rows, cols, true)
}

/// The 3-bit block interleave `[cols/512, rows, 48]` back to row-major `[rows, cols*3/32]`.
pub fn interleaved_to_row_major(codes: &[u32], rows: usize, cols: usize) -> Result<Vec<u32>> {
    relayout(codes, rows, cols, false)
}

/// Moves every block's 24 words between the two layouts of a 3-bit matrix.
fn relayout(codes: &[u32], rows: usize, cols: usize, to_interleaved: bool) -> Result<Vec<u32>> {
    let row_major = TrellisGeometry::row_major(rows, cols, 3, 256, 12, 0)?;
    let interleaved = row_major.interleaved()?;
    if codes.len() != row_major.code_words() {
        invalid!("{} code words for {rows} rows of {cols} 3-bit weights", codes.len());
    }
    let (from, to) = if to_interleaved { (row_major, interleaved) } else { (interleaved, row_major) };
    let mut out = vec![0u32; codes.len()];
    for r in 0..rows {
        for b in 0..row_major.blocks_per_row() {
            let (src, dst) = (from.word_index(r, b, 0), to.word_index(r, b, 0));
            out[dst..dst + 24].copy_from_slice(&codes[src..src + 24]);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_conversions_invert_each_other() {
        let mut rng = crate::trellis::synthetic::SplitMix64::new(1);
        let (rows, cols) = (5, 1024);
        let codes: Vec<u32> = (0..rows * cols * 3 / 32).map(|_| rng.next_u32()).collect();
        let inter = row_major_to_interleaved(&codes, rows, cols).unwrap();
        assert_ne!(inter, codes);
        assert_eq!(interleaved_to_row_major(&inter, rows, cols).unwrap(), codes);
        // Spec §4: a reshape [R, C*3/32] -> [R, C/512, 48] and transpose to [C/512, R, 48].
        for g in 0..cols / 512 {
            for r in 0..rows {
                for w in 0..48 {
                    assert_eq!(inter[(g * rows + r) * 48 + w], codes[r * (cols * 3 / 32) + g * 48 + w]);
                }
            }
        }
    }
}

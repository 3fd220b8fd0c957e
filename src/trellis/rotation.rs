//! The coded axis of a layer as the format describes it (docs/format.md §10): an optional incoherence
//! rotation ([`Rotation`], a seeded random-sign block Hadamard) and the zero padding of the coded
//! axis to whole blocks ([`CodedAxis`]). This file holds the host-side definition and arithmetic
//! (f64, exact orthonormal); the run-time application on MLX is in
//! [`transform`](super::transform).
//!
//! # The rotation
//!
//! For a coded axis of logical length `n`, with block size `b` (a power of two dividing `n`,
//! at most [`MAX_ROTATION_BLOCK`]) and signs `s ∈ {−1, +1}ⁿ`:
//!
//! `Q = diag(s) · blockdiag(H_b / √b, …, H_b / √b)` (`n / b` blocks),
//!
//! where `H_b` is the Sylvester Hadamard matrix of natural order, `H_b[i][j] = (−1)^popcount(i & j)`
//! (symmetric). `Q` is orthogonal. A row vector `v` of length `n` is rotated as `v · Q`: multiply
//! by the signs elementwise, then transform each consecutive block of `b` entries by `H_b / √b`.
//! The inverse is `v · Qᵀ`: transform the blocks, then multiply by the signs.
//!
//! Every row of the stored matrix is rotated along its columns (the coded axis) before coding,
//! `S' = S · Q`, so the decoded stored matrix approximates `S · Q` and the layer's weights are
//! `decode(codes) · Qᵀ`.

use crate::error::{invalid, Result};

use super::synthetic::SplitMix64;

/// The largest rotation block.
pub const MAX_ROTATION_BLOCK: usize = 256;

/// The rotation block of a coded axis of logical length `n`: the largest power of two at most
/// [`MAX_ROTATION_BLOCK`] that divides `n` (576 → 64, 192 → 64, 1536 → 256).
pub fn rotation_block(n: usize) -> Result<usize> {
    if n == 0 {
        invalid!("rotation: an axis of length 0 has no rotation block");
    }
    // The lowest set bit of n is the largest power of two dividing it.
    Ok((n & n.wrapping_neg()).min(MAX_ROTATION_BLOCK))
}

/// A random-sign block Hadamard rotation of one coded axis (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct Rotation {
    signs: Vec<f32>,
    block: usize,
    seed: u64,
}

impl Rotation {
    /// The rotation of an axis of `n` entries drawn from `seed`: block
    /// [`rotation_block(n)`](rotation_block), sign `i` negative where bit 63 of the `i`-th output of
    /// [`SplitMix64::new(seed)`](SplitMix64) is set.
    pub fn seeded(n: usize, seed: u64) -> Result<Rotation> {
        let block = rotation_block(n)?;
        let mut rng = SplitMix64::new(seed);
        let signs = (0..n).map(|_| if rng.next_u64() >> 63 == 1 { -1.0 } else { 1.0 }).collect();
        Rotation::new(signs, block, seed)
    }

    /// A rotation from its parts, checked: at least one sign, every sign exactly `±1`, `block` a
    /// power of two at most [`MAX_ROTATION_BLOCK`] that divides the length. `seed` is recorded
    /// only (the signs are authoritative).
    pub fn new(signs: Vec<f32>, block: usize, seed: u64) -> Result<Rotation> {
        let n = signs.len();
        if n == 0 {
            invalid!("rotation: no signs");
        }
        if !block.is_power_of_two() || block > MAX_ROTATION_BLOCK {
            invalid!("rotation: block {block} is not a power of two in 1..={MAX_ROTATION_BLOCK}");
        }
        if !n.is_multiple_of(block) {
            invalid!("rotation: block {block} does not divide the axis length {n}");
        }
        if let Some((i, s)) = signs.iter().enumerate().find(|(_, &s)| s != 1.0 && s != -1.0) {
            invalid!("rotation: sign {i} is {s}; every sign must be exactly +1 or -1");
        }
        Ok(Rotation { signs, block, seed })
    }

    /// The axis length `n`.
    pub fn len(&self) -> usize {
        self.signs.len()
    }

    /// Always false: a rotation has at least one sign.
    pub fn is_empty(&self) -> bool {
        self.signs.is_empty()
    }

    /// The Hadamard block size `b`.
    pub fn block(&self) -> usize {
        self.block
    }

    /// The seed the signs were drawn from (as recorded).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The signs (each `±1`).
    pub fn signs(&self) -> &[f32] {
        &self.signs
    }

    /// Checks that `data` is whole rows of `n` values; returns the row count.
    fn rows_of(&self, what: &str, len: usize) -> Result<usize> {
        let n = self.len();
        if !len.is_multiple_of(n) {
            invalid!("rotation: {what} of {len} values are not whole rows of {n}");
        }
        Ok(len / n)
    }

    /// `v · Q` for one row in f64.
    pub fn rotate_f64(&self, row: &mut [f64]) -> Result<()> {
        self.rows_of("a row", row.len())?;
        for row in row.chunks_exact_mut(self.len()) {
            for (v, &s) in row.iter_mut().zip(&self.signs) {
                *v *= f64::from(s);
            }
            self.blocks_f64(row);
        }
        Ok(())
    }

    /// `v · Qᵀ` for one row (or whole rows) in f64.
    pub fn inverse_f64(&self, row: &mut [f64]) -> Result<()> {
        self.rows_of("a row", row.len())?;
        for row in row.chunks_exact_mut(self.len()) {
            self.blocks_f64(row);
            for (v, &s) in row.iter_mut().zip(&self.signs) {
                *v *= f64::from(s);
            }
        }
        Ok(())
    }

    /// Every row of `data` (whole rows of `n`) replaced by `row · Q`, computed in f64 and rounded
    /// to f32 once.
    pub fn rotate_rows(&self, data: &mut [f32]) -> Result<()> {
        self.rows_of("the rows", data.len())?;
        let mut buf = vec![0f64; self.len()];
        for row in data.chunks_exact_mut(self.len()) {
            buf.iter_mut().zip(row.iter()).for_each(|(b, &v)| *b = f64::from(v));
            self.rotate_f64(&mut buf)?;
            row.iter_mut().zip(&buf).for_each(|(v, &b)| *v = b as f32);
        }
        Ok(())
    }

    /// Every row of `data` replaced by `row · Qᵀ` (the inverse of [`rotate_rows`](Self::rotate_rows)).
    pub fn inverse_rows(&self, data: &mut [f32]) -> Result<()> {
        self.rows_of("the rows", data.len())?;
        let mut buf = vec![0f64; self.len()];
        for row in data.chunks_exact_mut(self.len()) {
            buf.iter_mut().zip(row.iter()).for_each(|(b, &v)| *b = f64::from(v));
            self.inverse_f64(&mut buf)?;
            row.iter_mut().zip(&buf).for_each(|(v, &b)| *v = b as f32);
        }
        Ok(())
    }

    /// Each block of `b` entries of a row times `H_b / √b` (the fast Walsh–Hadamard butterflies
    /// give the natural-order Sylvester matrix).
    fn blocks_f64(&self, row: &mut [f64]) {
        let b = self.block;
        let norm = 1.0 / (b as f64).sqrt();
        for block in row.chunks_exact_mut(b) {
            let mut h = 1;
            while h < b {
                for i in (0..b).step_by(2 * h) {
                    for j in i..i + h {
                        let (u, v) = (block[j], block[j + h]);
                        block[j] = u + v;
                        block[j + h] = u - v;
                    }
                }
                h *= 2;
            }
            block.iter_mut().for_each(|v| *v *= norm);
        }
    }
}

/// How a layer's coded axis (the stored columns) relates to its logical features: an optional
/// rotation of the logical entries, and zero padding of the stored axis past them.
#[derive(Debug, Clone, PartialEq)]
pub struct CodedAxis {
    /// The rotation of the `logical` entries, if any.
    pub rotation: Option<Rotation>,
    /// The logical length of the coded axis (the stored columns past it are padding).
    pub logical: usize,
}

impl CodedAxis {
    /// A coded axis of `logical` entries with no rotation.
    pub fn plain(logical: usize) -> CodedAxis {
        CodedAxis { rotation: None, logical }
    }

    /// Whether nothing is applied at run time for a stored axis of `stored` columns.
    pub fn is_identity(&self, stored: usize) -> bool {
        self.rotation.is_none() && self.logical == stored
    }

    /// Checks the axis against a stored axis of `stored` columns in blocks of `t`: `logical` in
    /// `stored - t + 1 ..= stored` (padding is less than one block) and at least 1, and a rotation
    /// of exactly `logical` signs.
    pub fn check(&self, stored: usize, t: usize) -> Result<()> {
        let n = self.logical;
        if n == 0 || n > stored || stored - n >= t.max(1) {
            invalid!(
                "coded axis: {n} logical columns do not fit {stored} stored columns (the padding must be less than one block of {t})"
            );
        }
        if let Some(r) = &self.rotation {
            if r.len() != n {
                invalid!("coded axis: the rotation has {} signs but the axis has {n} logical columns", r.len());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_follow_the_rule() {
        let cases = [(576, 64), (192, 64), (1536, 256), (512, 256), (1, 1), (6, 2), (768, 256)];
        for (n, b) in cases {
            assert_eq!(rotation_block(n).unwrap(), b, "n {n}");
        }
        assert!(rotation_block(0).is_err());
    }

    #[test]
    fn the_rotation_is_orthonormal_and_inverts() {
        let r = Rotation::seeded(576, 3).unwrap();
        assert_eq!(r.block(), 64);
        let x: Vec<f64> = (0..576).map(|i| ((i * 37) % 101) as f64 / 50.0 - 1.0).collect();
        let mut y = x.clone();
        r.rotate_f64(&mut y).unwrap();
        let (nx, ny) = (x.iter().map(|v| v * v).sum::<f64>(), y.iter().map(|v| v * v).sum::<f64>());
        assert!((nx - ny).abs() < 1e-12 * nx);
        r.inverse_f64(&mut y).unwrap();
        assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 1e-13));
    }

    #[test]
    fn bad_parts_are_refused() {
        assert!(Rotation::new(vec![1.0, 0.5], 2, 0).unwrap_err().to_string().contains("sign 1 is 0.5"));
        assert!(Rotation::new(vec![1.0; 6], 4, 0).unwrap_err().to_string().contains("does not divide"));
        assert!(Rotation::new(vec![1.0; 6], 3, 0).unwrap_err().to_string().contains("power of two"));
        assert!(Rotation::new(vec![1.0; 1024], 512, 0).is_err());
        assert!(Rotation::new(vec![], 1, 0).is_err());
        assert!(Rotation::new(vec![f32::NAN; 2], 2, 0).is_err());
        assert!(CodedAxis::plain(500).check(768, 256).is_err());
        assert!(CodedAxis::plain(576).check(768, 256).is_ok());
        assert!(CodedAxis { rotation: Some(Rotation::seeded(512, 0).unwrap()), logical: 576 }.check(768, 256).is_err());
    }
}

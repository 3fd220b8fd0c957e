//! A layer's coded axis (docs/format.md §10) on the host: the rotation `x · Q` and zero padding
//! of an axis-1 layer's activations, and for an axis-0 layer the slice of its stored outputs to
//! the logical columns and the inverse rotation `y · Qᵀ`.
//!
//! Each row is rotated in f64 and rounded to f32 once ([`Rotation::rotate_rows`]), on rayon's
//! threads where there are enough rows to pay for waking them.

use std::borrow::Cow;

use rayon::prelude::*;

use crate::alloc::try_with_capacity;
use crate::error::{invalid, Result};
use crate::trellis::rotation::{CodedAxis, Rotation};

/// Values rotated on the calling thread alone: up to this many (a few tens of µs of
/// butterflies) the threads' wake-up would cost about as much as it saves.
const SERIAL_VALUES: usize = 1 << 14;

/// A rotation applied to whole rows in place: [`Rotation::rotate_rows`] or
/// [`Rotation::inverse_rows`].
type RowsRotation = fn(&Rotation, &mut [f32]) -> Result<()>;

/// The first `r.len()` values of every row of `stride` in `data` through `rotate`.
fn rotate_each(data: &mut [f32], stride: usize, r: &Rotation, rotate: RowsRotation) -> Result<()> {
    let one = |row: &mut [f32]| rotate(r, &mut row[..r.len()]);
    if data.len() <= SERIAL_VALUES {
        return data.chunks_exact_mut(stride).try_for_each(one);
    }
    let per_task = stride * (SERIAL_VALUES / stride).max(1);
    data.par_chunks_mut(per_task).try_for_each(|rows| rows.chunks_exact_mut(stride).try_for_each(one))
}

/// The activations an axis-1 layer's stored matrix takes for logical `x` (`m` rows of
/// `axis.logical`): each row times `Q`, then zero columns up to `stored`.
pub(super) fn stored_input<'a>(x: &'a [f32], m: usize, axis: &CodedAxis, stored: usize) -> Result<Cow<'a, [f32]>> {
    let n = axis.logical;
    if m.checked_mul(n) != Some(x.len()) {
        invalid!("host path: {} activations are not {m} rows of {n}", x.len());
    }
    if axis.rotation.is_none() && n == stored {
        return Ok(Cow::Borrowed(x));
    }
    let Some(len) = m.checked_mul(stored) else {
        invalid!("host path: stored activations of [{m}, {stored}] values overflow");
    };
    let mut xs = try_with_capacity(len, || format!("the host path's stored activations [{m}, {stored}]"))?;
    for row in x.chunks_exact(n.max(1)) {
        xs.extend_from_slice(row);
        xs.resize(xs.len() + stored - n, 0.0);
    }
    if let Some(r) = &axis.rotation {
        rotate_each(&mut xs, stored, r, Rotation::rotate_rows)?;
    }
    Ok(Cow::Owned(xs))
}

/// An axis-0 layer's output from its stored matrix's `y` (`m` rows of `stored`): the first
/// `axis.logical` columns of each row, times `Qᵀ`.
pub(super) fn logical_output(y: Vec<f32>, m: usize, axis: &CodedAxis, stored: usize) -> Result<Vec<f32>> {
    let n = axis.logical;
    if m.checked_mul(stored) != Some(y.len()) {
        invalid!("host path: {} outputs are not {m} rows of {stored}", y.len());
    }
    let mut y =
        if n == stored { y } else { y.chunks_exact(stored.max(1)).flat_map(|row| &row[..n]).copied().collect() };
    if let Some(r) = &axis.rotation {
        rotate_each(&mut y, n, r, Rotation::inverse_rows)?;
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trellis::synthetic::gaussian;

    fn axis(n: usize, seed: Option<u64>) -> CodedAxis {
        CodedAxis { rotation: seed.map(|s| Rotation::seeded(n, s).unwrap()), logical: n }
    }

    #[test]
    fn inputs_are_rotated_then_padded_and_outputs_sliced_then_rotated_back() {
        // Serial and threaded row counts, with and without padding or rotation.
        for (n, stored, m, seed) in [
            (96, 128, 3, Some(5)),
            (576, 576, 40, Some(6)),
            (192, 256, 70, Some(7)),
            (64, 64, 2, None),
            (40, 48, 1, None),
        ] {
            let a = axis(n, seed);
            let x = gaussian(m * n, 9).unwrap();
            let xs = stored_input(&x, m, &a, stored).unwrap();
            for (row, (got, want)) in xs.chunks_exact(stored).zip(x.chunks_exact(n)).enumerate() {
                let mut want64: Vec<f64> = want.iter().map(|&v| v as f64).collect();
                if let Some(r) = &a.rotation {
                    r.rotate_f64(&mut want64).unwrap();
                }
                for (j, &g) in got.iter().enumerate() {
                    let w = want64.get(j).map_or(0.0, |&w| w as f32);
                    assert_eq!(g.to_bits(), w.to_bits(), "row {row} column {j} of {n} -> {stored}");
                }
            }
            // Back: the stored columns past `n` are dropped, the rest rotated back to `x`.
            let y = logical_output(xs.into_owned(), m, &a, stored).unwrap();
            assert_eq!(y.len(), x.len());
            for (g, w) in y.iter().zip(&x) {
                assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{g} vs {w}");
            }
        }
    }

    #[test]
    fn wrong_sizes_are_errors() {
        let a = axis(64, Some(1));
        assert!(stored_input(&[0.0; 63], 1, &a, 64).is_err());
        assert!(logical_output(vec![0.0; 65], 1, &a, 64).is_err());
        assert!(stored_input(&[0.0; 64], usize::MAX / 32, &a, 64).is_err());
        assert!(logical_output(vec![0.0; 64], usize::MAX / 32, &a, 64).is_err());
    }
}

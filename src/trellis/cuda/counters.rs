//! Fold counters for several fed calls of the down kernel, zeroed by one fill.
//!
//! The down kernel folds its split-K partial sums in the same launch: the last thread block of a
//! column tile to finish, found through a counter per tile, adds them up. Its counters must be
//! zero when it starts. A call's pre-pass zeroes them (and finds the rows' powers of two); a fed
//! call takes them zeroed from elsewhere and finds the powers of two in its own blocks. A block's
//! q, k·v and o projections then need one fill of all their counters before the first of them,
//! where each would otherwise have a pre-pass launch of its own (docs/cuda-down.md §4).

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, Result};

/// Zeroed fold counters (u32) that fed calls take their parts of, in turn: one MLX fill for
/// them all. Each part is a view of the fill, so two calls never count into the same counters;
/// a part is taken once.
pub struct FoldCounters {
    zeroed: MlxArray,
    taken: usize,
}

impl FoldCounters {
    /// `count` counters, zeroed by one MLX fill (queued, as every MLX operation is).
    pub fn zeroed(count: usize) -> Result<FoldCounters> {
        if count == 0 || i32::try_from(count).is_err() {
            invalid!("fold counters: {count} is not a count one fill holds (1 to 2^31 - 1)");
        }
        Ok(FoldCounters { zeroed: MlxArray::zeros(&[count], Dtype::Uint32)?, taken: 0 })
    }

    /// Counters not yet taken.
    pub fn remaining(&self) -> usize {
        self.zeroed.size() - self.taken
    }

    /// The next `count` counters, as a view of the fill.
    pub(crate) fn take(&mut self, count: usize) -> Result<MlxArray> {
        if count == 0 || count > self.remaining() {
            invalid!("fold counters: a call takes {count}, {} of {} remain", self.remaining(), self.zeroed.size());
        }
        // Both ends fit an i32: `zeroed` checked the whole count.
        let (start, stop) = (self.taken as i32, (self.taken + count) as i32);
        let part = self.zeroed.slice(&[start], &[stop], &[1])?;
        self.taken += count;
        Ok(part)
    }
}

impl std::fmt::Debug for FoldCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FoldCounters({} of {} remaining)", self.remaining(), self.zeroed.size())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_consecutive_zeroed_views_taken_once() {
        let mut counters = FoldCounters::zeroed(10).unwrap();
        let a = counters.take(4).unwrap();
        let b = counters.take(6).unwrap();
        assert_eq!((a.shape(), b.shape(), counters.remaining()), (vec![4], vec![6], 0));
        assert_eq!(a.dtype(), Dtype::Uint32);
        assert_eq!(b.to_vec::<u32>().unwrap(), vec![0; 6]);
        let err = counters.take(1).unwrap_err();
        assert!(err.to_string().contains("takes 1, 0 of 10 remain"), "{err}");
        for count in [0, 1 << 31] {
            assert!(FoldCounters::zeroed(count).is_err(), "{count}");
        }
        assert!(FoldCounters::zeroed(3).unwrap().take(0).is_err());
    }
}

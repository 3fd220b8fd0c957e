//! Tensor-parallel shards of a coded MLP by stored rows (docs/format.md §9): one rule for every
//! projection. Gate and up (axis 1, stored `[out, in]`) store output rows and down (axis 0,
//! stored `[in, out]`) stores input rows, so rank `r` of `n` takes stored rows
//! `[r·R/n, (r+1)·R/n)` of each code tensor (row-major `[R, W]` along its first axis, the 3-bit
//! interleave `[C/512, R, 48]` along its middle one) and of its scales. The slice of the
//! intermediate activation that its gate and up compute is then exactly the down input it holds,
//! and the MLP is `y = Σ_r down_r(silu(gate_r(x)) ⊙ up_r(x))`: one all-reduce per MLP
//! ([`ShardedMlp`](crate::distributed::ShardedMlp)).
//!
//! This module holds the rule ([`RowShard`], [`SHARD_ROW_MULTIPLE`]); the types apply it in their
//! own files: [`TrellisLinear::row_slice`](super::TrellisLinear::row_slice),
//! [`TrellisMlp::shard`](super::TrellisMlp::shard) and, reading only a shard's rows from disk,
//! [`Artifact::mlp_shard`](super::Artifact::mlp_shard).

use std::ops::Range;

use crate::error::{invalid, Result};

/// Stored rows per shard must be a multiple of this (where there is more than one shard).
///
/// 16 is the granularity every kernel works in along the stored rows, so that each shard is
/// served exactly as the whole layer is: the CUDA down kernel walks input rows in steps of 16 to
/// 64 (one 16-row MMA chunk per `ks`) and loads activations 8 at a time where the rows are a
/// multiple of 8; Metal's wide MMA down kernel needs rows in multiples of 8; the CUDA gate/up
/// kernels tile output rows by 16. A shard of other rows would be served (the kernels take
/// ragged ends) but by slower or different paths than the layer it came from. Real MLPs divide
/// well: Qwen3-14B's 17408 intermediate rows are 16 · 1088, so 2, 4, 8, 16 and 17 shards pass.
pub const SHARD_ROW_MULTIPLE: usize = 16;

/// Rank `rank`'s share of `count` equal shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RowShard {
    rank: usize,
    count: usize,
}

impl RowShard {
    /// Rank `rank` of `count` shards (`count >= 1`, `rank < count`).
    pub fn new(rank: usize, count: usize) -> Result<RowShard> {
        if count == 0 {
            invalid!("a layer is split into at least one shard, got 0");
        }
        if rank >= count {
            invalid!("shard rank {rank} is not below the shard count {count}");
        }
        Ok(RowShard { rank, count })
    }

    /// The whole layer (rank 0 of 1).
    pub fn whole() -> RowShard {
        RowShard { rank: 0, count: 1 }
    }

    /// This shard's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of shards.
    pub fn count(&self) -> usize {
        self.count
    }

    /// This shard's stored rows of a tensor of `total` rows: `[rank·total/count, (rank+1)·total/count)`.
    /// Refused (an [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming `what`)
    /// unless `count` divides `total` into shards of a multiple of [`SHARD_ROW_MULTIPLE`] rows;
    /// one shard takes any rows.
    pub fn rows(&self, total: usize, what: &str) -> Result<Range<usize>> {
        if self.count == 1 {
            return Ok(0..total);
        }
        if !total.is_multiple_of(self.count) {
            invalid!("{what}: {total} stored rows do not split into {} equal shards", self.count);
        }
        let per = total / self.count;
        if !per.is_multiple_of(SHARD_ROW_MULTIPLE) {
            invalid!(
                "{what}: {total} stored rows in {} shards give {per} rows each, not a multiple of {SHARD_ROW_MULTIPLE} (the kernels' row granularity)",
                self.count
            );
        }
        Ok(self.rank * per..(self.rank + 1) * per)
    }
}

/// Refuses `what`, stored on `axis`, unless the row rule's `want` (see the module docs): gate and
/// up on axis 1, down on axis 0. On any other axis its stored rows are not the intermediate rows.
pub(crate) fn check_rule_axis(what: &str, axis: u32, want: u32) -> Result<()> {
    if axis != want {
        invalid!(
            "{what} is stored on axis {axis}, but an MLP shards by stored rows only with gate and up on axis 1 (stored [out, in]) and down on axis 0 (stored [in, out])"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_row_rule() {
        let s = |r, n| RowShard::new(r, n).unwrap();
        assert_eq!(s(1, 3).rows(768, "w").unwrap(), 256..512);
        assert_eq!(s(1, 2).rows(17408, "w").unwrap(), 8704..17408);
        assert_eq!(s(0, 1).rows(77, "w").unwrap(), 0..77);
        let e = s(0, 5).rows(768, "w").unwrap_err().to_string();
        assert!(e.contains("do not split into 5 equal shards"), "{e}");
        let e = s(0, 32).rows(768, "w").unwrap_err().to_string();
        assert!(e.contains("24 rows each, not a multiple of 16"), "{e}");
        assert!(RowShard::new(0, 0).unwrap_err().to_string().contains("at least one shard"));
        assert!(RowShard::new(3, 3).unwrap_err().to_string().contains("rank 3 is not below"));
        for n in [2, 4, 8, 16, 17] {
            assert!(s(0, n).rows(17408, "qwen").is_ok(), "{n}");
        }
        check_rule_axis("down", 0, 0).unwrap();
        let e = check_rule_axis("layer \"g\"", 0, 1).unwrap_err();
        assert!(e.to_string().contains("layer \"g\" is stored on axis 0"), "{e}");
    }
}

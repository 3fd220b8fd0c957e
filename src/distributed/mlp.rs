//! [`ShardedMlp`]: one rank's shard of a coded MLP and the all-reduce that completes it.

use std::fmt;
use std::rc::Rc;

use crate::array::MlxArray;
use crate::error::{ErrorContext, Result};
use crate::trellis::{Artifact, ForwardPath, RowShard, TrellisMlp};

use super::group::Group;

/// This rank's shard of a coded MLP (see [`crate::trellis::shard`]) over a [`Group`]:
/// `forward` runs the local MLP on the full activations and sums the ranks' outputs, one
/// `all_sum` per MLP. Every rank must call `forward` on the same activations.
///
/// The sum runs in the activations' dtype, as model runners all-reduce: with 16-bit activations
/// each rank's partial output is rounded to that dtype before the ranks add them, which adds up
/// to about one rounding of the output per rank to the unsharded MLP's error.
#[derive(Clone)]
pub struct ShardedMlp {
    local: TrellisMlp,
    group: Rc<Group>,
}

impl ShardedMlp {
    /// The shard `local` (rank `group.rank()` of `group.size()` of its MLP) over `group`.
    pub fn new(local: TrellisMlp, group: Rc<Group>) -> ShardedMlp {
        ShardedMlp { local, group }
    }

    /// Shards a whole MLP for this process's rank of `group` (it keeps only its rows).
    pub fn from_full(mlp: &TrellisMlp, group: Rc<Group>) -> Result<ShardedMlp> {
        Ok(ShardedMlp { local: mlp.shard(group.rank(), group.size())?, group })
    }

    /// Loads this process's shard of the MLP `prefix` of an artifact, reading only its rows from
    /// disk ([`Artifact::mlp_shard`]).
    pub fn from_artifact(artifact: &Artifact, prefix: &str, group: Rc<Group>) -> Result<ShardedMlp> {
        let local = artifact
            .mlp_shard(prefix, group.rank(), group.size())
            .with_context(|| format!("rank {} of {}", group.rank(), group.size()))?;
        Ok(ShardedMlp { local, group })
    }

    /// The local shard.
    pub fn local(&self) -> &TrellisMlp {
        &self.local
    }

    /// The group.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// This rank's shard.
    pub fn shard(&self) -> RowShard {
        RowShard::new(self.group.rank(), self.group.size()).expect("a group's rank is below its size")
    }

    /// The MLP `y = Σ_ranks down_r(silu(gate_r(x)) ⊙ up_r(x))` over the last dimension of `x`
    /// (`[..., hidden]`), in `x`'s dtype: the local shard by `path`, then one `all_sum` over the
    /// group. Every rank of the group must make the same call.
    pub fn forward(&self, x: &MlxArray, path: ForwardPath) -> Result<MlxArray> {
        let partial = self.local.forward_with(x, path)?;
        if partial.size() == 0 {
            // Every rank has the same empty activations: nothing to sum.
            return Ok(partial);
        }
        partial.all_sum(&self.group)
    }

    /// The local partial output alone (no all-reduce), for timing and checks.
    pub fn forward_local(&self, x: &MlxArray, path: ForwardPath) -> Result<MlxArray> {
        self.local.forward_with(x, path)
    }
}

impl fmt::Debug for ShardedMlp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ShardedMlp({:?} over {:?})", self.local, self.group)
    }
}

/// The relErr gate of an `n`-rank [`ShardedMlp`] with bf16 activations against the whole MLP:
/// each rank's partial output is rounded to bf16 and the all-reduce adds them in bf16, 2n - 1
/// roundings of half a bf16 unit (2^-8 of the value) against the whole MLP's one, so
/// (n + 1) · 2^-8, and never below 1e-2, the bf16 gate of one process.
pub fn bf16_tp_gate(n: usize) -> f64 {
    ((n as f64 + 1.0) * 2f64.powi(-8)).max(1e-2)
}

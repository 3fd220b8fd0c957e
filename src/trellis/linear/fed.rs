//! Fed calls on MLX's CUDA back-end: several coded layers coded along their outputs, run on one
//! fill of fold counters ([`FoldCounters`]) instead of a pre-pass launch each. A block's q, k·v
//! and o projections are three launches this way (and their part of a fill the runner shares
//! among its calls), where each call with its own pre-pass is two launches (docs/cuda-down.md §4). The down kernel's blocks then find their
//! rows' powers of two over their own split of the inputs (`BLOCK_EXP`), so a fed call's bits
//! are not the pre-passed call's; both are checked against the f64 reference.

use crate::array::MlxArray;
use crate::device::{backend, Backend, Stream};
use crate::dtype::Dtype;
use crate::error::{invalid, ErrorContext, Result};
use crate::trellis::checks::activation_rows;
use crate::trellis::cuda::down::{self, OutputRotation};
use crate::trellis::cuda::FoldCounters;

use super::{ForwardPath, TrellisLinear};

/// One launch of a fed call: a layer, or two neighbours of one geometry as the pair variant, with
/// the rotations their fold turns back.
enum FedLaunch<'a> {
    Single(&'a TrellisLinear, Option<OutputRotation<'a>>),
    Pair([&'a TrellisLinear; 2], Option<[OutputRotation<'a>; 2]>),
}

impl FedLaunch<'_> {
    /// The counters it takes for `m` rows of `dtype` activations; `None` where its plan does not
    /// run fed.
    fn counters(&self, m: usize, dtype: Dtype) -> Option<usize> {
        let (g, pair, block) = match self {
            FedLaunch::Single(l, r) => (&l.geometry, false, r.map(|r| r.block)),
            FedLaunch::Pair([a, _], r) => (&a.geometry, true, r.map(|[r, _]| r.block)),
        };
        down::fed_counters_for(g, m, dtype, pair, block)
    }
}

/// A fed call checked and ready: its launches with the fold counters each takes, the rows of the
/// input they take (`[M, in]`) and the leading shape of their outputs.
struct FedPlan<'a> {
    launches: Vec<(FedLaunch<'a>, usize)>,
    x2: MlxArray,
    lead: Vec<usize>,
}

/// The launches a fed call of `layers` (one input) runs, pairing neighbours as
/// [`TrellisLinear::forward_shared_input`] does; `None` where a layer cannot run fed: not coded
/// along its outputs on a geometry the down kernel serves, or with an output transform its fold
/// does not turn back.
fn launches<'a>(layers: &[&'a TrellisLinear], dtype: Dtype) -> Option<Vec<FedLaunch<'a>>> {
    let mut out = Vec::with_capacity(layers.len());
    let mut i = 0;
    while i < layers.len() {
        let a = layers[i];
        if let Some(rotations) = layers.get(i + 1).and_then(|&b| TrellisLinear::cuda_pair_rotations(a, b, dtype)) {
            out.push(FedLaunch::Pair([a, layers[i + 1]], rotations));
            i += 2;
            continue;
        }
        let served = a.geometry.axis == 0 && down::supports(&a.geometry) && a.best_path() == ForwardPath::Cuda;
        let rotation = a.cuda_output_rotation(ForwardPath::Cuda, dtype);
        if !served || (rotation.is_none() && a.has_output_transform()) {
            return None;
        }
        out.push(FedLaunch::Single(a, rotation));
        i += 1;
    }
    Some(out)
}

impl TrellisLinear {
    /// The fold counters that [`forward_shared_input_fed`](TrellisLinear::forward_shared_input_fed)
    /// (or, for one layer, [`forward_residual_fed`](TrellisLinear::forward_residual_fed)) takes
    /// for `m` rows of `dtype` activations, or `None` where those calls do not run: a back-end
    /// other than CUDA or a stream off the GPU, a layer not coded along its outputs or whose output
    /// transform the down kernel's fold does not turn back, or a row count whose plan runs a
    /// pre-pass (more than 8 rows, say). A runner sums them over its calls (a block's, or a whole
    /// forward pass's) and makes one [`FoldCounters`] for them.
    pub fn fed_counters(layers: &[&TrellisLinear], m: usize, dtype: Dtype) -> Option<usize> {
        if layers.is_empty() || backend() != Backend::Cuda || !Stream::current_is_gpu() {
            return None;
        }
        launches(layers, dtype)?.iter().try_fold(0usize, |sum, l| sum.checked_add(l.counters(m, dtype)?))
    }

    /// [`forward_shared_input`](TrellisLinear::forward_shared_input) on CUDA, each launch taking
    /// its fold counters from `counters` instead of a pre-pass ([`TrellisLinear::fed_counters`]
    /// of them): two neighbours of one geometry as one launch, every output rotation turned back in
    /// the fold. An error, before anything runs, where the call does not run fed.
    pub fn forward_shared_input_fed(
        layers: &[&TrellisLinear],
        x: &MlxArray,
        counters: &mut FoldCounters,
    ) -> Result<Vec<MlxArray>> {
        let names = || layers.iter().map(|l| l.name.as_str()).collect::<Vec<_>>().join(", ");
        let FedPlan { launches, x2, lead } =
            Self::fed_plan(layers, x, counters).with_context(|| format!("{} fed on one input", names()))?;
        let shape = |l: &TrellisLinear| lead.iter().copied().chain([l.out_features()]).collect::<Vec<_>>();
        let mut ys = Vec::with_capacity(layers.len());
        for (launch, count) in launches {
            let part = counters.take(count)?;
            match launch {
                FedLaunch::Single(l, rotation) => {
                    ys.push(l.fed_forward(&x2, rotation, None, &part)?.reshape(&shape(l))?)
                }
                FedLaunch::Pair([a, b], rotations) => {
                    let g = &a.geometry;
                    let (codes, scales) = ([&a.codes, &b.codes], [&a.scales, &b.scales]);
                    let pair = down::down_pair_fed(&a.stored_input(&x2)?, codes, scales, g, rotations, &part);
                    let pair = pair.with_context(|| format!("{} and {} ({g}) fed by the cuda path", a.name, b.name))?;
                    for y in pair {
                        ys.push(y.reshape(&shape(a))?);
                    }
                }
            }
        }
        Ok(ys)
    }

    /// [`forward_residual`](TrellisLinear::forward_residual) on CUDA, the launch taking its fold
    /// counters from `counters` ([`TrellisLinear::fed_counters`] of `[self]`): one launch, the
    /// residual (of the output's shape and `x`'s dtype) added in its fold. An error, before
    /// anything runs, where the call does not run fed.
    pub fn forward_residual_fed(
        &self,
        x: &MlxArray,
        residual: &MlxArray,
        counters: &mut FoldCounters,
    ) -> Result<MlxArray> {
        let what = || format!("{} ({}) plus a residual, fed", self.name, self.geometry);
        let FedPlan { mut launches, x2, lead: mut out_shape } =
            Self::fed_plan(&[self], x, counters).with_context(what)?;
        let (FedLaunch::Single(_, rotation), count) = launches.remove(0) else {
            unreachable!("one layer is one launch");
        };
        out_shape.push(self.out_features());
        if residual.shape() != out_shape || residual.dtype() != x.dtype() {
            invalid!(
                "{}: residual {:?} {} must have the output's shape {out_shape:?} and the activations' dtype {}",
                what(),
                residual.shape(),
                residual.dtype(),
                x.dtype()
            );
        }
        let m = x2.shape()[0];
        let part = counters.take(count)?;
        let r2 = residual.reshape(&[m, self.out_features()])?;
        self.fed_forward(&x2, rotation, Some(&r2), &part)?.reshape(&out_shape)
    }

    /// The launches of a fed call of `layers` on `x` with the fold counters each takes, the rows
    /// of `x` they take and the leading shape of their outputs; an error where the layers do not
    /// share their input or do not run fed at this row count, or `counters` holds too few.
    fn fed_plan<'a>(layers: &[&'a TrellisLinear], x: &MlxArray, counters: &FoldCounters) -> Result<FedPlan<'a>> {
        let dtype = x.dtype();
        let (Some(first), true) = (layers.first(), backend() == Backend::Cuda && Stream::current_is_gpu()) else {
            invalid!("a fed call runs layers on MLX's CUDA back-end, on the GPU");
        };
        super::check_shared_input(first, layers)?;
        let Some(plan) = launches(layers, dtype) else {
            invalid!("a fed call runs layers coded along their outputs, on a geometry the down kernel serves, whose output transform its fold turns back");
        };
        let (x2, lead) = activation_rows(&first.name, "layer", x, first.in_features(), Some(&first.geometry))?;
        let m = x2.shape()[0];
        let mut want = 0usize;
        let mut counted = Vec::with_capacity(plan.len());
        for launch in plan {
            let Some(n) = launch.counters(m, dtype) else {
                invalid!(
                    "{m} rows of {dtype} activations do not run fed (1 to {} rows, as the plan has it)",
                    down::FED_MAX_ROWS
                );
            };
            want = want.saturating_add(n);
            counted.push((launch, n));
        }
        if want > counters.remaining() {
            invalid!("the call takes {want} fold counters, {} remain", counters.remaining());
        }
        for l in layers {
            l.check_fits(m, dtype)?;
        }
        Ok(FedPlan { launches: counted, x2, lead })
    }

    /// One fed launch of this layer on `x2` (logical rows), its rotation turned back in the fold
    /// and `residual` (`[m, out]`) added there where given.
    fn fed_forward(
        &self,
        x2: &MlxArray,
        rotation: Option<OutputRotation<'_>>,
        residual: Option<&MlxArray>,
        counters: &MlxArray,
    ) -> Result<MlxArray> {
        let (g, xs) = (&self.geometry, self.stored_input(x2)?);
        let y = match rotation {
            Some(r) => down::down_rotated_fed(&xs, &self.codes, &self.scales, g, r, residual, counters),
            None => down::down_fed(&xs, &self.codes, &self.scales, g, counters, residual),
        };
        y.with_context(|| format!("{} ({g}) fed by the cuda path", self.name))
    }
}

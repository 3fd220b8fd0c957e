//! [`TrellisMlp`]: a coded MLP of the Qwen/Llama convention (docs/format.md §9),
//! `y = down(silu(gate(x)) ⊙ up(x))`, with gate and up stored `[out, in]` (axis 1) and down
//! stored `[in, out]` (axis 0), each its own [`TrellisLinear`].
//!
//! Any valid combination of projections is accepted: gate and up on either axis, of different
//! bit widths, rotated or padded (docs/format.md §10). The gate·up·SwiGLU part runs as one fused kernel
//! where the back-end has one and it applies (gate and up both on axis 1 with one geometry and
//! one coded axis: both code tensors read for the same output rows, the input rotated once,
//! `silu(g) ⊙ u` written in the activation dtype); otherwise gate and up run projection by
//! projection. The down projection runs by its own kernels. On the host path (MLX's CPU
//! back-end) the whole MLP is one call: one evaluation of its input, every projection, rotation
//! and the SwiGLU in f32 on the host, one rounding of its output. The paths follow
//! [`TrellisLinear`]'s rule: a forced path whose kernels do not serve a part fails with
//! [`Error::Unserved`](crate::Error::Unserved); [`ForwardPath::Auto`] falls back to the generic
//! path part by part (projection by projection where the fused kernel does not apply).
//!
//! Every method of the type is here, its tensor-parallel shards included ([`TrellisMlp::shard`],
//! [`TrellisMlp::from_artifact_shard`]); the row rule they apply is [`RowShard`]'s (`shard.rs`),
//! and the reading of a shard's rows from disk is [`Artifact::mlp_shard`]'s (`model/`).

use std::fmt;

use crate::array::MlxArray;
use crate::device::Stream;
use crate::dtype::Dtype;
use crate::error::{invalid, ErrorContext, ErrorKind, Result};

use super::checks::{activation_rows, same_but_bits};
use super::cuda::swiglu_rotate::Side;
use super::cuda::FoldCounters;
use super::linear::{from_host_f64, host_f64, resolve_auto, ForwardPath, TrellisLinear};
use super::model::Artifact;
use super::reference_coded::{mlp_coded_f64, swiglu_coded_f64};
use super::shard::{check_rule_axis, RowShard};
use super::{cuda, host, metal};

/// One coded MLP: gate, up and down projections of matching widths.
#[derive(Clone)]
pub struct TrellisMlp {
    gate: TrellisLinear,
    up: TrellisLinear,
    down: TrellisLinear,
}

impl TrellisMlp {
    /// An MLP from its three projections: gate and up map `hidden -> intermediate`, down maps
    /// `intermediate -> hidden`.
    pub fn new(gate: TrellisLinear, up: TrellisLinear, down: TrellisLinear) -> Result<TrellisMlp> {
        let (u, d) = (&up, &down);
        let hidden = gate.in_features();
        let inter = gate.out_features();
        if (u.in_features(), u.out_features()) != (hidden, inter) {
            invalid!(
                "MLP: gate {:?} maps {hidden} -> {inter} but up {:?} maps {} -> {}",
                gate.name(),
                up.name(),
                u.in_features(),
                u.out_features()
            );
        }
        if (d.in_features(), d.out_features()) != (inter, hidden) {
            invalid!(
                "MLP: gate and up map {hidden} -> {inter} but down {:?} maps {} -> {} (expected {inter} -> {hidden})",
                down.name(),
                d.in_features(),
                d.out_features()
            );
        }
        Ok(TrellisMlp { gate, up, down })
    }

    /// The MLP `PREFIX.gate_proj`, `PREFIX.up_proj`, `PREFIX.down_proj` of a model directory
    /// (each with its own quantization entry), for example `prefix = "model.layers.0.mlp"`.
    pub fn from_artifact(artifact: &Artifact, prefix: &str) -> Result<TrellisMlp> {
        let load = |name: &str| artifact.module(&format!("{prefix}.{name}"));
        (|| TrellisMlp::new(load("gate_proj")?, load("up_proj")?, load("down_proj")?))()
            .with_context(|| format!("MLP {prefix:?}"))
    }

    /// [`Artifact::mlp_shard`]: rank `rank`'s shard of `count` of the MLP `prefix`, read from disk
    /// alone.
    pub fn from_artifact_shard(artifact: &Artifact, prefix: &str, rank: usize, count: usize) -> Result<TrellisMlp> {
        artifact.mlp_shard(prefix, rank, count)
    }

    /// Rank `rank`'s shard of `count` (see [`RowShard`]): gate, up and down restricted to the
    /// same intermediate rows, `hidden -> intermediate / count -> hidden`. Summed over the ranks,
    /// the shards' outputs are the MLP's. Refused unless gate and up are stored on axis 1 and down
    /// on axis 0, and the intermediate rows split into equal shards of a multiple of
    /// [`SHARD_ROW_MULTIPLE`](super::SHARD_ROW_MULTIPLE) rows.
    pub fn shard(&self, rank: usize, count: usize) -> Result<TrellisMlp> {
        let cut = || {
            let shard = RowShard::new(rank, count)?;
            for (l, want) in [(self.gate(), 1), (self.up(), 1), (self.down(), 0)] {
                check_rule_axis(&format!("layer {:?}", l.name()), l.geometry().axis, want)?;
            }
            let rows = shard.rows(self.intermediate(), &format!("MLP of {:?}", self.down().name()))?;
            let part = |l: &TrellisLinear| l.row_slice(rows.clone());
            TrellisMlp::new(part(self.gate())?, part(self.up())?, part(self.down())?)
        };
        cut().with_context(|| format!("shard {rank} of {count} of the MLP of {:?}", self.down().name()))
    }

    /// The gate projection.
    pub fn gate(&self) -> &TrellisLinear {
        &self.gate
    }

    /// The up projection.
    pub fn up(&self) -> &TrellisLinear {
        &self.up
    }

    /// The down projection.
    pub fn down(&self) -> &TrellisLinear {
        &self.down
    }

    /// The model width (the MLP's input and output features).
    pub fn hidden(&self) -> usize {
        self.gate.in_features()
    }

    /// The intermediate width (gate and up outputs, down inputs).
    pub fn intermediate(&self) -> usize {
        self.gate.out_features()
    }

    /// Whether gate and up can run as one fused kernel: both stored `[out, in]` (axis 1) with one
    /// geometry but for their bit widths, and one coded axis, so one transformed input feeds both.
    pub fn fuses_gate_up(&self) -> bool {
        let (g, u) = (self.gate.geometry(), self.up.geometry());
        g.axis == 1 && same_but_bits(g, u) && self.gate.coded_axis() == self.up.coded_axis()
    }

    /// Whether [`TrellisMlp::forward`] on this thread joins gate and up through one launch on MLX's
    /// CUDA back-end for activations of `dtype`: the rotations turned back, the SwiGLU, the down
    /// projection's input rotation and padding (see the module documentation). It does where
    /// gate and up do not fuse, every projection's kernels serve its geometry, the rotations'
    /// blocks are served and this thread's operations go to the GPU.
    pub fn joins_on_cuda(&self, dtype: Dtype) -> bool {
        self.cuda_join_sides(dtype).is_some()
    }

    /// The three sides of the CUDA join where it applies ([`TrellisMlp::joins_on_cuda`]). The
    /// stream is checked here once, for the three sides (it runs at every forward).
    fn cuda_join_sides(&self, dtype: Dtype) -> Option<(Side<'_>, Side<'_>, Side<'_>)> {
        let layers = [&self.gate, &self.up, &self.down];
        if self.fuses_gate_up()
            || !cuda::rotate::serves(dtype, 1)
            || layers.iter().any(|l| l.best_path() != ForwardPath::Cuda)
            || !Stream::current_is_gpu()
        {
            return None;
        }
        Some((self.gate.cuda_side(false, dtype)?, self.up.cuda_side(false, dtype)?, self.down.cuda_side(true, dtype)?))
    }

    /// The path [`ForwardPath::Auto`] tries first on this machine for the fused gate·up·SwiGLU
    /// part: the gate's (the fused kernels dispatch on the gate's geometry).
    pub fn best_path(&self) -> ForwardPath {
        self.gate.best_path()
    }

    /// `down(silu(gate(x)) ⊙ up(x))` over the last dimension of `x` (`[..., hidden]`), in `x`'s
    /// dtype, by the best path for this back-end.
    pub fn forward(&self, x: &MlxArray) -> Result<MlxArray> {
        self.forward_with(x, ForwardPath::Auto)
    }

    /// [`TrellisMlp::forward`] by a chosen path. [`ForwardPath::Reference`] computes the whole MLP
    /// in f64 on the host with no intermediate rounding.
    pub fn forward_with(&self, x: &MlxArray, path: ForwardPath) -> Result<MlxArray> {
        self.forward_plus(x, None, path)
    }

    /// `residual + forward(x)` (`residual` of `x`'s shape): a model's residual stream after the
    /// MLP, by the best path for this back-end. On CUDA the add runs in the down projection's
    /// launch wherever its output needs no transform back (see
    /// [`TrellisLinear::forward_residual`]), in f32 before the output's one rounding (one launch
    /// fewer); elsewhere it is MLX's add after [`TrellisMlp::forward`].
    pub fn forward_residual(&self, x: &MlxArray, residual: &MlxArray) -> Result<MlxArray> {
        self.forward_residual_with(x, residual, ForwardPath::Auto)
    }

    /// [`TrellisMlp::forward_residual`] by a chosen path.
    pub fn forward_residual_with(&self, x: &MlxArray, residual: &MlxArray, path: ForwardPath) -> Result<MlxArray> {
        if residual.shape() != x.shape() {
            invalid!("MLP residual {:?} must have the activations' shape {:?}", residual.shape(), x.shape());
        }
        self.forward_plus(x, Some(residual), path)
    }

    /// The fold counters [`TrellisMlp::forward_residual_fed`] takes for `m` rows of `dtype`
    /// activations: where [`TrellisMlp::joins_on_cuda`] and gate and up, stored along their outputs
    /// with one geometry, run as one fed launch of the down kernel's pair variant (1 to 8 rows);
    /// `None` elsewhere. A runner adds them to its block's other fed calls' and makes one
    /// [`FoldCounters`] for them all.
    pub fn fed_counters(&self, m: usize, dtype: Dtype) -> Option<usize> {
        let (g, u) = (self.gate.geometry(), self.up.geometry());
        if g.axis != 0 || g != u || !self.joins_on_cuda(dtype) {
            return None;
        }
        cuda::down::fed_counters_for(g, m, dtype, true, None)
    }

    /// [`TrellisMlp::forward_residual`] by the CUDA join, gate and up's launch taking its fold
    /// counters from `counters` instead of a pre-pass ([`TrellisMlp::fed_counters`] of them). An
    /// error, before anything runs, where it does not run so.
    pub fn forward_residual_fed(
        &self,
        x: &MlxArray,
        residual: &MlxArray,
        counters: &mut FoldCounters,
    ) -> Result<MlxArray> {
        if residual.shape() != x.shape() {
            invalid!("MLP residual {:?} must have the activations' shape {:?}", residual.shape(), x.shape());
        }
        let m = x.shape()[..x.ndim().saturating_sub(1)].iter().product();
        if self.fed_counters(m, x.dtype()).is_none() {
            invalid!(
                "MLP of {:?}, {:?} and {:?}: {m} rows of {} activations do not run fed (gate and up stored along their outputs with one geometry, joined on CUDA, 1 to 8 rows)",
                self.gate.name(),
                self.up.name(),
                self.down.name(),
                x.dtype()
            );
        }
        match self.joined_on_cuda(x, ForwardPath::Cuda, Some(residual), Some(counters))? {
            Some(y) => Ok(y),
            None => invalid!(
                "MLP of {:?}, {:?} and {:?}: no rows to run fed",
                self.gate.name(),
                self.up.name(),
                self.down.name()
            ),
        }
    }

    /// The MLP of `x` by `path`, plus `residual` where given: the CUDA join where it applies, else
    /// gate·up·SwiGLU and down by the path (the add by the down projection's
    /// [`TrellisLinear::forward_residual_with`]).
    fn forward_plus(&self, x: &MlxArray, residual: Option<&MlxArray>, path: ForwardPath) -> Result<MlxArray> {
        if path == ForwardPath::Reference {
            let (x2, lead) = self.rows(x)?;
            let m = x2.shape()[0];
            let (g, u, d) = (self.gate.to_host()?, self.up.to_host()?, self.down.to_host()?);
            let (ga, ua, da) = (self.gate.coded_axis(), self.up.coded_axis(), self.down.coded_axis());
            let y = mlp_coded_f64(&host_f64(&x2)?, m, [(&g, &ga), (&u, &ua), (&d, &da)])?;
            let y = from_host_f64(&y, &widths(&lead, self.hidden()), x.dtype())?;
            return match residual {
                Some(r) => r.add(&y),
                None => Ok(y),
            };
        }
        if path == ForwardPath::Host || (path == ForwardPath::Auto && self.runs_on_host()) {
            let y = self.host_forward(x)?;
            return match residual {
                Some(r) => r.add(&y),
                None => Ok(y),
            };
        }
        if let Some(y) = self.joined_on_cuda(x, path, residual, None)? {
            return Ok(y);
        }
        if let Some(y) = self.fed_on_cuda(x, path, residual)? {
            return Ok(y);
        }
        let h = self.swiglu_with(x, path)?;
        match residual {
            Some(r) => self.down.forward_residual_with(&h, r, path),
            None => self.down.forward_with(&h, path),
        }
    }

    /// [`TrellisMlp::forward_with`] on MLX's CUDA back-end where gate and up do not fuse: gate and
    /// up by their kernels to their stored outputs (one launch for both where they share a
    /// geometry on axis 0), then one launch for the SwiGLU with the
    /// rotations on either side of it (`cuda::swiglu_rotate`), then the down projection's kernel.
    /// `None` where that does not apply: another path or back-end, gate and up fused, a rotation
    /// its kernel does not serve, no rows, or (with `Auto`) a projection its kernel does not serve
    /// at this row count, which the projection-by-projection path then takes.
    /// With `residual` (`x`'s shape) the result is `residual + forward(x)`.
    /// With `fed`, gate and up's pair launch takes its fold counters from it (the caller has
    /// checked [`TrellisMlp::fed_counters`]).
    fn joined_on_cuda(
        &self,
        x: &MlxArray,
        path: ForwardPath,
        residual: Option<&MlxArray>,
        mut fed: Option<&mut FoldCounters>,
    ) -> Result<Option<MlxArray>> {
        if !matches!(path, ForwardPath::Auto | ForwardPath::Cuda) {
            return Ok(None);
        }
        let Some((gate, up, down)) = self.cuda_join_sides(x.dtype()) else {
            return Ok(None);
        };
        let (x2, lead) = self.rows(x)?;
        let (m, dtype) = (x2.shape()[0], x2.dtype());
        if m == 0 {
            return Ok(None);
        }
        let mut run = || -> Result<MlxArray> {
            for l in [&self.gate, &self.up, &self.down] {
                l.check_fits(m, dtype)?;
            }
            let [g, u] = self.gate_up_stored_on_cuda(&x2, fed.as_deref_mut())?;
            let h = cuda::swiglu_rotate::swiglu_rotated(&g, &u, self.intermediate(), gate, up, down)?;
            let y = match residual {
                Some(r) => {
                    let r2 = r.reshape(&widths(&[m], self.hidden()))?;
                    self.down.forward_stored_input_plus(&h, &r2, ForwardPath::Cuda)?
                }
                None => self.down.forward_stored_input(&h, ForwardPath::Cuda)?,
            };
            y.reshape(&widths(&lead, self.hidden()))
        };
        match run() {
            Ok(y) => Ok(Some(y)),
            Err(e) if path == ForwardPath::Auto && e.kind() == ErrorKind::Unserved => Ok(None),
            Err(e) => Err(e).with_context(|| {
                format!(
                    "MLP of {:?}, {:?} and {:?} by the cuda path",
                    self.gate.name(),
                    self.up.name(),
                    self.down.name()
                )
            }),
        }
    }

    /// [`TrellisMlp::forward_with`] on MLX's CUDA back-end where gate and up fuse, the down
    /// projection is stored along its outputs with no transform of them, up to
    /// `cuda::down::FED_MAX_ROWS` rows: the fused gate·up·SwiGLU (the fragment kernel, or from
    /// `GEMM_FUSED_MIN_ROWS` rows of 16-bit activations the GEMM after its hand-over pre-pass),
    /// which also zeroes the down kernel's fold counters, then the down kernel,
    /// which finds its rows' powers of two itself (no pre-pass launch between them; the residual
    /// added in its fold where given in `x`'s dtype). `None` where that does not apply, where
    /// the other paths then run the MLP as before.
    fn fed_on_cuda(&self, x: &MlxArray, path: ForwardPath, residual: Option<&MlxArray>) -> Result<Option<MlxArray>> {
        let (gate, up, down) = (&self.gate, &self.up, &self.down);
        let served = [gate, up, down].iter().all(|l| l.best_path() == ForwardPath::Cuda);
        if !matches!(path, ForwardPath::Auto | ForwardPath::Cuda)
            || !served
            || !self.fuses_gate_up()
            || down.geometry().axis != 0
            || down.has_output_transform()
            || !Stream::current_is_gpu()
        {
            return Ok(None);
        }
        let (x2, lead) = self.rows(x)?;
        let (m, dtype) = (x2.shape()[0], x2.dtype());
        let Some(counters) = cuda::down::fed_counters(down.geometry(), m, dtype) else {
            return Ok(None);
        };
        let run = || -> Result<Option<MlxArray>> {
            for l in [gate, up, down] {
                l.check_fits(m, dtype)?;
            }
            let xs = gate.stored_input(&x2)?;
            let Some((h, counters)) = cuda::gate_up::swiglu_feeding(&xs, gate.operands(), up.operands(), counters)?
            else {
                return Ok(None);
            };
            let r2 = residual.map(|r| r.reshape(&widths(&[m], self.hidden()))).transpose()?;
            let fold_residual = r2.as_ref().filter(|r| r.dtype() == dtype);
            let (codes, scales) = (down.codes(), down.scales());
            let mut y = cuda::down::down_fed(&h, codes, scales, down.geometry(), &counters, fold_residual)?;
            if let (Some(r), None) = (&r2, fold_residual) {
                y = r.add(&y)?;
            }
            Ok(Some(y.reshape(&widths(&lead, self.hidden()))?))
        };
        match run() {
            Err(e) if path == ForwardPath::Auto && e.kind() == ErrorKind::Unserved => Ok(None),
            y => y.with_context(|| {
                format!("MLP of {:?}, {:?} and {:?} by the cuda path", gate.name(), up.name(), down.name())
            }),
        }
    }

    /// Whether [`ForwardPath::Auto`] runs each projection on the host path (MLX's CPU
    /// back-end): then the whole MLP is one host call.
    fn runs_on_host(&self) -> bool {
        [&self.gate, &self.up, &self.down].iter().all(|l| l.best_path() == ForwardPath::Host)
    }

    /// The MLP of `x` on the host path as one call: one evaluation of `x`, gate, up, the SwiGLU
    /// and down (each with its rotation and padding) in f32 on the host, one rounding to `x`'s
    /// dtype.
    fn host_forward(&self, x: &MlxArray) -> Result<MlxArray> {
        let (x2, lead) = self.rows(x)?;
        let (m, dtype) = (x2.shape()[0], x2.dtype());
        let out_shape = widths(&lead, self.hidden());
        if m == 0 {
            return MlxArray::zeros(&out_shape, dtype);
        }
        let (gate, up, down) = (&self.gate, &self.up, &self.down);
        let y = (|| {
            for l in [gate, up, down] {
                l.check_fits(m, dtype)?;
            }
            let ops = (gate.host_operands()?, up.host_operands()?, down.host_operands()?);
            host::mlp_forward(ops.0, ops.1, ops.2, &x2)?.reshape(&out_shape)
        })();
        y.with_context(|| format!("MLP of {:?}, {:?} and {:?} by the host path", gate.name(), up.name(), down.name()))
    }

    /// Gate's and up's stored outputs on MLX's CUDA back-end: one launch of the down kernel's pair
    /// variant where both are stored along their outputs (axis 0) with one geometry (their input
    /// then needs no transform), a call each otherwise.
    /// With `fed`, that launch takes its fold counters from it and runs no pre-pass.
    fn gate_up_stored_on_cuda(&self, x2: &MlxArray, fed: Option<&mut FoldCounters>) -> Result<[MlxArray; 2]> {
        let (g, u) = (&self.gate, &self.up);
        if g.geometry().axis == 0 && g.geometry() == u.geometry() {
            let (codes, scales, geometry) = ([g.codes(), u.codes()], [g.scales(), u.scales()], g.geometry());
            let pair = match fed {
                Some(counters) => {
                    let (m, dtype) = (x2.shape()[0], x2.dtype());
                    let Some(n) = cuda::down::fed_counters_for(geometry, m, dtype, true, None) else {
                        invalid!(
                            "{:?} and {:?} ({geometry}): {m} rows of {dtype} activations do not run fed",
                            g.name(),
                            u.name()
                        );
                    };
                    cuda::down::down_pair_fed(x2, codes, scales, geometry, None, &counters.take(n)?)
                }
                None => cuda::down::down_pair_cuda(x2, codes, scales, geometry),
            };
            return pair.with_context(|| {
                format!("{:?} and {:?} ({}) by one launch of the cuda path", g.name(), u.name(), g.geometry())
            });
        }
        Ok([g.stored_output(x2, ForwardPath::Cuda)?, u.stored_output(x2, ForwardPath::Cuda)?])
    }

    /// `silu(gate(x)) ⊙ up(x)` (`[..., intermediate]` in `x`'s dtype), the input of the down
    /// projection, by a chosen path: one fused kernel on the GPU back-ends where it applies
    /// ([`fuses_gate_up`](Self::fuses_gate_up)), gate and up each by the path otherwise.
    pub fn swiglu_with(&self, x: &MlxArray, path: ForwardPath) -> Result<MlxArray> {
        let (x2, lead) = self.rows(x)?;
        let out_shape = widths(&lead, self.intermediate());
        if x2.shape()[0] == 0 {
            return MlxArray::zeros(&out_shape, x.dtype());
        }
        if path == ForwardPath::Auto && !self.fuses_gate_up() && !self.runs_on_host() {
            // Each projection by its own best path.
            let h = (|| self.gate.forward(&x2)?.silu()?.multiply(&self.up.forward(&x2)?))();
            return h.and_then(|h| h.reshape(&out_shape)).with_context(|| {
                format!("gate·up·SwiGLU of {:?} and {:?}, projection by projection", self.gate.name(), self.up.name())
            });
        }
        let (path, h) = resolve_auto(path, || self.best_path(), |path| self.swiglu_2d(&x2, path));
        h.and_then(|h| h.reshape(&out_shape)).with_context(|| {
            format!("gate·up·SwiGLU of {:?} and {:?} by the {path} path", self.gate.name(), self.up.name())
        })
    }

    /// [`TrellisMlp::swiglu_with`] on `x2 [m, hidden]` by `path` (not `Auto`).
    fn swiglu_2d(&self, x2: &MlxArray, path: ForwardPath) -> Result<MlxArray> {
        let m = x2.shape()[0];
        match path {
            ForwardPath::Auto => unreachable!("resolved by swiglu_with"),
            ForwardPath::Reference => {
                let (g, u) = (self.gate.to_host()?, self.up.to_host()?);
                let (ga, ua) = (self.gate.coded_axis(), self.up.coded_axis());
                let h = swiglu_coded_f64(&host_f64(x2)?, m, (&g, &ga), (&u, &ua))?;
                from_host_f64(&h, &[m, self.intermediate()], x2.dtype())
            }
            ForwardPath::Host => host::swiglu_forward(self.gate.host_operands()?, self.up.host_operands()?, x2),
            ForwardPath::Generic => self.separate(x2, path),
            _ if !self.fuses_gate_up() => self.separate(x2, path),
            // Gate and up share the input transform: rotate and pad once.
            ForwardPath::Cuda => {
                cuda::gate_up::swiglu(&self.gate.stored_input(x2)?, self.gate.operands(), self.up.operands())
            }
            ForwardPath::Metal => metal::swiglu(&self.gate.stored_input(x2)?, self.gate.operands(), self.up.operands()),
            ForwardPath::MetalSim => {
                metal::swiglu_sim(&self.gate.stored_input(x2)?, self.gate.operands(), self.up.operands())
            }
        }
    }

    /// `silu(gate(x2)) ⊙ up(x2)` with each projection by `path`.
    fn separate(&self, x2: &MlxArray, path: ForwardPath) -> Result<MlxArray> {
        let g = self.gate.forward_with(x2, path)?;
        let u = self.up.forward_with(x2, path)?;
        g.silu()?.multiply(&u)
    }

    /// `x` as `[m, hidden]` rows (checked), and its leading dimensions.
    fn rows(&self, x: &MlxArray) -> Result<(MlxArray, Vec<usize>)> {
        activation_rows("MLP", "MLP", x, self.hidden(), None)
    }
}

/// The shape `[lead..., width]`.
fn widths(lead: &[usize], width: usize) -> Vec<usize> {
    lead.iter().copied().chain([width]).collect()
}

impl fmt::Debug for TrellisMlp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TrellisMlp({:?}, {:?}, {:?})", self.gate, self.up, self.down)
    }
}

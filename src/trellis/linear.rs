//! [`TrellisLinear`]: one coded linear layer, and the one place that chooses how to run it.
//!
//! The rule for a forced path ([`ForwardPath::Metal`], [`ForwardPath::MetalSim`],
//! [`ForwardPath::Cuda`]) is the same on every back-end: where its kernels do not serve the
//! layer's geometry or the call's row count, the call fails with [`Error::Unserved`] and nothing
//! runs. [`ForwardPath::Auto`] takes the back-end's kernels where they serve the call and the
//! [`ForwardPath::Generic`] path otherwise.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use half::f16;

use crate::array::MlxArray;
use crate::device::{backend, Backend, Stream};
use crate::dtype::Dtype;
use crate::error::{invalid, unserved, Error, ErrorContext, ErrorKind, Result};

use super::checks::{activation_rows, check_codes, check_scales};
use super::cuda::down::OutputRotation;
use super::cuda::swiglu_rotate::Side;
use super::format::{CodeLayout, HostLayer, TrellisGeometry};
use super::generic::generic_forward_f32;
use super::host::{self, HostOperands};
use super::operands::LayerOperands;
use super::reference_coded::forward_coded_f64;
use super::rotation::{CodedAxis, Rotation};
use super::transform::AxisTransform;
use super::{cuda, metal};
use crate::memory::check_fits;

mod fed;

/// How a forward pass is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForwardPath {
    /// The best path the back-end offers for this geometry and row count.
    Auto,
    /// Decode to dense f32 with MLX operations, then MLX's matmul (every back-end).
    Generic,
    /// Multi-threaded Rust on the host CPU, reading MLX's arrays in place (every back-end; the
    /// best on MLX's CPU back-end, which has no custom kernels): see [`crate::trellis::host`].
    Host,
    /// The plain-Rust f64 reference on the host (slow; for checks).
    Reference,
    /// The Metal kernels (Apple GPUs): the upstream down kernels on axis 0, the gate/up kernels on
    /// axis 1.
    Metal,
    /// The Metal kernels on the CPU simulator of MLX's Metal wrapping (needs the
    /// `metal-sim` feature).
    MetalSim,
    /// The CUDA kernels (MLX's CUDA back-end).
    Cuda,
}

impl ForwardPath {
    /// Every path, for listings.
    pub const ALL: [ForwardPath; 7] = [
        ForwardPath::Auto,
        ForwardPath::Generic,
        ForwardPath::Host,
        ForwardPath::Reference,
        ForwardPath::Metal,
        ForwardPath::MetalSim,
        ForwardPath::Cuda,
    ];

    /// The path's name as the command-line tools spell it.
    pub fn name(self) -> &'static str {
        match self {
            ForwardPath::Auto => "auto",
            ForwardPath::Generic => "generic",
            ForwardPath::Host => "host",
            ForwardPath::Reference => "reference",
            ForwardPath::Metal => "metal",
            ForwardPath::MetalSim => "metal-sim",
            ForwardPath::Cuda => "cuda",
        }
    }
}

impl fmt::Display for ForwardPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ForwardPath {
    type Err = Error;

    fn from_str(s: &str) -> Result<ForwardPath> {
        ForwardPath::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<_> = ForwardPath::ALL.iter().map(|p| p.name()).collect();
            Error::invalid(format!("unknown path {s:?}; expected one of {}", names.join(", ")))
        })
    }
}

/// One trellis-coded linear layer: codes, per-row scales and their geometry, and where the
/// format's coded axis is rotated or padded (docs/format.md §10), what every path applies around the
/// stored matrix (callers give and get the logical features).
#[derive(Clone)]
pub struct TrellisLinear {
    name: String,
    codes: MlxArray,
    scales: MlxArray,
    geometry: TrellisGeometry,
    /// Boxed: most layers have none, and a layer is held in enums beside small variants.
    transform: Option<Arc<AxisTransform>>,
    /// The host path's operands, made at its first call (shared by clones: the same codes).
    host: Arc<OnceLock<HostOperands>>,
}

/// Refuses `layers` that do not all take `first`'s input features (one input for them all).
fn check_shared_input(first: &TrellisLinear, layers: &[&TrellisLinear]) -> Result<()> {
    match layers.iter().find(|l| l.in_features() != first.in_features()) {
        Some(l) => invalid!(
            "{:?} takes {} features but {:?} takes {}: the layers must share their input",
            first.name,
            first.in_features(),
            l.name,
            l.in_features()
        ),
        None => Ok(()),
    }
}

/// Runs `run` by `path` and returns the path taken with its result. [`ForwardPath::Auto`] takes
/// `best()`, then the generic path where `best`'s kernels refuse the call as unserved (they serve
/// the geometry but not this row count).
pub(crate) fn resolve_auto<T>(
    path: ForwardPath,
    best: impl FnOnce() -> ForwardPath,
    mut run: impl FnMut(ForwardPath) -> Result<T>,
) -> (ForwardPath, Result<T>) {
    match path {
        ForwardPath::Auto => {
            let best = best();
            match run(best) {
                Err(e) if e.kind() == ErrorKind::Unserved && best != ForwardPath::Generic => {
                    (ForwardPath::Generic, run(ForwardPath::Generic))
                }
                y => (best, y),
            }
        }
        path => (path, run(path)),
    }
}

/// An array's values as f64 on the host (through f32).
pub(crate) fn host_f64(x: &MlxArray) -> Result<Vec<f64>> {
    Ok(x.astype(Dtype::Float32)?.to_vec::<f32>()?.into_iter().map(f64::from).collect())
}

/// f64 values as an array of `shape` and `dtype` (through f32).
pub(crate) fn from_host_f64(v: &[f64], shape: &[usize], dtype: Dtype) -> Result<MlxArray> {
    let v32: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    MlxArray::from_slice(&v32, shape)?.astype(dtype)
}

impl TrellisLinear {
    /// A layer from its code tensor (uint32, either layout) and scales (float16 `[rows]`, all
    /// finite; they are read to check), with the format parameters `k, t, l, axis`. `name`
    /// appears in errors.
    pub fn new(
        name: &str,
        codes: MlxArray,
        scales: MlxArray,
        k: u32,
        t: u32,
        l: u32,
        axis: u32,
    ) -> Result<TrellisLinear> {
        let geometry = check_codes(name, &codes, k, t, l, axis)?;
        check_scales(name, &scales, &geometry, &codes)?;
        Ok(TrellisLinear::from_checked(name, codes, scales, geometry))
    }

    /// A layer whose operands passed [`check_codes`] and [`check_scales`].
    pub(crate) fn from_checked(name: &str, codes: MlxArray, scales: MlxArray, geometry: TrellisGeometry) -> Self {
        TrellisLinear { name: name.to_string(), codes, scales, geometry, transform: None, host: Arc::default() }
    }

    /// The layer with coded axis `axis` (checked against the geometry: its logical columns, its
    /// rotation's length). [`CodedAxis::plain`] of the stored columns is the plain layer.
    pub fn with_coded_axis(mut self, axis: CodedAxis) -> Result<TrellisLinear> {
        let name = self.name.clone();
        self.transform =
            AxisTransform::new(axis, &self.geometry).with_context(|| format!("layer {name:?}"))?.map(Arc::new);
        Ok(self)
    }

    /// Uploads a host layer with its coded axis.
    pub fn from_host_coded(name: &str, layer: &HostLayer, axis: CodedAxis) -> Result<TrellisLinear> {
        TrellisLinear::from_host(name, layer)?.with_coded_axis(axis)
    }

    /// The coded axis: its rotation and logical length ([`CodedAxis::plain`] of the stored
    /// columns for a plain layer).
    pub fn coded_axis(&self) -> CodedAxis {
        match &self.transform {
            Some(t) => t.host().clone(),
            None => CodedAxis::plain(self.geometry.cols),
        }
    }

    /// The rotation of the coded axis, if any.
    pub fn rotation(&self) -> Option<&Rotation> {
        self.transform.as_ref().and_then(|t| t.host().rotation.as_ref())
    }

    /// Input features the layer takes (logical: without the stored padding).
    pub fn in_features(&self) -> usize {
        match (&self.transform, self.geometry.axis) {
            (Some(t), 1) => t.host().logical,
            _ => self.geometry.in_features(),
        }
    }

    /// Output features the layer gives (logical: without the stored padding).
    pub fn out_features(&self) -> usize {
        match (&self.transform, self.geometry.axis) {
            (Some(t), 0) => t.host().logical,
            _ => self.geometry.out_features(),
        }
    }

    /// Uploads a host layer.
    pub fn from_host(name: &str, layer: &HostLayer) -> Result<TrellisLinear> {
        let g = layer.geometry;
        let codes = MlxArray::from_slice(&layer.codes, &g.codes_shape())?;
        let scales = MlxArray::from_slice(&layer.scales, &[g.rows])?;
        TrellisLinear::new(name, codes, scales, g.k, g.t, g.l, g.axis)
    }

    /// The layer's name (its module path in an artifact).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The code tensor.
    pub fn codes(&self) -> &MlxArray {
        &self.codes
    }

    /// The scales.
    pub fn scales(&self) -> &MlxArray {
        &self.scales
    }

    /// The geometry of the stored matrix (padded columns included).
    pub fn geometry(&self) -> &TrellisGeometry {
        &self.geometry
    }

    /// The codes, scales and geometry, borrowed, as the back-ends' kernels take them.
    pub fn operands(&self) -> LayerOperands<'_> {
        LayerOperands::new(&self.codes, &self.scales, &self.geometry)
    }

    /// The layer of stored rows `rows` only (codes and scales copied out, so the whole layer can
    /// be dropped): output rows for an axis-1 layer, input rows for an axis-0 one. The rule that
    /// picks a tensor-parallel rank's rows is [`RowShard`](super::RowShard)'s.
    pub fn row_slice(&self, rows: Range<usize>) -> Result<TrellisLinear> {
        let g = self.geometry;
        if rows.start >= rows.end || rows.end > g.rows {
            invalid!("{}: stored rows {rows:?} are not a non-empty range of its {} rows", self.name, g.rows);
        }
        let int = |v: usize| i32::try_from(v).expect("array dimensions fit MLX's int");
        let (r0, r1) = (int(rows.start), int(rows.end));
        let shape: Vec<i32> = self.codes.shape().into_iter().map(int).collect();
        let codes = match g.layout() {
            CodeLayout::RowMajor => self.codes.slice(&[r0, 0], &[r1, shape[1]], &[1, 1])?,
            CodeLayout::K3Interleaved => self.codes.slice(&[0, r0, 0], &[shape[0], r1, shape[2]], &[1, 1, 1])?,
        }
        .deep_copy()?;
        let scales = self.scales.slice(&[r0], &[r1], &[1])?.deep_copy()?;
        let geometry = check_codes(&self.name, &codes, g.k, g.t, g.l, g.axis)?;
        // The stored columns are kept, so the coded axis (rotation, padding) applies unchanged.
        TrellisLinear::from_checked(&self.name, codes, scales, geometry).with_coded_axis(self.coded_axis())
    }

    /// Copies the codes and scales to the host (the stored matrix; see [`coded_axis`](Self::coded_axis)).
    pub fn to_host(&self) -> Result<HostLayer> {
        Ok(HostLayer {
            codes: self.codes.to_vec::<u32>()?,
            scales: self.scales.to_vec::<f16>()?,
            geometry: self.geometry,
        })
    }

    /// The path [`ForwardPath::Auto`] takes on this machine (the kernels then pick by row count).
    pub fn best_path(&self) -> ForwardPath {
        let gpu = match backend() {
            Backend::Metal => ForwardPath::Metal,
            Backend::Cuda => ForwardPath::Cuda,
            Backend::Cpu => return ForwardPath::Host,
        };
        let served = match gpu {
            ForwardPath::Cuda => cuda::down::supports(&self.geometry) || cuda::gate_up::supports(&self.geometry),
            _ => metal::serves(&self.geometry),
        };
        if served {
            gpu
        } else {
            ForwardPath::Generic
        }
    }

    /// `x · W` over the last dimension of `x` (`[..., in] -> [..., out]`, in `x`'s dtype), by the
    /// best path for this back-end.
    pub fn forward(&self, x: &MlxArray) -> Result<MlxArray> {
        self.forward_with(x, ForwardPath::Auto)
    }

    /// `x · W` by a chosen path. A product whose working set exceeds the memory MLX can get
    /// (see [`crate::available_memory`]) is refused before it runs.
    pub fn forward_with(&self, x: &MlxArray, path: ForwardPath) -> Result<MlxArray> {
        let g = &self.geometry;
        let (x2, mut out_shape) = activation_rows(&self.name, "layer", x, self.in_features(), Some(g))?;
        let m = x2.shape()[0];
        out_shape.push(self.out_features());
        if m == 0 {
            return MlxArray::zeros(&out_shape, x.dtype());
        }
        self.check_fits(m, x.dtype())?;
        let (path, y) = resolve_auto(path, || self.best_path(), |path| self.forward_2d(&x2, m, path));
        y.and_then(|y| y.reshape(&out_shape)).with_context(|| format!("{} ({g}) by the {path} path", self.name))
    }

    /// Refuses a product of `m` rows of `dtype` activations whose working set exceeds the memory
    /// MLX can get.
    pub(crate) fn check_fits(&self, m: usize, dtype: Dtype) -> Result<()> {
        let g = &self.geometry;
        check_fits(working_set(m, g, dtype), || format!("{} ({g}) on {m} activation rows", self.name))
    }

    /// The stored outputs of logical `x2 [m, in]` by `path` (not `Auto`, not `Reference`): the
    /// input transform applied, the output transform not (`[m, stored out]` on axis 0), for a
    /// kernel that turns several layers' outputs back at once.
    pub(crate) fn stored_output(&self, x2: &MlxArray, path: ForwardPath) -> Result<MlxArray> {
        let y = self.stored_forward(&self.stored_input(x2)?, path);
        y.with_context(|| format!("{} ({}) by the {path} path", self.name, self.geometry))
    }

    /// The logical outputs from the stored activations `xs [m, stored in]` (already transformed)
    /// by `path` (not `Auto`, not `Reference`): the stored matrix, then the output transform.
    pub(crate) fn forward_stored_input(&self, xs: &MlxArray, path: ForwardPath) -> Result<MlxArray> {
        let y = self.logical_forward(xs, path);
        y.with_context(|| format!("{} ({}) by the {path} path", self.name, self.geometry))
    }

    /// The logical outputs from the stored activations `xs` by `path` (not `Auto`, not
    /// `Reference`, not `Host`): the stored matrix, then the output transform; on CUDA a rotated
    /// output is turned back in the down kernel's fold (one launch fewer, the same bits).
    fn logical_forward(&self, xs: &MlxArray, path: ForwardPath) -> Result<MlxArray> {
        if let Some(rotation) = self.cuda_output_rotation(path, xs.dtype()) {
            return cuda::down::down_rotated_cuda(xs, &self.codes, &self.scales, &self.geometry, rotation, None);
        }
        let y = self.stored_forward(xs, path)?;
        match &self.transform {
            Some(t) => t.logical_output(&y),
            None => Ok(y),
        }
    }

    /// The output rotation the CUDA down kernel's fold applies for `path` and activations of
    /// `dtype`: on the CUDA path, for a layer coded along its rotated outputs whose rotation the
    /// CUDA kernels serve ([`AxisTransform::cuda_output_rotation`]).
    fn cuda_output_rotation(&self, path: ForwardPath, dtype: Dtype) -> Option<OutputRotation<'_>> {
        match (&self.transform, path) {
            (Some(t), ForwardPath::Cuda) => t.cuda_output_rotation(dtype),
            _ => None,
        }
    }

    /// `residual +` [`TrellisLinear::forward_stored_input`] (`residual` `[m, out]`): the add in
    /// the CUDA kernel's launch where [`TrellisLinear::adds_in_kernel`], otherwise MLX's add after
    /// the output.
    pub(crate) fn forward_stored_input_plus(
        &self,
        xs: &MlxArray,
        residual: &MlxArray,
        path: ForwardPath,
    ) -> Result<MlxArray> {
        if self.adds_in_kernel(path, xs.dtype(), residual.dtype()) {
            let g = &self.geometry;
            let y = if g.axis == 1 {
                cuda::gate_up::linear_residual(xs, &self.codes, &self.scales, g, residual)
            } else if let Some(rotation) = self.cuda_output_rotation(path, xs.dtype()) {
                cuda::down::down_rotated_cuda(xs, &self.codes, &self.scales, g, rotation, Some(residual))
            } else {
                cuda::down::down_residual_cuda(xs, &self.codes, &self.scales, g, residual)
            };
            return y.with_context(|| format!("{} ({g}) plus a residual by the {path} path", self.name));
        }
        residual.add(&self.forward_stored_input(xs, path)?)
    }

    /// Whether the layer's stored outputs need a transform back to its logical ones (a rotation or
    /// padding of an axis-0 layer's outputs).
    pub(crate) fn has_output_transform(&self) -> bool {
        self.geometry.axis == 0 && self.transform.is_some()
    }

    /// Whether `path` adds a residual of `residual_dtype` to this layer's output of `dtype`
    /// activations in the kernel's own launch, in f32 before the output's last rounding: on
    /// CUDA, where the output needs no transform back (a layer stored along its inputs, or along
    /// its outputs without a rotation or padding) or its rotation turns back in the down kernel's
    /// fold, and the residual has the output's dtype.
    fn adds_in_kernel(&self, path: ForwardPath, dtype: Dtype, residual_dtype: Dtype) -> bool {
        path == ForwardPath::Cuda
            && residual_dtype == dtype
            && (!self.has_output_transform() || self.cuda_output_rotation(path, dtype).is_some())
    }

    /// `residual + x · W` (`residual` of the output's shape `[..., out]`): a model's residual
    /// stream after this layer, by the best path for this back-end. On CUDA the add runs in the
    /// kernel's launch where the output needs no transform back (a layer stored along its inputs,
    /// or along its outputs without a rotation or padding) and `residual` has `x`'s dtype: added
    /// in f32 before the output's one rounding, one launch fewer. Elsewhere it is MLX's add after
    /// [`TrellisLinear::forward`].
    pub fn forward_residual(&self, x: &MlxArray, residual: &MlxArray) -> Result<MlxArray> {
        self.forward_residual_with(x, residual, ForwardPath::Auto)
    }

    /// `x · W` for each of `layers`, which take the same input (a block's q, k and v
    /// projections), by the best path for this back-end: on the host path (MLX's CPU back-end)
    /// one evaluation of `x` and the products side by side; on CUDA two neighbours the down
    /// kernel's pair variant serves together as one launch (a block's k and v, coded along their
    /// outputs: one geometry, rotated alike), each other layer by its own
    /// [`forward`](TrellisLinear::forward), as elsewhere.
    pub fn forward_shared_input(layers: &[&TrellisLinear], x: &MlxArray) -> Result<Vec<MlxArray>> {
        if layers.len() > 1 && backend() == Backend::Cuda && Stream::current_is_gpu() {
            let mut ys = Vec::with_capacity(layers.len());
            let mut i = 0;
            while i < layers.len() {
                match layers.get(i + 1).map(|b| Self::cuda_pair_forward(layers[i], b, x)).transpose()?.flatten() {
                    Some(pair) => {
                        ys.extend(pair);
                        i += 2;
                    }
                    None => {
                        ys.push(layers[i].forward(x)?);
                        i += 1;
                    }
                }
            }
            return Ok(ys);
        }
        let on_host = layers.iter().all(|l| l.best_path() == ForwardPath::Host);
        let Some(first) = layers.first().filter(|_| on_host && layers.len() > 1) else {
            return layers.iter().map(|l| l.forward(x)).collect();
        };
        check_shared_input(first, layers)?;
        let (x2, lead) = activation_rows(&first.name, "layer", x, first.in_features(), Some(&first.geometry))?;
        let m = x2.shape()[0];
        if m == 0 {
            return layers.iter().map(|l| l.forward(x)).collect();
        }
        let names = || layers.iter().map(|l| l.name.as_str()).collect::<Vec<_>>().join(", ");
        let ys = (|| {
            let mut ops = Vec::with_capacity(layers.len());
            for l in layers {
                l.check_fits(m, x.dtype())?;
                ops.push(l.host_operands()?);
            }
            host::shared_input_forward(&ops, &x2)
        })();
        let ys = ys.with_context(|| format!("{} on one input by the host path", names()))?;
        ys.into_iter()
            .zip(layers)
            .map(|(y, l)| y.reshape(&lead.iter().copied().chain([l.out_features()]).collect::<Vec<_>>()))
            .collect()
    }

    /// `a`'s and `b`'s outputs of `x` as one launch of the CUDA down kernel's pair variant, or
    /// `None` where it does not serve them together ([`TrellisLinear::cuda_pair_rotations`]).
    fn cuda_pair_forward(a: &TrellisLinear, b: &TrellisLinear, x: &MlxArray) -> Result<Option<[MlxArray; 2]>> {
        let (g, dtype, path) = (&a.geometry, x.dtype(), ForwardPath::Cuda);
        let Some(rotations) = Self::cuda_pair_rotations(a, b, dtype) else {
            return Ok(None);
        };
        let (x2, mut out_shape) = activation_rows(&a.name, "layer", x, a.in_features(), Some(g))?;
        let m = x2.shape()[0];
        if m == 0 {
            return Ok(None);
        }
        out_shape.push(a.out_features());
        let ys = (|| {
            a.check_fits(m, dtype)?;
            b.check_fits(m, dtype)?;
            let (codes, scales) = ([&a.codes, &b.codes], [&a.scales, &b.scales]);
            let [ya, yb] = match rotations {
                Some(r) => cuda::down::down_pair_rotated_cuda(&x2, codes, scales, g, r)?,
                None => cuda::down::down_pair_cuda(&x2, codes, scales, g)?,
            };
            Ok([ya.reshape(&out_shape)?, yb.reshape(&out_shape)?])
        })();
        ys.map(Some).with_context(|| format!("{} and {} ({g}) on one input by the {path} path", a.name, b.name))
    }

    /// Whether the CUDA down kernel's pair variant serves `a` and `b` together on activations of
    /// `dtype`, and with which rotations: both coded along their outputs in one geometry the
    /// kernel serves, with no output transform (`Some(None)`) or with rotations of one width and
    /// block that the fold turns back (`Some(Some(..))`); `None` where it does not.
    fn cuda_pair_rotations<'a>(
        a: &'a TrellisLinear,
        b: &'a TrellisLinear,
        dtype: Dtype,
    ) -> Option<Option<[OutputRotation<'a>; 2]>> {
        let g = &a.geometry;
        if g.axis != 0 || b.geometry != *g || !cuda::down::supports(g) || a.best_path() != ForwardPath::Cuda {
            return None;
        }
        let path = ForwardPath::Cuda;
        match (a.cuda_output_rotation(path, dtype), b.cuda_output_rotation(path, dtype)) {
            (Some(ra), Some(rb)) if (ra.logical, ra.block) == (rb.logical, rb.block) => Some(Some([ra, rb])),
            (None, None) if !a.has_output_transform() && !b.has_output_transform() => Some(None),
            _ => None,
        }
    }

    /// [`TrellisLinear::forward_residual`] by a chosen path.
    pub fn forward_residual_with(&self, x: &MlxArray, residual: &MlxArray, path: ForwardPath) -> Result<MlxArray> {
        let g = &self.geometry;
        let (x2, mut out_shape) = activation_rows(&self.name, "layer", x, self.in_features(), Some(g))?;
        let m = x2.shape()[0];
        out_shape.push(self.out_features());
        if residual.shape() != out_shape {
            invalid!("{}: residual {:?} must have the output's shape {out_shape:?}", self.name, residual.shape());
        }
        if m == 0 {
            return residual.add(&self.forward_with(x, path)?);
        }
        self.check_fits(m, x.dtype())?;
        let r2 = residual.reshape(&[m, self.out_features()])?;
        let run = |path: ForwardPath| {
            if self.adds_in_kernel(path, x2.dtype(), r2.dtype()) {
                self.forward_stored_input_plus(&self.stored_input(&x2)?, &r2, path)
            } else {
                r2.add(&self.forward_2d(&x2, m, path)?)
            }
        };
        let (path, y) = resolve_auto(path, || self.best_path(), run);
        y.and_then(|y| y.reshape(&out_shape))
            .with_context(|| format!("{} ({g}) plus a residual by the {path} path", self.name))
    }

    /// The stored side of the outputs (axis 0) or of the inputs (axis 1, `input` true) as the
    /// CUDA SwiGLU with rotations takes it for activations of `dtype`; the logical features where
    /// that side has no transform, `None` where the kernel does not serve its rotation. For a
    /// caller that has checked that this thread's operations go to the GPU.
    pub(crate) fn cuda_side(&self, input: bool, dtype: Dtype) -> Option<Side<'_>> {
        let axis = if input { 1 } else { 0 };
        match &self.transform {
            Some(t) if self.geometry.axis == axis => t.cuda_side(dtype),
            _ => Some(Side { stored: if input { self.in_features() } else { self.out_features() }, rotation: None }),
        }
    }

    /// `x2 [m, in] · W` by `path` (not `Auto`), in `x2`'s dtype, logical features in and out.
    fn forward_2d(&self, x2: &MlxArray, m: usize, path: ForwardPath) -> Result<MlxArray> {
        match (&self.transform, path) {
            (_, ForwardPath::Reference) => self.reference_forward(x2, m),
            // The rotation and padding on the host too: one evaluation of the activations.
            (_, ForwardPath::Host) => self.host_operands()?.forward(x2),
            (None, path) => self.stored_forward(x2, path),
            (Some(t), path) => self.logical_forward(&t.stored_input(x2)?, path),
        }
    }

    /// The activations the stored matrix takes for logical `x2` (rotated and padded on axis 1),
    /// for a fused kernel that reads several layers of one input transform.
    pub(crate) fn stored_input(&self, x2: &MlxArray) -> Result<MlxArray> {
        match &self.transform {
            Some(t) => t.stored_input(x2),
            None => Ok(x2.clone()),
        }
    }

    /// `x2 [m, stored in] · S` by `path` (not `Auto`, not `Reference`): the stored matrix alone.
    fn stored_forward(&self, x2: &MlxArray, path: ForwardPath) -> Result<MlxArray> {
        let g = &self.geometry;
        match path {
            ForwardPath::Auto => unreachable!("resolved by forward_with"),
            ForwardPath::Reference => unreachable!("taken by forward_2d (it applies the coded axis in f64)"),
            ForwardPath::Generic => generic_forward_f32(x2, &self.codes, &self.scales, g)?.astype(x2.dtype()),
            ForwardPath::Host => unreachable!("taken by forward_2d (it applies the coded axis on the host)"),
            ForwardPath::Metal | ForwardPath::MetalSim if !metal::serves(g) => {
                unserved!("the Metal kernels do not serve {g} (k 2..4; down kernels: axis 0; gate/up kernels: axis 1, row-major, T 256)")
            }
            ForwardPath::Metal => metal::forward(x2, &self.codes, &self.scales, g),
            ForwardPath::MetalSim => metal::forward_sim(x2, &self.codes, &self.scales, g),
            ForwardPath::Cuda if g.axis == 1 => cuda::gate_up::linear(x2, &self.codes, &self.scales, g),
            ForwardPath::Cuda => cuda::down::down_cuda(x2, &self.codes, &self.scales, g),
        }
    }

    /// The host path's operands, made (checked and evaluated) at the first call.
    pub(crate) fn host_operands(&self) -> Result<&HostOperands> {
        if let Some(h) = self.host.get() {
            return Ok(h);
        }
        let h = HostOperands::new(&self.codes, &self.scales, &self.geometry, &self.coded_axis())?;
        Ok(self.host.get_or_init(|| h))
    }

    /// The f64 reference on the host (rotation and padding in f64 too), `[m, out]` in `x2`'s
    /// dtype (through f32).
    fn reference_forward(&self, x2: &MlxArray, m: usize) -> Result<MlxArray> {
        let host = self.to_host()?;
        let y = forward_coded_f64(&host_f64(x2)?, m, &host, &self.coded_axis())?;
        from_host_f64(&y, &[m, self.out_features()], x2.dtype())
    }
}

impl<'a> From<&'a TrellisLinear> for LayerOperands<'a> {
    fn from(layer: &'a TrellisLinear) -> Self {
        layer.operands()
    }
}

impl fmt::Debug for TrellisLinear {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TrellisLinear({:?}, {}", self.name, self.geometry)?;
        if let Some(t) = &self.transform {
            let a = t.host();
            write!(f, ", {} logical columns", a.logical)?;
            if let Some(r) = &a.rotation {
                write!(f, ", Hadamard rotation of block {}", r.block())?;
            }
        }
        f.write_str(")")
    }
}

/// The bytes a product of `m` rows through `g` may hold at once, whatever the path: the
/// activations and the output in f32 and in the activations' dtype, and the generic path's
/// decoded weights (states and values, f32).
fn working_set(m: usize, g: &TrellisGeometry, dtype: Dtype) -> u128 {
    let per_value = 4 + dtype.size_of() as u128;
    let rows = m as u128 * (g.in_features() as u128 + g.out_features() as u128) * per_value;
    rows + 8 * g.rows as u128 * g.cols as u128
}

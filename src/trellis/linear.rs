//! [`TrellisLinear`]: one coded linear layer and the choice of how to run it.

use std::fmt;
use std::str::FromStr;

use anyhow::Context;
use half::f16;

use crate::array::MlxArray;
use crate::device::{backend, Backend};
use crate::dtype::Dtype;
use crate::error::{invalid, Error, Result};

use super::expand::generic_forward_f32;
use super::geometry::TrellisGeometry;
use super::reference::forward_f64;
use super::synthetic::HostLayer;

/// How a forward pass is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// The best path the back-end offers for this geometry and row count.
    Auto,
    /// Decode to dense f32 with MLX operations, then MLX's matmul (every back-end).
    Generic,
    /// The plain-Rust f64 reference on the host (slow; for checks).
    Reference,
    /// The seed's Metal kernels (Apple GPUs).
    Metal,
    /// The seed's Metal kernels on the CPU simulator of MLX's Metal wrapping (needs the
    /// `metal-sim` feature).
    MetalSim,
    /// The CUDA kernels (MLX's CUDA back-end).
    Cuda,
}

impl Path {
    /// Every path, for listings.
    pub const ALL: [Path; 6] = [Path::Auto, Path::Generic, Path::Reference, Path::Metal, Path::MetalSim, Path::Cuda];

    /// The path's name as the command-line tools spell it.
    pub fn name(self) -> &'static str {
        match self {
            Path::Auto => "auto",
            Path::Generic => "generic",
            Path::Reference => "reference",
            Path::Metal => "metal",
            Path::MetalSim => "metal-sim",
            Path::Cuda => "cuda",
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Path {
    type Err = Error;

    fn from_str(s: &str) -> std::result::Result<Path, Error> {
        Path::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<_> = Path::ALL.iter().map(|p| p.name()).collect();
            Error::invalid(format!("unknown path {s:?}; expected one of {}", names.join(", ")))
        })
    }
}

/// One trellis-coded linear layer: codes, per-row scales and their geometry.
#[derive(Clone)]
pub struct TrellisLinear {
    name: String,
    codes: MlxArray,
    scales: MlxArray,
    geometry: TrellisGeometry,
}

impl TrellisLinear {
    /// A layer from its code tensor (uint32, either layout) and scales (float16 `[rows]`), with
    /// the format parameters `k, t, l, axis`. `name` appears in errors.
    pub fn new(
        name: &str,
        codes: MlxArray,
        scales: MlxArray,
        k: u32,
        t: u32,
        l: u32,
        axis: u32,
    ) -> Result<TrellisLinear> {
        if codes.dtype() != Dtype::Uint32 {
            invalid!("trellis codes {name:?} are {}, expected uint32", codes.dtype());
        }
        let geometry = TrellisGeometry::from_codes_shape(name, &codes.shape(), k, t, l, axis)?;
        if scales.dtype() != Dtype::Float16 {
            invalid!("trellis scales of {name:?} are {}, expected float16", scales.dtype());
        }
        if scales.shape() != [geometry.rows] {
            invalid!(
                "trellis scales of {name:?} have shape {:?}, expected [{}] (one per stored row of codes {:?})",
                scales.shape(),
                geometry.rows,
                codes.shape()
            );
        }
        Ok(TrellisLinear { name: name.to_string(), codes, scales, geometry })
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

    /// The geometry.
    pub fn geometry(&self) -> &TrellisGeometry {
        &self.geometry
    }

    /// Copies the codes and scales to the host.
    pub fn to_host(&self) -> Result<HostLayer> {
        Ok(HostLayer {
            codes: self.codes.to_vec::<u32>()?,
            scales: self.scales.to_vec::<f16>()?,
            geometry: self.geometry,
        })
    }

    /// The path [`Path::Auto`] takes on this machine (the kernels then pick by row count).
    pub fn best_path(&self) -> Path {
        let gpu = match backend() {
            Backend::Metal => Path::Metal,
            Backend::Cuda => Path::Cuda,
            Backend::Cpu => return Path::Generic,
        };
        if super::down::serves(gpu, &self.geometry) {
            gpu
        } else {
            Path::Generic
        }
    }

    /// `x · W` over the last dimension of `x` (`[..., in] -> [..., out]`, in `x`'s dtype), by the
    /// best path for this back-end.
    pub fn forward(&self, x: &MlxArray) -> Result<MlxArray> {
        self.forward_with(x, Path::Auto)
    }

    /// `x · W` by a chosen path.
    pub fn forward_with(&self, x: &MlxArray, path: Path) -> Result<MlxArray> {
        let g = &self.geometry;
        let shape = x.shape();
        let Some((&inf, lead)) = shape.split_last() else {
            invalid!("{}: activations must have at least one dimension, got a scalar", self.name);
        };
        if inf != g.in_features() {
            invalid!(
                "{}: activations of shape {shape:?} have {inf} features, the layer takes {} ({g})",
                self.name,
                g.in_features()
            );
        }
        if !matches!(x.dtype(), Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16) {
            invalid!("{}: activations are {}, expected float32, float16 or bfloat16", self.name, x.dtype());
        }
        let m: usize = lead.iter().product();
        let mut out_shape = lead.to_vec();
        out_shape.push(g.out_features());
        if m == 0 {
            return MlxArray::zeros(&out_shape, x.dtype());
        }
        let x2 = x.reshape(&[m, inf])?;
        let path = if path == Path::Auto { self.best_path() } else { path };
        let y = match path {
            Path::Auto => unreachable!("resolved above"),
            Path::Generic => generic_forward_f32(&x2, &self.codes, &self.scales, g)?.astype(x.dtype())?,
            Path::Reference => self.reference_forward(&x2, m)?.astype(x.dtype())?,
            Path::Metal | Path::MetalSim | Path::Cuda => super::down::forward(path, &x2, &self.codes, &self.scales, g)?,
        };
        y.reshape(&out_shape).with_context(|| format!("{} ({g}) by the {path} path", self.name))
    }

    /// The f64 reference on the host, returned as f32 `[m, out]`.
    fn reference_forward(&self, x2: &MlxArray, m: usize) -> Result<MlxArray> {
        let host = self.to_host()?;
        let x: Vec<f64> = x2.astype(Dtype::Float32)?.to_vec::<f32>()?.into_iter().map(f64::from).collect();
        let y = forward_f64(&x, m, &host.codes, &host.scales, &self.geometry)?;
        let y32: Vec<f32> = y.into_iter().map(|v| v as f32).collect();
        MlxArray::from_slice(&y32, &[m, self.geometry.out_features()])
    }
}

impl fmt::Debug for TrellisLinear {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TrellisLinear({:?}, {})", self.name, self.geometry)
    }
}

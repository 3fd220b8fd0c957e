//! Helpers shared by the kernel test files.
#![allow(dead_code)] // each test binary uses a different subset

#[cfg(feature = "metal-sim")]
#[macro_use]
pub mod metal_mode;

use mlx_trellis::trellis::reference::forward_f64;
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{
    synthetic_layer, synthetic_layer_in_blocks, CodeLayout, HostLayer, TrellisGeometry, TrellisLinear,
};
use mlx_trellis::{backend, Backend, Dtype, MlxArray, Result};

/// The relErr gate of a kernel's output: f32 accumulation against the f64 reference, then the
/// cast to the activation dtype. The output's rounding alone is 2^-24 (f32), 2^-11 (f16) and
/// 2^-8 (bf16) of the largest output at most; the gates allow about four such units in 16 bits,
/// so that a lost bit of a 4-bit weight (2^-4 of a weight, far more of the output) fails.
pub fn gate(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::Float32 => 1e-4,
        Dtype::Float16 => 2e-3,
        _ => 1e-2,
    }
}

/// The relErr gate of a product that runs through MLX's own f32 matmul: 1e-5 where it
/// multiplies in f32. On CUDA, MLX multiplies f32 matrices in TF32 unless `MLX_ENABLE_TF32=0`:
/// operands keep 10 mantissa bits (unit roundoff 2^-11 = 4.9e-4 each), so the gate is four
/// such units, 1.95e-3 (the H200 measured 2e-4 to 4e-4 on the tests' layers).
pub fn f32_matmul_gate() -> f64 {
    let tf32 = backend() == Backend::Cuda && std::env::var("MLX_ENABLE_TF32").map_or(true, |v| v.trim() != "0");
    if tf32 {
        4.0 * 2f64.powi(-11)
    } else {
        1e-5
    }
}

/// Panics unless MLX runs on CUDA here: a GPU test (ignored elsewhere, with the reason "needs
/// MLX's CUDA back-end"; `scripts/gpu.sh test` runs them with `--include-ignored`) run without a GPU
/// fails instead of passing.
///
/// It also makes the test binary end without MLX's CUDA static destructors
/// ([`mlx_trellis::skip_static_destructors_at_exit`], after a first evaluation on the GPU), which
/// otherwise may abort it after every test passed (`driver shutting down`, status 134): the
/// binary's status is then libtest's own.
pub fn require_cuda() {
    assert_eq!(backend(), Backend::Cuda, "this test needs MLX's CUDA back-end; run it on a CUDA machine");
    MlxArray::from_slice(&[1.0f32, 2.0], &[2]).and_then(|x| x.astype(Dtype::Float16)).and_then(|x| x.eval()).unwrap();
    mlx_trellis::skip_static_destructors_at_exit();
}

/// A seeded synthetic axis-0 layer on the host and on MLX.
pub struct Case {
    pub host: HostLayer,
    pub lin: TrellisLinear,
}

impl Case {
    pub fn new(rows: usize, cols: usize, k: u32, layout: CodeLayout) -> Case {
        Case::with_state_bits(rows, cols, k, 12, layout)
    }

    /// A layer with `l`-bit states (`new` uses 12).
    pub fn with_state_bits(rows: usize, cols: usize, k: u32, l: u32, layout: CodeLayout) -> Case {
        let seed = (rows * 31 + cols + k as usize) as u64 + layout as u64;
        let host = synthetic_layer(rows, cols, k, l, 0, layout, 0.02, seed).unwrap();
        let lin = TrellisLinear::from_host("down", &host).unwrap();
        Case { host, lin }
    }

    /// A row-major layer in coded blocks of `t` positions along its `cols` outputs (`new` and
    /// `with_state_bits` take 256), from `seed`.
    pub fn in_blocks(rows: usize, cols: usize, k: u32, l: u32, t: u32, seed: u64) -> Case {
        let host = synthetic_layer_in_blocks(rows, cols, k, l, t, 0, 0.02, seed).unwrap();
        let lin = TrellisLinear::from_host("down", &host).unwrap();
        Case { host, lin }
    }

    pub fn g(&self) -> &TrellisGeometry {
        self.lin.geometry()
    }

    /// Seeded activations `[m, rows]` in `dtype`, and their values as the kernels see them.
    pub fn x(&self, m: usize, dtype: Dtype) -> (MlxArray, Vec<f64>) {
        let rows = self.g().rows;
        seeded(m, rows, dtype, 1.0, 1000 * m as u64 + rows as u64)
    }

    pub fn reference(&self, xr: &[f64], m: usize) -> Vec<f64> {
        forward_f64(xr, m, &self.host.codes, &self.host.scales, self.g()).unwrap()
    }

    /// Runs `f` on `x` and checks the output's shape and dtype.
    pub fn run(&self, what: &str, x: &MlxArray, f: &dyn Fn(&MlxArray) -> Result<MlxArray>) -> Vec<f64> {
        let (m, dtype, g) = (x.shape()[0], x.dtype(), self.g());
        let y = f(x).unwrap_or_else(|e| panic!("{what} {g} M {m} {dtype}: {e:#}"));
        assert_eq!((y.shape(), y.dtype()), (vec![m, g.cols], dtype), "{what} {g} M {m}");
        to_f64(&y)
    }
}

/// Seeded values `[m, width]` in `dtype` (standard normal times `scale`, from `seed`), and their
/// values as the kernels see them (after the cast).
pub fn seeded(m: usize, width: usize, dtype: Dtype, scale: f32, seed: u64) -> (MlxArray, Vec<f64>) {
    let v: Vec<f32> = gaussian(m * width, seed).unwrap().into_iter().map(|v| v * scale).collect();
    let a = MlxArray::from_slice(&v, &[m, width]).unwrap().astype(dtype).unwrap();
    let values = to_f64(&a);
    (a, values)
}

/// `a + b` elementwise (a reference output plus the residual stream it is added to).
pub fn plus(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| a + b).collect()
}

/// The largest |v|, at least the smallest normal f32: the scale of a residual stream of about an
/// output's size, so that the output's error shows in the sum's relErr.
pub fn largest_abs(v: &[f64]) -> f64 {
    v.iter().fold(f64::from(f32::MIN_POSITIVE), |a, b| a.max(b.abs()))
}

pub fn to_f64(a: &MlxArray) -> Vec<f64> {
    a.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap().into_iter().map(f64::from).collect()
}

/// A safetensors file split into its header (as JSON) and its data.
pub fn split_safetensors(bytes: &[u8]) -> (serde_json::Map<String, serde_json::Value>, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header.as_object().unwrap().clone(), bytes[8 + n..].to_vec())
}

/// A safetensors file of `header` (JSON text) and `data`.
pub fn join_safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

pub mod mlp_artifact;

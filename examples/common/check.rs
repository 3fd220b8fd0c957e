//! What the checking examples share to check a result: the f32 gate of MLX's own matmul, arrays
//! as f64, the gate's verdict and a dense f64 product.
#![allow(dead_code)] // each example uses a subset

use anyhow::{bail, Context, Result};
use mlx_trellis::{backend, Backend, Dtype, MlxArray};

/// The relErr gate of a product through MLX's own f32 matmul (the generic path): 1e-4, or four
/// TF32 units where MLX's CUDA back-end multiplies f32 matrices in TF32 (its default unless
/// `MLX_ENABLE_TF32=0`; see `tests/common::f32_matmul_gate`).
pub fn f32_gate() -> f64 {
    let tf32 = backend() == Backend::Cuda && std::env::var("MLX_ENABLE_TF32").map_or(true, |v| v.trim() != "0");
    if tf32 {
        4.0 * 2f64.powi(-11)
    } else {
        1e-4
    }
}

/// The values of `a` (any float dtype) as f64.
pub fn to_f64(a: &MlxArray) -> Result<Vec<f64>> {
    let v = a.astype(Dtype::Float32)?.to_vec::<f32>()?;
    let mut out = Vec::new();
    out.try_reserve_exact(v.len()).with_context(|| format!("no memory for {} f64 values", v.len()))?;
    out.extend(v.into_iter().map(f64::from));
    Ok(out)
}

/// The gate's verdict on output `y` and its relErr `err`: relErr below `gate` and every output
/// finite. `rel_err` is infinite for non-finite values already; the finite check is belt and
/// braces, and names the failure.
pub fn verdict(y: &MlxArray, err: f64, gate: f64) -> Result<(bool, &'static str)> {
    if !y.all_finite()? {
        return Ok((false, "FAIL (non-finite output)"));
    }
    Ok(if err < gate { (true, "ok") } else { (false, "FAIL") })
}

/// `y[m, o] = Σ_i x[m, i] · W[o, i]` in f64, `W` held row-major as a stored `[rows, cols]`
/// matrix on `axis`: 0 is `Wᵀ [in, out]`, 1 is `W [out, in]`.
pub fn dense_f64(x: &[f64], m: usize, stored: &[f32], rows: usize, cols: usize, axis: u32) -> Result<Vec<f64>> {
    let (inf, outf) = if axis == 0 { (rows, cols) } else { (cols, rows) };
    if Some(stored.len()) != rows.checked_mul(cols) || Some(x.len()) != m.checked_mul(inf) {
        bail!(
            "dense product: {} weights for [{rows}, {cols}] and {} activations for [{m}, {inf}]",
            stored.len(),
            x.len()
        );
    }
    let mut y = vec![0f64; m.checked_mul(outf).context("dense product: the output's size overflows")?];
    if outf == 0 || inf == 0 {
        return Ok(y);
    }
    for (xr, yr) in x.chunks_exact(inf).zip(y.chunks_exact_mut(outf)) {
        if axis == 0 {
            for (&a, wr) in xr.iter().zip(stored.chunks_exact(cols)) {
                for (yo, &w) in yr.iter_mut().zip(wr) {
                    *yo += a * f64::from(w);
                }
            }
        } else {
            for (yo, wr) in yr.iter_mut().zip(stored.chunks_exact(cols)) {
                *yo = xr.iter().zip(wr).map(|(&a, &w)| a * f64::from(w)).sum();
            }
        }
    }
    Ok(y)
}

/// The 2-D float tensor `key` of safetensors `file` (already loaded as `st`, the tensor taken out
/// of it) as f32 `W [out, in]`, with its shape and dtype.
pub fn take_dense_weight(
    st: &mut mlx_trellis::Safetensors,
    file: &str,
    key: &str,
) -> Result<(Vec<f32>, usize, usize, Dtype)> {
    let t = st.tensors.remove(key).with_context(|| format!("{file} has no tensor {key:?}"))?;
    let shape = t.shape();
    if shape.len() != 2 {
        bail!("tensor {key:?} in {file} has shape {shape:?}; expected a 2-D weight [out, in]");
    }
    if !matches!(t.dtype(), Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32 | Dtype::Float64) {
        bail!("tensor {key:?} in {file} is {}; expected a float tensor", t.dtype());
    }
    let w = t.astype(Dtype::Float32)?.to_vec::<f32>().with_context(|| format!("reading tensor {key:?}"))?;
    Ok((w, shape[0], shape[1], t.dtype()))
}

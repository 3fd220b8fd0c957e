//! MLX's contenders: the dense bf16 twin of a trellis layer, its affine 4-bit quantization, and
//! their MLPs with the residual add.

use anyhow::Result;
use mlx_trellis::trellis::cuda::expand::expand_cuda;
use mlx_trellis::trellis::TrellisMlp;
use mlx_trellis::{eval_all, quantize, quantized_matmul, Dtype, MlxArray};

/// How MLX's bf16 MLP adds the residual stream after its down projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bf16Residual {
    /// A matmul, then MLX's add (as mlx-lm's models do).
    Add,
    /// `addmm`: one call (on CUDA, cuBLAS with the add in its epilogue).
    Addmm,
}

impl Bf16Residual {
    /// The contender's name in the tables and the JSON.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Bf16Residual::Add => "MLX bf16 (matmul, add)",
            Bf16Residual::Addmm => "MLX bf16 (addmm)",
        }
    }
}

/// The dense twin of one trellis layer: `[out, in]` bf16 weights of each projection (as
/// `nn.Linear` stores them) and their affine 4-bit quantization.
pub(crate) struct Dense {
    pub(crate) w: [MlxArray; 3],
    pub(crate) q4: [(MlxArray, MlxArray, MlxArray); 3],
}

pub(crate) fn dense_twin(mlp: &TrellisMlp) -> Result<Dense> {
    let gate = expand_cuda(mlp.gate().codes(), mlp.gate().scales(), mlp.gate().geometry(), Dtype::Bfloat16)?;
    let up = expand_cuda(mlp.up().codes(), mlp.up().scales(), mlp.up().geometry(), Dtype::Bfloat16)?;
    // A down projection stored [in, out] (axis 0) has its nn.Linear weight as the transpose.
    let down = expand_cuda(mlp.down().codes(), mlp.down().scales(), mlp.down().geometry(), Dtype::Bfloat16)?;
    let down = if mlp.down().geometry().axis == 0 { down.t()?.contiguous()? } else { down };
    let w = [gate, up, down];
    eval_all(&w.iter().collect::<Vec<_>>())?;
    let q4 = [quantize(&w[0], 64, 4)?, quantize(&w[1], 64, 4)?, quantize(&w[2], 64, 4)?];
    eval_all(&q4.iter().flat_map(|(a, b, c)| [a, b, c]).collect::<Vec<_>>())?;
    Ok(Dense { w, q4 })
}

/// The residual stream after MLX's bf16 MLP of `x`: `x + mlp(x)`, the add as `how` says.
pub(crate) fn bf16_mlp_residual(d: &Dense, x: &MlxArray, how: Bf16Residual) -> mlx_trellis::Result<MlxArray> {
    let g = x.matmul(&d.w[0].t()?)?;
    let u = x.matmul(&d.w[1].t()?)?;
    let h = g.silu()?.multiply(&u)?;
    match how {
        Bf16Residual::Addmm => x.addmm(&h, &d.w[2].t()?),
        Bf16Residual::Add => x.add(&h.matmul(&d.w[2].t()?)?),
    }
}

pub(crate) fn q4_matmul(q: &(MlxArray, MlxArray, MlxArray), x: &MlxArray) -> mlx_trellis::Result<MlxArray> {
    quantized_matmul(x, &q.0, &q.1, &q.2, true, 64, 4)
}

pub(crate) fn q4_mlp(d: &Dense, x: &MlxArray) -> mlx_trellis::Result<MlxArray> {
    let g = q4_matmul(&d.q4[0], x)?;
    let u = q4_matmul(&d.q4[1], x)?;
    q4_matmul(&d.q4[2], &g.silu()?.multiply(&u)?)
}

//! Grouped-query self-attention with rotary position embeddings and a key/value cache.

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::nn::{rope, scaled_dot_product_attention, AttentionMask};
use crate::ops::concatenate;
use crate::trellis::cuda::FoldCounters;
use crate::trellis::TrellisLinear;

use super::config::LlamaConfig;
use super::linear::Linear;

/// One layer's cached keys and values, `[1, kv_heads, positions, head_dim]` each.
#[derive(Debug, Clone, Default)]
pub struct LayerCache {
    kv: Option<(MlxArray, MlxArray)>,
}

impl LayerCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.kv.as_ref().map_or(0, |(k, _)| k.shape()[2])
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.kv.is_none()
    }
}

/// A block's attention: the q, k, v and output projections and the head geometry.
#[derive(Debug, Clone)]
pub struct Attention {
    /// `q_proj` (`[heads · head_dim, hidden]`).
    pub q: Linear,
    /// `k_proj` (`[kv_heads · head_dim, hidden]`).
    pub k: Linear,
    /// `v_proj` (`[kv_heads · head_dim, hidden]`).
    pub v: Linear,
    /// `o_proj` (`[hidden, heads · head_dim]`).
    pub o: Linear,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rope_base: f32,
}

impl Attention {
    /// The attention of a block with these projections, checked against `config`.
    pub fn new(q: Linear, k: Linear, v: Linear, o: Linear, config: &LlamaConfig) -> Result<Attention> {
        let c = config;
        let want = [
            (q.shape(), [c.heads * c.head_dim, c.hidden], "q_proj"),
            (k.shape(), [c.kv_heads * c.head_dim, c.hidden], "k_proj"),
            (v.shape(), [c.kv_heads * c.head_dim, c.hidden], "v_proj"),
            (o.shape(), [c.hidden, c.heads * c.head_dim], "o_proj"),
        ];
        for (got, want, name) in want {
            if got != want {
                invalid!("{name} is {got:?}, the config needs {want:?}");
            }
        }
        Ok(Attention { q, k, v, o, heads: c.heads, kv_heads: c.kv_heads, head_dim: c.head_dim, rope_base: c.rope_base })
    }

    /// `[1, L, heads · head_dim]` → `[1, heads, L, head_dim]`.
    fn split_heads(&self, x: &MlxArray, heads: usize) -> Result<MlxArray> {
        let l = x.shape()[1];
        x.reshape(&[1, l, heads, self.head_dim])?.transpose(&[0, 2, 1, 3])
    }

    /// The q, k and v projections of `x`: coded ones as one call where the back-end allows
    /// ([`TrellisLinear::forward_shared_input`]: on the host path one evaluation of `x`).
    fn qkv(&self, x: &MlxArray) -> Result<[MlxArray; 3]> {
        if let (Linear::Trellis(q), Linear::Trellis(k), Linear::Trellis(v)) = (&self.q, &self.k, &self.v) {
            return match <[MlxArray; 3]>::try_from(TrellisLinear::forward_shared_input(&[q, k, v], x)?) {
                Ok(qkv) => Ok(qkv),
                Err(ys) => invalid!("q, k and v gave {} outputs", ys.len()),
            };
        }
        Ok([self.q.forward(x)?, self.k.forward(x)?, self.v.forward(x)?])
    }

    /// The residual stream after the attention: `residual` plus the attention output of `x`
    /// (`[1, L, hidden]`, normalized; `residual` of its shape), at the positions after those
    /// `cache` holds; appends this call's keys and values to `cache`. The add is the output
    /// projection's ([`Linear::forward_residual`]: on CUDA a coded one adds it in its kernel).
    /// On CUDA, coded projections at up to 8 rows share one fill of their fold counters and run
    /// without pre-passes ([`Attention::fed_counters`]).
    /// `observe` sees the input of every projection (q, k and v share `x`).
    pub fn forward_residual(
        &self,
        x: &MlxArray,
        residual: &MlxArray,
        cache: &mut LayerCache,
        observe: &mut dyn FnMut(&str, &MlxArray) -> Result<()>,
    ) -> Result<MlxArray> {
        let rows = x.shape()[..x.ndim().saturating_sub(1)].iter().product();
        let fed = self.fed_counters(rows, x.dtype()).filter(|_| residual.dtype() == x.dtype());
        let mut fed = fed.map(FoldCounters::zeroed).transpose()?;
        self.forward_residual_with(x, residual, cache, observe, fed.as_mut())
    }

    /// [`Attention::forward_residual`] with the q, k·v and o launches taking their fold counters
    /// from `counters` ([`Attention::fed_counters`] of them), for a runner that fills one
    /// [`FoldCounters`] for many calls (the model's forward pass: every block's attention and
    /// MLP). An error where they do not run fed.
    pub fn forward_residual_fed(
        &self,
        x: &MlxArray,
        residual: &MlxArray,
        cache: &mut LayerCache,
        observe: &mut dyn FnMut(&str, &MlxArray) -> Result<()>,
        counters: &mut FoldCounters,
    ) -> Result<MlxArray> {
        self.forward_residual_with(x, residual, cache, observe, Some(counters))
    }

    /// The fold counters the block's coded q, k·v and o launches take fed on CUDA for `rows` rows
    /// of `dtype` activations ([`TrellisLinear::fed_counters`]): one fill for them in place of
    /// a pre-pass each, two launches fewer. `None` where a projection is not coded or does not
    /// run fed.
    pub fn fed_counters(&self, rows: usize, dtype: Dtype) -> Option<usize> {
        let (Linear::Trellis(q), Linear::Trellis(k), Linear::Trellis(v), Linear::Trellis(o)) =
            (&self.q, &self.k, &self.v, &self.o)
        else {
            return None;
        };
        TrellisLinear::fed_counters(&[q, k, v], rows, dtype)?.checked_add(TrellisLinear::fed_counters(
            &[o],
            rows,
            dtype,
        )?)
    }

    /// [`Attention::forward_residual`], fed from `fed` where given.
    fn forward_residual_with(
        &self,
        x: &MlxArray,
        residual: &MlxArray,
        cache: &mut LayerCache,
        observe: &mut dyn FnMut(&str, &MlxArray) -> Result<()>,
        mut fed: Option<&mut FoldCounters>,
    ) -> Result<MlxArray> {
        let l = x.shape()[1];
        let offset = cache.len();
        for name in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"] {
            observe(name, x)?;
        }
        let [q, k, v] = match fed.as_deref_mut() {
            Some(counters) => self.qkv_fed(x, counters)?,
            None => self.qkv(x)?,
        };
        let q = self.split_heads(&q, self.heads)?;
        let k = self.split_heads(&k, self.kv_heads)?;
        let v = self.split_heads(&v, self.kv_heads)?;
        // llama.cpp's converter permuted the Q/K rows so that each rotated pair is adjacent.
        let q = rope(&q, self.head_dim, true, self.rope_base, 1.0, offset)?;
        let k = rope(&k, self.head_dim, true, self.rope_base, 1.0, offset)?;
        let (k, v) = match cache.kv.take() {
            Some((pk, pv)) => (concatenate(&[&pk, &k], 2)?, concatenate(&[&pv, &v], 2)?),
            None => (k, v),
        };
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        let mask = if l > 1 { AttentionMask::Causal } else { AttentionMask::None };
        let out = scaled_dot_product_attention(&q, &k, &v, scale, mask)?;
        cache.kv = Some((k, v));
        let out = out.transpose(&[0, 2, 1, 3])?.reshape(&[1, l, self.heads * self.head_dim])?;
        observe("self_attn.o_proj", &out)?;
        match (&self.o, fed) {
            (Linear::Trellis(o), Some(counters)) => o.forward_residual_fed(&out, residual, counters),
            (_, Some(_)) => invalid!("a fed attention's output projection must be coded"),
            (_, None) => self.o.forward_residual(&out, residual),
        }
    }

    /// [`Attention::qkv`] of coded projections, fed from `counters`.
    fn qkv_fed(&self, x: &MlxArray, counters: &mut FoldCounters) -> Result<[MlxArray; 3]> {
        let (Linear::Trellis(q), Linear::Trellis(k), Linear::Trellis(v)) = (&self.q, &self.k, &self.v) else {
            invalid!("fed q, k and v projections must be coded");
        };
        match <[MlxArray; 3]>::try_from(TrellisLinear::forward_shared_input_fed(&[q, k, v], x, counters)?) {
            Ok(qkv) => Ok(qkv),
            Err(ys) => invalid!("q, k and v gave {} outputs", ys.len()),
        }
    }
}

//! The decoder operations of `mlx_trellis::nn` against values computed on the host in f64.

mod common;

use anyhow::{ensure, Result};
use mlx_trellis::nn::select::{
    argmax, argsort, categorical, cumsum, embedding, less, log_softmax, logsumexp, softmax, sort, take_along_axis, topk,
};
use mlx_trellis::nn::{hadamard_transform, rms_norm, rope, scaled_dot_product_attention, AttentionMask};
use mlx_trellis::trellis::reference::rel_err;
use mlx_trellis::{Dtype, ErrorKind, MlxArray};

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn f64s(a: &MlxArray) -> Result<Vec<f64>> {
    Ok(a.astype(Dtype::Float32)?.to_vec::<f32>()?.into_iter().map(f64::from).collect())
}

fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// f32 operations of a few dozen terms against f64: well inside 1e-5.
const F32_GATE: f64 = 1e-5;

fn close(got: &[f64], want: &[f64], what: &str) -> Result<()> {
    let e = rel_err(got, want)?;
    ensure!(e < F32_GATE, "{what}: relErr {e:.2e}");
    Ok(())
}

#[test]
fn rms_norm_matches_the_host() -> Result<()> {
    let (rows, d, eps) = (3, 40, 1e-5);
    let x = values(rows * d, 1);
    let w = values(d, 2);
    let got = f64s(&rms_norm(&MlxArray::from_slice(&x, &[rows, d])?, &MlxArray::from_slice(&w, &[d])?, eps)?)?;
    let want: Vec<f64> = wide(&x)
        .chunks(d)
        .flat_map(|r| {
            let s = (r.iter().map(|v| v * v).sum::<f64>() / d as f64 + f64::from(eps)).sqrt();
            r.iter().zip(&w).map(move |(v, g)| v / s * f64::from(*g)).collect::<Vec<_>>()
        })
        .collect();
    close(&got, &want, "rms_norm")?;
    let bad = rms_norm(&MlxArray::from_slice(&x, &[rows, d])?, &MlxArray::from_slice(&w[..3], &[3])?, eps);
    assert_eq!(bad.unwrap_err().kind(), ErrorKind::InvalidArgument);
    Ok(())
}

/// Host RoPE of `x [heads, positions, dim]`: adjacent pairs (`traditional`) or halves.
fn rope_host(x: &[f64], heads: usize, len: usize, dim: usize, traditional: bool, base: f64, offset: usize) -> Vec<f64> {
    let mut y = x.to_vec();
    for h in 0..heads {
        for p in 0..len {
            for i in 0..dim / 2 {
                let theta = (offset + p) as f64 * base.powf(-2.0 * i as f64 / dim as f64);
                let (c, s) = (theta.cos(), theta.sin());
                let row = (h * len + p) * dim;
                let (a, b) = if traditional { (row + 2 * i, row + 2 * i + 1) } else { (row + i, row + i + dim / 2) };
                y[a] = x[a] * c - x[b] * s;
                y[b] = x[a] * s + x[b] * c;
            }
        }
    }
    y
}

#[test]
fn rope_rotates_adjacent_pairs_or_halves() -> Result<()> {
    let (heads, len, dim, base, offset) = (2, 5, 8, 10_000.0f32, 3);
    let x = values(heads * len * dim, 3);
    let xa = MlxArray::from_slice(&x, &[1, heads, len, dim])?;
    for traditional in [true, false] {
        let got = f64s(&rope(&xa, dim, traditional, base, 1.0, offset)?)?;
        let want = rope_host(&wide(&x), heads, len, dim, traditional, f64::from(base), offset);
        close(&got, &want, &format!("rope traditional={traditional}"))?;
    }
    assert_eq!(rope(&xa, 7, true, base, 1.0, 0).unwrap_err().kind(), ErrorKind::InvalidArgument);
    Ok(())
}

/// Host attention of `q [hq, l, d]` over `k, v [hkv, s, d]`; `causal` aligns the queries with the
/// last `l` keys; `mask` is additive `[l, s]`.
#[allow(clippy::too_many_arguments)]
fn attention_host(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (hq, hkv, l, s, d): (usize, usize, usize, usize, usize),
    scale: f64,
    causal: bool,
    mask: Option<&[f64]>,
) -> Vec<f64> {
    let mut out = vec![0.0; hq * l * d];
    for h in 0..hq {
        let g = h / (hq / hkv);
        for i in 0..l {
            let visible = if causal { i + s - l + 1 } else { s };
            let scores: Vec<f64> = (0..visible)
                .map(|j| {
                    let dot: f64 = (0..d).map(|t| q[(h * l + i) * d + t] * k[(g * s + j) * d + t]).sum();
                    dot * scale + mask.map_or(0.0, |m| m[i * s + j])
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let z: f64 = e.iter().sum();
            for (j, w) in e.iter().enumerate() {
                for t in 0..d {
                    out[(h * l + i) * d + t] += w / z * v[(g * s + j) * d + t];
                }
            }
        }
    }
    out
}

#[test]
fn attention_is_grouped_and_masked_like_the_host() -> Result<()> {
    let (hq, hkv, l, s, d) = (6, 2, 3, 5, 8);
    let (q, k, v) = (values(hq * l * d, 4), values(hkv * s * d, 5), values(hkv * s * d, 6));
    let qa = MlxArray::from_slice(&q, &[1, hq, l, d])?;
    let ka = MlxArray::from_slice(&k, &[1, hkv, s, d])?;
    let va = MlxArray::from_slice(&v, &[1, hkv, s, d])?;
    let scale = 1.0 / (d as f32).sqrt();
    let dims = (hq, hkv, l, s, d);
    let (qh, kh, vh) = (wide(&q), wide(&k), wide(&v));
    let none = f64s(&scaled_dot_product_attention(&qa, &ka, &va, scale, AttentionMask::None)?)?;
    close(&none, &attention_host(&qh, &kh, &vh, dims, f64::from(scale), false, None), "no mask")?;
    let causal = f64s(&scaled_dot_product_attention(&qa, &ka, &va, scale, AttentionMask::Causal)?)?;
    close(&causal, &attention_host(&qh, &kh, &vh, dims, f64::from(scale), true, None), "causal")?;
    let m = values(l * s, 7);
    let ma = MlxArray::from_slice(&m, &[l, s])?;
    let masked = f64s(&scaled_dot_product_attention(&qa, &ka, &va, scale, AttentionMask::Array(&ma))?)?;
    close(&masked, &attention_host(&qh, &kh, &vh, dims, f64::from(scale), false, Some(&wide(&m))), "array mask")?;
    let k5 = MlxArray::from_slice(&values(4 * s * d, 8), &[1, 4, s, d])?;
    let refused = scaled_dot_product_attention(&qa, &k5, &k5, scale, AttentionMask::None).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidArgument, "6 query heads over 4 kv heads: {refused}");
    Ok(())
}

#[test]
fn hadamard_transform_is_sylvesters_matrix() -> Result<()> {
    let (rows, n) = (3, 16);
    let x = values(rows * n, 9);
    let scale = 0.25f32;
    let got = f64s(&hadamard_transform(&MlxArray::from_slice(&x, &[rows, n])?, scale)?)?;
    // Sylvester's Hadamard matrix: H[i][j] = (-1)^popcount(i & j).
    let want: Vec<f64> = wide(&x)
        .chunks(n)
        .flat_map(|r| {
            (0..n).map(move |j| {
                r.iter().enumerate().map(|(i, v)| if (i & j).count_ones() % 2 == 0 { *v } else { -*v }).sum::<f64>()
                    * 0.25
            })
        })
        .collect();
    close(&got, &want, "hadamard")?;
    // Orthonormal scale: applying it twice is the identity.
    let once = hadamard_transform(&MlxArray::from_slice(&x, &[rows, n])?, scale)?;
    close(&f64s(&hadamard_transform(&once, scale)?)?, &wide(&x), "H·H")?;
    let odd = hadamard_transform(&MlxArray::from_slice(&values(7, 1), &[7])?, 1.0).unwrap_err();
    assert_eq!(odd.kind(), ErrorKind::InvalidArgument);
    Ok(())
}

#[test]
fn embedding_gathers_rows_and_refuses_ids_past_the_table() -> Result<()> {
    let table: Vec<f32> = (0..15).map(|i| i as f32).collect();
    let t = MlxArray::from_slice(&table, &[5, 3])?;
    let got = embedding(&t, &MlxArray::from_slice(&[4u32, 0, 2, 2], &[2, 2])?)?;
    assert_eq!(got.shape(), [2, 2, 3]);
    assert_eq!(got.to_vec::<f32>()?, [12., 13., 14., 0., 1., 2., 6., 7., 8., 6., 7., 8.]);
    for bad in [&[5i32][..], &[-1]] {
        let e = embedding(&t, &MlxArray::from_slice(bad, &[1])?).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }
    Ok(())
}

#[test]
fn reductions_over_an_axis_match_the_host() -> Result<()> {
    let (rows, n) = (4, 9);
    let x = values(rows * n, 10);
    let xa = MlxArray::from_slice(&x, &[rows, n])?;
    let host: Vec<Vec<f64>> = wide(&x).chunks(n).map(<[f64]>::to_vec).collect();
    let lse: Vec<f64> = host.iter().map(|r| r.iter().map(|v| v.exp()).sum::<f64>().ln()).collect();
    close(&f64s(&logsumexp(&xa, 1, false)?)?, &lse, "logsumexp")?;
    let ls: Vec<f64> = host.iter().zip(&lse).flat_map(|(r, l)| r.iter().map(move |v| v - l)).collect();
    close(&f64s(&log_softmax(&xa, -1)?)?, &ls, "log_softmax")?;
    let sm: Vec<f64> = ls.iter().map(|v| v.exp()).collect();
    close(&f64s(&softmax(&xa, 1)?)?, &sm, "softmax")?;
    let am: Vec<u32> = host
        .iter()
        .map(|r| r.iter().enumerate().fold((0, f64::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32)
        .collect();
    assert_eq!(argmax(&xa, 1, false)?.to_vec::<u32>()?, am);
    assert!(argmax(&xa, 2, false).is_err());
    Ok(())
}

#[test]
fn ordering_and_cumulative_sums_match_the_host() -> Result<()> {
    let x = [0.3f32, -1.0, 2.5, 0.0, 1.25];
    let xa = MlxArray::from_slice(&x, &[5])?;
    assert_eq!(sort(&xa, 0)?.to_vec::<f32>()?, [-1.0, 0.0, 0.3, 1.25, 2.5]);
    let order = argsort(&xa, 0)?;
    assert_eq!(order.to_vec::<u32>()?, [1, 3, 0, 4, 2]);
    assert_eq!(take_along_axis(&xa, &order, 0)?.to_vec::<f32>()?, [-1.0, 0.0, 0.3, 1.25, 2.5]);
    let mut top = topk(&xa, 2, 0)?.to_vec::<f32>()?;
    top.sort_by(f32::total_cmp);
    assert_eq!(top, [1.25, 2.5]);
    assert!(topk(&xa, 6, 0).is_err());
    let c = [1.0f32, 2.0, 3.0, 4.0];
    let ca = MlxArray::from_slice(&c, &[4])?;
    assert_eq!(cumsum(&ca, 0, false, true)?.to_vec::<f32>()?, [1.0, 3.0, 6.0, 10.0]);
    assert_eq!(cumsum(&ca, 0, false, false)?.to_vec::<f32>()?, [0.0, 1.0, 3.0, 6.0]);
    assert_eq!(cumsum(&ca, 0, true, true)?.to_vec::<f32>()?, [10.0, 9.0, 7.0, 4.0]);
    assert_eq!(less(&ca, &MlxArray::scalar(2.5f32)?)?.to_vec::<bool>()?, [true, true, false, false]);
    Ok(())
}

#[test]
fn categorical_draws_only_possible_indices_reproducibly() -> Result<()> {
    let half = 0.5f32.ln();
    let logits = MlxArray::from_slice(&[half, f32::NEG_INFINITY, half], &[3])?;
    let draws: Vec<u32> = (0..64)
        .map(|seed| categorical(&logits, 0, seed)?.item_f64().map(|v| v as u32))
        .collect::<mlx_trellis::Result<_>>()?;
    assert!(draws.iter().all(|&d| d == 0 || d == 2), "{draws:?}");
    assert!(draws.contains(&0) && draws.contains(&2), "64 draws of a fair coin gave one side only: {draws:?}");
    let again: Vec<u32> = (0..64)
        .map(|seed| categorical(&logits, 0, seed)?.item_f64().map(|v| v as u32))
        .collect::<mlx_trellis::Result<_>>()?;
    assert_eq!(draws, again, "the same seeds draw the same indices");
    Ok(())
}

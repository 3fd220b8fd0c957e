//! The input second moment `H = Σ xᵀx` of a linear layer (`[in, in]`, f64, row-major): its
//! checks, the feedback factor the Hessian-weighted encoder uses, the proxy error
//! `tr(E H Eᵀ)`, and the change of basis for a rotated layer.
//!
//! # The feedback factor
//!
//! With `E = Ŵ − W` (`[out, in]`) and the input columns split into consecutive groups of `g`,
//! coding group `k` against the target `W_k + (W − Ŵ)_{<k} A_{<k,k}` leaves a per-group residual
//! `η_k = Ŵ_k − target_k`, so `E (I + A) = η` with `A` strictly upper block-triangular. The
//! proxy error is then `tr(η M ηᵀ)` with `M = (I + A)⁻¹ H (I + A)⁻ᵀ`, which is block diagonal
//! exactly when `H = U D Uᵀ` with `U = I + A` unit upper block-triangular and `D` block diagonal
//! (the block "UDUᵀ" decomposition, the mirror image of LDLᵀ: QuIP's LDLQ and QTIP's BlockLDLQ
//! in forward order). The error of each group is then weighted by its own `D_k` only, and the
//! feedback is the best linear correction from the groups already coded.
//!
//! The factorisation computes `U`: the upper Cholesky factor `H = R Rᵀ` (`R` upper
//! triangular, computed from the last index backwards), then `U = R B⁻¹` with
//! `B = blockdiag(R_kk)` (so `D_k = R_kk R_kkᵀ`). All in f64.

use crate::alloc::try_filled;
use crate::error::{invalid, Result};

use super::parallel::{axpy, dot, rows_in_parallel};

/// The proxy error of a coded linear layer: `tr(E H Eᵀ)` with `E = Ŵ − W` in `[out, in]`
/// orientation, and the same form of the weights themselves, `tr(W H Wᵀ)`, to normalise it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProxyError {
    /// `tr(E H Eᵀ)`: the summed squared error of the layer's outputs over the inputs that `H`
    /// was collected on.
    pub error: f64,
    /// `tr(W H Wᵀ)`: the summed squared outputs of the dense layer over the same inputs.
    pub reference: f64,
}

impl ProxyError {
    /// `error / reference`: the output error relative to the output energy (0 when both are 0,
    /// infinite when only the reference is).
    pub fn relative(&self) -> f64 {
        if self.error == 0.0 {
            0.0
        } else {
            self.error / self.reference
        }
    }
}

/// Why a Hessian cannot weight the code (the encoder then codes unweighted and says why).
pub(super) fn unusable(h: &[f64], n: usize) -> Option<String> {
    if let Some(i) = h.iter().position(|v| !v.is_finite()) {
        return Some(format!("H[{}, {}] is {} (not finite)", i / n, i % n, h[i]));
    }
    if let Some(i) = (0..n).find(|&i| h[i * n + i] < 0.0) {
        return Some(format!("H[{i}, {i}] = {} is negative (H is not a second moment)", h[i * n + i]));
    }
    // Finite and non-negative by the checks above, so zero is the only failing value.
    if mean_diagonal(h, n) <= 0.0 {
        return Some("H has an all-zero diagonal (singular)".into());
    }
    None
}

/// The mean of the diagonal of `h`.
pub(super) fn mean_diagonal(h: &[f64], n: usize) -> f64 {
    (0..n).map(|i| h[i * n + i]).sum::<f64>() / n as f64
}

/// Checks that `h` holds `n * n` values.
pub(super) fn check_len(h: &[f64], n: usize, what: &str) -> Result<()> {
    if n.checked_mul(n) != Some(h.len()) {
        invalid!("{what}: H has {} values, expected [{n}, {n}] for {n} input features", h.len());
    }
    Ok(())
}

/// The feedback factor `U` (`n * n`, row-major, unit upper block-triangular with blocks of
/// `group` indices starting at 0) of `H + damping · mean(diag H) · I`, reading the upper
/// triangle of `h` (H is taken as symmetric). `None` when the damped matrix is not positive
/// definite in f64 (a pivot is not positive, or a value not finite).
pub(super) fn feedback_factor(
    h: &[f64],
    n: usize,
    damping: f64,
    group: usize,
    threads: usize,
) -> Result<Option<Vec<f64>>> {
    let shift = damping * mean_diagonal(h, n);
    let mut r = try_filled(h.len(), 0f64, || format!("the feedback factor [{n}, {n}]"))?;
    for i in 0..n {
        r[i * n + i..(i + 1) * n].copy_from_slice(&h[i * n + i..(i + 1) * n]);
        r[i * n + i] += shift;
    }
    if !upper_cholesky(&mut r, n, threads) {
        return Ok(None);
    }
    divide_diagonal_blocks(&mut r, n, group.max(1), threads);
    Ok(Some(r))
}

/// Below this many multiply-adds a step runs on the calling thread (spawning costs more).
const PARALLEL_WORK: usize = 1 << 16;

/// Columns of `R` finished per panel in [`upper_cholesky`].
const PANEL: usize = 32;

/// In place: the upper triangle of `r` (holding the damped H) becomes `R` with `H = R Rᵀ`.
/// False if a pivot is not positive and finite.
///
/// `R[i, j] = (H[i, j] − R[i, j+1..] · R[j, j+1..]) / R[j, j]`, from the last column. Columns
/// go in panels of [`PANEL`], from the last: first every row subtracts its dot products with
/// the panel rows over the columns already finished (each row's tail read once per panel, the
/// panel's tails staying in cache), then the panel's own triangle is finished, then the rows
/// above it subtract the in-panel remainder and divide.
fn upper_cholesky(r: &mut [f64], n: usize, threads: usize) -> bool {
    let mut p1 = n;
    while p1 > 0 {
        let p0 = p1.saturating_sub(PANEL);
        let width = p1 - p0;
        // The panel rows' finished tails, [width, n - p1].
        let tail_len = n - p1;
        let mut tails = vec![0f64; width * tail_len];
        if tail_len > 0 {
            for (m, t) in tails.chunks_exact_mut(tail_len).enumerate() {
                t.copy_from_slice(&r[(p0 + m) * n + p1..(p0 + m + 1) * n]);
            }
        }
        let tails = &tails;
        let update = |first: usize, run: &mut [f64]| {
            for (k, row) in run.chunks_exact_mut(n).enumerate() {
                let i = first + k;
                let (head, tail) = row.split_at_mut(p1);
                for j in i.max(p0)..p1 {
                    head[j] -= dot(tail, &tails[(j - p0) * tail_len..(j - p0 + 1) * tail_len]);
                }
            }
        };
        let threads_a = if p1 * tail_len * width >= PARALLEL_WORK { threads } else { 1 };
        rows_in_parallel(&mut r[..p1 * n], n, threads_a, update);
        // The panel's own triangle, column by column from its last.
        for j in (p0..p1).rev() {
            let row_j = j * n;
            let pivot = r[row_j + j] - dot(&r[row_j + j + 1..row_j + p1], &r[row_j + j + 1..row_j + p1]);
            if !(pivot > 0.0 && pivot.is_finite()) {
                return false;
            }
            let rjj = pivot.sqrt();
            r[row_j + j] = rjj;
            for i in p0..j {
                let (above, from_j) = r.split_at_mut(row_j);
                let row_i = &mut above[i * n..(i + 1) * n];
                row_i[j] = (row_i[j] - dot(&row_i[j + 1..p1], &from_j[j + 1..p1])) / rjj;
            }
        }
        // The rows above the panel: the in-panel remainder and the division.
        let mut block = vec![0f64; width * width];
        for m in 0..width {
            block[m * width..(m + 1) * width].copy_from_slice(&r[(p0 + m) * n + p0..(p0 + m) * n + p1]);
        }
        let block = &block;
        let finish = |_: usize, run: &mut [f64]| {
            for row in run.chunks_exact_mut(n) {
                let seg = &mut row[p0..p1];
                for m in (0..width).rev() {
                    let panel_row = &block[m * width..(m + 1) * width];
                    seg[m] = (seg[m] - dot(&seg[m + 1..], &panel_row[m + 1..])) / panel_row[m];
                }
            }
        };
        let threads_b = if p0 * width * width >= PARALLEL_WORK { threads } else { 1 };
        rows_in_parallel(&mut r[..p0 * n], n, threads_b, finish);
        p1 = p0;
    }
    true
}

/// In place: `R` becomes `U = R B⁻¹` with `B = blockdiag(R_kk)` over blocks of `group` indices,
/// so every diagonal block of `U` is exactly the identity.
fn divide_diagonal_blocks(r: &mut [f64], n: usize, group: usize, threads: usize) {
    let mut start = 0;
    while start < n {
        let end = (start + group).min(n);
        let size = end - start;
        // The block's transpose, row-major: lower[c * size + m] = R[start + m, start + c].
        let mut lower = vec![0f64; size * size];
        for m in 0..size {
            for c in m..size {
                lower[c * size + m] = r[(start + m) * n + start + c];
            }
        }
        // Rows above the block: solve x R_kk = y for each row's slice of the block's columns.
        let solve = |_: usize, run: &mut [f64]| {
            for row in run.chunks_exact_mut(n) {
                let x = &mut row[start..end];
                for c in 0..size {
                    let diagonal = lower[c * size + c];
                    x[c] = (x[c] - dot(&x[..c], &lower[c * size..c * size + c])) / diagonal;
                }
            }
        };
        let threads = if start * size * size >= PARALLEL_WORK { threads } else { 1 };
        rows_in_parallel(&mut r[..start * n], n, threads, solve);
        for i in start..end {
            r[i * n + start..i * n + end].fill(0.0);
            r[i * n + i] = 1.0;
        }
        start = end;
    }
}

/// Rows that share one pass over `H` in [`proxy_error`] (four rows of `E`, four of `W`).
const PROXY_ROWS: usize = 8;

/// The proxy error of a coded linear layer: `w` is the dense weight `[out, in]` (row-major),
/// `reconstruction` the decoded stored matrix of the code (`[in, out]` for `axis` 0, `[out, in]`
/// for axis 1, as [`Encoded::reconstruction`](super::Encoded::reconstruction) holds it), `h` the
/// input's second moment `[in, in]` in the same basis as `w` (read as symmetric: its upper
/// triangle). Sums in f64 in a fixed order on
/// `threads` threads (`None`: one per core); the result does not depend on the thread count.
pub fn proxy_error(
    w: &[f32],
    reconstruction: &[f32],
    out_features: usize,
    in_features: usize,
    axis: u32,
    h: &[f64],
    threads: Option<usize>,
) -> Result<ProxyError> {
    let (out, n) = (out_features, in_features);
    if out.checked_mul(n) != Some(w.len()) || reconstruction.len() != w.len() {
        invalid!(
            "proxy error: {} weights and {} reconstructed values given for [out {out}, in {n}]",
            w.len(),
            reconstruction.len()
        );
    }
    if axis > 1 {
        invalid!("proxy error: axis = {axis} must be 0 (stored [in, out]) or 1 (stored [out, in])");
    }
    check_len(h, n, "proxy error")?;
    if let Some(i) = h.iter().position(|v| !v.is_finite()) {
        invalid!("proxy error: H[{}, {}] is {} (not finite)", i / n, i % n, h[i]);
    }
    let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |t| t.get())).max(1);
    // E and W as f64 [out, in], E's row o interleaved before W's: rows 2o and 2o + 1.
    let mut ew = try_filled(2 * w.len(), 0f64, || format!("the proxy error's operands [2 x {out}, {n}]"))?;
    for o in 0..out {
        for i in 0..n {
            let stored = if axis == 0 { i * out + o } else { o * n + i };
            ew[2 * o * n + i] = reconstruction[stored] as f64 - w[o * n + i] as f64;
            ew[(2 * o + 1) * n + i] = w[o * n + i] as f64;
        }
    }
    let mut forms = vec![0f64; 2 * out];
    let ew = &ew;
    rows_in_parallel(&mut forms, PROXY_ROWS, threads, |first, run| {
        quadratic_forms(&ew[first * PROXY_ROWS * n..], h, n, run);
    });
    let error = forms.iter().step_by(2).sum();
    let reference = forms.iter().skip(1).step_by(2).sum();
    Ok(ProxyError { error, reference })
}

/// `out[r] = v_r H v_rᵀ` for the first `out.len()` rows `v_r` of `rows` (each `n` long), up to
/// [`PROXY_ROWS`] rows per pass over the upper triangle of `H` (taken as symmetric):
/// `v H vᵀ = Σ_b v_b (H_bb v_b + 2 Σ_{a>b} H_ba v_a)`. The pass's rows are interleaved
/// (`PROXY_ROWS` values per index) so that each `H` entry feeds all of them from one load.
fn quadratic_forms(rows: &[f64], h: &[f64], n: usize, out: &mut [f64]) {
    let mut packed = vec![0f64; n * PROXY_ROWS];
    for (pass, forms) in out.chunks_mut(PROXY_ROWS).enumerate() {
        packed.fill(0.0);
        for (r, v) in rows[pass * PROXY_ROWS * n..].chunks_exact(n).take(forms.len()).enumerate() {
            for (a, &x) in v.iter().enumerate() {
                packed[a * PROXY_ROWS + r] = x;
            }
        }
        let mut sums = [0f64; PROXY_ROWS];
        for b in 0..n {
            let mut tail = [0f64; PROXY_ROWS];
            let h_tail = &h[b * n + b + 1..(b + 1) * n];
            for (&hv, va) in h_tail.iter().zip(packed[(b + 1) * PROXY_ROWS..].chunks_exact(PROXY_ROWS)) {
                for (t, &x) in tail.iter_mut().zip(va) {
                    *t += hv * x;
                }
            }
            let vb = &packed[b * PROXY_ROWS..(b + 1) * PROXY_ROWS];
            let diagonal = h[b * n + b];
            for ((s, &t), &x) in sums.iter_mut().zip(&tail).zip(vb) {
                *s += x * (diagonal * x + 2.0 * t);
            }
        }
        forms.copy_from_slice(&sums[..forms.len()]);
    }
}

/// `Qᵀ H Q` (`[n, n]`, row-major): the second moment of the inputs `x' = x Q` of a layer whose
/// coded axis is rotated (`W' = W Q` for a stored `W [out, in]`). The Hessian-weighted encoder
/// takes `H` in the basis of the weights it codes, so a caller that rotates the weights passes
/// the rotated `H` through this (or collects `H` of the rotated inputs directly). `q` is the
/// dense rotation `[n, n]`; costs two dense `n³` products on `threads` threads (`None`: one per
/// core).
pub fn rotate_hessian(h: &[f64], q: &[f64], n: usize, threads: Option<usize>) -> Result<Vec<f64>> {
    check_len(h, n, "rotate_hessian")?;
    if n.checked_mul(n) != Some(q.len()) {
        invalid!("rotate_hessian: the rotation has {} values, expected [{n}, {n}]", q.len());
    }
    if let Some(i) = h.iter().chain(q).position(|v| !v.is_finite()) {
        let (what, i) = if i < h.len() { ("H", i) } else { ("Q", i - h.len()) };
        invalid!("rotate_hessian: {what}[{}, {}] is not finite", i / n, i % n);
    }
    let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |t| t.get())).max(1);
    // M = H Q, row by row; then (Qᵀ M) row c = Σ_a Q[a, c] M[a, :], i.e. rows of Qᵀ times M.
    let mut m = try_filled(h.len(), 0f64, || format!("H Q [{n}, {n}]"))?;
    rows_in_parallel(&mut m, n, threads, |first, run| {
        for (i, row) in run.chunks_exact_mut(n).enumerate() {
            let h_row = &h[(first + i) * n..(first + i + 1) * n];
            for (b, &hb) in h_row.iter().enumerate() {
                axpy(row, hb, &q[b * n..(b + 1) * n]);
            }
        }
    });
    let mut rotated = try_filled(h.len(), 0f64, || format!("Qᵀ H Q [{n}, {n}]"))?;
    let m = &m;
    rows_in_parallel(&mut rotated, n, threads, |first, run| {
        for (i, row) in run.chunks_exact_mut(n).enumerate() {
            let c = first + i;
            for a in 0..n {
                axpy(row, q[a * n + c], &m[a * n..(a + 1) * n]);
            }
        }
    });
    Ok(rotated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trellis::synthetic::SplitMix64;

    /// A random symmetric positive definite matrix `Xᵀ X + 0.1 I`.
    fn spd(n: usize, seed: u64) -> Vec<f64> {
        let mut rng = SplitMix64::new(seed);
        let x: Vec<f64> = (0..2 * n * n).map(|_| rng.next_gaussian()).collect();
        let mut h = vec![0f64; n * n];
        for a in 0..n {
            for b in 0..n {
                h[a * n + b] = (0..2 * n).map(|s| x[s * n + a] * x[s * n + b]).sum::<f64>();
            }
            h[a * n + a] += 0.1;
        }
        h
    }

    #[test]
    fn the_factor_reassembles_the_damped_matrix_with_block_diagonal_d() {
        // Past one panel of the factorisation too (70 = 2 x 32 + 6).
        for (n, group) in [(7usize, 1usize), (10, 3), (12, 4), (9, 9), (70, 1), (70, 16)] {
            let h = spd(n, n as u64 + group as u64);
            let damping = 0.05;
            let u = feedback_factor(&h, n, damping, group, 2).unwrap().unwrap();
            let shift = damping * mean_diagonal(&h, n);
            let block = |i: usize| i / group;
            // U is unit upper block-triangular.
            for i in 0..n {
                for j in 0..n {
                    let want_structure = if block(i) == block(j) { (i == j) as u8 as f64 } else { u[i * n + j] };
                    assert_eq!(u[i * n + j], want_structure, "n {n} g {group}: U[{i}, {j}] inside a diagonal block");
                    if block(j) < block(i) {
                        assert_eq!(u[i * n + j], 0.0, "U[{i}, {j}] below the diagonal blocks");
                    }
                }
            }
            // M = U⁻¹ (H + shift I) U⁻ᵀ is block diagonal: solve by back substitution, U is unit
            // upper triangular.
            let mut damped = h.clone();
            (0..n).for_each(|i| damped[i * n + i] += shift);
            let solve_upper = |b: &[f64]| -> Vec<f64> {
                // x with U x = b, column by column of b (b is [n, n], column c = b[.., c]).
                let mut x = b.to_vec();
                for c in 0..n {
                    for i in (0..n).rev() {
                        let s: f64 = (i + 1..n).map(|m| u[i * n + m] * x[m * n + c]).sum();
                        x[i * n + c] = b[i * n + c] - s;
                    }
                }
                x
            };
            let left = solve_upper(&damped); // U⁻¹ H'
            let transposed: Vec<f64> = (0..n * n).map(|i| left[(i % n) * n + i / n]).collect();
            let m = solve_upper(&transposed); // U⁻¹ H' U⁻ᵀ (H' is symmetric)
            let scale = damped.iter().fold(0f64, |a, v| a.max(v.abs()));
            for i in 0..n {
                for j in 0..n {
                    if block(i) != block(j) {
                        assert!(m[i * n + j].abs() <= 1e-10 * scale, "n {n} g {group}: M[{i}, {j}] = {}", m[i * n + j]);
                    }
                }
            }
        }
    }

    #[test]
    fn an_indefinite_matrix_has_no_factor() {
        let n = 4;
        let mut h = spd(n, 3);
        h[0] = -100.0;
        assert!(feedback_factor(&h, n, 0.0, 1, 1).unwrap().is_none());
        assert!(unusable(&h, n).is_some());
    }

    #[test]
    fn the_proxy_error_is_the_plain_double_sum() {
        let (out, n) = (9usize, 11usize);
        let h = spd(n, 5);
        let mut rng = SplitMix64::new(8);
        let w: Vec<f32> = (0..out * n).map(|_| rng.next_gaussian() as f32).collect();
        let rec_linear: Vec<f32> = w.iter().map(|&v| v + 0.1 * rng.next_gaussian() as f32).collect();
        let form = |m: &dyn Fn(usize, usize) -> f64| -> f64 {
            (0..out)
                .map(|o| (0..n).map(|a| (0..n).map(|b| m(o, a) * h[a * n + b] * m(o, b)).sum::<f64>()).sum::<f64>())
                .sum()
        };
        let want_error = form(&|o, a| rec_linear[o * n + a] as f64 - w[o * n + a] as f64);
        let want_reference = form(&|o, a| w[o * n + a] as f64);
        let stored_t: Vec<f32> = (0..n * out).map(|s| rec_linear[(s % out) * n + s / out]).collect();
        for (axis, rec) in [(1u32, &rec_linear), (0, &stored_t)] {
            for threads in [1, 3] {
                let p = proxy_error(&w, rec, out, n, axis, &h, Some(threads)).unwrap();
                assert!((p.error - want_error).abs() <= 1e-10 * want_error, "axis {axis}: {} vs {want_error}", p.error);
                assert!((p.reference - want_reference).abs() <= 1e-10 * want_reference, "axis {axis}");
            }
        }
    }

    #[test]
    fn rotating_h_is_q_transpose_h_q() {
        let n = 6;
        let h = spd(n, 9);
        let mut rng = SplitMix64::new(2);
        let q: Vec<f64> = (0..n * n).map(|_| rng.next_gaussian()).collect();
        let r = rotate_hessian(&h, &q, n, Some(2)).unwrap();
        for c in 0..n {
            for d in 0..n {
                let want: f64 =
                    (0..n).map(|a| (0..n).map(|b| q[a * n + c] * h[a * n + b] * q[b * n + d]).sum::<f64>()).sum();
                assert!((r[c * n + d] - want).abs() <= 1e-10 * want.abs().max(1.0), "[{c}, {d}]");
            }
        }
    }
}

//! Hessian-weighted coding (LDLQ / BlockLDLQ): each group of input features is coded against
//! its weights plus the error of the groups already coded, fed back through the factor of the
//! layer's input second moment `H` (see [`hessian`](super::hessian) for the derivation), so the
//! codes minimise the output error `tr(E H Eᵀ)` rather than the plain squared error.
//!
//! # The two axes
//!
//! - **Axis 1** (stored `W [out, in]`, blocks of `T = 256` consecutive input features of one
//!   output row): BlockLDLQ with the trellis block as the group, `g = T`. The input blocks are
//!   coded in order; block `b`'s target is `W[:, b] + (W − Ŵ)[:, <b] · U[<b, b]` and every
//!   output row's target block is one trellis block, coded with plain squared error.
//! - **Axis 0** (stored `Wᵀ [in, out]`, one stored row per input feature, coded along the
//!   output): LDLQ over the stored rows, [`LdlqConfig::stored_row_group`] rows at a time (default
//!   1, the exact LDLQ). Row `i`'s target is `S[i] + Σ_{j<i} U[j, i] · (S[j] − Ŝ[j])`, coded as
//!   that row's blocks. A group of `g > 1` rows is coded independently (block LDL with blocks of
//!   `g` rows, their error fed back after the group); larger groups put more blocks in every
//!   search call, which a GPU search needs to be busy, at some cost in quality.
//!
//! # Scales
//!
//! Axis 1 takes each row's f16 scale from the original row (the scale must be known when the
//! row's first block is coded, before the targets of its later blocks exist). Axis 0 takes it
//! from the target row (known whole before the row is coded), so the normalised values the
//! search sees have the codebook's RMS. With `H = I` both are the plain encoder's scales.
//!
//! # Damping and the guard against blow-up
//!
//! `H` is damped to `H + λ · mean(diag H) · I` (`λ` = [`LdlqConfig::damping`], 0.01 by default)
//! before the f64 factorisation. An attempt is abandoned, and retried with ten times the
//! damping, when the damped matrix is not positive definite or a target's RMS exceeds
//! [`LdlqConfig::growth_limit`] times the larger of its original stored row's RMS and the
//! matrix's (targets that large would saturate the codebook; it is the sign of feedback that
//! amplifies error). After [`LdlqConfig::retries`] retries the layer is coded unweighted. A
//! missing `H`, one with a non-finite entry, a negative diagonal entry or an all-zero diagonal
//! also gives the unweighted code. Every such case is reported in [`LdlqEncoded::warnings`];
//! none is an error.
//!
//! # Rotated and padded layers
//!
//! The encoder codes the matrix it is given: a configuration with
//! [`EncoderConfig::rotation`] is refused (the result could not record the rotation), and so is a
//! coded axis that is not a whole number of blocks (LDLQ does not pad; [`code_linear`](super::code_linear)
//! pads and rotates, unweighted). `H` must be in the basis of the weights coded: for a layer whose input axis is rotated
//! (`W' = W Q`, inputs `x' = x Q`) that is `Qᵀ H Q`; [`rotate_hessian`](super::rotate_hessian)
//! computes it from a dense `Q`.
//!
//! # Search back-end and determinism
//!
//! The feedback runs on the host in f64; every step's blocks go through the same search
//! dispatch as the plain encoder (CPU threads or the CUDA kernel per
//! [`EncoderConfig::backend`]), and each block is coded exactly as the plain encoder codes a
//! block with the same values and scale. The output does not depend on the thread count or the
//! search back-end. With `H = I` the feedback is exactly zero and the codes are the plain
//! encoder's, bit for bit.

use half::f16;

use crate::alloc::try_filled;
use crate::error::{invalid, ErrorContext, Result};
use crate::trellis::format::codebook::lut1mad;
use crate::trellis::format::{row_major_to_interleaved, CodeLayout, HostLayer, TrellisGeometry};

use super::hessian::{check_len, feedback_factor, proxy_error, unusable, ProxyError};
use super::parallel::{axpy, rows_in_parallel};
use super::{encode_with_progress, rms, row_scale, search_and_code, stored_from_linear, BlockSearch};
use super::{Encoded, EncoderConfig, RowsOf};

/// How the Hessian-weighted encoder feeds back and guards (see the [module](self) docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LdlqConfig {
    /// `λ` in `H + λ · mean(diag H) · I`; finite and at least 0. Default 0.01.
    pub damping: f64,
    /// Attempts after the first, each with ten times the previous damping, before the layer is
    /// coded unweighted; at most 10. Default 3.
    pub retries: u32,
    /// The largest allowed ratio of a target's RMS to its original stored row's (or, if larger,
    /// the matrix's) RMS; finite and above 1. Default 4.
    pub growth_limit: f64,
    /// Axis 0 only: stored rows (input features) coded per step, at least 1. 1 is the exact
    /// LDLQ; more rows per step give the search larger batches. Default 1.
    pub stored_row_group: usize,
}

impl Default for LdlqConfig {
    fn default() -> Self {
        LdlqConfig { damping: 0.01, retries: 3, growth_limit: 4.0, stored_row_group: 1 }
    }
}

impl LdlqConfig {
    /// Checks every parameter; each error names the one it rejects.
    pub fn validate(&self) -> Result<()> {
        let LdlqConfig { damping, retries, growth_limit, stored_row_group } = *self;
        if !(damping.is_finite() && damping >= 0.0) {
            invalid!("LDLQ: damping = {damping} must be finite and at least 0");
        }
        if retries > 10 {
            invalid!("LDLQ: retries = {retries} is above 10 (the damping grows tenfold per retry)");
        }
        if !(growth_limit.is_finite() && growth_limit > 1.0) {
            invalid!("LDLQ: growth_limit = {growth_limit} must be finite and above 1");
        }
        if stored_row_group == 0 {
            invalid!("LDLQ: stored_row_group = 0; at least one stored row is coded per step");
        }
        Ok(())
    }
}

/// Whether the code was chosen against `H`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LdlqOutcome {
    /// Coded with feedback through `H + damping · mean(diag H) · I`.
    Weighted {
        /// The damping `λ` of the attempt that succeeded.
        damping: f64,
    },
    /// Coded by the plain encoder (no `H`, an unusable `H`, or every attempt failed); the
    /// reason is in [`LdlqEncoded::warnings`].
    Unweighted,
}

/// The result of [`encode_linear_ldlq`].
#[derive(Debug, Clone)]
pub struct LdlqEncoded {
    /// The codes, scales, reconstruction (stored orientation) and mean squared error against
    /// the weights, as [`encode_linear`](super::encode_linear) reports them.
    pub encoded: Encoded,
    /// Whether `H` weighted the code, and with which damping.
    pub outcome: LdlqOutcome,
    /// The proxy error of the codes against the `H` given (undamped); `None` without a finite
    /// `H`.
    pub proxy: Option<ProxyError>,
    /// Retries and fallbacks, in order, each saying why.
    pub warnings: Vec<String>,
}

/// Codes a dense linear weight `w` `[out_features, in_features]` (row-major) along `cfg.axis`
/// with feedback through `hessian`, the second moment `H = Σ xᵀx` of the layer's input
/// (`[in, in]`, f64, row-major, in the basis of `w`; `None` codes unweighted). See the
/// [module](self) docs for the algorithm, damping, guard and fallbacks. Errors only on invalid
/// arguments (shapes, configurations, non-finite weights, an `H` of the wrong size).
pub fn encode_linear_ldlq(
    w: &[f32],
    out_features: usize,
    in_features: usize,
    hessian: Option<&[f64]>,
    cfg: &EncoderConfig,
    ldlq: &LdlqConfig,
) -> Result<LdlqEncoded> {
    encode_linear_ldlq_with_progress(w, out_features, in_features, hessian, cfg, ldlq, &mut |_, _| {})
}

/// [`encode_linear_ldlq`], calling `progress(blocks_done, blocks)` on the calling thread as
/// blocks are coded (an attempt that is retried starts again from zero).
pub fn encode_linear_ldlq_with_progress(
    w: &[f32],
    out_features: usize,
    in_features: usize,
    hessian: Option<&[f64]>,
    cfg: &EncoderConfig,
    ldlq: &LdlqConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<LdlqEncoded> {
    Ok(encode_ldlq(w, out_features, in_features, hessian, cfg, ldlq, progress)?.0)
}

/// [`encode_linear_ldlq`] that also returns the targets the blocks were coded against (stored
/// orientation; the weights themselves when coded unweighted). For tests.
#[doc(hidden)]
pub fn encode_linear_ldlq_with_targets(
    w: &[f32],
    out_features: usize,
    in_features: usize,
    hessian: Option<&[f64]>,
    cfg: &EncoderConfig,
    ldlq: &LdlqConfig,
) -> Result<(LdlqEncoded, Vec<f32>)> {
    encode_ldlq(w, out_features, in_features, hessian, cfg, ldlq, &mut |_, _| {})
}

fn encode_ldlq(
    w: &[f32],
    out_features: usize,
    in_features: usize,
    hessian: Option<&[f64]>,
    cfg: &EncoderConfig,
    ldlq: &LdlqConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(LdlqEncoded, Vec<f32>)> {
    cfg.validate()?;
    ldlq.validate()?;
    if cfg.rotation.is_some() {
        invalid!(
            "LDLQ: codes the matrix as given and its result cannot record a rotation (set rotation: None; to code a rotated layer, rotate the weights along the coded axis first and, on axis 1, H with rotate_hessian)"
        );
    }
    let (stored, rows, cols) = stored_from_linear(w, out_features, in_features, cfg.axis)?;
    let t = cfg.t as usize;
    if rows == 0 || cols == 0 || cols % t != 0 {
        invalid!(
            "LDLQ: the stored matrix [{rows}, {cols}] is empty or not a whole number of {t}-weight blocks per row (LDLQ does not pad the coded axis; code_linear pads, unweighted)"
        );
    }
    if let Some(i) = stored.iter().position(|v| !v.is_finite()) {
        invalid!(
            "LDLQ: stored weight at row {}, column {} is {} (the input must be finite)",
            i / cols,
            i % cols,
            stored[i]
        );
    }
    let n = in_features;
    let threads = cfg.thread_count(rows.max(cols));
    let mut warnings = Vec::new();
    let unweighted = |warnings: Vec<String>, proxy_h: Option<&[f64]>, progress: &mut dyn FnMut(usize, usize)| {
        let blocks = rows * (cols / t);
        let encoded =
            encode_with_progress(&stored, rows, cols, cfg, &mut |done, _| progress(done * (cols / t), blocks))?;
        let proxy = match proxy_h {
            Some(h) => {
                Some(proxy_error(w, &encoded.reconstruction, out_features, in_features, cfg.axis, h, Some(threads))?)
            }
            None => None,
        };
        Ok::<_, crate::Error>((
            LdlqEncoded { encoded, outcome: LdlqOutcome::Unweighted, proxy, warnings },
            stored.clone(),
        ))
    };
    let Some(h) = hessian else {
        warnings.push("LDLQ: no H given; coded unweighted".to_string());
        return unweighted(warnings, None, progress);
    };
    check_len(h, n, "LDLQ")?;
    if let Some(why) = unusable(h, n) {
        warnings.push(format!("LDLQ: {why}; coded unweighted"));
        let finite = h.iter().all(|v| v.is_finite());
        return unweighted(warnings, finite.then_some(h), progress);
    }
    let group = if cfg.axis == 1 { t } else { ldlq.stored_row_group };
    let mut damping = ldlq.damping;
    for _attempt in 0..=ldlq.retries {
        let step = match feedback_factor(h, n, damping, group, threads)? {
            None => Err(format!("H + {damping} · mean(diag H) · I is not positive definite")),
            Some(u) => {
                let coder = FeedbackCoder {
                    stored: &stored,
                    rows,
                    cols,
                    u: &u,
                    n,
                    cfg,
                    growth_limit: ldlq.growth_limit,
                    threads,
                };
                if cfg.axis == 1 {
                    coder.code_input_blocks(progress)?
                } else {
                    coder.code_stored_rows(group, progress)?
                }
            }
        };
        match step {
            Ok((codes, scales, reconstruction, targets)) => {
                let encoded = finish(&stored, rows, cols, cfg, codes, scales, reconstruction)?;
                let proxy =
                    proxy_error(w, &encoded.reconstruction, out_features, in_features, cfg.axis, h, Some(threads))?;
                let outcome = LdlqOutcome::Weighted { damping };
                return Ok((LdlqEncoded { encoded, outcome, proxy: Some(proxy), warnings }, targets));
            }
            Err(why) => warnings.push(format!("LDLQ: damping {damping}: {why}; retrying with {}", damping * 10.0)),
        }
        // Zero damping cannot grow by multiplication; the first retry uses the default.
        damping = if damping == 0.0 { LdlqConfig::default().damping } else { damping * 10.0 };
    }
    warnings.push(format!("LDLQ: no attempt succeeded after {} retries; coded unweighted", ldlq.retries));
    unweighted(warnings, Some(h), progress)
}

/// Codes, scales, reconstruction and targets of a finished attempt, or why it was abandoned.
type Attempt = std::result::Result<(Vec<u32>, Vec<f16>, Vec<f32>, Vec<f32>), String>;

/// Assembles the [`Encoded`] of row-major codes: the layout conversion and the mean squared
/// error against the stored weights, summed in row-major order as the plain encoder does.
fn finish(
    stored: &[f32],
    rows: usize,
    cols: usize,
    cfg: &EncoderConfig,
    codes: Vec<u32>,
    scales: Vec<f16>,
    reconstruction: Vec<f32>,
) -> Result<Encoded> {
    let row_major = TrellisGeometry::row_major(rows, cols, cfg.k, cfg.t, cfg.l, cfg.axis)?;
    let (codes, geometry) = match cfg.layout {
        CodeLayout::RowMajor => (codes, row_major),
        CodeLayout::K3Interleaved => (row_major_to_interleaved(&codes, rows, cols)?, row_major.interleaved()?),
    };
    let sq: f64 = stored.iter().zip(&reconstruction).map(|(&w, &q)| (w as f64 - q as f64).powi(2)).sum();
    let mse = sq / (rows * cols) as f64;
    Ok(Encoded { layer: HostLayer { codes, scales, geometry }, reconstruction, mse, logical_cols: cols })
}

/// One attempt's inputs: the stored matrix, the feedback factor `U` (`[n, n]`) and the limits.
struct FeedbackCoder<'a> {
    stored: &'a [f32],
    rows: usize,
    cols: usize,
    u: &'a [f64],
    n: usize,
    cfg: &'a EncoderConfig,
    growth_limit: f64,
    threads: usize,
}

impl FeedbackCoder<'_> {
    /// The largest RMS allowed for a target drawn from stored row `r`.
    fn limits(&self) -> Vec<f64> {
        let all = rms(self.stored);
        self.stored.chunks_exact(self.cols).map(|row| self.growth_limit * rms(row).max(all)).collect()
    }

    /// Axis 1: BlockLDLQ over the input blocks (the stored columns), one trellis block of every
    /// stored row per step.
    fn code_input_blocks(&self, progress: &mut dyn FnMut(usize, usize)) -> Result<Attempt> {
        let (rows, cols, t, n, u) = (self.rows, self.cols, self.cfg.t as usize, self.n, self.u);
        let blocks = cols / t;
        let geometry = TrellisGeometry::row_major(rows, cols, self.cfg.k, self.cfg.t, self.cfg.l, self.cfg.axis)?;
        let (words_per_row, wpb) = (geometry.code_words() / rows, geometry.code_words() / rows / blocks);
        let lut = lut1mad(self.cfg.l)?;
        let lut_rms = rms(&lut);
        let scales = self
            .stored
            .chunks_exact(cols)
            .enumerate()
            .map(|(r, row)| row_scale(row, lut_rms, r))
            .collect::<Result<Vec<f16>>>()?;
        let limits = self.limits();
        let size = || format!("the LDLQ buffers of [{rows}, {cols}]");
        let mut codes = try_filled(geometry.code_words(), 0u32, size)?;
        let mut reconstruction = try_filled(rows * cols, 0f32, size)?;
        let mut targets_all = try_filled(rows * cols, 0f32, size)?;
        // W − Ŵ of the blocks already coded ([rows, cols], f64).
        let mut residual = try_filled(rows * cols, 0f64, size)?;
        let mut target = try_filled(rows * t, 0f64, size)?;
        let (mut step_codes, mut step_rec) = (vec![0u32; rows * wpb], vec![0f32; rows * t]);
        for b in 0..blocks {
            let c0 = b * t;
            let (stored, residual_ref) = (self.stored, &residual);
            // target[o] = W[o, c0..c0+T] + Σ_{j < c0} residual[o, j] · U[j, c0..c0+T], for
            // FEEDBACK_ROWS rows per pass over U's slice (each row's sum in the same order).
            rows_in_parallel(&mut target, t, self.threads, |first, run| {
                for (pass, accs) in run.chunks_mut(FEEDBACK_ROWS * t).enumerate() {
                    let o0 = first + pass * FEEDBACK_ROWS;
                    for (i, acc) in accs.chunks_exact_mut(t).enumerate() {
                        let o = o0 + i;
                        for (a, &v) in acc.iter_mut().zip(&stored[o * cols + c0..o * cols + c0 + t]) {
                            *a = v as f64;
                        }
                    }
                    for j in 0..c0 {
                        let u_row = &u[j * n + c0..j * n + c0 + t];
                        for (i, acc) in accs.chunks_exact_mut(t).enumerate() {
                            axpy(acc, residual_ref[(o0 + i) * cols + j], u_row);
                        }
                    }
                }
            });
            let target_f32: Vec<f32> = target.iter().map(|&v| v as f32).collect();
            for (o, block) in target_f32.chunks_exact(t).enumerate() {
                let got = rms(block);
                if got.is_nan() || got > limits[o] {
                    return Ok(Err(format!(
                        "the target of stored row {o}, block {b} has RMS {got:.4e}, above {} times its row's",
                        self.growth_limit
                    )));
                }
            }
            let step = RowsOf {
                weights: &target_f32,
                codes: &mut step_codes,
                reconstruction: &mut step_rec,
                scales: &scales,
                cols: t,
            };
            search_and_code(step, None, self.cfg, &lut, BlockSearch::Viterbi, &mut |done, _| {
                progress(b * rows + done, blocks * rows)
            })
            .with_context(|| format!("LDLQ: input block {b}"))?;
            for o in 0..rows {
                let words = o * words_per_row + b * wpb;
                codes[words..words + wpb].copy_from_slice(&step_codes[o * wpb..(o + 1) * wpb]);
                let at = o * cols + c0;
                reconstruction[at..at + t].copy_from_slice(&step_rec[o * t..(o + 1) * t]);
                targets_all[at..at + t].copy_from_slice(&target_f32[o * t..(o + 1) * t]);
                for ((res, &w), &q) in residual[at..at + t].iter_mut().zip(&stored[at..at + t]).zip(&step_rec[o * t..])
                {
                    *res = w as f64 - q as f64;
                }
            }
        }
        Ok(Ok((codes, scales, reconstruction, targets_all)))
    }

    /// Axis 0: LDLQ over the stored rows (input features), `group` rows per step. The feedback
    /// from rows before a span of [`SPAN_ROWS`] is summed once for the whole span, the rest per
    /// step.
    fn code_stored_rows(&self, group: usize, progress: &mut dyn FnMut(usize, usize)) -> Result<Attempt> {
        let (rows, cols, t, n, u) = (self.rows, self.cols, self.cfg.t as usize, self.n, self.u);
        let blocks_per_row = cols / t;
        let geometry = TrellisGeometry::row_major(rows, cols, self.cfg.k, self.cfg.t, self.cfg.l, self.cfg.axis)?;
        let words_per_row = geometry.code_words() / rows;
        let lut = lut1mad(self.cfg.l)?;
        let lut_rms = rms(&lut);
        let limits = self.limits();
        let size = || format!("the LDLQ buffers of [{rows}, {cols}]");
        let mut codes = try_filled(geometry.code_words(), 0u32, size)?;
        let mut reconstruction = try_filled(rows * cols, 0f32, size)?;
        let mut targets_all = try_filled(rows * cols, 0f32, size)?;
        let mut scales = vec![f16::ONE; rows];
        // S − Ŝ of the rows already coded ([rows, cols], f64).
        let mut residual = try_filled(rows * cols, 0f64, size)?;
        let span_rows = group * (SPAN_ROWS / group).max(1);
        let mut span = try_filled(span_rows * cols, 0f64, size)?;
        let mut s0 = 0;
        while s0 < rows {
            let s1 = (s0 + span_rows).min(rows);
            let span = &mut span[..(s1 - s0) * cols];
            let (stored, residual_ref) = (self.stored, &residual);
            // span[i] = S[s0 + i] + Σ_{j < s0} U[j, s0 + i] · residual[j]; each residual row is
            // read once per thread and applied to all of the thread's rows.
            rows_in_parallel(span, cols, self.threads, |first, run| {
                for (i, acc) in run.chunks_exact_mut(cols).enumerate() {
                    let r = s0 + first + i;
                    for (a, &v) in acc.iter_mut().zip(&stored[r * cols..(r + 1) * cols]) {
                        *a = v as f64;
                    }
                }
                for j in 0..s0 {
                    let res = &residual_ref[j * cols..(j + 1) * cols];
                    for (i, acc) in run.chunks_exact_mut(cols).enumerate() {
                        axpy(acc, u[j * n + s0 + first + i], res);
                    }
                }
            });
            let mut g0 = s0;
            while g0 < s1 {
                let g1 = (g0 + group).min(s1);
                // The feedback from the span's rows already coded, then the group's targets.
                let mut targets = Vec::with_capacity((g1 - g0) * cols);
                for i in g0..g1 {
                    let acc = &mut span[(i - s0) * cols..(i - s0 + 1) * cols];
                    for j in s0..g0 {
                        axpy(acc, u[j * n + i], &residual[j * cols..(j + 1) * cols]);
                    }
                    targets.extend(acc.iter().map(|&v| v as f32));
                }
                let mut block_scales = Vec::with_capacity((g1 - g0) * blocks_per_row);
                for (i, row) in targets.chunks_exact(cols).enumerate() {
                    let r = g0 + i;
                    let got = rms(row);
                    if got.is_nan() || got > limits[r] {
                        return Ok(Err(format!(
                            "the target of stored row {r} has RMS {got:.4e}, above {} times its original's",
                            self.growth_limit
                        )));
                    }
                    scales[r] = row_scale(row, lut_rms, r)?;
                    block_scales.extend(std::iter::repeat_n(scales[r], blocks_per_row));
                }
                // The group's rows are contiguous in the codes and the reconstruction; viewed as
                // rows of one block each, every block of the step is a unit of the search.
                let step = RowsOf {
                    weights: &targets,
                    codes: &mut codes[g0 * words_per_row..g1 * words_per_row],
                    reconstruction: &mut reconstruction[g0 * cols..g1 * cols],
                    scales: &block_scales,
                    cols: t,
                };
                let done_before = g0 * blocks_per_row;
                search_and_code(step, None, self.cfg, &lut, BlockSearch::Viterbi, &mut |done, _| {
                    progress(done_before + done, rows * blocks_per_row)
                })
                .with_context(|| format!("LDLQ: stored rows {g0}..{g1}"))?;
                targets_all[g0 * cols..g1 * cols].copy_from_slice(&targets);
                let at = g0 * cols..g1 * cols;
                for ((res, &w), &q) in
                    residual[at.clone()].iter_mut().zip(&self.stored[at.clone()]).zip(&reconstruction[at])
                {
                    *res = w as f64 - q as f64;
                }
                g0 = g1;
            }
            s0 = s1;
        }
        Ok(Ok((codes, scales, reconstruction, targets_all)))
    }
}

/// Axis 1: output rows whose feedback shares one pass over the factor's column block.
const FEEDBACK_ROWS: usize = 4;

/// Stored rows whose feedback from earlier rows is summed in one pass (a multiple of the group).
const SPAN_ROWS: usize = 64;

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
//! [`EncoderConfig::rotation`] is refused (the result could not record the rotation). `H` must be
//! in the basis of the weights coded: for a layer whose input axis is rotated (`W' = W Q`, inputs
//! `x' = x Q`) that is `Qᵀ H Q`; [`rotate_hessian`](super::rotate_hessian) computes it from a
//! dense `Q`.
//!
//! A coded axis that is not a whole number of blocks is zero-padded to one, as
//! [`encode_padded`](super::encode_padded) pads it (docs/format.md §10): the padded positions
//! weigh nothing in the block search, and are left out of the scales, the growth guard and the
//! error. No error of a padded position is fed forward. On axis 1 the padded positions are
//! inputs that are always zero: the factor spans them with `H` extended by a diagonal block of
//! `mean(diag H)` (the damping is then the logical `H`'s), which leaves them uncoupled from the
//! logical inputs, so their targets are exactly zero. On axis 0 they are outputs that do not
//! exist; `H` (over the inputs) is untouched. With `H = I` the code is `encode_padded`'s, bit for
//! bit.
//!
//! # Search back-end and determinism
//!
//! The feedback runs on the host in f64; every step's blocks go through the same search
//! dispatch as the plain encoder (CPU threads or the CUDA kernel per
//! [`EncoderConfig::backend`]), and each block is coded exactly as the plain encoder codes a
//! block with the same values and scale. The output does not depend on the thread count or the
//! search back-end. With `H = I` the feedback is exactly zero and the codes are the plain
//! encoder's, bit for bit.
//!
//! # Several problems in lockstep
//!
//! [`encode_linear_ldlq_lockstep`] runs the feedback steps of several independent problems
//! side by side and gives each step's blocks of all of them to one search call, so a search that
//! is fast on large batches is not called once per small step of each problem. Each problem's
//! feedback, guard and result are those of [`encode_linear_ldlq`] alone, bit for bit. A problem
//! whose coded axis is padded is coded alone (the search of its padded blocks weighs positions,
//! which one shared search call does not).

use half::f16;

use crate::alloc::try_filled;
use crate::error::{invalid, ErrorContext, Result};
use crate::trellis::format::codebook::lut1mad;
use crate::trellis::format::{row_major_to_interleaved, CodeLayout, HostLayer, TrellisGeometry};

use super::hessian::{check_len, feedback_factor, mean_diagonal, proxy_error, unusable, ProxyError};
use super::parallel::{axpy, rows_in_parallel};
use super::{encode_inner, logical_mse, rms, row_scale, search_and_code, stored_from_linear, BlockSearch};
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

/// One independent problem of [`encode_linear_ldlq_lockstep`]: the arguments of one
/// [`encode_linear_ldlq`] call.
#[derive(Debug, Clone, Copy)]
pub struct LdlqProblem<'a> {
    /// The dense weight `[out_features, in_features]`, row-major.
    pub w: &'a [f32],
    /// Output features (rows of `w`).
    pub out_features: usize,
    /// Input features (columns of `w`, the width of `H`).
    pub in_features: usize,
    /// `H` `[in, in]` in the basis of `w`; `None` codes unweighted.
    pub hessian: Option<&'a [f64]>,
    /// The problem's encoder; every problem of one call must agree on `k`, `l`, `t`, `backend`
    /// and `threads` (the settings of the shared search), and may differ in `axis` and `layout`.
    pub cfg: EncoderConfig,
}

/// Codes several independent problems as [`encode_linear_ldlq`] codes each alone, with the
/// feedback steps of all of them in lockstep: at every step the blocks of that step of every
/// problem still running go through one call of the block search (a GPU search is then given
/// one large batch instead of many small ones), then each problem takes its codes back and
/// feeds its own error forward. Problems with fewer steps finish earlier. A problem that is not
/// coded weighted at the first damping (no `H`, an unusable one, a factor that is not positive
/// definite, a target beyond the growth limit), and a problem whose coded axis is padded, leave
/// the lockstep and are coded alone by [`encode_linear_ldlq`]; since the encoder is
/// deterministic, that gives their result.
///
/// Every result is bit for bit the one [`encode_linear_ldlq`] returns for that problem alone
/// (each block is searched with the same values and scale, and the search of a block does not
/// depend on the other blocks of the call). `progress(blocks_done, blocks)` counts the blocks
/// of all problems. Errors on invalid arguments, as [`encode_linear_ldlq`] does, naming the
/// problem, and on problems whose search settings differ.
pub fn encode_linear_ldlq_lockstep(
    problems: &[LdlqProblem<'_>],
    ldlq: &LdlqConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<LdlqEncoded>> {
    ldlq.validate()?;
    let checked = problems
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let c = Checked::new(p.w, p.out_features, p.in_features, p.hessian, &p.cfg, ldlq)
                .with_context(|| format!("LDLQ lockstep: problem {i}"))?;
            let first = &problems[0].cfg;
            let search = |c: &EncoderConfig| (c.k, c.l, c.t, c.backend, c.threads);
            if search(&p.cfg) != search(first) {
                invalid!(
                    "LDLQ lockstep: problem {i} searches with (k, L, T, backend, threads) = {:?}, problem 0 with {:?}; one search serves one setting",
                    search(&p.cfg),
                    search(first)
                );
            }
            Ok(c)
        })
        .collect::<Result<Vec<Checked<'_>>>>()?;
    let blocks: Vec<usize> = checked.iter().map(|c| c.rows * (c.cols / c.cfg.t as usize)).collect();
    let total: usize = blocks.iter().sum();
    let mut results: Vec<Option<LdlqEncoded>> = vec![None; problems.len()];
    // Problems in the lockstep: their index and first attempt; the others are coded alone.
    let mut running: Vec<(usize, FeedbackRun<'_>)> = Vec::new();
    let mut alone = Vec::new();
    for (i, c) in checked.iter().enumerate() {
        // A padded problem's last blocks weigh positions in their search, which a shared search
        // call does not: it is coded alone.
        match c.hessian.filter(|&h| unusable(h, c.n).is_none() && !c.padded()) {
            None => alone.push((i, 0)),
            Some(h) => match c.factor(h, ldlq.damping, c.group(ldlq))? {
                None => alone.push((i, 0)),
                Some(u) => running.push((i, FeedbackRun::new(c.coder(u, ldlq), c.group(ldlq))?)),
            },
        }
    }
    let mut done = 0;
    if let Some((_, first)) = running.first() {
        let cfg = *first.coder.cfg;
        let lut = lut1mad(cfg.l)?;
        let wpb = (cfg.t * cfg.k / 32) as usize;
        while !running.is_empty() {
            // The step's blocks of every running problem, in problem order.
            let (mut targets, mut scales, mut taken) = (Vec::new(), Vec::new(), Vec::new());
            let mut still = Vec::with_capacity(running.len());
            for (i, mut run) in running.drain(..) {
                match run.next_step()? {
                    Step::Done => {
                        let (d, c) = (ldlq.damping, &checked[i]);
                        results[i] = Some(c.weighted(run.into_parts(), d, Vec::new())?.0);
                    }
                    Step::Abandoned(_) => {
                        alone.push((i, run.blocks_done));
                    }
                    Step::Search(step_scales) => {
                        targets.extend_from_slice(&run.step);
                        scales.extend_from_slice(&step_scales);
                        taken.push(step_scales.len());
                        still.push((i, run));
                    }
                }
            }
            running = still;
            if running.is_empty() {
                break;
            }
            let n_blocks = scales.len();
            let (mut codes, mut rec) = (vec![0u32; n_blocks * wpb], vec![0f32; n_blocks * cfg.t as usize]);
            let rows = RowsOf {
                weights: &targets,
                codes: &mut codes,
                reconstruction: &mut rec,
                scales: &scales,
                cols: cfg.t as usize,
            };
            search_and_code(rows, None, &cfg, &lut, BlockSearch::Viterbi, &mut |d, _| progress(done + d, total))
                .context("LDLQ lockstep: a step's search")?;
            done += n_blocks;
            let mut b0 = 0;
            for ((_, run), n) in running.iter_mut().zip(taken) {
                let t = cfg.t as usize;
                run.absorb(&codes[b0 * wpb..(b0 + n) * wpb], &rec[b0 * t..(b0 + n) * t]);
                b0 += n;
            }
        }
    }
    // The rest alone, from the start, as encode_linear_ldlq codes them.
    alone.sort_unstable();
    for (i, coded) in alone {
        let c = &checked[i];
        results[i] = Some(c.solve(ldlq, &mut |_, _| {}).with_context(|| format!("LDLQ lockstep: problem {i}"))?.0);
        done += blocks[i] - coded;
        progress(done, total);
    }
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| crate::Error::invalid("LDLQ lockstep: a problem was left uncoded")))
        .collect()
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
    Checked::new(w, out_features, in_features, hessian, cfg, ldlq)?.solve(ldlq, progress)
}

/// A problem whose arguments passed every check, with its stored matrix.
struct Checked<'a> {
    w: &'a [f32],
    out_features: usize,
    in_features: usize,
    hessian: Option<&'a [f64]>,
    cfg: &'a EncoderConfig,
    /// The stored matrix, its rows zero-padded to whole blocks.
    stored: Vec<f32>,
    rows: usize,
    /// Stored columns, padding included (a multiple of `T`).
    cols: usize,
    /// Stored columns before the padding.
    logical: usize,
    /// Input features (the width of `H`).
    n: usize,
    threads: usize,
}

impl<'a> Checked<'a> {
    /// The checks of [`encode_linear_ldlq`], in its order (`ldlq` is validated by the caller).
    fn new(
        w: &'a [f32],
        out_features: usize,
        in_features: usize,
        hessian: Option<&'a [f64]>,
        cfg: &'a EncoderConfig,
        ldlq: &LdlqConfig,
    ) -> Result<Checked<'a>> {
        cfg.validate()?;
        ldlq.validate()?;
        if cfg.rotation.is_some() {
            invalid!(
                "LDLQ: codes the matrix as given and its result cannot record a rotation (set rotation: None; to code a rotated layer, rotate the weights along the coded axis first and, on axis 1, H with rotate_hessian)"
            );
        }
        let (unpadded, rows, logical) = stored_from_linear(w, out_features, in_features, cfg.axis)?;
        let t = cfg.t as usize;
        if rows == 0 || logical == 0 {
            invalid!("LDLQ: the stored matrix [{rows}, {logical}] is empty");
        }
        if let Some(i) = unpadded.iter().position(|v| !v.is_finite()) {
            invalid!(
                "LDLQ: stored weight at row {}, column {} is {} (the input must be finite)",
                i / logical,
                i % logical,
                unpadded[i]
            );
        }
        let Some(cols) = logical.div_ceil(t).checked_mul(t) else {
            invalid!("LDLQ: {logical} columns padded to whole blocks overflow");
        };
        let stored = if cols == logical {
            unpadded
        } else {
            let Some(total) = rows.checked_mul(cols) else {
                invalid!("LDLQ: {rows} rows x {cols} padded columns overflow");
            };
            let mut padded = try_filled(total, 0f32, || format!("the padded matrix [{rows}, {cols}]"))?;
            for (dst, src) in padded.chunks_exact_mut(cols).zip(unpadded.chunks_exact(logical)) {
                dst[..logical].copy_from_slice(src);
            }
            padded
        };
        let n = in_features;
        if let Some(h) = hessian {
            check_len(h, n, "LDLQ")?;
        }
        let threads = cfg.thread_count(rows.max(cols));
        Ok(Checked { w, out_features, in_features, hessian, cfg, stored, rows, cols, logical, n, threads })
    }

    /// Whether the coded axis is padded to whole blocks.
    fn padded(&self) -> bool {
        self.cols != self.logical
    }

    /// The feedback factor of `h` at `damping` (see [`feedback_factor`]). On a padded axis 1 the
    /// factor spans the padded inputs too: `H` is extended by a diagonal block of
    /// `mean(diag H)` (so the damping is the logical `H`'s), which leaves the padded inputs
    /// uncoupled from the logical ones: their feedback to and from them is exactly zero.
    fn factor(&self, h: &[f64], damping: f64, group: usize) -> Result<Option<Vec<f64>>> {
        let (n, m) = (self.n, self.cols);
        if self.cfg.axis != 1 || m == n {
            return feedback_factor(h, n, damping, group, self.threads);
        }
        let Some(len) = m.checked_mul(m) else {
            invalid!("LDLQ: the padded H [{m}, {m}] overflows");
        };
        let mut padded = try_filled(len, 0f64, || format!("the padded H [{m}, {m}]"))?;
        for (dst, src) in padded.chunks_exact_mut(m).zip(h.chunks_exact(n)) {
            dst[..n].copy_from_slice(src);
        }
        let d = mean_diagonal(h, n);
        (n..m).for_each(|i| padded[i * m + i] = d);
        feedback_factor(&padded, m, damping, group, self.threads)
    }

    /// The logical columns of a stored-orientation `[rows, cols]` matrix (itself when nothing
    /// is padded).
    fn logical_part<'r>(&self, padded: &'r [f32]) -> std::borrow::Cow<'r, [f32]> {
        if self.padded() {
            padded.chunks_exact(self.cols).flat_map(|r| r[..self.logical].iter().copied()).collect()
        } else {
            std::borrow::Cow::Borrowed(padded)
        }
    }

    /// The input features coded per feedback step.
    fn group(&self, ldlq: &LdlqConfig) -> usize {
        if self.cfg.axis == 1 {
            self.cfg.t as usize
        } else {
            ldlq.stored_row_group
        }
    }

    fn coder(&self, u: Vec<f64>, ldlq: &LdlqConfig) -> FeedbackCoder<'_> {
        FeedbackCoder {
            stored: &self.stored,
            rows: self.rows,
            cols: self.cols,
            logical: self.logical,
            u,
            // Axis 1's factor spans the padded inputs (`factor`).
            n: if self.cfg.axis == 1 { self.cols } else { self.n },
            cfg: self.cfg,
            growth_limit: ldlq.growth_limit,
            threads: self.threads,
        }
    }

    /// The proxy error of the stored-orientation `reconstruction` (padding included).
    fn proxy(&self, h: &[f64], reconstruction: &[f32]) -> Result<ProxyError> {
        let (w, out, inf, axis) = (self.w, self.out_features, self.in_features, self.cfg.axis);
        proxy_error(w, &self.logical_part(reconstruction), out, inf, axis, h, Some(self.threads))
    }

    /// The result of an attempt at `damping` that ran to the end.
    fn weighted(&self, parts: Parts, damping: f64, warnings: Vec<String>) -> Result<(LdlqEncoded, Vec<f32>)> {
        let (codes, scales, reconstruction, targets) = parts;
        let encoded =
            finish(&self.stored, self.rows, self.cols, self.logical, self.cfg, codes, scales, reconstruction)?;
        let h = self.hessian.ok_or_else(|| crate::Error::invalid("LDLQ: a weighted code without H"))?;
        let proxy = self.proxy(h, &encoded.reconstruction)?;
        let outcome = LdlqOutcome::Weighted { damping };
        Ok((LdlqEncoded { encoded, outcome, proxy: Some(proxy), warnings }, targets))
    }

    /// The plain encoder's code, with the proxy error against `proxy_h` where given.
    fn unweighted(
        &self,
        warnings: Vec<String>,
        proxy_h: Option<&[f64]>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<(LdlqEncoded, Vec<f32>)> {
        let (rows, cols, t) = (self.rows, self.cols, self.cfg.t as usize);
        let blocks = rows * (cols / t);
        let encoded =
            encode_inner(&self.stored, rows, cols, self.logical, self.cfg, BlockSearch::Viterbi, &mut |done, _| {
                progress(done * (cols / t), blocks)
            })?;
        let proxy = match proxy_h {
            Some(h) => Some(self.proxy(h, &encoded.reconstruction)?),
            None => None,
        };
        Ok((LdlqEncoded { encoded, outcome: LdlqOutcome::Unweighted, proxy, warnings }, self.stored.clone()))
    }

    /// Codes the problem alone: the fallbacks, then the attempts at growing damping.
    fn solve(&self, ldlq: &LdlqConfig, progress: &mut dyn FnMut(usize, usize)) -> Result<(LdlqEncoded, Vec<f32>)> {
        let (n, cfg) = (self.n, self.cfg);
        let mut warnings = Vec::new();
        let Some(h) = self.hessian else {
            warnings.push("LDLQ: no H given; coded unweighted".to_string());
            return self.unweighted(warnings, None, progress);
        };
        if let Some(why) = unusable(h, n) {
            warnings.push(format!("LDLQ: {why}; coded unweighted"));
            let finite = h.iter().all(|v| v.is_finite());
            return self.unweighted(warnings, finite.then_some(h), progress);
        }
        let group = self.group(ldlq);
        let lut = lut1mad(cfg.l)?;
        let mut damping = ldlq.damping;
        for _attempt in 0..=ldlq.retries {
            let step = match self.factor(h, damping, group)? {
                None => Err(format!("H + {damping} · mean(diag H) · I is not positive definite")),
                Some(u) => FeedbackRun::new(self.coder(u, ldlq), group)?.run_alone(&lut, progress)?,
            };
            match step {
                Ok(parts) => return self.weighted(parts, damping, warnings),
                Err(why) => warnings.push(format!("LDLQ: damping {damping}: {why}; retrying with {}", damping * 10.0)),
            }
            // Zero damping cannot grow by multiplication; the first retry uses the default.
            damping = if damping == 0.0 { LdlqConfig::default().damping } else { damping * 10.0 };
        }
        warnings.push(format!("LDLQ: no attempt succeeded after {} retries; coded unweighted", ldlq.retries));
        self.unweighted(warnings, Some(h), progress)
    }
}

/// Codes, scales, reconstruction and targets of a finished attempt.
type Parts = (Vec<u32>, Vec<f16>, Vec<f32>, Vec<f32>);

/// Assembles the [`Encoded`] of row-major codes: the layout conversion and the mean squared
/// error against the stored weights, summed in row-major order as the plain encoder does.
#[allow(clippy::too_many_arguments)] // the parts of one result, each named
fn finish(
    stored: &[f32],
    rows: usize,
    cols: usize,
    logical: usize,
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
    let mse = logical_mse(stored, &reconstruction, cols, logical);
    Ok(Encoded { layer: HostLayer { codes, scales, geometry }, reconstruction, mse, logical_cols: logical })
}

/// One attempt's inputs: the stored matrix, the feedback factor `U` (`[n, n]`) and the limits.
struct FeedbackCoder<'a> {
    stored: &'a [f32],
    rows: usize,
    /// Stored columns (padding included) and the logical ones before the padding.
    cols: usize,
    logical: usize,
    u: Vec<f64>,
    n: usize,
    cfg: &'a EncoderConfig,
    growth_limit: f64,
    threads: usize,
}

/// What [`FeedbackRun::next_step`] found.
enum Step {
    /// Every block is coded.
    Done,
    /// The attempt is abandoned, for this reason.
    Abandoned(String),
    /// The step's targets are in [`FeedbackRun::step`] (rows of `T`, one block each), with these
    /// scales, one per block: search them and give the codes to [`FeedbackRun::absorb`].
    Search(Vec<f16>),
}

/// One attempt in progress, a feedback step at a time: on axis 1 an input block of every stored
/// row (BlockLDLQ over the stored columns), on axis 0 a group of stored rows (LDLQ over the
/// input features). On axis 0 the feedback from the rows before a span of [`SPAN_ROWS`] is summed
/// once for the whole span, the rest per step.
struct FeedbackRun<'a> {
    coder: FeedbackCoder<'a>,
    /// Axis 0: stored rows per step and per span.
    group: usize,
    span_rows: usize,
    lut_rms: f64,
    limits: Vec<f64>,
    words_per_row: usize,
    codes: Vec<u32>,
    reconstruction: Vec<f32>,
    targets: Vec<f32>,
    scales: Vec<f16>,
    /// W − Ŵ (axis 1) or S − Ŝ (axis 0) of what is already coded, `[rows, cols]`.
    residual: Vec<f64>,
    /// Axis 1: the step's targets `[rows, T]`; axis 0: the span's partial targets.
    scratch: Vec<f64>,
    /// The step's targets as searched (f32, rows of `T`).
    step: Vec<f32>,
    /// Axis 1: the next input block; axis 0: the first stored row of the next step, the span
    /// `[s0, s1)` it is in and the end of the step in progress.
    next: usize,
    s0: usize,
    s1: usize,
    g1: usize,
    /// Blocks coded so far.
    blocks_done: usize,
}

impl<'a> FeedbackRun<'a> {
    fn new(coder: FeedbackCoder<'a>, group: usize) -> Result<FeedbackRun<'a>> {
        let (rows, cols, t) = (coder.rows, coder.cols, coder.cfg.t as usize);
        let cfg = coder.cfg;
        let geometry = TrellisGeometry::row_major(rows, cols, cfg.k, cfg.t, cfg.l, cfg.axis)?;
        let lut_rms = rms(&lut1mad(cfg.l)?);
        let logical = coder.logical;
        let all = if logical == cols {
            rms(coder.stored)
        } else {
            let sq: f64 =
                coder.stored.chunks_exact(cols).flat_map(|r| &r[..logical]).map(|&v| (v as f64).powi(2)).sum();
            (sq / (rows * logical) as f64).sqrt()
        };
        let limits =
            coder.stored.chunks_exact(cols).map(|row| coder.growth_limit * rms(&row[..logical]).max(all)).collect();
        let size = || format!("the LDLQ buffers of [{rows}, {cols}]");
        // Axis 1 takes each row's scale from the original row; axis 0 from its target.
        let scales = if cfg.axis == 1 {
            coder
                .stored
                .chunks_exact(cols)
                .enumerate()
                .map(|(r, row)| row_scale(&row[..logical], lut_rms, r))
                .collect::<Result<Vec<f16>>>()?
        } else {
            vec![f16::ONE; rows]
        };
        let span_rows = group * (SPAN_ROWS / group).max(1);
        let scratch = try_filled(if cfg.axis == 1 { rows * t } else { span_rows * cols }, 0f64, size)?;
        Ok(FeedbackRun {
            group,
            span_rows,
            lut_rms,
            limits,
            words_per_row: geometry.code_words() / rows,
            codes: try_filled(geometry.code_words(), 0u32, size)?,
            reconstruction: try_filled(rows * cols, 0f32, size)?,
            targets: try_filled(rows * cols, 0f32, size)?,
            scales,
            residual: try_filled(rows * cols, 0f64, size)?,
            scratch,
            step: Vec::new(),
            next: 0,
            s0: 0,
            s1: 0,
            g1: 0,
            blocks_done: 0,
            coder,
        })
    }

    /// Runs every step with its own search call.
    fn run_alone(
        mut self,
        lut: &[f32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<std::result::Result<Parts, String>> {
        let cfg = *self.coder.cfg;
        let (t, wpb) = (cfg.t as usize, (cfg.t * cfg.k / 32) as usize);
        let blocks = self.coder.rows * (self.coder.cols / t);
        loop {
            let scales = match self.next_step()? {
                Step::Done => return Ok(Ok(self.into_parts())),
                Step::Abandoned(why) => return Ok(Err(why)),
                Step::Search(scales) => scales,
            };
            let (mut codes, mut rec) = (vec![0u32; scales.len() * wpb], vec![0f32; scales.len() * t]);
            let (cols, scales, weights) = self.search_shape(scales);
            let per_row = cols / t;
            let rows =
                RowsOf { weights: &self.step, codes: &mut codes, reconstruction: &mut rec, scales: &scales, cols };
            let before = self.blocks_done;
            search_and_code(rows, weights.as_deref(), &cfg, lut, BlockSearch::Viterbi, &mut |done, _| {
                progress(before + done * per_row, blocks)
            })
            .with_context(|| self.step_name())?;
            self.absorb(&codes, &rec);
        }
    }

    /// How the step's blocks (`block_scales`, one a block) go to the search: the columns of a
    /// searched row, a scale a row and the positions' weights. Unpadded, one block a row, every
    /// position weighing 1. On a padded axis the padding weighs 0: axis 1's last input block
    /// is searched with the mask of its logical positions; axis 0 searches whole stored rows (the
    /// same blocks in the same order, their last one padded) with the mask of the row.
    fn search_shape(&self, block_scales: Vec<f16>) -> (usize, Vec<f16>, Option<Vec<f32>>) {
        let c = &self.coder;
        let (t, logical) = (c.cfg.t as usize, c.logical);
        let mask = |first: usize, len: usize| (first..first + len).map(|i| f32::from(u8::from(i < logical))).collect();
        if logical == c.cols {
            (t, block_scales, None)
        } else if c.cfg.axis == 1 {
            let c0 = self.next * t;
            (t, block_scales, (c0 + t > logical).then(|| mask(c0, t)))
        } else {
            let per_row = c.cols / t;
            let row_scales = block_scales.into_iter().step_by(per_row).collect();
            (c.cols, row_scales, Some(mask(0, c.cols)))
        }
    }

    fn step_name(&self) -> String {
        if self.coder.cfg.axis == 1 {
            format!("LDLQ: input block {}", self.next)
        } else {
            format!("LDLQ: stored rows {}..{}", self.next, self.g1)
        }
    }

    fn into_parts(self) -> Parts {
        (self.codes, self.scales, self.reconstruction, self.targets)
    }

    /// The next step's targets, or why the attempt stops.
    fn next_step(&mut self) -> Result<Step> {
        if self.coder.cfg.axis == 1 {
            self.next_input_block()
        } else {
            self.next_row_group()
        }
    }

    /// Axis 1: block `b`'s target of every stored row.
    fn next_input_block(&mut self) -> Result<Step> {
        let c = &self.coder;
        let (rows, cols, t, n, u) = (c.rows, c.cols, c.cfg.t as usize, c.n, &c.u[..]);
        let b = self.next;
        if b == cols / t {
            return Ok(Step::Done);
        }
        let c0 = b * t;
        let (stored, residual_ref) = (c.stored, &self.residual);
        // target[o] = W[o, c0..c0+T] + Σ_{j < c0} residual[o, j] · U[j, c0..c0+T], for
        // FEEDBACK_ROWS rows per pass over U's slice (each row's sum in the same order).
        rows_in_parallel(&mut self.scratch, t, c.threads, |first, run| {
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
        self.step.clear();
        self.step.extend(self.scratch.iter().map(|&v| v as f32));
        // The block's logical positions (all of them but on a padded axis' last block).
        let valid = (c.logical - c0).min(t);
        for (o, block) in self.step.chunks_exact(t).enumerate() {
            let got = rms(&block[..valid]);
            if got.is_nan() || got > self.limits[o] {
                return Ok(Step::Abandoned(format!(
                    "the target of stored row {o}, block {b} has RMS {got:.4e}, above {} times its row's",
                    c.growth_limit
                )));
            }
        }
        debug_assert_eq!(self.scales.len(), rows);
        Ok(Step::Search(self.scales.clone()))
    }

    /// Axis 0: the targets of the next group of stored rows (starting a span where needed).
    fn next_row_group(&mut self) -> Result<Step> {
        let c = &self.coder;
        let (rows, cols, t, n, u) = (c.rows, c.cols, c.cfg.t as usize, c.n, &c.u[..]);
        let g0 = self.next;
        if g0 == rows {
            return Ok(Step::Done);
        }
        if g0 == self.s1 {
            let (s0, s1) = (g0, (g0 + self.span_rows).min(rows));
            (self.s0, self.s1) = (s0, s1);
            let span = &mut self.scratch[..(s1 - s0) * cols];
            let (stored, residual_ref) = (c.stored, &self.residual);
            // span[i] = S[s0 + i] + Σ_{j < s0} U[j, s0 + i] · residual[j]; each residual row is
            // read once per thread and applied to all of the thread's rows.
            rows_in_parallel(span, cols, c.threads, |first, run| {
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
        }
        let (s0, g1) = (self.s0, (g0 + self.group).min(self.s1));
        self.g1 = g1;
        // The feedback from the span's rows already coded, then the group's targets.
        self.step.clear();
        for i in g0..g1 {
            let acc = &mut self.scratch[(i - s0) * cols..(i - s0 + 1) * cols];
            for j in s0..g0 {
                axpy(acc, u[j * n + i], &self.residual[j * cols..(j + 1) * cols]);
            }
            self.step.extend(acc.iter().map(|&v| v as f32));
        }
        let blocks_per_row = cols / t;
        let mut block_scales = Vec::with_capacity((g1 - g0) * blocks_per_row);
        for (i, padded_row) in self.step.chunks_exact(cols).enumerate() {
            let (r, row) = (g0 + i, &padded_row[..c.logical]);
            let got = rms(row);
            if got.is_nan() || got > self.limits[r] {
                return Ok(Step::Abandoned(format!(
                    "the target of stored row {r} has RMS {got:.4e}, above {} times its original's",
                    c.growth_limit
                )));
            }
            self.scales[r] = row_scale(row, self.lut_rms, r)?;
            block_scales.extend(std::iter::repeat_n(self.scales[r], blocks_per_row));
        }
        Ok(Step::Search(block_scales))
    }

    /// Takes the searched step's codes (row-major, one block per row) and reconstruction, and
    /// records its error for the feedback of the steps after it.
    fn absorb(&mut self, step_codes: &[u32], step_rec: &[f32]) {
        let c = &self.coder;
        let (rows, cols, t) = (c.rows, c.cols, c.cfg.t as usize);
        let wpr = self.words_per_row;
        if c.cfg.axis == 1 {
            let b = self.next;
            let (c0, wpb) = (b * t, wpr / (cols / t));
            for o in 0..rows {
                let words = o * wpr + b * wpb;
                self.codes[words..words + wpb].copy_from_slice(&step_codes[o * wpb..(o + 1) * wpb]);
                let at = o * cols + c0;
                self.reconstruction[at..at + t].copy_from_slice(&step_rec[o * t..(o + 1) * t]);
                self.targets[at..at + t].copy_from_slice(&self.step[o * t..(o + 1) * t]);
                for ((res, &w), &q) in
                    self.residual[at..at + t].iter_mut().zip(&c.stored[at..at + t]).zip(&step_rec[o * t..])
                {
                    *res = w as f64 - q as f64;
                }
                // Padding is not a weight: no error of it is fed forward.
                if c0 + t > c.logical {
                    self.residual[o * cols + c.logical..at + t].fill(0.0);
                }
            }
            self.next = b + 1;
            self.blocks_done += rows;
        } else {
            let (g0, g1) = (self.next, self.g1);
            // The group's rows are contiguous in the codes and the reconstruction.
            self.codes[g0 * wpr..g1 * wpr].copy_from_slice(step_codes);
            let at = g0 * cols..g1 * cols;
            self.reconstruction[at.clone()].copy_from_slice(step_rec);
            self.targets[at.clone()].copy_from_slice(&self.step);
            for ((res, &w), &q) in self.residual[at.clone()].iter_mut().zip(&c.stored[at]).zip(step_rec) {
                *res = w as f64 - q as f64;
            }
            // Padding is not a weight: no error of it is fed forward.
            if c.logical < cols {
                for row in self.residual[g0 * cols..g1 * cols].chunks_exact_mut(cols) {
                    row[c.logical..].fill(0.0);
                }
            }
            self.next = g1;
            self.blocks_done += (g1 - g0) * (cols / t);
        }
    }
}

/// Axis 1: output rows whose feedback shares one pass over the factor's column block.
const FEEDBACK_ROWS: usize = 4;

/// Stored rows whose feedback from earlier rows is summed in one pass (a multiple of the group).
const SPAN_ROWS: usize = 64;

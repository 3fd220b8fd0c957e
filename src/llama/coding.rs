//! One projection coded as whole-model quantization codes it: on the axis the rule of docs/format.md §10
//! picks, rotated on that axis, and either unweighted or Hessian-weighted (LDLQ) against the
//! second moment of the layer's input; with the proxy error `tr(E H Eᵀ)` of the code wherever an
//! `H` is known.
//!
//! # Bases
//!
//! The rotation `Q` acts on the coded axis. Coded along the inputs (axis 1, `W' = W Q`), the
//! inputs the layer sees are `x Q`, so the code is weighted by `Qᵀ H Q`
//! ([`rotate_hessian`]). Coded along the outputs (axis 0,
//! `W' = Qᵀ W`), the input axis is untouched and `H` is used as collected. The proxy error is
//! the same in either basis (`E' H' E'ᵀ = E H Eᵀ`), so it is computed in the coded one.
//!
//! # Padding
//!
//! A coded axis that is not whole blocks is zero-padded and coded with the padding free, by the
//! plain encoder ([`encode_padded`]) and by the Hessian-weighted one alike (SmolLM2's MLP
//! projections are not padded; its attention projections are).

use crate::error::{invalid, Error, ErrorContext, Result};
use crate::trellis::encoder::{
    choose_axis, encode_linear_ldlq_lockstep, encode_padded, match_row_norms, proxy_error, stored_from_linear,
    AxisChoice, CodedLinear, Encoded, EncoderConfig, LdlqConfig, LdlqEncoded, LdlqOutcome, LdlqProblem, ProxyError,
    BLOCK_LEN,
};
use crate::trellis::format::CodeLayout;
use crate::trellis::reference::expand;
use crate::trellis::rotation::{CodedAxis, Rotation};

use super::calibrate::{rotate_hessian, Hessian};

/// How [`code_projection`] codes one projection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProjectionCoding {
    /// The encoder's parameters (`k`, `L`, threads, back-end); its `axis` is the conventional
    /// axis of the projection, its `rotation` and `layout` are ignored (set from the fields
    /// below and the chosen axis).
    pub encoder: EncoderConfig,
    /// The seed of the coded axis' rotation; `None` codes the weights unrotated.
    pub rotation_seed: Option<u64>,
    /// Hessian-weighted coding with these parameters; `None` codes unweighted.
    pub ldlq: Option<LdlqConfig>,
    /// With `ldlq`: also code unweighted, to report that code's proxy error beside the weighted
    /// one (doubles the work).
    pub baseline: bool,
    /// Set each stored row's scale after coding so that the row decodes with the dense row's
    /// norm ([`match_row_norms`]): the search's reconstruction is shorter than the row it codes.
    /// The code's error and proxy error are then the rescaled weights'; a `baseline` code's
    /// proxy error is reported as coded.
    pub match_norms: bool,
}

/// A coded projection and what is known of its error.
#[derive(Debug, Clone)]
pub struct ProjectionCode {
    /// The code, its coded axis and its weight error.
    pub coded: CodedLinear,
    /// The chosen axis.
    pub choice: AxisChoice,
    /// The proxy error of the code (`None` without a usable `H`).
    pub proxy: Option<ProxyError>,
    /// The proxy error of the unweighted code when it was coded too (see
    /// [`ProjectionCoding::baseline`]).
    pub baseline_proxy: Option<ProxyError>,
    /// How the LDLQ coding went (`None` where it was not asked for or not applicable).
    pub ldlq: Option<LdlqOutcome>,
    /// Why the code is not what was asked for (no `H`, LDLQ fallbacks), in order.
    pub warnings: Vec<String>,
}

/// Codes the dense `w` `[out_features, in_features]` (row-major) of projection `module` as
/// `coding` says, weighted by (and measured against) `hessian`, the second moment of its input in
/// the dense weights' basis (see the [module](self) docs). Errors on invalid arguments only; a
/// missing, mis-sized or unusable `H` codes unweighted with a warning.
pub fn code_projection(
    module: &str,
    w: &[f32],
    out_features: usize,
    in_features: usize,
    hessian: Option<&Hessian>,
    coding: &ProjectionCoding,
) -> Result<ProjectionCode> {
    let job = ProjectionJob { module, w, out_features, in_features, hessian, coding: *coding };
    let mut codes = code_projections(&[job], &mut |_, _| {})?;
    codes.pop().ok_or_else(|| Error::invalid(format!("code_projection: {module}: nothing was coded")))
}

/// One projection of [`code_projections`]: the arguments of one [`code_projection`] call.
#[derive(Debug, Clone, Copy)]
pub struct ProjectionJob<'a> {
    /// The module's name, in its warnings.
    pub module: &'a str,
    /// The dense weight `[out_features, in_features]`, row-major.
    pub w: &'a [f32],
    /// Output features.
    pub out_features: usize,
    /// Input features.
    pub in_features: usize,
    /// The second moment of its input, in the dense weights' basis.
    pub hessian: Option<&'a Hessian>,
    /// How to code it.
    pub coding: ProjectionCoding,
}

/// Codes every job as [`code_projection`] codes it alone, with the same results, but with the
/// Hessian-weighted ones in lockstep ([`encode_linear_ldlq_lockstep`]): the jobs that LDLQ codes
/// and whose searches and LDLQ parameters agree (`k`, `L`, `T`, back-end, threads) share one
/// search call per feedback step. `progress(done, total)` follows the lockstep runs' blocks
/// (each run counts from 0 to its own total). Returns one code per job, in order; errors name
/// the module.
pub fn code_projections(
    jobs: &[ProjectionJob<'_>],
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<ProjectionCode>> {
    let prepared = jobs
        .iter()
        .map(|j| prepare(j).with_context(|| format!("code_projection: {}", j.module)))
        .collect::<Result<Vec<_>>>()?;
    let mut weighted: Vec<Option<LdlqEncoded>> = vec![None; jobs.len()];
    // The LDLQ jobs, grouped by what one lockstep run shares; each group in job order.
    let key = |p: &Prepared| {
        let e = &p.encoder;
        p.ldlq.map(|l| (l, e.k, e.l, e.t, e.backend, e.threads))
    };
    let mut groups: Vec<(_, Vec<usize>)> = Vec::new();
    for (i, p) in prepared.iter().enumerate() {
        if let Some(k) = key(p) {
            match groups.iter_mut().find(|(g, _)| *g == k) {
                Some((_, members)) => members.push(i),
                None => groups.push((k, vec![i])),
            }
        }
    }
    for ((ldlq, ..), members) in groups {
        let problems: Vec<LdlqProblem<'_>> = members
            .iter()
            .map(|&i| {
                let (p, j) = (&prepared[i], &jobs[i]);
                LdlqProblem {
                    w: &p.rotated_linear,
                    out_features: j.out_features,
                    in_features: j.in_features,
                    hessian: p.h.as_deref(),
                    cfg: p.encoder,
                }
            })
            .collect();
        let coded = encode_linear_ldlq_lockstep(&problems, &ldlq, progress).with_context(|| {
            let names: Vec<&str> = members.iter().map(|&i| jobs[i].module).collect();
            format!("code_projections: LDLQ of {}", names.join(", "))
        })?;
        for (i, c) in members.into_iter().zip(coded) {
            weighted[i] = Some(c);
        }
    }
    // The unweighted codes (and baselines) are one more run for the progress: its blocks over
    // all the jobs that need one.
    let unweighted_blocks = |p: &Prepared, wt: &Option<LdlqEncoded>, j: &ProjectionJob<'_>| {
        let t = p.encoder.t as usize;
        if wt.is_none() || j.coding.baseline {
            p.rows * p.n.div_ceil(t)
        } else {
            0
        }
    };
    let total: usize = prepared.iter().zip(&weighted).zip(jobs).map(|((p, wt), j)| unweighted_blocks(p, wt, j)).sum();
    let mut done = 0;
    prepared
        .into_iter()
        .zip(weighted)
        .zip(jobs)
        .map(|((p, wt), j)| {
            let blocks = unweighted_blocks(&p, &wt, j);
            let per_row = p.n.div_ceil(p.encoder.t as usize);
            // The coder reports finished rows.
            let code = finish(j, p, wt, &mut |rows, _| progress(done + (rows * per_row).min(blocks), total));
            done += blocks;
            code.with_context(|| format!("code_projection: {}", j.module))
        })
        .collect()
}

/// A projection rotated and checked, before its (weighted) code.
struct Prepared {
    choice: AxisChoice,
    encoder: EncoderConfig,
    warnings: Vec<String>,
    stored: Vec<f32>,
    rows: usize,
    n: usize,
    original: Vec<f32>,
    rotation: Option<Rotation>,
    /// The weights in the coded basis, as a linear `[out, in]` again.
    rotated_linear: Vec<f32>,
    /// `H` in the coded basis, where one of the right size is known.
    h: Option<Vec<f64>>,
    /// The LDLQ parameters where it codes the projection.
    ldlq: Option<LdlqConfig>,
}

fn prepare(job: &ProjectionJob<'_>) -> Result<Prepared> {
    let ProjectionJob { module, w, out_features, in_features, hessian, coding } = *job;
    let cfg = &coding.encoder;
    let choice = choose_axis(out_features, in_features, cfg.axis, cfg.t as usize)?;
    let mut encoder = EncoderConfig { axis: choice.axis, rotation: None, ..*cfg };
    // The 3-bit block interleave (of 256-weight blocks) is what the axis-0 kernels read fastest.
    let interleaves = cfg.k == 3 && cfg.l == 12 && cfg.t == BLOCK_LEN && choice.axis == 0;
    encoder.layout =
        if interleaves && choice.stored % 512 == 0 { CodeLayout::K3Interleaved } else { CodeLayout::RowMajor };
    let mut warnings = Vec::new();

    let (mut stored, rows, n) = stored_from_linear(w, out_features, in_features, choice.axis)?;
    let original = stored.clone();
    let rotation = coding.rotation_seed.map(|seed| Rotation::seeded(n, seed)).transpose()?;
    if let Some(r) = &rotation {
        r.rotate_rows(&mut stored)?;
    }
    let rotated_linear = match choice.axis {
        1 => stored.clone(),
        _ => {
            let mut t = vec![0f32; stored.len()];
            for (i, row) in stored.chunks_exact(n).enumerate() {
                for (o, &v) in row.iter().enumerate() {
                    t[o * in_features + i] = v;
                }
            }
            t
        }
    };
    let h = match hessian {
        None => {
            warnings.push(format!("{module}: no calibration H for its input; coded unweighted, no proxy error"));
            None
        }
        Some(h) if h.n != in_features || h.data.len() != in_features * in_features => {
            warnings.push(format!(
                "{module}: the calibration H is [{0}, {0}], the layer has {in_features} inputs; coded unweighted",
                h.n
            ));
            None
        }
        Some(h) => match (&rotation, choice.axis) {
            (Some(r), 1) => Some(rotate_hessian(&h.data, r)?),
            _ => Some(h.data.clone()),
        },
    };
    let ldlq = match (&coding.ldlq, &h) {
        (Some(ldlq), Some(_)) => Some(*ldlq),
        _ => None,
    };
    Ok(Prepared { choice, encoder, warnings, stored, rows, n, original, rotation, rotated_linear, h, ldlq })
}

/// The rest of [`code_projection`] once the weighted code (where LDLQ codes it) is known.
fn finish(
    job: &ProjectionJob<'_>,
    p: Prepared,
    weighted: Option<LdlqEncoded>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ProjectionCode> {
    let ProjectionJob { module, out_features, in_features, coding, .. } = *job;
    let Prepared { choice, encoder, mut warnings, stored, rows, n, original, rotation, rotated_linear, h, ldlq } = p;
    if ldlq.is_some() != weighted.is_some() {
        invalid!("code_projection: {module}: the weighted code is missing or not asked for");
    }
    let proxy_of = |reconstruction: &[f32]| -> Result<Option<ProxyError>> {
        match &h {
            Some(h) => Ok(Some(proxy_error(
                &rotated_linear,
                reconstruction,
                out_features,
                in_features,
                choice.axis,
                h,
                coding.encoder.threads,
            )?)),
            None => Ok(None),
        }
    };
    let unweighted_needed = weighted.is_none() || coding.baseline;
    let unweighted = if unweighted_needed {
        let e = encode_padded(&stored, rows, n, &encoder, progress)?;
        let logical = logical_columns(&e, n);
        let proxy = proxy_of(&logical)?;
        Some((e, logical, proxy))
    } else {
        None
    };
    let (mut layer, mut reconstruction, mut proxy, baseline_proxy, outcome) = match (weighted, unweighted) {
        (Some(wt), base) => {
            warnings.extend(wt.warnings.iter().map(|w| format!("{module}: {w}")));
            let baseline = base.and_then(|(_, _, p)| p);
            let logical = logical_columns(&wt.encoded, n);
            (wt.encoded.layer, logical, wt.proxy, baseline, Some(wt.outcome))
        }
        (None, Some((e, logical, proxy))) => (e.layer, logical, proxy, None, None),
        (None, None) => invalid!("code_projection: {module}: nothing was coded"),
    };
    if coding.match_norms {
        // The rotation keeps each stored row's norm: the dense rows are the targets as they are.
        match_row_norms(&mut layer, &original, n)?;
        let cols = layer.geometry.cols;
        let decoded = expand(&layer.codes, &layer.scales, &layer.geometry)?;
        reconstruction = decoded.chunks_exact(cols).flat_map(|r| r[..n].iter().copied()).collect();
        proxy = proxy_of(&reconstruction)?;
    }
    let (mse, mean_square) = logical_error(&reconstruction, &original, n, rotation.as_ref())?;
    let zero_rows = original.chunks_exact(n).filter(|row| row.iter().all(|&v| v == 0.0)).count();
    Ok(ProjectionCode {
        coded: CodedLinear { layer, coded_axis: CodedAxis { rotation, logical: n }, mse, mean_square, zero_rows },
        choice,
        proxy,
        baseline_proxy,
        ldlq: outcome,
        warnings,
    })
}

/// The first `n` (logical) columns of each stored row of a code's reconstruction.
fn logical_columns(e: &Encoded, n: usize) -> Vec<f32> {
    let cols = e.layer.geometry.cols;
    e.reconstruction.chunks_exact(cols).flat_map(|r| r[..n].iter().copied()).collect()
}

/// The mean squared error of the decoded logical columns `reconstruction` (`[rows, n]`, coded
/// basis), rotated back in f64, against the stored weights `original` (`[rows, n]`, dense basis),
/// and the mean of `original²`.
fn logical_error(
    reconstruction: &[f32],
    original: &[f32],
    n: usize,
    rotation: Option<&Rotation>,
) -> Result<(f64, f64)> {
    if reconstruction.len() != original.len() || n == 0 {
        invalid!("code_projection: {} reconstructed values for {} weights", reconstruction.len(), original.len());
    }
    let mut sq = 0f64;
    let mut row = vec![0f64; n];
    for (dec, orig) in reconstruction.chunks_exact(n).zip(original.chunks_exact(n)) {
        row.iter_mut().zip(dec).for_each(|(r, &d)| *r = f64::from(d));
        if let Some(r) = rotation {
            r.inverse_f64(&mut row)?;
        }
        sq += row.iter().zip(orig).map(|(&d, &o)| (d - f64::from(o)).powi(2)).sum::<f64>();
    }
    let count = original.len() as f64;
    let mean_square = original.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / count;
    Ok((sq / count, mean_square))
}

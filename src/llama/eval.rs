//! Scoring a model on a text: log-probabilities of a window, and per-window negative
//! log-likelihood and KL divergence against a reference model.

use std::collections::BTreeSet;

use crate::array::MlxArray;
use crate::error::{invalid, Result};
use crate::nn::select::{exp, log_softmax, take_along_axis};
use crate::ops::{concatenate, eval_all};

use super::model::LlamaModel;
use crate::trellis::Artifact;

/// The log-probabilities (`[L, vocab]`, float32) `model` gives the token after each of `tokens`,
/// from an empty cache.
pub fn log_probs(model: &LlamaModel, tokens: &[u32]) -> Result<MlxArray> {
    let mut cache = model.new_cache();
    log_softmax(&model.forward(tokens, &mut cache)?, -1)
}

/// [`log_probs`] the way a model generates: one token at a time through the cache, so every
/// projection runs at one row (the kernels a decode step runs, which differ from a whole
/// window's: other kernel plans, other paths). `[L, vocab]`, float32. Each step is evaluated
/// before the next is built.
pub fn log_probs_decoded(model: &LlamaModel, tokens: &[u32]) -> Result<MlxArray> {
    let mut cache = model.new_cache();
    let mut rows = Vec::with_capacity(tokens.len());
    for &token in tokens {
        let row = log_softmax(&model.forward(&[token], &mut cache)?, -1)?;
        eval_all(&[&row])?;
        rows.push(row);
    }
    concatenate(&rows.iter().collect::<Vec<_>>(), 0)
}

/// Sums over one window's scored positions (all but the last: each predicts the next token).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WindowScore {
    /// Σ −log p(next token).
    pub nll: f64,
    /// Σ KL(reference ‖ this model) over the vocabulary, in nats.
    pub kl: f64,
    /// Positions scored.
    pub positions: usize,
}

impl std::ops::AddAssign for WindowScore {
    fn add_assign(&mut self, o: WindowScore) {
        self.nll += o.nll;
        self.kl += o.kl;
        self.positions += o.positions;
    }
}

/// Scores `logp` (`[L, vocab]` log-probabilities of `tokens`, `L = tokens.len()`) against the
/// reference `ref_logp` of the same window: the negative log-likelihood of `tokens[1..]` and
/// `Σ_v p_ref (log p_ref − log p)` at each of the first `L − 1` positions.
pub fn score_window(ref_logp: &MlxArray, logp: &MlxArray, tokens: &[u32]) -> Result<WindowScore> {
    let l = tokens.len();
    if l < 2 || logp.ndim() != 2 || logp.shape()[0] != l || ref_logp.shape() != logp.shape() {
        invalid!(
            "scoring a window of {l} tokens needs [{l}, vocab] log-probabilities, got {:?} and {:?}",
            ref_logp.shape(),
            logp.shape()
        );
    }
    let v = logp.shape()[1] as i32;
    let rows = |a: &MlxArray| a.slice(&[0, 0], &[l as i32 - 1, v], &[1, 1]);
    let (r, p) = (rows(ref_logp)?, rows(logp)?);
    let targets: Vec<u32> = tokens[1..].to_vec();
    let targets = MlxArray::from_slice(&targets, &[l - 1, 1])?;
    let nll = take_along_axis(&p, &targets, 1)?.sum_all(false)?.negative()?;
    let kl = exp(&r)?.multiply(&r.subtract(&p)?)?.sum_all(false)?;
    eval_all(&[&nll, &kl])?;
    Ok(WindowScore { nll: nll.item_f64()?, kl: kl.item_f64()?, positions: l - 1 })
}

/// What coding each module alone costs: for every name in `modules`, the mean KL(`reference` ‖
/// `reference` with only that module replaced by `artifact`'s) per token over `windows` (each
/// scored from an empty cache, as [`score_window`] does). `progress(done, total)` after each
/// module. The reference's log-probabilities are computed once per window.
pub fn module_sensitivity(
    reference: &LlamaModel,
    artifact: &Artifact,
    modules: &[String],
    windows: &[&[u32]],
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<f64>> {
    if windows.is_empty() || windows.iter().any(|w| w.len() < 2) {
        invalid!("module sensitivity needs at least one window, each of at least 2 tokens");
    }
    let references = windows
        .iter()
        .map(|w| {
            let logp = log_probs(reference, w)?;
            eval_all(&[&logp])?;
            Ok(logp)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut out = Vec::with_capacity(modules.len());
    for (i, module) in modules.iter().enumerate() {
        let model = reference.with_coded(artifact, &BTreeSet::from([module.clone()]))?;
        let mut score = WindowScore::default();
        for (w, r) in windows.iter().zip(&references) {
            score += score_window(r, &log_probs(&model, w)?, w)?;
        }
        let kl = score.kl / score.positions as f64;
        if !kl.is_finite() {
            invalid!("module sensitivity: coding {module} alone gives a KL of {kl} per token");
        }
        out.push(kl);
        progress(i + 1, modules.len());
    }
    Ok(out)
}

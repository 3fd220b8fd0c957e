//! Bits per weight per tensor from a budget: given each tensor's measured error at every
//! candidate `k`, pick one `k` per tensor that keeps the total stored bits within
//! `budget · Σ weights` and makes the summed error small.
//!
//! The choice is greedy on the marginal error reduction per stored bit: every tensor starts at
//! its cheapest candidate, then the upgrade (to any candidate with more stored bits) with the
//! largest `Δerror / Δbits` that still fits the budget is applied, until none fits or none lowers
//! the error. Allowing jumps past the next candidate handles measured errors that do not fall
//! evenly with `k`. The bits counted are the real stored bits of a candidate (codes and f16
//! scales, [`stored_bits`]), so the achieved bits per weight is what the artifact holds. Ties go
//! to the tensor whose name sorts first, then to the smaller upgrade, so the result depends
//! neither on the order the tensors are given in nor on anything but the inputs.
//!
//! Tensors a runner launches together, which must share one `k` (gate and up, k and v), are
//! allocated as one: [`tie_tensors`] joins them ([`TensorOptions::joined`]) before
//! [`allocate_bits`], and each member takes the joined tensor's choice.

use std::collections::BTreeMap;

use crate::error::{invalid, Result};

/// One candidate coding of a tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct BitCandidate {
    /// Bits per coded weight of the trellis code.
    pub k: u32,
    /// Everything the tensor stores at this `k`, in bits (codes and scales; [`stored_bits`]).
    pub stored_bits: u64,
    /// The measured error of this candidate (for example the proxy error `tr(E H Eᵀ)`); finite
    /// and at least 0.
    pub error: f64,
}

/// A tensor to allocate bits to.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorOptions {
    /// The tensor's name; unique among the tensors of one allocation.
    pub name: String,
    /// The number of weights of the dense tensor (the budget is per weight of these).
    pub weights: u64,
    /// The codings to choose from; at least one, distinct `k`.
    pub candidates: Vec<BitCandidate>,
}

impl TensorOptions {
    /// Tensors that must share one `k` (a runner's paired launches need one geometry: gate and
    /// up of a fused MLP, k and v of one attention), as one tensor for [`allocate_bits`]: its
    /// weights the parts' sum, and a candidate at each `k` every part has, with the parts' stored
    /// bits and errors summed. Errors when `parts` is empty, a part is invalid (as
    /// [`allocate_bits`] checks it), the parts share no `k`, or a sum overflows.
    pub fn joined(name: impl Into<String>, parts: &[TensorOptions]) -> Result<TensorOptions> {
        let name = name.into();
        let Some(first) = parts.first() else {
            invalid!("TensorOptions::joined: {name:?} joins no tensors");
        };
        let weights = checked_weights(parts, || format!("TensorOptions::joined: {name:?}'s weight count"))?;
        let mut candidates = Vec::new();
        for c in &first.candidates {
            let at_k: Option<Vec<&BitCandidate>> =
                parts.iter().map(|p| p.candidates.iter().find(|d| d.k == c.k)).collect();
            let Some(at_k) = at_k else { continue };
            let Some(stored_bits) = at_k.iter().try_fold(0u64, |s, d| s.checked_add(d.stored_bits)) else {
                invalid!("TensorOptions::joined: {name:?}'s stored bits at k = {} overflow 64 bits", c.k);
            };
            candidates.push(BitCandidate { k: c.k, stored_bits, error: at_k.iter().map(|d| d.error).sum() });
        }
        if candidates.is_empty() {
            let names: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
            invalid!("TensorOptions::joined: {names:?} share no k, so {name:?} has no candidates");
        }
        Ok(TensorOptions { name, weights, candidates })
    }
}

/// [`tie_tensors`]' result: the tensors to allocate, and which given tensors each one stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct TiedTensors {
    /// One tensor per tied group ([`TensorOptions::joined`], named `PREFIX.a+b`) and per untied
    /// tensor, in the order their first member was given.
    pub tensors: Vec<TensorOptions>,
    /// For each of [`tensors`](Self::tensors), the indices of its members in the given tensors
    /// (one index for an untied tensor); each member takes the allocated tensor's `k`.
    pub members: Vec<Vec<usize>>,
}

/// Ties tensors that must share one `k`: each of `ties` names tensors by the last dot-separated
/// part of their names (`["gate_proj", "up_proj"]`), and the tensors with those names under one
/// prefix (`model.layers.3.mlp`) become one [`TensorOptions::joined`]. Errors when a tie has fewer
/// than two names, repeats one or names a dotted one, a name is in two ties, a prefix has some of
/// a tie's names but not all (or one twice), or the parts share no `k`.
pub fn tie_tensors(tensors: &[TensorOptions], ties: &[Vec<String>]) -> Result<TiedTensors> {
    for (i, tie) in ties.iter().enumerate() {
        if tie.len() < 2 || tie.iter().any(|n| n.is_empty() || n.contains('.')) {
            invalid!(
                "tie_tensors: the tie {tie:?} needs two or more names, each the last part of a tensor name (no dots)"
            );
        }
        for (j, name) in tie.iter().enumerate() {
            if tie[..j].contains(name) || ties[..i].iter().any(|t| t.contains(name)) {
                invalid!("tie_tensors: {name:?} is named twice in the ties");
            }
        }
    }
    // Each tied group by (prefix, tie), its members in the order given; the entries in the order
    // of each one's first member.
    let mut groups: BTreeMap<(&str, usize), Vec<usize>> = BTreeMap::new();
    enum Entry<'a> {
        Alone(usize),
        Tied(&'a str, usize),
    }
    let mut order: Vec<Entry<'_>> = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let (prefix, last) = t.name.rsplit_once('.').unwrap_or(("", t.name.as_str()));
        match ties.iter().position(|tie| tie.iter().any(|n| n == last)) {
            Some(tie) => {
                let members = groups.entry((prefix, tie)).or_default();
                if members.is_empty() {
                    order.push(Entry::Tied(prefix, tie));
                }
                members.push(i);
            }
            None => order.push(Entry::Alone(i)),
        }
    }
    let mut out = TiedTensors { tensors: Vec::with_capacity(order.len()), members: Vec::with_capacity(order.len()) };
    for entry in order {
        match entry {
            Entry::Alone(i) => {
                out.tensors.push(tensors[i].clone());
                out.members.push(vec![i]);
            }
            Entry::Tied(prefix, tie) => {
                let members = &groups[&(prefix, tie)];
                let mut names: Vec<&str> =
                    members.iter().map(|&i| tensors[i].name.rsplit('.').next().unwrap_or("")).collect();
                names.sort_unstable();
                let mut want: Vec<&str> = ties[tie].iter().map(String::as_str).collect();
                want.sort_unstable();
                if names != want {
                    invalid!("tie_tensors: under {prefix:?} the tie {:?} finds {names:?}", ties[tie]);
                }
                let parts: Vec<TensorOptions> = members.iter().map(|&i| tensors[i].clone()).collect();
                let name =
                    if prefix.is_empty() { ties[tie].join("+") } else { format!("{prefix}.{}", ties[tie].join("+")) };
                out.tensors.push(TensorOptions::joined(name, &parts)?);
                out.members.push(members.clone());
            }
        }
    }
    Ok(out)
}

/// Each tensor checked ([`check_tensor`]) and their weights summed; `what` names the sum in the
/// error when it overflows 64 bits.
fn checked_weights(tensors: &[TensorOptions], what: impl Fn() -> String) -> Result<u64> {
    let mut weights = 0u64;
    for t in tensors {
        check_tensor(t)?;
        weights = match weights.checked_add(t.weights) {
            Some(w) => w,
            None => invalid!("{} overflows 64 bits", what()),
        };
    }
    Ok(weights)
}

/// The candidate chosen for one tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorChoice {
    /// The tensor's name.
    pub name: String,
    /// The chosen bits per coded weight.
    pub k: u32,
    /// The chosen candidate's stored bits.
    pub stored_bits: u64,
    /// The chosen candidate's error.
    pub error: f64,
}

/// The result of [`allocate_bits`].
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// One choice per tensor, in the order the tensors were given.
    pub choices: Vec<TensorChoice>,
    /// The stored bits of all choices.
    pub stored_bits: u64,
    /// The weights of all tensors.
    pub weights: u64,
    /// `stored_bits / weights`: the achieved bits per weight, at most the budget.
    pub bits_per_weight: f64,
    /// The summed error of the choices.
    pub error: f64,
}

/// The stored bits of a coded matrix of `rows` stored rows and `cols` coded columns at `k` bits
/// per weight: `rows · cols · k` bits of codes and 16 bits of f16 scale per row.
pub fn stored_bits(rows: usize, cols: usize, k: u32) -> Result<u64> {
    let codes = (rows as u64).checked_mul(cols as u64).and_then(|w| w.checked_mul(u64::from(k)));
    match codes.and_then(|c| c.checked_add(16 * rows as u64)) {
        Some(bits) => Ok(bits),
        None => invalid!("stored_bits: [{rows}, {cols}] at k = {k} overflows a 64-bit count of bits"),
    }
}

/// Picks one candidate per tensor with `Σ stored_bits ≤ budget · Σ weights`, greedy on error
/// reduction per bit (see the [module](self) docs). Errors when the inputs are invalid (empty,
/// duplicate names, no candidates, repeated `k`, zero weights or bits, a negative or non-finite
/// error, a non-positive or non-finite budget) and when even the cheapest candidates exceed the
/// budget (the error names that minimum).
pub fn allocate_bits(tensors: &[TensorOptions], budget_bits_per_weight: f64) -> Result<Allocation> {
    let budget = budget_bits_per_weight;
    if !(budget.is_finite() && budget > 0.0) {
        invalid!("allocate_bits: the budget {budget} bits per weight must be finite and positive");
    }
    if tensors.is_empty() {
        invalid!("allocate_bits: no tensors given");
    }
    let mut by_name: Vec<usize> = (0..tensors.len()).collect();
    by_name.sort_by(|&a, &b| tensors[a].name.cmp(&tensors[b].name));
    for pair in by_name.windows(2) {
        if tensors[pair[0]].name == tensors[pair[1]].name {
            invalid!("allocate_bits: the tensor name {:?} is given twice", tensors[pair[0]].name);
        }
    }
    // Each tensor's candidates from cheapest (ties: lower error, then lower k).
    let weights = checked_weights(tensors, || "allocate_bits: the weight count".to_string())?;
    let mut sorted = Vec::with_capacity(tensors.len());
    for t in tensors {
        let mut order: Vec<&BitCandidate> = t.candidates.iter().collect();
        order.sort_by(|a, b| a.stored_bits.cmp(&b.stored_bits).then(a.error.total_cmp(&b.error)).then(a.k.cmp(&b.k)));
        sorted.push(order);
    }
    let allowed = budget * weights as f64;
    let mut chosen = vec![0usize; tensors.len()];
    let mut used: u64 = 0;
    for order in &sorted {
        used = match used.checked_add(order[0].stored_bits) {
            Some(u) => u,
            None => invalid!("allocate_bits: the stored bits overflow 64 bits"),
        };
    }
    if used as f64 > allowed {
        invalid!(
            "allocate_bits: a budget of {budget} bits per weight is below the minimum {:.6} (every tensor at its cheapest candidate)",
            used as f64 / weights as f64
        );
    }
    loop {
        // The best upgrade: (ratio, tensor, candidate, Δbits); ties to the name first, then the
        // smaller Δbits (the tensors are visited in name order, candidates by growing bits).
        let mut best: Option<(f64, usize, usize, u64)> = None;
        for &t in &by_name {
            let order = &sorted[t];
            let current = order[chosen[t]];
            for (c, cand) in order.iter().enumerate().skip(chosen[t] + 1) {
                let extra = cand.stored_bits - current.stored_bits;
                let gain = current.error - cand.error;
                if extra == 0 || gain <= 0.0 || used.checked_add(extra).is_none_or(|u| u as f64 > allowed) {
                    continue;
                }
                let ratio = gain / extra as f64;
                if best.is_none_or(|(r, ..)| ratio > r) {
                    best = Some((ratio, t, c, extra));
                }
            }
        }
        match best {
            Some((_, t, c, extra)) => {
                chosen[t] = c;
                used += extra;
            }
            None => break,
        }
    }
    let choices: Vec<TensorChoice> = tensors
        .iter()
        .zip(&sorted)
        .zip(&chosen)
        .map(|((t, order), &c)| TensorChoice {
            name: t.name.clone(),
            k: order[c].k,
            stored_bits: order[c].stored_bits,
            error: order[c].error,
        })
        .collect();
    // Summed in name order, so the total does not depend on the input order either.
    let error = by_name.iter().map(|&t| choices[t].error).sum();
    Ok(Allocation { choices, stored_bits: used, weights, bits_per_weight: used as f64 / weights as f64, error })
}

/// A tensor's candidate errors weighted by what coding it costs the model, for [`allocate_bits`].
///
/// `at` is the tensor's candidates as `(k, stored bits, proxy error)`; `kl` holds, for some of
/// those `k`, the measured cost of coding this tensor alone at `k` (for example KL(model ‖ model
/// with only this tensor coded) per token). A candidate's error is its measured cost where there is
/// one, else its proxy error scaled by measured cost over proxy error at the nearest measured `k`
/// (the lower one on a tie): `kl(j) · proxy(k) / proxy(j)`. A measured cost of 0 is floored at
/// 1e-12 for the scale, so that the tensor stays ordered by its proxy errors. Errors when no `k`
/// is measured, when a measured `k` is not a candidate, and on a negative or non-finite cost or
/// proxy error.
pub fn kl_weighted_candidates(at: &[(u32, u64, f64)], kl: &BTreeMap<u32, f64>) -> Result<Vec<BitCandidate>> {
    if kl.is_empty() {
        invalid!("kl_weighted_candidates: no measured cost at any k");
    }
    for (&k, &v) in kl {
        if !(v.is_finite() && v >= 0.0) {
            invalid!("kl_weighted_candidates: the measured cost {v} at k = {k} must be finite and at least 0");
        }
        if !at.iter().any(|a| a.0 == k) {
            invalid!("kl_weighted_candidates: a cost is measured at k = {k}, which is not a candidate");
        }
    }
    if let Some(&(k, _, p)) = at.iter().find(|a| !(a.2.is_finite() && a.2 >= 0.0)) {
        invalid!("kl_weighted_candidates: the proxy error {p} at k = {k} must be finite and at least 0");
    }
    Ok(at
        .iter()
        .map(|&(k, stored_bits, proxy)| {
            let error = match kl.get(&k) {
                Some(&v) => v,
                None => {
                    let (&j, &kl_j) = kl.iter().min_by_key(|(&j, _)| (j.abs_diff(k), j)).expect("not empty");
                    let proxy_j = at.iter().find(|a| a.0 == j).expect("checked above").2;
                    kl_j.max(1e-12) * proxy / proxy_j.max(f64::MIN_POSITIVE)
                }
            };
            BitCandidate { k, stored_bits, error }
        })
        .collect())
}

/// Checks one tensor's counts and candidates.
fn check_tensor(t: &TensorOptions) -> Result<()> {
    let name = &t.name;
    if t.weights == 0 {
        invalid!("allocate_bits: tensor {name:?} has no weights");
    }
    if t.candidates.is_empty() {
        invalid!("allocate_bits: tensor {name:?} has no candidates");
    }
    for (i, c) in t.candidates.iter().enumerate() {
        if t.candidates[..i].iter().any(|d| d.k == c.k) {
            invalid!("allocate_bits: tensor {name:?} lists k = {} twice", c.k);
        }
        if c.stored_bits == 0 {
            invalid!("allocate_bits: tensor {name:?} at k = {} stores no bits", c.k);
        }
        if !(c.error.is_finite() && c.error >= 0.0) {
            invalid!(
                "allocate_bits: tensor {name:?} at k = {} has error {} (must be finite and at least 0)",
                c.k,
                c.error
            );
        }
    }
    Ok(())
}

//! The block searches: the fast tail-biting Viterbi ([`Trellis`]) and, for tests, a plain
//! reference Viterbi and deliberately broken searches ([`broken`]).

use super::BlockSearch;

/// The cost of a start state a pinned pass may not use. Finite, so that adding emissions to it
/// stays ordered and never makes a NaN; far above any real path cost.
const FORBIDDEN: f32 = 1e30;

/// The fast Viterbi over one block: cost arrays and per-step group minima, reused across blocks.
pub(super) struct Trellis {
    l: u32,
    /// Path cost of every state at the current step.
    cost: Vec<f32>,
    /// Path cost of every state at the next step.
    next: Vec<f32>,
    /// `best[t * 2^(L-k) + h]`: the least path cost into group `h` (the states `s` with
    /// `s >> k == h`) before step `t`'s emission. Enough to recompute the traceback exactly.
    best: Vec<f32>,
}

/// Element-wise minimum of four costs and the four at the start of `other` (plain selects, so
/// the compiler emits one vector minimum).
#[inline(always)]
fn min4(a: [f32; 4], other: &[f32]) -> [f32; 4] {
    let b = [other[0], other[1], other[2], other[3]];
    [
        if b[0] < a[0] { b[0] } else { a[0] },
        if b[1] < a[1] { b[1] } else { a[1] },
        if b[2] < a[2] { b[2] } else { a[2] },
        if b[3] < a[3] { b[3] } else { a[3] },
    ]
}

/// The cost of a path that reaches a state with `best` and emits `value` for `x`. Every place that
/// forms a path cost calls this, so the traceback's recomputation is bit-identical.
#[inline(always)]
fn branch_cost(best: f32, x: f32, value: f32) -> f32 {
    let e = x - value;
    best + e * e
}

/// The cost of a path that reaches a state with `best` and emits `value` for `x` at weight `w`:
/// [`branch_cost`] itself at `w = 1` (so unweighted positions cost bit for bit what the plain
/// search computes), `best + w·(x − value)²` otherwise (`best` alone at `w = 0`).
#[inline(always)]
fn weighted_cost(best: f32, x: f32, value: f32, w: f32) -> f32 {
    if w == 1.0 {
        branch_cost(best, x, value)
    } else {
        let e = x - value;
        best + w * (e * e)
    }
}

impl Trellis {
    pub(super) fn new(k: u32, l: u32, t: usize) -> Trellis {
        let (states, groups) = if t == 0 { (0, 0) } else { (1usize << l, 1usize << (l - k)) };
        Trellis { l, cost: vec![0.0; states], next: vec![0.0; states], best: vec![0.0; t * groups] }
    }

    /// The minimum squared-error path for `x` into `states`. With `pin = Some(p)`, the first
    /// state must satisfy `s >> k == p` and the last `s & (2^(L-k) - 1) == p` (tail-biting).
    pub(super) fn search(&mut self, k: u32, x: &[f32], lut: &[f32], pin: Option<u32>, states: &mut [u32]) {
        self.search_weighted(k, x, None, lut, pin, states)
    }

    /// [`search`](Self::search) minimising `Σ w[t]·(x[t] − value(state_t))²`: with `w = None`
    /// every weight is 1 (the plain search, bit for bit). Weights must be finite and
    /// non-negative; a zero weight makes its position free (padding).
    pub(super) fn search_weighted(
        &mut self,
        k: u32,
        x: &[f32],
        w: Option<&[f32]>,
        lut: &[f32],
        pin: Option<u32>,
        states: &mut [u32],
    ) {
        // Monomorphised per k so the branch loops have compile-time lengths and vectorise.
        match k {
            1 => self.search_k::<1>(x, w, lut, pin, states),
            2 => self.search_k::<2>(x, w, lut, pin, states),
            3 => self.search_k::<3>(x, w, lut, pin, states),
            4 => self.search_k::<4>(x, w, lut, pin, states),
            5 => self.search_k::<5>(x, w, lut, pin, states),
            6 => self.search_k::<6>(x, w, lut, pin, states),
            7 => self.search_k::<7>(x, w, lut, pin, states),
            8 => self.search_k::<8>(x, w, lut, pin, states),
            k => unreachable!("k = {k} passed validation"),
        }
    }

    fn search_k<const K: u32>(
        &mut self,
        x: &[f32],
        w: Option<&[f32]>,
        lut: &[f32],
        pin: Option<u32>,
        states: &mut [u32],
    ) {
        let branches = 1usize << K;
        let groups = 1usize << (self.l - K);
        let steps = x.len();
        let weight = |t: usize| w.map_or(1.0, |w| w[t]);
        // Step 0: the emission alone, or forbidden outside the pinned start group.
        let start_cost = |s: usize| match pin {
            Some(p) if (s >> K) as u32 != p => FORBIDDEN,
            _ => weighted_cost(0.0, x[0], lut[s], weight(0)),
        };
        for (s, c) in self.cost.iter_mut().enumerate() {
            *c = start_cost(s);
        }
        for (step, &xt) in x.iter().enumerate().skip(1) {
            let wt = weight(step);
            // Two loop shapes compute the same values; which compiles to tighter vector code
            // depends on k and the target's vector width (the choice follows the timings in
            // docs/encoder.md; the tiled shape needs k >= 2). Weighted steps take a plain loop.
            if wt != 1.0 {
                self.step_weighted::<K>(step, xt, wt, lut);
            } else if K >= 2 && (K <= 3 || cfg!(target_feature = "avx2")) {
                self.step_tiled::<K>(step, xt, lut);
            } else {
                self.step_flat::<K>(step, xt, lut);
            }
            std::mem::swap(&mut self.cost, &mut self.next);
        }

        // The best allowed final state (the lowest state on ties).
        let end_states = |j: usize| match pin {
            None => j,
            Some(p) => p as usize | (j * groups),
        };
        let end_count = if pin.is_some() { branches } else { 1 << self.l };
        let mut last = end_states(0);
        for s in (1..end_count).map(end_states) {
            if self.cost[s] < self.cost[last] {
                last = s;
            }
        }
        // Traceback: the predecessors of state s are (s >> k) | (j << (L-k)); their path costs
        // are recomputed from the stored group minima exactly as the forward pass formed them,
        // and the cheapest (lowest j on ties) is the one the forward minimum came from.
        let mut state = last as u32;
        states[steps - 1] = state;
        for step in (1..steps).rev() {
            let group = state >> K;
            let prev = step - 1;
            let mut best_j = 0;
            let mut best_cost = f32::INFINITY;
            for j in 0..branches as u32 {
                let p = (group | (j << (self.l - K))) as usize;
                let c = if prev == 0 {
                    start_cost(p)
                } else {
                    weighted_cost(self.best[prev * groups + (p >> K)], x[prev], lut[p], weight(prev))
                };
                if c < best_cost {
                    best_cost = c;
                    best_j = j;
                }
            }
            state = group | (best_j << (self.l - K));
            states[prev] = state;
        }
    }

    /// One step in tiles of four groups: their minima over the `2^k` predecessor chunks, then
    /// the `4 * 2^k` new states, each group's minimum broadcast over its `2^k` states. Needs
    /// `k >= 2`. Kept out of line: inlined into the search, the compiler scalarises the emission.
    #[inline(never)]
    fn step_tiled<const K: u32>(&mut self, step: usize, xt: f32, lut: &[f32]) {
        let branches = 1usize << K;
        let groups = 1usize << (self.l - K);
        let best = &mut self.best[step * groups..(step + 1) * groups];
        let cost = &self.cost;
        let tiles =
            best.chunks_exact_mut(4).zip(self.next.chunks_exact_mut(4 * branches)).zip(lut.chunks_exact(4 * branches));
        for (tile, ((tile_best, out), values)) in tiles.enumerate() {
            let h0 = tile * 4;
            let mut m: [f32; 4] = [cost[h0], cost[h0 + 1], cost[h0 + 2], cost[h0 + 3]];
            for j in 1..branches {
                m = min4(m, &cost[j * groups + h0..j * groups + h0 + 4]);
            }
            tile_best.copy_from_slice(&m);
            for (g, (out, values)) in out.chunks_exact_mut(branches).zip(values.chunks_exact(branches)).enumerate() {
                let b = m[g];
                for (o4, v4) in out.chunks_exact_mut(4).zip(values.chunks_exact(4)) {
                    for i in 0..4 {
                        o4[i] = branch_cost(b, xt, v4[i]);
                    }
                }
            }
        }
    }

    /// One step at weight `wt` != 1: the group minima as [`Self::step_flat`], then every new
    /// state's [`weighted_cost`].
    #[inline(never)]
    fn step_weighted<const K: u32>(&mut self, step: usize, xt: f32, wt: f32, lut: &[f32]) {
        let groups = 1usize << (self.l - K);
        let best = &mut self.best[step * groups..(step + 1) * groups];
        let mut chunks = self.cost.chunks_exact(groups);
        best.copy_from_slice(chunks.next().expect("2^k >= 2 predecessor chunks"));
        for chunk in chunks {
            for (b, &c) in best.iter_mut().zip(chunk) {
                *b = if c < *b { c } else { *b };
            }
        }
        for (s, (o, &v)) in self.next.iter_mut().zip(lut).enumerate() {
            *o = weighted_cost(best[s >> K], xt, v, wt);
        }
    }

    /// One step in two flat passes: the group minima over the `2^k` contiguous predecessor
    /// chunks, then every new state from its group's minimum. Out of line like [`Self::step_tiled`].
    #[inline(never)]
    fn step_flat<const K: u32>(&mut self, step: usize, xt: f32, lut: &[f32]) {
        let branches = 1usize << K;
        let groups = 1usize << (self.l - K);
        let best = &mut self.best[step * groups..(step + 1) * groups];
        let mut chunks = self.cost.chunks_exact(groups);
        best.copy_from_slice(chunks.next().expect("2^k >= 2 predecessor chunks"));
        for chunk in chunks {
            for (b, &c) in best.iter_mut().zip(chunk) {
                *b = if c < *b { c } else { *b };
            }
        }
        if branches >= 4 {
            let quads_per_group = branches / 4;
            for (q, (o4, v4)) in self.next.chunks_exact_mut(4).zip(lut.chunks_exact(4)).enumerate() {
                let b = best[q / quads_per_group];
                for i in 0..4 {
                    o4[i] = branch_cost(b, xt, v4[i]);
                }
            }
        } else {
            for ((out, values), &b) in
                self.next.chunks_exact_mut(branches).zip(lut.chunks_exact(branches)).zip(best.iter())
            {
                for (o, &v) in out.iter_mut().zip(values) {
                    *o = branch_cost(b, xt, v);
                }
            }
        }
    }
}

/// Slow, plain searches for tests: a reference Viterbi and deliberately broken ones.
pub(super) mod broken {
    use super::BlockSearch;

    /// Runs `search` on the block `x` (and its rotation by `T/2`) into `states`.
    pub(in crate::trellis::encoder) fn search(
        search: BlockSearch,
        x: &[f32],
        rotated: &[f32],
        lut: &[f32],
        k: u32,
        l: u32,
        states: &mut [u32],
    ) {
        let forward = |p: u32, b: u32| ((p << k) | b) & ((1 << l) - 1);
        match search {
            BlockSearch::Viterbi => unreachable!("the fast path codes BlockSearch::Viterbi"),
            BlockSearch::ReferenceViterbi => {
                let first = viterbi(rotated, lut, k, l, forward, None, false);
                let pinned = first[x.len() - x.len() / 2] >> k;
                states.copy_from_slice(&viterbi(x, lut, k, l, forward, Some(pinned), false));
            }
            BlockSearch::Greedy => {
                let mut state = (0..1u32 << l)
                    .min_by(|&a, &b| err(x[0], lut[a as usize]).total_cmp(&err(x[0], lut[b as usize])))
                    .unwrap_or(0);
                states[0] = state;
                for (t, &xt) in x.iter().enumerate().skip(1) {
                    state = (0..1u32 << k)
                        .map(|b| forward(state, b))
                        .min_by(|&a, &b| err(xt, lut[a as usize]).total_cmp(&err(xt, lut[b as usize])))
                        .unwrap_or(0);
                    states[t] = state;
                }
            }
            BlockSearch::NoTraceback => states.copy_from_slice(&viterbi(x, lut, k, l, forward, None, true)),
            BlockSearch::NoTailBiting => states.copy_from_slice(&viterbi(x, lut, k, l, forward, None, false)),
            BlockSearch::WrongSuccessor => {
                let top = |p: u32, b: u32| (p >> k) | (b << (l - k));
                let path = viterbi(x, lut, k, l, top, None, false);
                // This trellis's new symbol is the top k bits; pack that one.
                for (s, p) in states.iter_mut().zip(path) {
                    *s = p >> (l - k);
                }
            }
        }
    }

    fn err(x: f32, v: f32) -> f64 {
        (x as f64 - v as f64).powi(2)
    }

    /// A textbook Viterbi in f64 over the trellis `successor`. `pin` as in the fast search;
    /// `no_traceback` returns each step's individually cheapest state instead of the path.
    fn viterbi(
        x: &[f32],
        lut: &[f32],
        k: u32,
        l: u32,
        successor: impl Fn(u32, u32) -> u32,
        pin: Option<u32>,
        no_traceback: bool,
    ) -> Vec<u32> {
        let n = 1usize << l;
        let low_mask = (1u32 << (l - k)) - 1;
        let mut cost: Vec<f64> = (0..n as u32)
            .map(|s| if pin.is_some_and(|p| s >> k != p) { f64::INFINITY } else { err(x[0], lut[s as usize]) })
            .collect();
        let mut back = vec![vec![0u32; n]; x.len()];
        let mut cheapest = vec![argmin(&cost, |_| true)];
        for (t, &xt) in x.iter().enumerate().skip(1) {
            let mut next = vec![f64::INFINITY; n];
            for p in 0..n as u32 {
                for b in 0..1u32 << k {
                    let s = successor(p, b) as usize;
                    let c = cost[p as usize] + err(xt, lut[s]);
                    if c < next[s] {
                        next[s] = c;
                        back[t][s] = p;
                    }
                }
            }
            cost = next;
            cheapest.push(argmin(&cost, |_| true));
        }
        if no_traceback {
            return cheapest.into_iter().map(|s| s as u32).collect();
        }
        let mut state = argmin(&cost, |s| pin.is_none_or(|p| (s as u32) & low_mask == p)) as u32;
        let mut path = vec![0u32; x.len()];
        for t in (0..x.len()).rev() {
            path[t] = state;
            state = back[t][state as usize];
        }
        path
    }

    fn argmin(cost: &[f64], allowed: impl Fn(usize) -> bool) -> usize {
        let mut best = None;
        for (s, &c) in cost.iter().enumerate() {
            if allowed(s) && best.is_none_or(|b: usize| c < cost[b]) {
                best = Some(s);
            }
        }
        best.unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trellis::format::codebook::lut1mad;
    use crate::trellis::synthetic::gaussian;

    /// Runs 20 steps of both loop shapes from the same start and compares every cost.
    fn compare_step_shapes<const K: u32>(l: u32) {
        let lut = lut1mad(l).unwrap();
        let x = gaussian(256, 11 + K as u64).unwrap();
        let (mut tiled, mut flat) = (Trellis::new(K, l, 256), Trellis::new(K, l, 256));
        for (s, (a, b)) in tiled.cost.iter_mut().zip(flat.cost.iter_mut()).enumerate() {
            *a = branch_cost(0.0, x[0], lut[s]);
            *b = *a;
        }
        for (step, &xt) in x.iter().enumerate().skip(1).take(20) {
            tiled.step_tiled::<K>(step, xt, &lut);
            flat.step_flat::<K>(step, xt, &lut);
            assert_eq!(tiled.next, flat.next, "k {K} L {l} step {step}");
            std::mem::swap(&mut tiled.cost, &mut tiled.next);
            std::mem::swap(&mut flat.cost, &mut flat.next);
        }
        assert_eq!(tiled.best, flat.best, "k {K} L {l}");
    }

    #[test]
    fn the_tiled_and_flat_steps_compute_the_same_costs() {
        compare_step_shapes::<2>(8);
        compare_step_shapes::<2>(12);
        compare_step_shapes::<3>(10);
        compare_step_shapes::<3>(12);
        compare_step_shapes::<4>(12);
        compare_step_shapes::<5>(11);
    }

    #[test]
    fn a_pinned_pass_closes_the_cycle() {
        let (k, l) = (4u32, 10u32);
        let lut = lut1mad(l).unwrap();
        let x = gaussian(256, 3).unwrap();
        let mut trellis = Trellis::new(k, l, 256);
        let mut states = vec![0u32; 256];
        for pin in [0u32, 1, 37, 63] {
            trellis.search(k, &x, &lut, Some(pin), &mut states);
            assert_eq!(states[0] >> k, pin);
            assert_eq!(states[255] & ((1 << (l - k)) - 1), pin);
            assert!(states.windows(2).all(|w| w[1] >> k == w[0] & ((1 << (l - k)) - 1)));
        }
    }
}

//! The host product on plain slices: `x · W` straight from the codes.
//!
//! It decodes each block once per pass of [`ROW_TILE`] activation rows, [`LANES`] stored rows at
//! a time, and spreads the work over rayon's threads in units fixed by the geometry alone, so the
//! sums do not depend on the thread count. Each unit's work is compiled for several instruction sets and picked at run
//! time (`multiversion`): x86-64's baseline, SSE2, has no 32-bit lane multiply for the 1MAD hash
//! and only 4-lane vectors, so an AVX2 machine runs the decode 8 lanes an instruction instead.

use multiversion::multiversion;
use rayon::prelude::*;
use wide::f32x8;

use super::lanes::{Lanes, Windows, LANES};
use crate::alloc::try_with_capacity;
use crate::error::{invalid, Result};
use crate::trellis::format::codebook::TRELLIS_RCP;
use crate::trellis::format::TrellisGeometry;

/// Axis 0 (stored `[in, out]`): stored rows (inputs) summed by one unit of work, so that a layer
/// with few blocks of outputs still splits into enough units for the threads.
const ROWS_PER_PART: usize = 512;

/// Activation rows multiplied per pass over the codes: each pass decodes every block once, and
/// its sums (axis 0: a block of outputs a row) stay in the core's L2.
pub(super) const ROW_TILE: usize = 16;

/// Independent partial sums a lane keeps along a block on axis 1, so that consecutive positions'
/// multiply-adds do not wait on each other.
const CHAINS: usize = 4;

/// One call's inputs: a validated geometry, its codes and f32 scales, and `m` activation rows.
struct Call<'a> {
    g: &'a TrellisGeometry,
    win: &'a Windows,
    codes: &'a [u32],
    scales: &'a [f32],
    x: &'a [f32],
    m: usize,
}

/// Axis 0: lane groups (of [`LANES`] stored rows) decoded before one pass over a unit's sums,
/// so that each sum is loaded and stored once for this many multiply-adds.
const GROUPS_PER_PASS: usize = 4;

/// A unit's scratch: the gathered words, and the decoded values of [`GROUPS_PER_PASS`] blocks.
struct Scratch {
    words: Vec<Lanes<u32>>,
    values: Vec<Lanes<f32>>,
}

impl Scratch {
    fn new(win: &Windows) -> Scratch {
        Scratch { words: win.word_scratch(), values: vec![[0.0; LANES]; GROUPS_PER_PASS * win.positions()] }
    }

    /// Decodes block `b` of stored rows `r0..r0 + LANES` into slot `slot` of `self.values`
    /// (code values `y`, `t` positions a slot).
    #[inline(always)]
    fn decode(&mut self, call: &Call<'_>, r0: usize, b: usize, slot: usize) {
        let t = call.win.positions();
        call.win.gather(call.codes, call.g, r0, b, &mut self.words);
        call.win.decode(&self.words, &mut self.values[slot * t..(slot + 1) * t]);
    }
}

/// `x [m, in] · W -> [m, out]` in f32 for a validated geometry whose `codes` and f32 `scales`
/// have its sizes, and `x` of `m * in` values: [`ROW_TILE`] activation rows a pass, each pass
/// decoding every block once. An output that overflows or cannot be allocated is an error.
pub(super) fn product(x: &[f32], m: usize, codes: &[u32], scales: &[f32], g: &TrellisGeometry) -> Result<Vec<f32>> {
    let (inf, outf) = (g.in_features(), g.out_features());
    let win = Windows::new(g);
    let Some(n) = m.checked_mul(outf) else {
        invalid!("host path: an output of [{m}, {outf}] values overflows");
    };
    let mut y = try_with_capacity(n, || format!("the host path's output [{m}, {outf}]"))?;
    for tile in x.chunks(ROW_TILE * inf) {
        let call = Call { g, win: &win, codes, scales, x: tile, m: tile.len() / inf };
        y.extend(if g.axis == 0 { axis_zero(&call) } else { axis_one(&call) });
    }
    Ok(y)
}

/// Axis 1 (stored `[out, in]`): a unit is a group of [`LANES`] outputs, each lane's dot product
/// along the blocks of its row.
fn axis_one(call: &Call<'_>) -> Vec<f32> {
    let (g, m) = (call.g, call.m);
    let groups = g.rows.div_ceil(LANES);
    // Each group's outputs, [group][row][lane].
    let mut parts = vec![0f32; groups * m * LANES];
    parts.par_chunks_mut(m * LANES).enumerate().for_each_init(
        || (Scratch::new(call.win), vec![[[0f32; LANES]; CHAINS]; m]),
        |(scratch, acc), (group, out)| axis_one_unit(call, group * LANES, scratch, acc, out),
    );
    let mut y = vec![0f32; m * g.rows];
    for (group, part) in parts.chunks_exact(m * LANES).enumerate() {
        let r0 = group * LANES;
        let lanes = LANES.min(g.rows - r0);
        for (row, p) in part.chunks_exact(LANES).enumerate() {
            y[row * g.rows + r0..][..lanes].copy_from_slice(&p[..lanes]);
        }
    }
    y
}

/// Axis 1's unit: outputs `r0..r0 + LANES` of every activation row into `out` (`[row][lane]`).
#[multiversion(targets = "simd")]
fn axis_one_unit(call: &Call<'_>, r0: usize, scratch: &mut Scratch, acc: &mut [[Lanes<f32>; CHAINS]], out: &mut [f32]) {
    let (t, cols) = (call.win.positions(), call.g.cols);
    acc.iter_mut().for_each(|a| *a = [[0.0; LANES]; CHAINS]);
    for b in 0..call.g.blocks_per_row() {
        scratch.decode(call, r0, b, 0);
        for (row, acc_row) in acc.iter_mut().enumerate() {
            let xs = &call.x[row * cols + b * t..][..t];
            // In registers along the block (a store to `acc` per step would be the loop's bound).
            // `t` is a multiple of CHAINS: `t * k` is whole 32-bit words with k <= 8.
            let mut a = *acc_row;
            for (xc, vc) in xs.chunks_exact(CHAINS).zip(scratch.values[..t].chunks_exact(CHAINS)) {
                for c in 0..CHAINS {
                    for lane in 0..LANES {
                        a[c][lane] += xc[c] * vc[c][lane];
                    }
                }
            }
            *acc_row = a;
        }
    }
    let mut row_scales = [0f32; LANES];
    for (lane, s) in row_scales.iter_mut().enumerate() {
        *s = call.scales.get(r0 + lane).map_or(0.0, |s| s * TRELLIS_RCP);
    }
    for (a, o) in acc.iter().zip(out.chunks_exact_mut(LANES)) {
        for (lane, ol) in o.iter_mut().enumerate() {
            *ol = a.iter().map(|chain| chain[lane]).sum::<f32>() * row_scales[lane];
        }
    }
}

/// Axis 0 (stored `[in, out]`): a unit is one block of outputs over up to [`ROWS_PER_PART`]
/// inputs; each lane keeps its own sums along the block (no dependency between positions), and
/// the lanes, then the parts, are added at the end.
fn axis_zero(call: &Call<'_>) -> Vec<f32> {
    let (g, m, t) = (call.g, call.m, call.win.positions());
    let blocks = g.blocks_per_row();
    let parts = g.rows.div_ceil(ROWS_PER_PART).max(1);
    // Each unit's sums, [block][part][row][position].
    let mut sums = vec![0f32; blocks * parts * m * t];
    sums.par_chunks_mut(m * t).enumerate().for_each_init(
        || (Scratch::new(call.win), vec![f32x8::ZERO; m * t]),
        |(scratch, acc), (unit, out)| {
            let (b, part) = (unit / parts, unit % parts);
            let first = part * ROWS_PER_PART;
            axis_zero_unit(call, b, first..g.rows.min(first + ROWS_PER_PART), scratch, acc, out)
        },
    );
    let out = g.cols;
    let mut y = vec![0f32; m * out];
    for (b, block) in sums.chunks_exact(parts * m * t).enumerate() {
        for part in block.chunks_exact(m * t) {
            for (row, p) in part.chunks_exact(t).enumerate() {
                for (yv, pv) in y[row * out + b * t..][..t].iter_mut().zip(p) {
                    *yv += pv;
                }
            }
        }
    }
    y
}

/// Axis 0's unit: block `b` of outputs summed over stored rows `rows` into `out`
/// (`[row][position]`).
#[multiversion(targets = "simd")]
fn axis_zero_unit(
    call: &Call<'_>,
    b: usize,
    rows: std::ops::Range<usize>,
    scratch: &mut Scratch,
    acc: &mut [f32x8],
    out: &mut [f32],
) {
    let (t, n) = (call.win.positions(), call.g.rows);
    acc.iter_mut().for_each(|a| *a = f32x8::ZERO);
    let end = rows.end;
    for r0 in rows.step_by(LANES * GROUPS_PER_PASS) {
        for slot in 0..GROUPS_PER_PASS {
            scratch.decode(call, r0 + slot * LANES, b, slot);
        }
        let values = &scratch.values;
        for (row, a) in acc.chunks_exact_mut(t).enumerate() {
            // The activation of each lane's input times its row's scale; 0 past the unit's rows.
            let mut xs = [f32x8::ZERO; GROUPS_PER_PASS];
            for (slot, xv) in xs.iter_mut().enumerate() {
                let mut lanes = [0f32; LANES];
                for (lane, xl) in lanes.iter_mut().enumerate() {
                    let r = r0 + slot * LANES + lane;
                    if r < end {
                        *xl = call.x[row * n + r] * call.scales[r];
                    }
                }
                *xv = f32x8::from(lanes);
            }
            // Explicit vectors here: as lane loops, the compiler vectorizes this loop across
            // positions instead, with a transpose of every eight.
            for (pos, ap) in a.iter_mut().enumerate() {
                let mut sum = *ap;
                for (slot, xv) in xs.iter().enumerate() {
                    sum += f32x8::from(values[slot * t + pos]) * *xv;
                }
                *ap = sum;
            }
        }
    }
    for (o, a) in out.iter_mut().zip(acc.iter()) {
        *o = a.reduce_add() * TRELLIS_RCP;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trellis::host::test_layers::{random_layer, LAYER_CASES};
    use crate::trellis::reference::forward_f64;
    use crate::trellis::synthetic::gaussian;
    use crate::trellis::CodeLayout;

    fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
        let norm = want.iter().map(|v| v * v).sum::<f64>().sqrt().max(f64::MIN_POSITIVE);
        let err = got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).powi(2)).sum::<f64>().sqrt();
        err / norm
    }

    #[test]
    fn products_match_the_f64_reference() {
        // Both axes, every case's k, L, T and layout; row counts that leave partial lane groups
        // and several axis-0 parts; 1 to 9 activation rows.
        for (i, case) in LAYER_CASES.iter().enumerate() {
            for axis in [0, 1] {
                if axis == 1 && case.layout == CodeLayout::K3Interleaved {
                    continue; // the block interleave is axis 0 only
                }
                for (rows, m) in [(13, 1), (8, 3), (1100, 2), (37, 9), (5, 2 * ROW_TILE + 3)] {
                    let layer = random_layer(rows, case, axis, (i * 31 + rows) as u64);
                    let g = layer.geometry;
                    let x = gaussian(m * g.in_features(), 5 + i as u64).unwrap();
                    let scales: Vec<f32> = layer.scales.iter().map(|s| s.to_f32()).collect();
                    let got = product(&x, m, &layer.codes, &scales, &g).unwrap();
                    let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
                    let want = forward_f64(&x64, m, &layer.codes, &layer.scales, &g).unwrap();
                    assert_eq!(got.len(), want.len());
                    let err = max_rel_err(&got, &want);
                    assert!(err < 1e-5, "{g}, {m} rows: relErr {err:e}");
                }
            }
        }
    }

    #[test]
    fn sums_do_not_depend_on_the_thread_count() {
        for axis in [0, 1] {
            // Axis 0 with three units of inputs a block; 3 rows: one pass.
            let layer = random_layer(1100, &LAYER_CASES[1], axis, 77);
            let g = layer.geometry;
            let x = gaussian(3 * g.in_features(), 78).unwrap();
            let scales: Vec<f32> = layer.scales.iter().map(|s| s.to_f32()).collect();
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                pool.install(|| product(&x, 3, &layer.codes, &scales, &g).unwrap())
            };
            let one = run(1);
            for threads in [2, 3, 8] {
                let many = run(threads);
                assert!(one.iter().zip(&many).all(|(a, b)| a.to_bits() == b.to_bits()), "{g}: {threads} threads");
            }
        }
    }
}

//! The Metal gate/up kernels (axis 1: the factored row and rows forms with the 1MAD arithmetic,
//! the MMA form with the half table) and the fused gate·up·SwiGLU against the f64 reference,
//! the Metal path of `TrellisLinear` and `TrellisMlp`, the block wrap and the typed errors.
//!
//! Every kernel test runs twice: `*_sim` on the CPU simulator of MLX's Metal wrapping (inside a
//! `MetalSimScope`, on any machine) with its strict lane checks on (`MSL_SIM_STRICT=1`, set
//! once for this whole binary before any kernel runs; `strict_lane_checks_are_on_sim` proves it),
//! and `*_metal` on real Metal (ignored here: it needs MLX's Metal back-end, a Mac):
//!
//! ```text
//! cargo test --release --features metal-sim,tuning --test metal_mlp -- --include-ignored
//! ```
//!
//! Shapes are small (8..100 output rows, most not multiples of 8 or 16; 256..1280 inputs, one
//! to five blocks) and the row counts and dtypes are chosen so that the simulator compiles about
//! a hundred and seventy kernel variants (template ints are baked per geometry), once per cache.
#![cfg(feature = "metal-sim")]

#[macro_use]
mod common;

use std::sync::Once;

use common::metal_mode::Mode;
use common::to_f64;
use mlx_trellis::trellis::metal::gate_up_factored::{
    gate_up_factored_row, gate_up_factored_rows, swiglu_factored_row, swiglu_factored_rows,
};
use mlx_trellis::trellis::metal::gate_up_mma::{gate_up_mma, gate_up_mma_pass, swiglu_mma, swiglu_mma_pass, UpPass};
use mlx_trellis::trellis::reference::{forward_f64, rel_err, swiglu_f64};
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{
    synthetic_layer, synthetic_mlp, CodeLayout, ForwardPath, HostLayer, TrellisGeometry, TrellisLinear, TrellisMlp,
};
use mlx_trellis::{Dtype, ErrorKind, KernelSource, LaunchConfig, MetalKernel, MetalSimScope, MlxArray, Result};

/// Sets `MSL_SIM_STRICT=1` for the simulator's kernel processes, once, before any test of this
/// binary runs a kernel: every test calls this first, and `Once` holds the others back until it
/// is set, so no thread reads the environment while it changes.
fn strict() {
    static STRICT: Once = Once::new();
    STRICT.call_once(|| std::env::set_var("MSL_SIM_STRICT", "1"));
}

/// The relErr gate of an axis-1 kernel's output against the f64 reference: [`common::gate`] in
/// 16 bits; 1e-5 in f32, tighter than the common gate because these kernels write each output
/// straight from its f32 sum (no partials, no fold), so f32 accumulation is the only error.
fn gate(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::Float32 => 1e-5,
        _ => common::gate(dtype),
    }
}

/// A seeded synthetic axis-1 layer (`rows` outputs, `cols` inputs) on the host and on MLX, its
/// scales about `1/sqrt(cols)` so outputs are of order one (SwiGLU's curve matters).
struct Up {
    host: HostLayer,
    lin: TrellisLinear,
}

impl Up {
    fn new(rows: usize, cols: usize, k: u32, l: u32, seed: u64) -> Up {
        let scale = (1.0 / (cols as f64).sqrt()) as f32;
        let host = synthetic_layer(rows, cols, k, l, 1, CodeLayout::RowMajor, scale, seed).unwrap();
        Up::from_host(host)
    }

    fn from_host(host: HostLayer) -> Up {
        let lin = TrellisLinear::from_host("up_proj", &host).unwrap();
        Up { host, lin }
    }

    fn g(&self) -> &TrellisGeometry {
        self.lin.geometry()
    }

    fn reference(&self, xr: &[f64], m: usize) -> Vec<f64> {
        forward_f64(xr, m, &self.host.codes, &self.host.scales, self.g()).unwrap()
    }
}

/// A gate and an up layer of one geometry (different codes and scales).
struct Pair {
    gate: Up,
    up: Up,
}

impl Pair {
    fn new(rows: usize, cols: usize, k: u32, l: u32) -> Pair {
        let seed = (rows * 131 + cols * 7) as u64 + 10 * k as u64 + l as u64;
        Pair { gate: Up::new(rows, cols, k, l, seed), up: Up::new(rows, cols, k, l, seed ^ 0x5eed) }
    }

    fn g(&self) -> &TrellisGeometry {
        self.gate.g()
    }

    fn reference(&self, xr: &[f64], m: usize) -> Vec<f64> {
        swiglu_f64(xr, m, &self.gate.host, &self.up.host).unwrap()
    }
}

/// Seeded standard-normal activations `[m, cols]` in `dtype`, and their values as the kernels see
/// them.
fn x(m: usize, cols: usize, dtype: Dtype) -> (MlxArray, Vec<f64>) {
    let x = MlxArray::from_slice(&gaussian(m * cols, 1000 * m as u64 + cols as u64).unwrap(), &[m, cols])
        .unwrap()
        .astype(dtype)
        .unwrap();
    let xr = to_f64(&x);
    (x, xr)
}

/// Runs `f` on `x`, checks the output's shape `[m, out]` and dtype, and returns its values.
fn run(what: &str, g: &TrellisGeometry, x: &MlxArray, f: &dyn Fn(&MlxArray) -> Result<MlxArray>) -> Vec<f64> {
    let (m, dtype) = (x.shape()[0], x.dtype());
    let y = f(x).unwrap_or_else(|e| panic!("{what} {g} M {m} {dtype}: {e:#}"));
    assert_eq!((y.shape(), y.dtype()), (vec![m, g.rows], dtype), "{what} {g} M {m}");
    to_f64(&y)
}

/// The worst relErr seen per kernel and dtype, printed at the end of a test.
#[derive(Default)]
struct Worst(Vec<(String, Dtype, f64)>);

impl Worst {
    /// Checks `got` against `want` under the dtype's gate and records the error.
    fn check(&mut self, what: &str, g: &TrellisGeometry, m: usize, dtype: Dtype, got: &[f64], want: &[f64]) {
        let err = rel_err(got, want).unwrap();
        assert!(err < gate(dtype), "{what} {g} M {m} {dtype}: relErr {err:.3e} against the f64 reference");
        match self.0.iter_mut().find(|(w, d, _)| w == what && *d == dtype) {
            Some(entry) => entry.2 = entry.2.max(err),
            None => self.0.push((what.to_string(), dtype, err)),
        }
    }

    fn print(&self) {
        for (what, dtype, err) in &self.0 {
            println!("{what} {dtype}: worst relErr {err:.2e}");
        }
    }
}

type Kernel = fn(&MlxArray, &MlxArray, &MlxArray, &TrellisGeometry) -> Result<MlxArray>;
type Fused = fn(&MlxArray, &MlxArray, &MlxArray, &MlxArray, &MlxArray, &TrellisGeometry) -> Result<MlxArray>;

fn linear(kernel: Kernel, c: &Up) -> impl Fn(&MlxArray) -> Result<MlxArray> + '_ {
    move |x| kernel(x, c.lin.codes(), c.lin.scales(), c.g())
}

fn fused(kernel: Fused, p: &Pair) -> impl Fn(&MlxArray) -> Result<MlxArray> + '_ {
    move |x| kernel(x, p.gate.lin.codes(), p.gate.lin.scales(), p.up.lin.codes(), p.up.lin.scales(), p.g())
}

/// The factored form for `m` rows: the row kernel for one, the rows kernel for 2..8.
fn factored(m: usize) -> (&'static str, Kernel) {
    if m == 1 {
        ("gate_up_factored_row", gate_up_factored_row)
    } else {
        ("gate_up_factored_rows", gate_up_factored_rows)
    }
}

fn factored_swiglu(m: usize) -> (&'static str, Fused) {
    if m == 1 {
        ("swiglu_factored_row", swiglu_factored_row)
    } else {
        ("swiglu_factored_rows", swiglu_factored_rows)
    }
}

/// (output rows, inputs, k, L): every k at every L the arithmetic forms serve, output rows
/// that are not multiples of the 16 rows a threadgroup of the row kernels covers (nor, mostly,
/// of 8), inputs of one block and of several.
const FACTORED_SHAPES: [(usize, usize, u32, u32); 9] = [
    (37, 256, 2, 8),
    (70, 768, 2, 12),
    (45, 512, 2, 16),
    (21, 512, 3, 8),
    (100, 256, 3, 12),
    (33, 1280, 3, 16),
    (50, 768, 4, 8),
    (9, 512, 4, 12),
    (64, 256, 4, 16),
];

/// (output rows, inputs, k, L) for the MMA form (L at most 12): output rows not multiples of
/// the 16 rows (two tiles of 8) a SIMD group covers, nor of 8.
/// The L <= 12 shapes of [`FACTORED_SHAPES`] (so that the dispatch and wrap tests reuse the
/// compiled kernels).
const MMA_SHAPES: [(usize, usize, u32, u32); 6] =
    [(70, 768, 2, 12), (37, 256, 2, 8), (100, 256, 3, 12), (21, 512, 3, 8), (9, 512, 4, 12), (50, 768, 4, 8)];

fn factored_forms(mode: Mode) {
    let _sim = mode.scope();
    let mut worst = Worst::default();
    for (i, &(rows, cols, k, l)) in FACTORED_SHAPES.iter().enumerate() {
        let c = Up::new(rows, cols, k, l, i as u64 + 1);
        // Every row count 1..8 in f32 on one shape per k (L 12), a spread on the others; f16
        // and bf16 at one, a few and eight rows on one shape per k and L.
        let f32_rows: &[usize] = if i % 3 == 1 { &[1, 2, 3, 4, 5, 6, 7, 8] } else { &[1, 2, 5, 8] };
        let half_rows: &[usize] = [&[1, 3][..], &[8], &[1, 8]][i % 3];
        let runs = f32_rows
            .iter()
            .map(|&m| (m, Dtype::Float32))
            .chain(half_rows.iter().flat_map(|&m| [(m, Dtype::Float16), (m, Dtype::Bfloat16)]));
        for (m, dtype) in runs {
            let (x, xr) = x(m, cols, dtype);
            let (what, kernel) = factored(m);
            let got = run(what, c.g(), &x, &linear(kernel, &c));
            worst.check(what, c.g(), m, dtype, &got, &c.reference(&xr, m));
        }
    }
    worst.print();
}

fn mma_form(mode: Mode) {
    let _sim = mode.scope();
    let mut worst = Worst::default();
    for (i, &(rows, cols, k, l)) in MMA_SHAPES.iter().enumerate() {
        let c = Up::new(rows, cols, k, l, 100 + i as u64);
        // Row counts inside one block of 8, across blocks, past one pass (MT <= 4 blocks) and
        // not multiples of 8; f16 and bf16 at a few.
        let f32_rows: &[usize] = if i % 2 == 0 { &[1, 7, 9, 16, 23, 40, 64] } else { &[3, 12, 33, 57] };
        let half_rows: &[usize] = if i % 2 == 0 { &[26] } else { &[5] };
        let runs = f32_rows
            .iter()
            .map(|&m| (m, Dtype::Float32))
            .chain(half_rows.iter().flat_map(|&m| [(m, Dtype::Float16), (m, Dtype::Bfloat16)]));
        for (m, dtype) in runs {
            let (x, xr) = x(m, cols, dtype);
            let got = run("gate_up_mma", c.g(), &x, &linear(gate_up_mma, &c));
            worst.check("gate_up_mma", c.g(), m, dtype, &got, &c.reference(&xr, m));
        }
    }
    worst.print();
}

fn fused_forms(mode: Mode) {
    let _sim = mode.scope();
    let mut worst = Worst::default();
    // The arithmetic forms at every k (L 8, 12, 16), the MMA form at every k (L 8, 12).
    for (i, &(rows, cols, k, l)) in [(37, 512, 2, 16), (70, 256, 3, 12), (45, 768, 4, 8)].iter().enumerate() {
        let p = Pair::new(rows, cols, k, l);
        for &m in &[1, 2, 4, 8] {
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                if dtype != Dtype::Float32 && m != [1, 4, 8][i] {
                    continue;
                }
                let (x, xr) = x(m, cols, dtype);
                let (what, kernel) = factored_swiglu(m);
                let got = run(what, p.g(), &x, &fused(kernel, &p));
                worst.check(what, p.g(), m, dtype, &got, &p.reference(&xr, m));
            }
        }
    }
    for &(rows, cols, k, l, ms) in
        &[(44, 512, 2, 12, &[1usize, 9, 40][..]), (37, 256, 3, 8, &[17, 64][..]), (53, 768, 4, 12, &[6, 33][..])]
    {
        let p = Pair::new(rows, cols, k, l);
        for &m in ms {
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                if dtype != Dtype::Float32 && m != ms[0] {
                    continue;
                }
                let (x, xr) = x(m, cols, dtype);
                let got = run("swiglu_mma", p.g(), &x, &fused(swiglu_mma, &p));
                worst.check("swiglu_mma", p.g(), m, dtype, &got, &p.reference(&xr, m));
            }
        }
    }
    worst.print();
}

fn mma_passes_are_bit_identical(mode: Mode) {
    // The pass shape (output tiles per SIMD group, blocks of 8 rows per pass) never changes a
    // sum: every output accumulates the same MMAs in the same order.
    let _sim = mode.scope();
    let c = Up::new(37, 512, 3, 12, 7);
    let p = Pair::new(37, 512, 3, 12);
    let passes = [UpPass { nt: 1, mt: 1 }, UpPass { nt: 2, mt: 3 }, UpPass { nt: 4, mt: 2 }, UpPass { nt: 3, mt: 8 }];
    for m in [5, 19] {
        let (x, _) = x(m, 512, Dtype::Float32);
        let bits = |v: Vec<f64>| v.into_iter().map(f64::to_bits).collect::<Vec<_>>();
        let lin = |pass: UpPass| {
            bits(run("gate_up_mma_pass", c.g(), &x, &|x| {
                gate_up_mma_pass(x, c.lin.codes(), c.lin.scales(), c.g(), pass)
            }))
        };
        let fus = |pass: UpPass| {
            bits(run("swiglu_mma_pass", p.g(), &x, &|x| {
                swiglu_mma_pass(
                    x,
                    p.gate.lin.codes(),
                    p.gate.lin.scales(),
                    p.up.lin.codes(),
                    p.up.lin.scales(),
                    p.g(),
                    pass,
                )
            }))
        };
        let (first, first_fused) = (lin(passes[0]), fus(passes[0]));
        for &pass in &passes[1..] {
            assert!(lin(pass) == first, "M {m}: pass {pass:?} differs from {:?}", passes[0]);
            assert!(fus(pass) == first_fused, "fused, M {m}: pass {pass:?} differs from {:?}", passes[0]);
        }
        println!("M {m}: {} passes bit-identical (one projection and fused)", passes.len());
    }
}

fn dispatch(mode: Mode) {
    // forward_with(Metal / MetalSim) on axis-1 layers: 1 row the factored row kernel, 2..8 its
    // rows kernel, more the MMA kernel; L above 12 has no MMA form, so more than 8 rows of it are
    // refused as unserved (Auto falls back to the generic path).
    let path = mode.path();
    let mut worst = Worst::default();
    for (i, &(rows, cols, k, l)) in
        [(70, 768, 2, 12), (100, 256, 3, 12), (9, 512, 4, 12), (45, 512, 2, 16)].iter().enumerate()
    {
        let c = Up::new(rows, cols, k, l, 200 + i as u64);
        for m in [1, 2, 8, 9, 40] {
            let (x, xr) = x(m, cols, Dtype::Float32);
            if l > 12 && m > 8 {
                let e = c.lin.forward_with(&x, path).expect_err("an unserved call must be refused");
                assert_eq!(e.kind(), ErrorKind::Unserved, "{path} {} M {m}: {e}", c.g());
                continue;
            }
            let got = run(path.name(), c.g(), &x, &|x| c.lin.forward_with(x, path));
            worst.check(path.name(), c.g(), m, Dtype::Float32, &got, &c.reference(&xr, m));
        }
    }
    worst.print();
}

/// The f64 reference of `mlp`'s host layers assembled from the separate references: gate and up
/// combined by SwiGLU, then the down projection of that.
fn mlp_reference(host: &(HostLayer, HostLayer, HostLayer), xr: &[f64], m: usize) -> (Vec<f64>, Vec<f64>) {
    let h = swiglu_f64(xr, m, &host.0, &host.1).unwrap();
    let y = forward_f64(&h, m, &host.2.codes, &host.2.scales, &host.2.geometry).unwrap();
    (h, y)
}

fn mlp(mode: Mode) {
    // TrellisMlp on the Metal path: the fused gate·up·SwiGLU kernel, then the upstream down kernels
    // (whose dispatch by rows differs: 1, 2..3, 4..8, wide from 9), against three separate
    // reference projections. 136 intermediate rows: 17 tiles of 8, not a multiple of 16.
    let path = mode.path();
    let mut worst = Worst::default();
    for (k, layout, runs) in [
        (2, CodeLayout::RowMajor, &[(1, Dtype::Float32), (3, Dtype::Float32), (9, Dtype::Float32)][..]),
        (3, CodeLayout::K3Interleaved, &[(2, Dtype::Bfloat16), (24, Dtype::Bfloat16), (5, Dtype::Float32)][..]),
        (4, CodeLayout::RowMajor, &[(8, Dtype::Float16), (17, Dtype::Float16), (1, Dtype::Bfloat16)][..]),
    ] {
        let host = synthetic_mlp(512, 136, k, layout, 40 + k as u64).unwrap();
        let lin = |name: &str, h: &HostLayer| TrellisLinear::from_host(name, h).unwrap();
        let mlp =
            TrellisMlp::new(lin("gate_proj", &host.0), lin("up_proj", &host.1), lin("down_proj", &host.2)).unwrap();
        for &(m, dtype) in runs {
            let (x, xr) = x(m, 512, dtype);
            let (h_want, y_want) = mlp_reference(&host, &xr, m);
            let h = mlp.swiglu_with(&x, path).unwrap_or_else(|e| panic!("SwiGLU k {k} M {m} {dtype}: {e:#}"));
            assert_eq!((h.shape(), h.dtype()), (vec![m, 136], dtype));
            worst.check("TrellisMlp::swiglu_with", mlp.gate().geometry(), m, dtype, &to_f64(&h), &h_want);
            let y = mlp.forward_with(&x, path).unwrap_or_else(|e| panic!("MLP k {k} M {m} {dtype}: {e:#}"));
            assert_eq!((y.shape(), y.dtype()), (vec![m, 512], dtype));
            // The same activations through the fused kernel's output, rounded to the dtype, and
            // the down kernels: the intermediate rounding is the only difference from the f64 MLP.
            worst.check("TrellisMlp::forward_with", mlp.down().geometry(), m, dtype, &to_f64(&y), &y_want);
        }
    }
    worst.print();
}

/// `host` with every block's words zeroed except its first, which `fill` gives (per row, block).
fn first_words_only(host: &HostLayer, mut fill: impl FnMut() -> u32) -> HostLayer {
    let mut out = host.clone();
    let wpb = host.geometry.words_per_block();
    for (i, w) in out.codes.iter_mut().enumerate() {
        *w = if i % wpb == 0 { fill() } else { 0 };
    }
    out
}

fn wraparound(mode: Mode) {
    // Codes whose only set bits sit in each block's first word, and activations that are zero
    // except at the positions whose L-bit window wraps past the block's end (t < (L - k) / k,
    // windows that start in the block's last word and continue at its bit 0): every output is a
    // sum over wrapped windows only. The same layer with other first words gives other outputs
    // (so the test sees the wrap), and a decode that read the next block's word (or zeros) past
    // the end would get these wrong.
    let _sim = mode.scope();
    let mut rng = mlx_trellis::trellis::synthetic::SplitMix64::new(0x7a11);
    let wrapped_x = |m: usize, cols: usize, k: u32, l: u32| {
        let wraps = ((l - k) as usize).div_ceil(k as usize);
        let v: Vec<f32> = gaussian(m * cols, 77)
            .unwrap()
            .into_iter()
            .enumerate()
            .map(|(i, v)| if (i % cols) % 256 < wraps { v } else { 0.0 })
            .collect();
        let x = MlxArray::from_slice(&v, &[m, cols]).unwrap();
        let xr = to_f64(&x);
        (x, xr)
    };
    for &(rows, cols, k, l, ms) in
        &[(70, 768, 2, 12, &[1usize, 3, 9][..]), (9, 512, 4, 12, &[1, 9][..]), (45, 512, 2, 16, &[2][..])]
    {
        let base = Up::new(rows, cols, k, l, 300);
        let c = Up::from_host(first_words_only(&base.host, || rng.next_u32()));
        let other = Up::from_host(first_words_only(&base.host, || rng.next_u32()));
        for &m in ms {
            let (x, xr) = wrapped_x(m, cols, k, l);
            let (want, want_other) = (c.reference(&xr, m), other.reference(&xr, m));
            assert!(rel_err(&want_other, &want).unwrap() > 0.1, "{} M {m}: the wrapped windows must matter", c.g());
            let (what, got) = if m > 8 {
                ("gate_up_mma", run("gate_up_mma", c.g(), &x, &linear(gate_up_mma, &c)))
            } else {
                let (what, kernel) = factored(m);
                (what, run(what, c.g(), &x, &linear(kernel, &c)))
            };
            let err = rel_err(&got, &want).unwrap();
            println!("{what} {} M {m}, wrapped windows only: relErr {err:.2e}", c.g());
            assert!(err < gate(Dtype::Float32), "{what} {} M {m}: relErr {err:.3e} on wrapped windows", c.g());
        }
    }
    // The fused kernels on wrapped windows of both projections.
    for &(rows, cols, k, l, ms) in &[(37, 512, 2, 16, &[1usize, 4][..]), (44, 512, 2, 12, &[9][..])] {
        let base = Pair::new(rows, cols, k, l);
        let p = Pair {
            gate: Up::from_host(first_words_only(&base.gate.host, || rng.next_u32())),
            up: Up::from_host(first_words_only(&base.up.host, || rng.next_u32())),
        };
        for &m in ms {
            let (x, xr) = wrapped_x(m, cols, k, l);
            let (what, got) = if m > 8 {
                ("swiglu_mma", run("swiglu_mma", p.g(), &x, &fused(swiglu_mma, &p)))
            } else {
                let (what, kernel) = factored_swiglu(m);
                (what, run(what, p.g(), &x, &fused(kernel, &p)))
            };
            let err = rel_err(&got, &p.reference(&xr, m)).unwrap();
            println!("{what} {} M {m}, wrapped windows only: relErr {err:.2e}", p.g());
            assert!(err < gate(Dtype::Float32), "{what} {} M {m}: relErr {err:.3e} on wrapped windows", p.g());
        }
    }
}

on_sim_and_metal! {
    setup = strict;
    factored_forms => factored_forms_match_the_reference_sim, factored_forms_match_the_reference_metal;
    mma_form => mma_form_matches_the_reference_sim, mma_form_matches_the_reference_metal;
    fused_forms => fused_swiglu_forms_match_the_reference_sim, fused_swiglu_forms_match_the_reference_metal;
    mma_passes_are_bit_identical => mma_passes_are_bit_identical_sim, mma_passes_are_bit_identical_metal;
    dispatch => dispatch_picks_the_axis_1_kernels_sim, dispatch_picks_the_axis_1_kernels_metal;
    mlp => mlp_runs_fused_swiglu_then_down_sim, mlp_runs_fused_swiglu_then_down_metal;
    wraparound => wrapped_windows_decode_inside_their_block_sim, wrapped_windows_decode_inside_their_block_metal;
}

/// The error's kind and full text (context chain included).
fn error_of(r: Result<MlxArray>) -> (ErrorKind, String) {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => (e.kind(), format!("{e:#}")),
    }
}

#[test]
fn bad_inputs_and_unserved_calls_give_typed_errors() {
    // Checks run before any kernel is applied, so this needs neither Metal nor the simulator
    // (a check that let a call through would fail at apply with an MLX error, not these kinds).
    use ErrorKind::{InvalidArgument as Invalid, Unserved};
    let p = Pair::new(37, 512, 2, 12);
    let c = &p.gate;
    let l16 = Up::new(45, 512, 2, 16, 1);
    let k5 = Up::new(16, 256, 5, 12, 2);
    let down = Up::from_host(synthetic_layer(512, 256, 2, 12, 0, CodeLayout::RowMajor, 0.02, 3).unwrap());
    let t128 = {
        let g = TrellisGeometry::row_major(16, 512, 2, 128, 12, 1).unwrap();
        let codes = MlxArray::from_slice(&vec![0x9e37_79b9u32; 16 * 32], &g.codes_shape()).unwrap();
        TrellisLinear::new("t128", codes, MlxArray::ones(&[16], Dtype::Float16).unwrap(), 2, 128, 12, 1).unwrap()
    };
    let zeros = |m: usize, w: usize, d: Dtype| MlxArray::zeros(&[m, w], d).unwrap();
    let x1 = zeros(1, 512, Dtype::Float32);
    let lin = |k: Kernel, u: &Up, x: &MlxArray| error_of(k(x, u.lin.codes(), u.lin.scales(), u.g()));
    let fus = |k: Fused, up: (&MlxArray, &MlxArray), x: &MlxArray| {
        error_of(k(x, p.gate.lin.codes(), p.gate.lin.scales(), up.0, up.1, p.g()))
    };
    let up = (p.up.lin.codes(), p.up.lin.scales());
    let f32_scales = MlxArray::ones(&[37], Dtype::Float32).unwrap();
    let cases: Vec<((ErrorKind, String), ErrorKind, &str)> = vec![
        // Wrong widths, dtypes and operands.
        (
            lin(gate_up_factored_row, c, &zeros(1, 768, Dtype::Float32)),
            Invalid,
            "activations [1, 768] must be [M >= 1, 512]",
        ),
        (lin(gate_up_mma, c, &zeros(9, 256, Dtype::Float32)), Invalid, "activations [9, 256] must be [M >= 1, 512]"),
        (lin(gate_up_factored_rows, c, &zeros(3, 512, Dtype::Int32)), Invalid, "activations are int32"),
        (lin(gate_up_mma, c, &zeros(0, 512, Dtype::Float32)), Invalid, "must be [M >= 1, 512]"),
        (
            fus(swiglu_factored_row, (c.lin.codes(), &f32_scales), &x1),
            Invalid,
            "swigluFactoredRow (up projection): codes",
        ),
        (fus(swiglu_mma, (l16.lin.codes(), l16.lin.scales()), &zeros(9, 512, Dtype::Float32)), Invalid, "do not match"),
        (
            error_of(gate_up_mma_pass(&x1, c.lin.codes(), c.lin.scales(), c.g(), UpPass { nt: 0, mt: 1 })),
            Invalid,
            "pass UpPass { nt: 0, mt: 1 } needs nt in 1..=4 and mt in 1..=8",
        ),
        (
            error_of(swiglu_mma_pass(&x1, up.0, up.1, up.0, up.1, p.g(), UpPass { nt: 1, mt: 9 })),
            Invalid,
            "needs nt in 1..=4 and mt in 1..=8",
        ),
        // Row counts, geometries and L that a form does not serve.
        (lin(gate_up_factored_row, c, &zeros(2, 512, Dtype::Float32)), Unserved, "serves one activation row (got 2)"),
        (lin(gate_up_factored_rows, c, &zeros(9, 512, Dtype::Float32)), Unserved, "M=9 outside 2..8"),
        (fus(swiglu_factored_rows, up, &x1), Unserved, "swigluFactoredRows: M=1 outside 2..8"),
        (lin(gate_up_mma, &l16, &zeros(9, 512, Dtype::Float32)), Unserved, "L <= 12"),
        (lin(gate_up_mma, &k5, &zeros(9, 256, Dtype::Float32)), Unserved, "k 2..4"),
        (lin(gate_up_factored_row, &k5, &zeros(1, 256, Dtype::Float32)), Unserved, "k 2..4"),
        (lin(gate_up_factored_rows, &down, &zeros(2, 512, Dtype::Float32)), Unserved, "serves axis-1"),
        (error_of(gate_up_mma(&x1, t128.codes(), t128.scales(), t128.geometry())), Unserved, "T 256"),
        // The Metal path of a layer and of an MLP.
        (
            error_of(k5.lin.forward_with(&zeros(1, 256, Dtype::Float32), ForwardPath::MetalSim)),
            Unserved,
            "do not serve",
        ),
        (error_of(t128.forward_with(&x1, ForwardPath::Metal)), Unserved, "do not serve"),
        (error_of(c.lin.forward_with(&zeros(2, 500, Dtype::Float32), ForwardPath::MetalSim)), Invalid, "500 features"),
    ];
    for ((kind, got), want_kind, want) in &cases {
        assert_eq!(kind, want_kind, "{got}");
        assert!(got.contains(want), "expected {want:?} in {got:?}");
    }
    // Gate and up of different bit widths (a valid MLP) have no fused kernel: the Metal path
    // runs them projection by projection (checked against the f64 reference in tests/rotation.rs);
    // the fused entry point itself refuses them as unserved. An MLP of L 16 at more than 8 rows
    // is unserved either way.
    let host = synthetic_mlp(256, 64, 2, CodeLayout::RowMajor, 5).unwrap();
    let up3 = synthetic_layer(64, 256, 3, 12, 1, CodeLayout::RowMajor, 0.06, 6).unwrap();
    let l = |name: &str, h: &HostLayer| TrellisLinear::from_host(name, h).unwrap();
    let mixed = TrellisMlp::new(l("gate", &host.0), l("up", &up3), l("down", &host.2)).unwrap();
    assert!(!mixed.fuses_gate_up());
    let x = zeros(1, 256, Dtype::Float32);
    assert_eq!(mixed.forward_with(&x, ForwardPath::MetalSim).unwrap().shape(), vec![1, 256]);
    let e = mlx_trellis::trellis::metal::swiglu_sim(&x, mixed.gate(), mixed.up()).unwrap_err();
    assert_eq!(e.kind(), Unserved, "{e:#}");
    assert!(format!("{e:#}").contains("needs gate and up of one geometry"), "{e:#}");
    let g16 = synthetic_layer(64, 256, 2, 16, 1, CodeLayout::RowMajor, 0.06, 7).unwrap();
    let u16 = synthetic_layer(64, 256, 2, 16, 1, CodeLayout::RowMajor, 0.06, 8).unwrap();
    let mlp16 = TrellisMlp::new(l("gate", &g16), l("up", &u16), l("down", &host.2)).unwrap();
    let e = mlp16.swiglu_with(&zeros(9, 256, Dtype::Float32), ForwardPath::MetalSim).unwrap_err();
    assert_eq!(e.kind(), Unserved, "{e:#}");
    println!("{} error paths checked", cases.len() + 3);
}

#[test]
fn strict_lane_checks_are_on_sim() {
    // The simulator's strict mode is on in this binary: a shuffle from lane 32 is an error (it
    // would be a poison value otherwise), so the kernel tests above ran under it.
    strict();
    assert_eq!(std::env::var("MSL_SIM_STRICT").as_deref(), Ok("1"));
    let src = KernelSource::new(
        "metal_mlp_strict_probe",
        &["x"],
        &["out"],
        "uint i = thread_position_in_grid.x;\n  out[i] = simd_shuffle(x[i], (ushort)(i + 8));",
    );
    let kernel = MetalKernel::new(src, false).unwrap();
    let x = MlxArray::from_slice(&[1.0f32; 32], &[32]).unwrap();
    let cfg = LaunchConfig::new([32, 1, 1], [32, 1, 1]).output(&[32], Dtype::Float32);
    let _sim = MetalSimScope::enter();
    let e = kernel.apply(&[&x], &cfg).expect_err("strict mode must refuse an out-of-range shuffle");
    assert!(e.to_string().contains("not a valid SIMD lane"), "{e}");
}

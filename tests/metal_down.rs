//! The Metal down kernels (factored, MMA, wide MMA, scatter baseline) against the f64 reference
//! and against each other.
//!
//! Every kernel test runs twice: `*_sim` on the CPU simulator of MLX's Metal wrapping (inside a
//! `MetalSimScope`, on any machine), and `*_metal` on real Metal when MLX's back-end is Metal
//! (it skips, saying why, elsewhere). `MSL_SIM_STRICT=1` makes an out-of-range `simd_shuffle`
//! lane an error instead of a poison value:
//!
//! ```text
//! MSL_SIM_STRICT=1 cargo test --release --features metal-sim --test metal_down
//! ```
//!
//! Shapes are small (input rows 64..520 with some not divisible by 128 or 8, 512 or 1024
//! outputs, k = 2, 3, 4 row-major and k = 3 interleaved) and the row counts and dtypes are
//! chosen so that the simulator compiles about a hundred and thirty kernel variants (template
//! ints are baked per geometry), once per cache.
#![cfg(feature = "metal-sim")]

use mlx_trellis::trellis::metal::down_factored::{down_factored_row, down_factored_rows};
use mlx_trellis::trellis::metal::down_k3_interleaved_factored::{
    down_k3_interleaved_factored_row, down_k3_interleaved_factored_rows,
};
use mlx_trellis::trellis::metal::down_mma::{down_k3_interleaved_mma, down_mma};
use mlx_trellis::trellis::metal::down_mma_wide::{
    down_k3_interleaved_mma_wide, down_k3_interleaved_mma_wide_pass, down_mma_wide, down_mma_wide_pass, passes, plan,
    plan_in_blocks, DownPass, DOWN_ONE_BLOCK,
};
#[macro_use]
mod common;

use common::metal_mode::Mode;
use common::{gate, to_f64, Case};
use mlx_trellis::trellis::metal::trellis_scatter::trellis_scatter;
use mlx_trellis::trellis::reference::rel_err;
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{synthetic_layer, CodeLayout, ForwardPath, TrellisGeometry, TrellisLinear};
use mlx_trellis::{backend, Backend, Dtype, ErrorKind, MetalSimScope, MlxArray, Result};

type Kernel = fn(&MlxArray, &MlxArray, &MlxArray, &TrellisGeometry) -> Result<MlxArray>;

fn call(c: &Case, kernel: Kernel, x: &MlxArray) -> Result<MlxArray> {
    kernel(x, c.lin.codes(), c.lin.scales(), c.g())
}

fn shapes(list: &[(usize, usize, u32, CodeLayout)]) -> Vec<Case> {
    list.iter().map(|&(r, c, k, l)| Case::new(r, c, k, l)).collect()
}

use CodeLayout::{K3Interleaved as IL, RowMajor as RM};

/// Checks `kernel` against the f64 reference and against the scatter baseline for every shape,
/// with f32 activations at `m_f32` rows and bf16 ones at `m_bf16`.
fn against_reference_and_scatter(
    mode: Mode,
    what: &str,
    cases: &[Case],
    m_f32: &[usize],
    m_bf16: &[usize],
    kernel: &dyn Fn(usize, &Case) -> Kernel,
) {
    let _sim = mode.scope();
    let runs = m_f32.iter().map(|&m| (m, Dtype::Float32)).chain(m_bf16.iter().map(|&m| (m, Dtype::Bfloat16)));
    let runs: Vec<_> = runs.collect();
    for c in cases {
        for &(m, dtype) in &runs {
            let (x, xr) = c.x(m, dtype);
            let want = c.reference(&xr, m);
            let got = c.run(what, &x, &|x| call(c, kernel(m, c), x));
            let base = c.run("trellis_scatter", &x, &|x| call(c, trellis_scatter, x));
            let (e_ref, e_base, e_scatter) =
                (rel_err(&got, &want).unwrap(), rel_err(&got, &base).unwrap(), rel_err(&base, &want).unwrap());
            println!(
                "{what} {} M {m} {dtype}: relErr {e_ref:.2e} (scatter: {e_base:.2e}; scatter itself {e_scatter:.2e})",
                c.g()
            );
            let tol = gate(dtype);
            assert!(e_ref < tol, "{what} {} M {m} {dtype}: relErr {e_ref:.3e} against the reference", c.g());
            assert!(e_base < tol, "{what} {} M {m} {dtype}: relErr {e_base:.3e} against the scatter baseline", c.g());
            assert!(
                e_scatter < tol,
                "trellis_scatter {} M {m} {dtype}: relErr {e_scatter:.3e} against the reference",
                c.g()
            );
        }
    }
}

fn factored_row_major(mode: Mode) {
    let cases = shapes(&[(64, 512, 2, RM), (203, 1024, 3, RM), (520, 512, 4, RM)]);
    let pick = |m: usize, _: &Case| -> Kernel {
        if m == 1 {
            down_factored_row
        } else {
            down_factored_rows
        }
    };
    against_reference_and_scatter(mode, "down_factored_row(s)", &cases, &[1, 2, 3, 4], &[1, 3], &pick);
}

fn factored_interleaved(mode: Mode) {
    let cases = shapes(&[(136, 1024, 3, IL), (99, 512, 3, IL)]);
    let pick = |m: usize, _: &Case| -> Kernel {
        if m == 1 {
            down_k3_interleaved_factored_row
        } else {
            down_k3_interleaved_factored_rows
        }
    };
    against_reference_and_scatter(mode, "down_k3_interleaved_factored_row(s)", &cases, &[1, 2, 3, 4], &[1, 3], &pick);
}

fn mma(mode: Mode) {
    let cases =
        shapes(&[(64, 512, 2, RM), (203, 1024, 3, RM), (520, 512, 4, RM), (136, 1024, 3, IL), (99, 512, 3, IL)]);
    let pick = |_: usize, c: &Case| -> Kernel {
        if c.g().layout() == IL {
            down_k3_interleaved_mma
        } else {
            down_mma
        }
    };
    against_reference_and_scatter(mode, "down_mma", &cases, &[1, 2, 3, 4, 5, 6, 7, 8], &[3, 8], &pick);
}

fn mma_wide(mode: Mode) {
    // The wide kernel needs input rows in whole steps of 8.
    let cases = shapes(&[(64, 512, 2, RM), (328, 1024, 3, RM), (520, 512, 4, RM), (136, 1024, 3, IL)]);
    let pick = |_: usize, c: &Case| -> Kernel {
        if c.g().layout() == IL {
            down_k3_interleaved_mma_wide
        } else {
            down_mma_wide
        }
    };
    against_reference_and_scatter(mode, "down_mma_wide", &cases, &[1, 8, 9, 16, 17, 24, 25, 40], &[9, 40], &pick);
}

fn scatter_any_rows(mode: Mode) {
    // The baseline alone, at row counts no other test gives it (its row count is a grid extent).
    let _sim = mode.scope();
    for c in shapes(&[(64, 512, 2, RM), (99, 512, 3, IL)]) {
        for m in [5, 33] {
            let (x, xr) = c.x(m, Dtype::Float32);
            let err = rel_err(&c.run("trellis_scatter", &x, &|x| call(&c, trellis_scatter, x)), &c.reference(&xr, m))
                .unwrap();
            println!("trellis_scatter {} M {m}: relErr {err:.2e}", c.g());
            assert!(err < 1e-4, "trellis_scatter {} M {m}: relErr {err:.3e}", c.g());
        }
    }
}

/// Runs one wide pass for `c`'s layout.
fn wide_pass(c: &Case, x: &MlxArray, pass: DownPass) -> Vec<f64> {
    let f = if c.g().layout() == IL { down_k3_interleaved_mma_wide_pass } else { down_mma_wide_pass };
    c.run(&format!("wide {pass:?}"), x, &|x| f(x, c.lin.codes(), c.lin.scales(), c.g(), pass))
}

fn wide_passes_are_bit_identical(mode: Mode) {
    let _sim = mode.scope();
    // Every pass of both plan tables on each layout: S and MT never change a sum.
    let mut all: Vec<DownPass> = Vec::new();
    for &(pass, _) in passes(RM).iter().chain(passes(IL)) {
        if !all.contains(&pass) {
            all.push(pass);
        }
    }
    for c in shapes(&[(64, 512, 2, RM), (136, 1024, 3, IL)]) {
        for m in [1, 9, 24, 40] {
            let (x, _) = c.x(m, Dtype::Float32);
            let first = wide_pass(&c, &x, all[0]);
            for &pass in &all[1..] {
                let other = wide_pass(&c, &x, pass);
                assert!(
                    first.iter().zip(&other).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} M {m}: pass {pass:?} differs from {:?}",
                    c.g(),
                    all[0]
                );
            }
            println!("{} M {m}: {} passes bit-identical", c.g(), all.len());
        }
        // The wide kernel is down_mma with a half table: the same sums, bit for bit (R % 8 == 0).
        let mma = if c.g().layout() == IL { down_k3_interleaved_mma } else { down_mma };
        for m in [1, 5, 8] {
            let (x, _) = c.x(m, Dtype::Float32);
            let a = wide_pass(&c, &x, DOWN_ONE_BLOCK);
            let b = c.run("down_mma", &x, &|x| call(&c, mma, x));
            assert!(
                a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{} M {m}: wide and down_mma differ",
                c.g()
            );
        }
    }
}

fn dispatch(mode: Mode) {
    // forward_with(Metal / MetalSim): 1 row factored, 2..3 factored rows, 4..8 MMA, more wide;
    // where the chosen kernel does not serve the call (input rows not a multiple of 8 above 8
    // rows) the forced path is refused as unserved, as on every back-end. An axis-1 layer goes
    // to the gate/up kernels (tested on their own in tests/metal_mlp.rs) and must match too.
    let path = mode.path();
    let mut cases = shapes(&[(64, 512, 2, RM), (203, 1024, 3, RM), (136, 1024, 3, IL)]);
    let up = synthetic_layer(64, 512, 2, 12, 1, RM, 0.02, 9).unwrap();
    cases.push(Case { lin: TrellisLinear::from_host("up", &up).unwrap(), host: up });
    for c in &cases {
        for m in [1, 2, 3, 4, 8, 9, 40] {
            let inf = c.lin.geometry().in_features();
            let x = MlxArray::from_slice(&gaussian(m * inf, 7 * m as u64).unwrap(), &[m, inf]).unwrap();
            let xr = to_f64(&x);
            let want = c.reference(&xr, m);
            let g = c.lin.geometry();
            if g.axis == 0 && m > 8 && g.rows % 8 != 0 {
                let e = c.lin.forward_with(&x, path).expect_err("an unserved call must be refused");
                assert_eq!(e.kind(), ErrorKind::Unserved, "{path} {} M {m}: {e}", c.g());
                continue;
            }
            let y = c.lin.forward_with(&x, path).unwrap_or_else(|e| panic!("{path} {} M {m}: {e:#}", c.g()));
            let err = rel_err(&to_f64(&y), &want).unwrap();
            println!("{path} {} M {m}: relErr {err:.2e}", c.g());
            assert!(err < 1e-4, "{path} {} M {m}: relErr {err:.3e}", c.g());
        }
    }
}

/// Layers in coded blocks shorter than 256 (what `quantize_model --fit-blocks` writes for an
/// axis 256 does not divide): SmolLM2's q/o (576 -> 576 in blocks of 192, k 3) and k/v shapes,
/// input rows not a multiple of 8 (the wide kernel refuses them), blocks of 64 and 128.
fn shorter_block_cases() -> Vec<Case> {
    vec![
        Case::in_blocks(576, 576, 3, 12, 192, 1),
        Case::in_blocks(48, 192, 2, 12, 192, 2),
        Case::in_blocks(100, 768, 4, 12, 192, 3),
        Case::in_blocks(40, 576, 3, 12, 64, 4),
        Case::in_blocks(64, 384, 2, 12, 128, 5),
    ]
}

fn shorter_blocks(mode: Mode) {
    let _sim = mode.scope();
    let path = mode.path();
    for c in shorter_block_cases() {
        let g = *c.g();
        let check = |what: &str, m: usize, dtype: Dtype, f: &dyn Fn(&MlxArray) -> Result<MlxArray>| {
            let (x, xr) = c.x(m, dtype);
            let err = rel_err(&c.run(what, &x, f), &c.reference(&xr, m)).unwrap();
            println!("{what} {g} M {m} {dtype}: relErr {err:.2e}");
            assert!(err < gate(dtype), "{what} {g} M {m} {dtype}: relErr {err:.3e}");
        };
        for (m, dtype) in [(1, Dtype::Float32), (4, Dtype::Float32), (8, Dtype::Float32), (3, Dtype::Bfloat16)] {
            check("down_mma", m, dtype, &|x| call(&c, down_mma, x));
        }
        if g.rows % 8 == 0 {
            for (m, dtype) in [(1, Dtype::Float32), (9, Dtype::Float32), (40, Dtype::Float32), (17, Dtype::Bfloat16)] {
                check("down_mma_wide", m, dtype, &|x| call(&c, down_mma_wide, x));
            }
            // The passes that tile the block give the same sums, bit for bit, and so does
            // down_mma (the wide kernel is it with a half table).
            let fitting: Vec<DownPass> = passes(RM).iter().map(|&(p, _)| p).filter(|p| g.t % (8 * p.s) == 0).collect();
            assert!(!fitting.is_empty(), "{g}");
            for m in [1, 8, 24] {
                let (x, _) = c.x(m, Dtype::Float32);
                let first = wide_pass(&c, &x, fitting[0]);
                for &pass in &fitting[1..] {
                    assert!(wide_pass(&c, &x, pass) == first, "{g} M {m}: pass {pass:?} differs from {:?}", fitting[0]);
                }
                if m <= 8 {
                    assert!(
                        c.run("down_mma", &x, &|x| call(&c, down_mma, x)) == first,
                        "{g} M {m}: wide and down_mma differ"
                    );
                }
            }
            // A pass whose SIMD group straddles two blocks is refused.
            if g.t % 128 != 0 {
                let (x, _) = c.x(1, Dtype::Float32);
                let e = down_mma_wide_pass(&x, c.lin.codes(), c.lin.scales(), &g, DOWN_ONE_BLOCK).unwrap_err();
                assert!(e.to_string().contains("8 S dividing the"), "{e}");
            }
        }
        // The layer's own dispatch: every row count, the wide kernel's refusal where R % 8 != 0.
        for m in [1, 2, 4, 8, 9, 40] {
            let (x, xr) = c.x(m, Dtype::Float32);
            match c.lin.forward_with(&x, path) {
                Err(e) if m > 8 && g.rows % 8 != 0 => {
                    assert_eq!(e.kind(), ErrorKind::Unserved, "{path} {g} M {m}: {e}")
                }
                y => {
                    let y = y.unwrap_or_else(|e| panic!("{path} {g} M {m}: {e:#}"));
                    let err = rel_err(&to_f64(&y), &c.reference(&xr, m)).unwrap();
                    assert!(err < gate(Dtype::Float32), "{path} {g} M {m}: relErr {err:.3e}");
                }
            }
        }
    }
}

on_sim_and_metal! {
    shorter_blocks => shorter_blocks_match_the_reference_sim, shorter_blocks_match_the_reference_metal;
    factored_row_major => factored_row_major_matches_reference_and_scatter_sim, factored_row_major_matches_reference_and_scatter_metal;
    factored_interleaved => factored_interleaved_matches_reference_and_scatter_sim, factored_interleaved_matches_reference_and_scatter_metal;
    mma => mma_matches_reference_and_scatter_sim, mma_matches_reference_and_scatter_metal;
    mma_wide => mma_wide_matches_reference_and_scatter_sim, mma_wide_matches_reference_and_scatter_metal;
    scatter_any_rows => scatter_serves_any_row_count_sim, scatter_serves_any_row_count_metal;
    wide_passes_are_bit_identical => wide_passes_are_bit_identical_sim, wide_passes_are_bit_identical_metal;
    dispatch => dispatch_matches_the_reference_sim, dispatch_matches_the_reference_metal;
}

#[test]
fn shorter_blocks_plan_passes_that_tile_them() {
    for m in 1..=200 {
        for layout in [RM, IL] {
            assert_eq!(plan_in_blocks(layout, m, 256), plan(layout, m), "M {m}");
        }
        // 192 and 64: 16 sub-tiles (128 positions) do not divide them; 128: the seed's passes.
        for t in [192, 64] {
            let p = plan_in_blocks(RM, m, t);
            assert!(p.s == 8 && t % (8 * p.s) == 0, "T {t} M {m}: {p:?}");
        }
        assert_eq!(plan_in_blocks(RM, m, 128), plan(RM, m), "M {m}");
    }
}

#[test]
fn plan_picks_the_seeds_passes() {
    let (a, b, c) = (DOWN_ONE_BLOCK, DownPass { s: 8, mt: 2 }, DownPass { s: 8, mt: 3 });
    assert_eq!(DOWN_ONE_BLOCK, DownPass { s: 16, mt: 1 });
    assert_eq!(passes(RM), &[(a, 0.6), (b, 1.0), (c, 1.44)]);
    assert_eq!(passes(IL), &[(a, 1.0)]);
    // Least ceil(M / (8 MT)) * cost, ties to more blocks (M 33..40: {16,1} and {8,2} both cost
    // 3, {8,3} 2.88).
    let table = [
        (1..=8, a),
        (9..=16, b),
        (17..=24, c),
        (25..=32, b),
        (33..=48, c),
        (49..=64, b),
        (65..=72, c),
        (73..=80, b),
        (81..=96, c),
        (97..=112, b),
        (113..=120, c),
        (121..=128, b),
    ];
    for (range, pass) in table {
        for m in range {
            assert_eq!(plan(RM, m), pass, "row-major M {m}");
            assert_eq!(plan(IL, m), DOWN_ONE_BLOCK, "interleaved M {m}");
        }
    }
}

/// The error's full text (context chain included).
fn error_of(r: Result<MlxArray>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn every_error_path_names_its_rule() {
    // Checks run before any kernel is applied, so this needs neither Metal nor the simulator.
    let rm = Case::new(64, 512, 2, RM);
    let rm3 = Case::new(203, 1024, 3, RM);
    let il = Case::new(136, 1024, 3, IL);
    let k5 = Case::new(64, 256, 5, RM);
    let up = synthetic_layer(64, 512, 2, 12, 1, RM, 0.02, 9).unwrap();
    let up = Case { lin: TrellisLinear::from_host("up", &up).unwrap(), host: up };
    // L = 13 (the MMA kernels take at most 12) and T = 128 (they take 256).
    let odd = |t: u32, l: u32| {
        let g = TrellisGeometry::row_major(64, 512, 2, t, l, 0).unwrap();
        let codes = MlxArray::from_slice(&vec![0x9e37_79b9u32; 64 * 32], &g.codes_shape()).unwrap();
        let scales = MlxArray::ones(&[64], Dtype::Float16).unwrap();
        (g, codes, scales)
    };
    let x = |c: &Case, m: usize| MlxArray::zeros(&[m, c.g().rows], Dtype::Float32).unwrap();
    let call_err = |k: Kernel, c: &Case, m: usize| error_of(call(c, k, &x(c, m)));
    let cases: Vec<(String, &str)> = vec![
        (call_err(down_factored_row, &rm, 2), "downFactoredRow: expects one activation row"),
        (call_err(down_factored_rows, &rm, 5), "downFactoredRows: M=5 outside 2..4"),
        (call_err(down_factored_rows, &rm, 1), "downFactoredRows: M=1 outside 2..4"),
        (call_err(down_factored_row, &il, 1), "downFactored: needs row-major axis-0 codes"),
        (call_err(down_factored_rows, &up, 2), "downFactored: needs row-major axis-0 codes"),
        (call_err(down_factored_row, &k5, 1), "downFactored: block of 40 words exceeds one SIMD group"),
        (
            call_err(down_k3_interleaved_factored_row, &il, 3),
            "downK3InterleavedFactoredRow: expects one activation row",
        ),
        (call_err(down_k3_interleaved_factored_rows, &il, 5), "downK3InterleavedFactoredRows: M=5 outside 2..4"),
        (
            call_err(down_k3_interleaved_factored_row, &rm3, 1),
            "downK3InterleavedFactored: needs 3-bit block-interleaved axis-0 codes (T 256, L 12)",
        ),
        (call_err(down_mma, &il, 1), "downMma: needs row-major codes"),
        (call_err(down_mma, &rm, 9), "downMma: M=9 outside 1..8"),
        (call_err(down_k3_interleaved_mma, &il, 9), "downMma: M=9 outside 1..8"),
        (call_err(down_mma, &up, 1), "downMma: unsupported geometry"),
        (call_err(down_k3_interleaved_mma, &rm3, 1), "downK3InterleavedMma: needs 3-bit block-interleaved codes"),
        (call_err(down_mma_wide, &il, 9), "downMmaWide: needs row-major codes"),
        (call_err(down_mma_wide, &rm3, 9), "downMmaWide: unsupported geometry"),
        (call_err(down_mma_wide, &up, 9), "downMmaWide: unsupported geometry"),
        (
            call_err(down_k3_interleaved_mma_wide, &rm, 9),
            "downK3InterleavedMmaWide: needs 3-bit block-interleaved codes",
        ),
        (
            error_of(down_mma_wide(
                &MlxArray::zeros(&[64], Dtype::Float32).unwrap(),
                rm.lin.codes(),
                rm.lin.scales(),
                rm.g(),
            )),
            "downMmaWide: expects [rows, inputs]",
        ),
        (
            error_of(down_mma_wide_pass(&x(&rm, 9), rm.lin.codes(), rm.lin.scales(), rm.g(), DownPass { s: 3, mt: 1 })),
            "downMmaWide: pass DownPass { s: 3, mt: 1 } needs S in 1, 2, 4, 8, 16, 32 with 8 S dividing the 256-position block, and MT in 1..=16",
        ),
        // Operands that do not fit the geometry (beyond the upstream checks).
        (call_err(down_mma, &rm, 0), "downMma: M=0 outside 1..8"),
        (
            error_of(down_factored_row(
                &MlxArray::zeros(&[1, 65], Dtype::Float32).unwrap(),
                rm.lin.codes(),
                rm.lin.scales(),
                rm.g(),
            )),
            "downFactored: activations [1, 65] must be [M >= 1, 64]",
        ),
        (
            error_of(down_mma(
                &MlxArray::zeros(&[2, 64], Dtype::Int32).unwrap(),
                rm.lin.codes(),
                rm.lin.scales(),
                rm.g(),
            )),
            "downMma: activations are int32, expected float32, float16 or bfloat16",
        ),
        (
            error_of(trellis_scatter(&x(&rm, 1), rm3.lin.codes(), rm.lin.scales(), rm.g())),
            "trellisScatter: codes uint32 [203, 96] / scales float16 [64] do not match",
        ),
        (
            error_of(trellis_scatter(&x(&k5, 1), k5.lin.codes(), k5.lin.scales(), k5.g())),
            "trellisScatter: needs axis-0 codes",
        ),
    ];
    for (got, want) in &cases {
        assert!(got.contains(want), "expected {want:?} in {got:?}");
    }
    // L past 12, and blocks the MMA kernels do not take (not a multiple of 64, or past 256).
    for (t, l) in [(256, 13), (32, 12), (512, 12)] {
        let (g, codes, scales) = odd(t, l);
        let x = MlxArray::zeros(&[8, 64], Dtype::Float32).unwrap();
        assert!(error_of(down_mma(&x, &codes, &scales, &g)).contains("downMma: unsupported geometry"), "T {t} L {l}");
        assert!(
            error_of(down_mma_wide(&x, &codes, &scales, &g)).contains("downMmaWide: unsupported geometry"),
            "T {t} L {l}"
        );
    }
    println!("{} error paths checked", cases.len() + 6);
}

#[test]
fn metal_path_without_metal_fails_clearly_and_scopes_nest() {
    let c = Case::new(64, 512, 2, RM);
    let (x, _) = c.x(1, Dtype::Float32);
    let on_mlx = |c: &Case| call(c, down_factored_row, &x).and_then(|y| y.eval().map(|_| y));
    let metal = backend() == Backend::Metal;
    // Without a scope the kernel goes to MLX: it runs on Metal and fails clearly elsewhere.
    match c.lin.forward_with(&x, ForwardPath::Metal).and_then(|y| y.eval().map(|_| y)) {
        Ok(_) => assert!(metal, "ForwardPath::Metal ran without Metal"),
        Err(e) => {
            assert!(!metal, "ForwardPath::Metal failed on Metal: {e}");
            assert!(e.to_string().contains("Metal"), "{e}");
        }
    }
    // Nested scopes: the simulator stays on until the outermost one ends.
    let outer = MetalSimScope::enter();
    {
        let _inner = MetalSimScope::enter();
        call(&c, down_factored_row, &x).unwrap();
    }
    call(&c, down_factored_row, &x).unwrap();
    drop(outer);
    assert_eq!(on_mlx(&c).is_ok(), metal);
}

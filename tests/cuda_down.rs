//! The CUDA down kernel against the f64 reference. The tests that run kernels are ignored
//! without MLX's CUDA back-end (`scripts/gpu.sh test` runs them on a CUDA machine); the host-side
//! checks of their configurations run on every back-end.

use mlx_trellis::trellis::cuda::down::{down_cuda, down_pair_cuda, down_residual_cuda, uses_dense, DENSE_MIN_ROWS};
use mlx_trellis::trellis::cuda::expand::{down_cuda_dense, expand_cuda};
use mlx_trellis::trellis::cuda::rotate::{rotate, Direction};
use mlx_trellis::trellis::cuda::tuning::{
    down_cuda_with, down_pair_cuda_with, down_pair_rotated_cuda_with, down_residual_cuda_with, down_rotated_cuda_with,
    down_ws_cuda_with, plan, plan_for, CudaDownConfig, CudaDownWsConfig, StepUnroll,
};
mod common;

use common::{f32_matmul_gate, gate, largest_abs, plus, require_cuda, seeded, to_f64, Case};
use mlx_trellis::trellis::reference::{expand, forward_f64, rel_err};
use mlx_trellis::trellis::{synthetic_layer, CodeLayout, ForwardPath, Rotation, TrellisLinear};
use mlx_trellis::{Dtype, MlxArray};

type Forward<'a> = &'a dyn Fn(&MlxArray) -> mlx_trellis::Result<MlxArray>;

/// Checks `f` (x -> y) against the reference for `m` rows of `dtype` activations.
fn check(c: &Case, m: usize, dtype: Dtype, what: &str, f: Forward) {
    let (x, xr) = c.x(m, dtype);
    check_on(c, &x, &xr, gate(dtype), what, f);
}

/// Checks `f` on the activations `x` (whose values are `xr`) against the reference: relErr
/// below `gate`.
fn check_on(c: &Case, x: &MlxArray, xr: &[f64], gate: f64, what: &str, f: Forward) {
    let (m, dtype) = (x.shape()[0], x.dtype());
    let got = c.run(what, x, f);
    let err = rel_err(&got, &c.reference(xr, m)).unwrap();
    println!("{what} {} M {m} {dtype}: relErr {err:.2e}", c.g());
    assert!(err < gate, "{what} {} M {m} {dtype}: relErr {err:.3e}", c.g());
}

/// The planned dispatch on one small layer at 1-128 rows, in f32, f16 and bf16. One test per
/// layer, so that the test harness runs the layers (their kernel compiles) side by side.
fn planned_dispatch_matches_the_reference(rows: usize, cols: usize, k: u32, layout: CodeLayout) {
    planned_dispatch_on(&Case::new(rows, cols, k, layout));
}

/// [`planned_dispatch_matches_the_reference`] on the layer `c`.
fn planned_dispatch_on(c: &Case) {
    require_cuda();
    for m in [1, 2, 3, 8, 9, 16, 17, 31, 33, 40, 50, 64, 65, 100, 128, DENSE_MIN_ROWS] {
        // f16 takes the same kernels as bf16, and the dense path from DENSE_MIN_ROWS.
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            check(c, m, dtype, "dispatch", &|x| c.lin.forward_with(x, ForwardPath::Auto));
        }
    }
    // Later calls reuse the first call's prepared launch (one per geometry, configuration, row
    // count and dtype): the same sums, bit for bit.
    for m in [1, 17, 40] {
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            let (x, xr) = c.x(m, dtype);
            let forward: Forward = &|x| c.lin.forward_with(x, ForwardPath::Auto);
            assert_eq!(c.run("repeat", &x, forward), c.run("repeat", &x, forward), "{} M {m} {dtype}", c.g());
            check_on(c, &x, &xr, gate(dtype), "repeated dispatch", forward);
        }
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn planned_kernel_matches_the_reference_k2_row_major() {
    planned_dispatch_matches_the_reference(64, 512, 2, CodeLayout::RowMajor);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn planned_kernel_matches_the_reference_k3_row_major() {
    planned_dispatch_matches_the_reference(200, 512, 3, CodeLayout::RowMajor);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn planned_kernel_matches_the_reference_k4_row_major() {
    planned_dispatch_matches_the_reference(520, 1024, 4, CodeLayout::RowMajor);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn planned_kernel_matches_the_reference_k3_interleaved() {
    planned_dispatch_matches_the_reference(136, 1024, 3, CodeLayout::K3Interleaved);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn planned_kernel_matches_the_reference_rows_not_a_multiple_of_8() {
    // Activations load one at a time.
    planned_dispatch_matches_the_reference(76, 768, 3, CodeLayout::RowMajor);
}

/// The ways the block-barrier ring may run its steps.
const STEP_UNROLLS: [StepUnroll; 3] = [StepUnroll::Rolled, StepUnroll::BTileSlots, StepUnroll::BothRings];

/// The shapes the plan takes at 1-16 rows (the one-row shape at 1-4, NC 4 at 5-8 and for f32 at
/// 9-16, 8-warp blocks on an mbarrier ring for 16-bit activations at 9-16) with their steps
/// rolled and unrolled both ways, on layers of k 2, 3 (both layouts) and 4, with the plan's
/// splits (mostly one step a block) and with one to three (a block then runs 1-13 steps, odd
/// counts among them, so that unrolled rounds end part-way), 16-bit activations and f32. Where
/// the plan loads the code words directly (rolled steps only), the unrolled steps take the ring;
/// where it syncs the ring on mbarriers (rolled steps only), they take the block barrier.
/// Each entry: the layer's index in `layers`, the rows, the dtype and the configuration.
fn planned_shapes_in_every_step_unroll(layers: &[Case]) -> Vec<(usize, usize, Dtype, CudaDownConfig)> {
    let mut shapes = Vec::new();
    let mut n = 0usize;
    for (i, c) in layers.iter().enumerate() {
        let g = *c.lin.geometry();
        for m in [1, 3, 4, 5, 8, 13, 16] {
            n += 1;
            let dtype = [Dtype::Bfloat16, Dtype::Float16, Dtype::Float32][n % 3];
            let planned = plan_for(&g, m, dtype);
            for splits in [planned.splits, 1 + (n % 3) as u32] {
                for step_unroll in STEP_UNROLLS {
                    let rolled = step_unroll == StepUnroll::Rolled;
                    let (direct_codes, mbarriers) = (planned.direct_codes && rolled, planned.mbarriers && rolled);
                    let splits = splits.min(planned.input_steps(&g));
                    let cfg = CudaDownConfig { splits, step_unroll, direct_codes, mbarriers, ..planned };
                    shapes.push((i, m, dtype, cfg));
                }
            }
        }
    }
    shapes
}

/// The layers of the step-unroll test: k 3 in both layouts, k 2 and k 4.
fn step_unroll_layers() -> [Case; 4] {
    [
        Case::new(200, 1024, 3, CodeLayout::K3Interleaved),
        Case::new(136, 1024, 2, CodeLayout::RowMajor),
        Case::new(88, 512, 4, CodeLayout::RowMajor),
        Case::new(100, 512, 3, CodeLayout::RowMajor),
    ]
}

#[test]
fn the_planned_shapes_in_every_step_unroll_are_valid_configurations() {
    // The GPU test below runs these; a configuration the kernel refuses would fail it before
    // any launch, so the host's check runs here, where there is no GPU.
    let layers = step_unroll_layers();
    let shapes = planned_shapes_in_every_step_unroll(&layers);
    assert_eq!(shapes.len(), layers.len() * 7 * 2 * STEP_UNROLLS.len());
    assert!(shapes.iter().any(|s| s.3.direct_codes), "the plan's direct code loads are among them");
    assert!(shapes.iter().any(|s| s.3.mbarriers), "the plan's mbarrier ring is among them");
    for (i, m, dtype, cfg) in shapes {
        let g = layers[i].lin.geometry();
        cfg.check(g, dtype).unwrap_or_else(|e| panic!("{cfg:?} does not fit {g} at M {m} with {dtype}: {e:#}"));
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn the_planned_shapes_up_to_16_rows_match_the_reference_in_every_step_unroll() {
    require_cuda();
    let layers = step_unroll_layers();
    for (i, m, dtype, cfg) in planned_shapes_in_every_step_unroll(&layers) {
        let c = &layers[i];
        // The host's checks of these configurations run in the test above; a refusal here would
        // name the configuration and the reason (`Case::run`).
        let g = *c.lin.geometry();
        check(c, m, dtype, &format!("{cfg:?}"), &|x| down_cuda_with(x, c.lin.codes(), c.lin.scales(), &g, cfg));
    }
}

/// Code words straight to registers (`direct_codes`: no ring, the split's B tiles built once) on
/// `layers`: blocks of half a coded block (NC 2), one (NC 4) and two (NC 8), 16-, 32- and 64-row
/// steps, one 8-row tile a pass at 1-7 rows and two at 9-16, splits from one (a block runs every
/// step: its B tiles a long strip) to one step a block, with and without the bias fold and the
/// IMAD pack, f32, f16 and bf16 in turn; then the pair variant (two matrices in one launch) at
/// one and three rows.
fn direct_code_loads_match_the_reference(layers: &[Case]) {
    require_cuda();
    let mut n = 0usize;
    for c in layers {
        let g = *c.lin.geometry();
        for (nc, ks) in [(8u32, 1u32), (4, 2), (2, 4)] {
            for mt in [1u32, 2] {
                n += 1;
                let dtype = [Dtype::Bfloat16, Dtype::Float16, Dtype::Float32][n % 3];
                let fold = dtype != Dtype::Float32;
                let base = CudaDownConfig {
                    nc,
                    mt,
                    ks,
                    warps: 4,
                    bias_fold: fold,
                    pack_fma: fold && n.is_multiple_of(2),
                    direct_codes: true,
                    ..Default::default()
                };
                let steps = base.input_steps(&g);
                for splits in [1, 3.min(steps), steps] {
                    let cfg = CudaDownConfig { splits, ..base };
                    cfg.check(&g, dtype).unwrap_or_else(|e| panic!("{cfg:?} does not fit {g} with {dtype}: {e:#}"));
                    let rows: &[usize] = if mt == 1 { &[1, 2, 4, 7] } else { &[9, 16] };
                    for &m in rows {
                        check(c, m, dtype, &format!("{cfg:?}"), &|x| {
                            down_cuda_with(x, c.lin.codes(), c.lin.scales(), &g, cfg)
                        });
                    }
                }
            }
        }
    }
    let a = &layers[0];
    let b = partner(a);
    let cfg = CudaDownConfig { splits: 3, direct_codes: true, step_unroll: StepUnroll::Rolled, ..plan(a.g(), 1) };
    let pair: Forward2 = &|x, [a, b]| {
        Ok(down_pair_cuda_with(x, [a.lin.codes(), b.lin.codes()], [a.lin.scales(), b.lin.scales()], a.g(), cfg)?
            .to_vec())
    };
    let single: Forward2 = &|x, [a, _]| Ok(vec![down_cuda_with(x, a.lin.codes(), a.lin.scales(), a.g(), cfg)?]);
    for (m, dtype) in [(1, Dtype::Bfloat16), (3, Dtype::Float16)] {
        let (x, xr) = a.x(m, dtype);
        check_pair(a, &b, &x, &xr, "direct pair", pair, single);
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn direct_code_loads_match_the_reference_k3() {
    // 100 rows: a ragged last step, whose rows past R read no codes.
    direct_code_loads_match_the_reference(&[
        Case::new(200, 1024, 3, CodeLayout::K3Interleaved),
        Case::new(100, 512, 3, CodeLayout::RowMajor),
    ]);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn direct_code_loads_match_the_reference_k2_k4() {
    direct_code_loads_match_the_reference(&[
        Case::new(136, 1024, 2, CodeLayout::RowMajor),
        Case::new(88, 512, 4, CodeLayout::RowMajor),
        Case::with_state_bits(72, 512, 4, 16, CodeLayout::RowMajor),
    ]);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn every_configuration_matches_the_reference() {
    require_cuda();
    let inter = Case::new(200, 1024, 3, CodeLayout::K3Interleaved);
    let rm = Case::new(200, 1024, 2, CodeLayout::RowMajor);
    let rm4 = Case::new(88, 512, 4, CodeLayout::RowMajor);
    // 100 rows: activations load one at a time (rows not a multiple of 8), the last step short.
    let odd = Case::new(100, 512, 3, CodeLayout::RowMajor);
    let mut n = 0usize;
    let mut per_nc = std::collections::BTreeMap::new();
    let shapes = [2u32, 4, 8].into_iter().flat_map(|nc| [1u32, 2, 4, 8].map(|mt| (nc, mt)));
    for (shape, (nc, mt)) in shapes.enumerate() {
        // Each shape with three of the decode variants (a different three for consecutive
        // shapes, so each variant meets every NC), cycling through layouts, dtypes, splits
        // (13 splits of 200 rows leave the last split short; 1 split runs all steps in one
        // block), block widths, ring depths and chunks per step.
        let variants = [
            (false, 2, 2, false),
            (false, 4, 4, false),
            (false, 3, 1, false),
            (true, 6, 1, false),
            (true, 3, 2, false),
            (true, 4, 4, false),
            (true, 4, 2, true),
            (true, 3, 1, true),
            (false, 5, 2, false),
        ];
        let picked = variants.into_iter().enumerate().filter(|(v, _)| (v + shape) % 3 == 0);
        for (_, (bias_fold, stages, ks, pack_fma)) in picked {
            let c = [&inter, &rm, &rm4, &odd][n % 4];
            let g = *c.lin.geometry();
            let blocks = [1u32, 2, 4][n % 3].min(g.blocks_per_row() as u32);
            let warps = (16 * blocks / nc).clamp(1, 8);
            let splits = [1u32, 5, 13][n % 3];
            // (n / 4) % 2: every layer meets both dtypes (n % 2 would pair them with n % 4).
            // The IMAD pack applies to 16-bit activations only, so it always gets bf16.
            let dtype = if (n / 4).is_multiple_of(2) && !pack_fma { Dtype::Float32 } else { Dtype::Bfloat16 };
            let cfg = CudaDownConfig {
                nc,
                mt,
                ks,
                warps,
                splits,
                stages,
                bias_fold,
                pack_fma,
                prescaled: false,
                mbarriers: false,
                // Configurations in turn with their steps rolled and in unrolled rounds of the B
                // tiles' slots (2 steps) or both rings (STAGES or 2 STAGES steps), a step count
                // that is no multiple of them.
                step_unroll: STEP_UNROLLS[n % 3],
                direct_codes: false,
            };
            let cfg = CudaDownConfig { splits: cfg.splits.min(cfg.input_steps(&g)), ..cfg };
            let Some(cfg) = cfg.with_deepest_ring(&g, dtype) else {
                continue;
            };
            n += 1;
            *per_nc.entry(nc).or_insert(0usize) += 1;
            for m in [1, 8 * mt as usize + 3] {
                check(c, m, dtype, &format!("{cfg:?}"), &|x| down_cuda_with(x, c.lin.codes(), c.lin.scales(), &g, cfg));
            }
        }
    }
    // Blocks that cover a part of a coded block (two to eight blocks share its codes) with each
    // decode, cycling through the layers, dtypes, steps and splits as above (by `p`, which also
    // counts the shapes that do not fit). 17 of the 18 fit: the other is a single warp of NC 4
    // loading 64-row steps of the 100-row layer one activation at a time.
    let mut p = 0usize;
    let mut part_blocks = 0usize;
    for (nc, warps, mt) in [(2u32, 4u32, 8u32), (2, 2, 4), (2, 2, 2), (4, 1, 1), (8, 1, 2), (2, 1, 1)] {
        for (bias_fold, pack_fma) in [(false, false), (true, false), (true, true)] {
            p += 1;
            let c = [&inter, &rm, &rm4, &odd][p % 4];
            let g = *c.lin.geometry();
            let ks = [1u32, 2, 4][p % 3];
            let splits = [1u32, 5, 13][(p / 3) % 3];
            // The bias fold and the IMAD pack apply to 16-bit activations only.
            let dtype = if bias_fold || (p / 4) % 2 == 1 { Dtype::Bfloat16 } else { Dtype::Float32 };
            let step_unroll = STEP_UNROLLS[(p / 2) % 3];
            let cfg =
                CudaDownConfig { nc, mt, ks, warps, splits, bias_fold, pack_fma, step_unroll, ..Default::default() };
            let cfg = CudaDownConfig { splits: cfg.splits.min(cfg.input_steps(&g)), ..cfg };
            let Some(cfg) = cfg.with_deepest_ring(&g, dtype) else {
                continue;
            };
            n += 1;
            part_blocks += 1;
            for m in [1, 8 * mt as usize + 3] {
                check(c, m, dtype, &format!("{cfg:?}"), &|x| down_cuda_with(x, c.lin.codes(), c.lin.scales(), &g, cfg));
            }
        }
    }
    assert_eq!(part_blocks, 17, "part-block configurations that fit");
    assert!(n >= 24, "only {n} configurations ran");
    assert!(per_nc.len() == 3 && per_nc.values().all(|&k| k >= 3), "configurations per NC: {per_nc:?}");
}

/// The small layers the prescaled configurations' test cycles through: k 2, 3 interleaved and row-major
/// (100 rows: not a multiple of 8, activations one at a time), 4 (word-aligned runs), 4 with L 16.
fn small_layers() -> [Case; 5] {
    [
        Case::new(200, 1024, 3, CodeLayout::K3Interleaved),
        Case::new(200, 1024, 2, CodeLayout::RowMajor),
        Case::new(88, 512, 4, CodeLayout::RowMajor),
        Case::new(100, 512, 3, CodeLayout::RowMajor),
        Case::with_state_bits(72, 512, 4, 16, CodeLayout::RowMajor),
    ]
}

/// The prescaled configurations' test cases on `small_layers()`: (layer, dtype, configuration),
/// each checked to fit its layer. B tiles from the pre-pass kernel (x * scale as f16, the f32
/// residues as more rows), streamed into the ring with the codes: the fragment shapes (one row
/// with the IMAD pack, 2-16 rows with the bias fold), the plan's from 9 rows (8-warp blocks) and
/// others: parts of a coded block, ring depths 2 to 6, steps of 16 to 64 rows, splits that do
/// not divide the steps; every layer (100 input rows: not a multiple of 8, so the pre-pass loads
/// one activation at a time and pads the rows), f32, f16 and bf16. Every other case also with
/// its ring on mbarriers (3 stages or more), warps drifting apart; the rest with their
/// block-barrier ring's steps in unrolled rounds.
fn prescaled_configurations(layers: &[Case]) -> Vec<(usize, Dtype, CudaDownConfig)> {
    let (f32, f16, bf16) = (Dtype::Float32, Dtype::Float16, Dtype::Bfloat16);
    let cases = [
        // (layer, dtype, nc, warps, mt, ks, splits, stages, bias_fold, pack_fma)
        (0, bf16, 2u32, 8u32, 8u32, 4u32, 5u32, 4u32, false, false),
        (1, f32, 2, 8, 4, 4, 1, 3, false, false),
        (2, bf16, 4, 4, 1, 2, 13, 4, true, false),
        (3, f16, 4, 4, 2, 4, 3, 4, true, false),
        (4, bf16, 8, 2, 1, 1, 2, 2, true, true),
        (0, f32, 2, 8, 8, 2, 13, 4, false, false),
        (1, bf16, 2, 8, 3, 4, 13, 4, false, false),
        (2, f32, 2, 2, 4, 1, 5, 6, false, false),
        (3, bf16, 2, 2, 2, 1, 1, 3, false, false),
        (4, f32, 2, 8, 6, 2, 4, 4, false, false),
        (3, f32, 2, 8, 5, 4, 2, 4, false, false),
        (0, f16, 8, 4, 1, 1, 13, 5, true, true),
    ];
    let configs: Vec<_> = cases
        .into_iter()
        .map(|(layer, dtype, nc, warps, mt, ks, splits, stages, bias_fold, pack_fma)| {
            let g = *layers[layer].lin.geometry();
            let cfg = CudaDownConfig {
                nc,
                mt,
                ks,
                warps,
                splits,
                stages,
                bias_fold,
                pack_fma,
                prescaled: true,
                ..Default::default()
            };
            let cfg = CudaDownConfig { splits: cfg.splits.min(cfg.input_steps(&g)), ..cfg };
            if let Err(e) = cfg.check(&g, dtype) {
                panic!("{cfg:?} does not fit {g} with {dtype}: {e:#}");
            }
            (layer, dtype, cfg)
        })
        .collect();
    let with_mbarriers: Vec<_> = configs
        .iter()
        .enumerate()
        .filter(|(i, (_, _, cfg))| i % 2 == 0 && cfg.stages >= 3)
        .map(|(_, &(layer, dtype, cfg))| (layer, dtype, CudaDownConfig { mbarriers: true, ..cfg }))
        .collect();
    for (layer, dtype, cfg) in &with_mbarriers {
        let g = layers[*layer].lin.geometry();
        cfg.check(g, *dtype).unwrap_or_else(|e| panic!("{cfg:?} does not fit {g} with {dtype}: {e:#}"));
    }
    assert_eq!(with_mbarriers.len(), 5);
    // The others (never on mbarriers) with their block-barrier ring's steps in unrolled rounds
    // (a B tile rides in each ring slot here, so both unrolled kinds run whole rounds).
    let configs = configs
        .into_iter()
        .enumerate()
        .map(|(i, (layer, dtype, cfg))| (layer, dtype, CudaDownConfig { step_unroll: STEP_UNROLLS[i % 3], ..cfg }));
    configs.chain(with_mbarriers).collect()
}

/// The layer of the unaligned-activations test and its prescaled configuration.
fn unaligned_case() -> (Case, CudaDownConfig) {
    // 200 input rows are 4 steps of 64: at most 4 splits.
    let prescaled = CudaDownConfig { nc: 2, mt: 4, ks: 4, warps: 8, splits: 3, prescaled: true, ..Default::default() };
    (Case::new(200, 1024, 3, CodeLayout::K3Interleaved), prescaled)
}

#[test]
fn prescaled_configurations_fit() {
    // The GPU tests' configurations, checked on every back-end.
    assert_eq!(prescaled_configurations(&small_layers()).len(), 17);
    let (c, prescaled) = unaligned_case();
    for dtype in [Dtype::Bfloat16, Dtype::Float32] {
        prescaled.check(c.g(), dtype).unwrap();
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn prescaled_configurations_match_the_reference() {
    // Each case at one row, one short of a pass and past one pass.
    require_cuda();
    let layers = small_layers();
    for (layer, dtype, cfg) in prescaled_configurations(&layers) {
        let (c, mt) = (&layers[layer], cfg.mt);
        let g = *c.lin.geometry();
        for m in [1, 8 * mt as usize - 1, 8 * mt as usize + 3] {
            check(c, m, dtype, &format!("{cfg:?}"), &|x| down_cuda_with(x, c.lin.codes(), c.lin.scales(), &g, cfg));
        }
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn activations_off_16_byte_alignment_load_one_at_a_time() {
    // A row-contiguous view 2 elements into its buffer (MLX passes such views with their offset):
    // rows then start 4 (16-bit) or 8 (f32) bytes off a 16-byte boundary, and the kernel must
    // not use 16-byte loads on them (`prescaled_configurations_fit` checks the configuration).
    require_cuda();
    let (c, prescaled) = unaligned_case();
    let rows = c.g().rows;
    let g = *c.lin.geometry();
    for dtype in [Dtype::Bfloat16, Dtype::Float32] {
        for m in [1, 9, 24] {
            let (x, xr) = c.x(m, dtype);
            let flat = x.reshape(&[m * rows]).unwrap();
            let padded = mlx_trellis::concatenate(&[&MlxArray::zeros(&[2], dtype).unwrap(), &flat], 0).unwrap();
            padded.eval().unwrap();
            let view = padded.slice(&[2], &[(2 + m * rows) as i32], &[1]).unwrap().reshape(&[m, rows]).unwrap();
            check_on(&c, &view, &xr, gate(dtype), "offset view", &|x| c.lin.forward_with(x, ForwardPath::Cuda));
            // The pre-pass kernel loads the view one activation at a time too.
            check_on(&c, &view, &xr, gate(dtype), "offset view, prescaled", &|x| {
                down_cuda_with(x, c.lin.codes(), c.lin.scales(), &g, prescaled)
            });
        }
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn qwen_sized_layers_match_the_reference() {
    require_cuda();
    for (k, layout) in [
        (3, CodeLayout::K3Interleaved),
        (2, CodeLayout::RowMajor),
        (4, CodeLayout::RowMajor),
        (3, CodeLayout::RowMajor),
    ] {
        let c = Case::new(17408, 5120, k, layout);
        for m in [1, 7, 8, 16, 24, 64, 100, DENSE_MIN_ROWS - 1, DENSE_MIN_ROWS] {
            if uses_dense(m, Dtype::Bfloat16) {
                println!("plan M {m}: dense weights and MLX's matmul");
            } else {
                println!("plan M {m}: {:?}", plan(c.lin.geometry(), m));
            }
            check(&c, m, Dtype::Bfloat16, "qwen", &|x| c.lin.forward_with(x, ForwardPath::Cuda));
        }
        check(&c, 4, Dtype::Float32, "qwen", &|x| c.lin.forward_with(x, ForwardPath::Cuda));
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn unsupported_geometries_fall_back_or_refuse() {
    require_cuda();
    // One bit per weight has no CUDA kernel on either axis: Auto takes the generic path, a forced
    // CUDA path refuses with the typed error (nothing runs).
    for axis in [0, 1] {
        let host = synthetic_layer(64, 512, 1, 12, axis, CodeLayout::RowMajor, 0.02, 1).unwrap();
        let lin = TrellisLinear::from_host("k1", &host).unwrap();
        assert_eq!(lin.best_path(), ForwardPath::Generic, "axis {axis}");
        let x = MlxArray::zeros(&[1, lin.geometry().in_features()], Dtype::Float32).unwrap();
        let err = lin.forward_with(&x, ForwardPath::Cuda).unwrap_err();
        assert_eq!(err.kind(), mlx_trellis::ErrorKind::Unserved, "axis {axis}: {err}");
        assert!(lin.forward_with(&x, ForwardPath::Auto).is_ok(), "axis {axis}");
    }
    // Axis 1 row-major has its kernels.
    let host = synthetic_layer(64, 512, 2, 12, 1, CodeLayout::RowMajor, 0.02, 1).unwrap();
    assert_eq!(TrellisLinear::from_host("up", &host).unwrap().best_path(), ForwardPath::Cuda);
}

/// `v` rounded once to `dtype`, as f64.
fn rounded(v: f32, dtype: Dtype) -> f64 {
    match dtype {
        Dtype::Bfloat16 => half::bf16::from_f32(v).to_f64(),
        Dtype::Float16 => half::f16::from_f32(v).to_f64(),
        _ => f64::from(v),
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn dense_weights_equal_the_reference_bit_for_bit() {
    require_cuda();
    // Both layouts (the interleave is k 3, L 12 only), k 2..8, L 8..16 (runs of 2 to 5 words),
    // blocks per row 1..6, rows that are not a multiple of anything.
    for c in [
        (64, 512, 2, 12, CodeLayout::RowMajor),
        (40, 512, 2, 16, CodeLayout::RowMajor),
        (200, 1024, 3, 12, CodeLayout::RowMajor),
        (136, 1024, 3, 12, CodeLayout::K3Interleaved),
        (37, 1536, 3, 12, CodeLayout::K3Interleaved),
        (37, 1536, 3, 16, CodeLayout::RowMajor),
        (88, 512, 4, 12, CodeLayout::RowMajor),
        (24, 768, 5, 12, CodeLayout::RowMajor),
        (16, 256, 7, 16, CodeLayout::RowMajor),
        (19, 768, 8, 16, CodeLayout::RowMajor),
        (21, 512, 6, 8, CodeLayout::RowMajor),
    ]
    .map(|(rows, cols, k, l, layout)| Case::with_state_bits(rows, cols, k, l, layout))
    .into_iter()
    // Shorter coded blocks: 192 at k 3 (18 words a block row, runs that wrap inside it), k 5 and
    // k 7; 64 and 128.
    .chain(
        [
            (37, 576, 3, 12, 192),
            (21, 192, 5, 16, 192),
            (24, 384, 7, 16, 192),
            (19, 576, 2, 8, 64),
            (16, 384, 4, 16, 128),
        ]
        .map(|(rows, cols, k, l, t)| Case::in_blocks(rows, cols, k, l, t, rows as u64)),
    ) {
        let (rows, cols) = (c.g().rows, c.g().cols);
        let want = expand(&c.host.codes, &c.host.scales, c.g()).unwrap();
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            let w = expand_cuda(c.lin.codes(), c.lin.scales(), c.g(), dtype).unwrap();
            assert_eq!((w.shape(), w.dtype()), (vec![rows, cols], dtype));
            let got = to_f64(&w);
            let bad = got.iter().zip(&want).position(|(&g, &r)| g.to_bits() != rounded(r, dtype).to_bits());
            println!("expand {} {dtype}: {}", c.g(), if bad.is_none() { "bit for bit" } else { "DIFFERS" });
            if let Some(i) = bad {
                panic!(
                    "expand {} {dtype}: weight [{}, {}] is {} (reference {})",
                    c.g(),
                    i / cols,
                    i % cols,
                    got[i],
                    want[i]
                );
            }
        }
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn dense_path_matches_the_reference() {
    require_cuda();
    for (rows, cols, k, layout) in [(200, 1024, 3, CodeLayout::K3Interleaved), (520, 1024, 4, CodeLayout::RowMajor)] {
        let c = Case::new(rows, cols, k, layout);
        let g = *c.g();
        for m in [1, 5, DENSE_MIN_ROWS, 100, 128] {
            for dtype in [Dtype::Float16, Dtype::Bfloat16] {
                check(&c, m, dtype, "dense", &|x| down_cuda_dense(x, c.lin.codes(), c.lin.scales(), &g));
            }
        }
        // f32 activations multiply through MLX's f32 matmul (TF32 unless MLX_ENABLE_TF32=0).
        let (x, xr) = c.x(64, Dtype::Float32);
        check_on(&c, &x, &xr, f32_matmul_gate(), "dense", &|x| down_cuda_dense(x, c.lin.codes(), c.lin.scales(), &g));
    }
}

#[test]
fn dense_path_refuses_bad_operands() {
    // Runs on every back-end: off CUDA the kernel refuses to run, on CUDA the operands are wrong.
    let c = Case::new(64, 512, 2, CodeLayout::RowMajor);
    let g = *c.g();
    let err = format!("{:#}", expand_cuda(c.lin.codes(), c.lin.scales(), &g, Dtype::Int32).unwrap_err());
    assert!(err.contains("int32") || err.contains("CUDA back-end"), "{err}");
    let other = Case::new(64, 768, 2, CodeLayout::RowMajor);
    let err = format!("{:#}", expand_cuda(other.lin.codes(), c.lin.scales(), &g, Dtype::Bfloat16).unwrap_err());
    assert!(err.contains("do not match") || err.contains("CUDA back-end"), "{err}");
    let x = MlxArray::zeros(&[3, 63], Dtype::Bfloat16).unwrap();
    let err = format!("{:#}", down_cuda_dense(&x, c.lin.codes(), c.lin.scales(), &g).unwrap_err());
    assert!(err.contains("[M >= 1, 64]"), "{err}");
    // A layer stored [out, in] (axis 1) is not a down projection's layout.
    let host = synthetic_layer(64, 512, 2, 12, 1, CodeLayout::RowMajor, 0.02, 1).unwrap();
    let up = TrellisLinear::from_host("up", &host).unwrap();
    let x = MlxArray::zeros(&[40, 512], Dtype::Bfloat16).unwrap();
    let err = format!("{:#}", down_cuda_dense(&x, up.codes(), up.scales(), up.geometry()).unwrap_err());
    assert!(err.contains("axis 0"), "{err}");
}

/// A seeded residual stream `[m, cols]` in `dtype` of about the size of `xw` (the product it is
/// added to, so that the product's error shows in the sum's relErr), and its values.
fn residual_for(xw: &[f64], m: usize, cols: usize, dtype: Dtype) -> (MlxArray, Vec<f64>) {
    seeded(m, cols, dtype, (largest_abs(xw) / 2.0) as f32, 5_000_003 + 17 * m as u64 + cols as u64)
}

/// Checks `f` (x, residual -> residual + x W) against the f64 sum for `m` rows of `dtype`
/// activations and a seeded residual stream ([`residual_for`]).
fn check_residual(
    c: &Case,
    m: usize,
    dtype: Dtype,
    what: &str,
    f: &dyn Fn(&MlxArray, &MlxArray) -> mlx_trellis::Result<MlxArray>,
) {
    let g = c.g();
    let (x, xr) = c.x(m, dtype);
    let xw = c.reference(&xr, m);
    let (r, rr) = residual_for(&xw, m, g.cols, dtype);
    let want = plus(&xw, &rr);
    let err = rel_err(&c.run(what, &x, &|x| f(x, &r)), &want).unwrap();
    println!("{what} {g} M {m} {dtype}: relErr {err:.2e}");
    assert!(err < gate(dtype), "{what} {g} M {m} {dtype}: relErr {err:.3e}");
}

/// The residual variant (the add in the kernel's fold, in f32 before the output's one rounding)
/// against the f64 `residual + x W`: `down_residual_cuda` and `TrellisLinear::forward_residual`
/// at every planned row bucket (the IMAD pack at 1-4 rows, 5-8, prescaled from 9 rows of 16-bit
/// activations and NC 4 for f32 at 9-16, two passes at 65, the dense path's matmul and add from
/// DENSE_MIN_ROWS rows of 16-bit activations) in every dtype, and explicit configurations: parts
/// of a coded block, prescaled B tiles on an mbarrier ring.
fn residual_variant_matches_the_reference(layers: &[Case]) {
    require_cuda();
    for c in layers {
        let g = *c.g();
        for m in [1, 3, 5, 16, 17, 65, DENSE_MIN_ROWS] {
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                check_residual(c, m, dtype, "down_residual_cuda", &|x, r| {
                    down_residual_cuda(x, c.lin.codes(), c.lin.scales(), &g, r)
                });
                check_residual(c, m, dtype, "forward_residual", &|x, r| c.lin.forward_residual(x, r));
            }
        }
        let parts = CudaDownConfig { nc: 2, mt: 1, ks: 1, warps: 2, splits: 5, ..Default::default() };
        let ring = CudaDownConfig {
            nc: 2,
            mt: 3,
            ks: 2,
            warps: 8,
            splits: 3,
            stages: 4,
            prescaled: true,
            mbarriers: true,
            ..Default::default()
        };
        for (m, dtype, cfg) in [(3, Dtype::Bfloat16, parts), (20, Dtype::Float16, ring), (9, Dtype::Float32, parts)] {
            let cfg = CudaDownConfig { splits: cfg.splits.min(cfg.input_steps(&g)), ..cfg };
            cfg.check(&g, dtype).unwrap_or_else(|e| panic!("{cfg:?} on {g} {dtype}: {e:#}"));
            check_residual(c, m, dtype, &format!("residual variant {cfg:?}"), &|x, r| {
                down_residual_cuda_with(x, c.lin.codes(), c.lin.scales(), &g, cfg, r)
            });
        }
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn the_residual_variant_matches_the_reference_k3() {
    let [inter, _, _, odd, _] = small_layers();
    residual_variant_matches_the_reference(&[inter, odd]);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn the_residual_variant_matches_the_reference_k2_k4() {
    let [_, k2, k4, _, k4_l16] = small_layers();
    residual_variant_matches_the_reference(&[k2, k4, k4_l16]);
}

#[test]
fn a_residual_of_another_shape_or_dtype_is_refused() {
    // Checked before anything runs, so on every back-end.
    let c = Case::new(64, 512, 2, CodeLayout::RowMajor);
    let x = MlxArray::zeros(&[2, 64], Dtype::Bfloat16).unwrap();
    for (shape, dtype) in [([2, 511], Dtype::Bfloat16), ([3, 512], Dtype::Bfloat16), ([2, 512], Dtype::Float32)] {
        let r = MlxArray::zeros(&shape, dtype).unwrap();
        let err = down_residual_cuda(&x, c.lin.codes(), c.lin.scales(), c.g(), &r).unwrap_err();
        assert_eq!(err.kind(), mlx_trellis::ErrorKind::InvalidArgument, "{err}");
        assert!(err.to_string().contains("must be bfloat16 [2, 512]"), "{err}");
    }
    // The layer's own entry point checks the shape against its output's (any dtype: one other
    // than the output's is added by MLX's add).
    let r = MlxArray::zeros(&[2, 511], Dtype::Bfloat16).unwrap();
    let err = c.lin.forward_residual(&x, &r).unwrap_err();
    assert_eq!(err.kind(), mlx_trellis::ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("must have the output's shape [2, 512]"), "{err}");
}

/// The down kernel folds its partial sums in its own launch, counting finished thread blocks in
/// an array zeroed for each call: two calls of one layer in flight at once (MLX runs
/// independent kernels of one evaluation concurrently) give the bits of the same calls run one
/// at a time.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn concurrent_calls_of_one_layer_equal_sequential_calls() {
    require_cuda();
    let c = Case::new(4352, 1536, 3, CodeLayout::K3Interleaved);
    for m in [1, 8, 24, 64] {
        for dtype in [Dtype::Bfloat16, Dtype::Float32] {
            let xs: Vec<MlxArray> = (0..4)
                .map(|i| c.x(m, dtype).0.multiply(&MlxArray::full(&[1], 1.0 + i as f64, dtype).unwrap()).unwrap())
                .collect();
            let alone: Vec<Vec<f64>> = xs
                .iter()
                .map(|x| {
                    let y = c.lin.forward_with(x, ForwardPath::Cuda).unwrap();
                    y.eval().unwrap();
                    to_f64(&y)
                })
                .collect();
            let together: Vec<MlxArray> =
                xs.iter().map(|x| c.lin.forward_with(x, ForwardPath::Cuda).unwrap()).collect();
            mlx_trellis::eval_all(&together.iter().collect::<Vec<_>>()).unwrap();
            for (i, (y, want)) in together.iter().zip(&alone).enumerate() {
                assert_eq!(&to_f64(y), want, "M {m} {dtype}: call {i} in flight with three others");
            }
        }
    }
}

/// Activations whose products with the row scales reach the edges of f16's range (the kernel
/// multiplies x * scale as f16): |x * scale| up to about 5e4, and around 1e-4, near f16's
/// smallest normal numbers.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn activations_at_the_edges_of_the_f16_range() {
    require_cuda();
    let c = Case::new(200, 1024, 3, CodeLayout::K3Interleaved);
    for (factor, dtype) in
        [(2.2e5, Dtype::Bfloat16), (2.2e5, Dtype::Float32), (5e-3, Dtype::Bfloat16), (5e-3, Dtype::Float16)]
    {
        for m in [1, 9, 24] {
            let (x, _) = c.x(m, Dtype::Float32);
            let x = x.multiply(&MlxArray::full(&[1], factor, Dtype::Float32).unwrap()).unwrap().astype(dtype).unwrap();
            let xr = to_f64(&x);
            let largest = xr
                .iter()
                .zip(0..)
                .map(|(v, i)| (v * f64::from(c.host.scales[i % c.g().rows].to_f32())).abs())
                .fold(0.0, f64::max);
            assert!(largest < 65504.0, "x * scale reaches {largest}: past f16's range");
            check_on(&c, &x, &xr, gate(dtype), &format!("x * {factor:e}"), &|x| {
                c.lin.forward_with(x, ForwardPath::Cuda)
            });
        }
    }
}

/// A second layer of `c`'s geometry with codes and scales of its own: the pair variant's second
/// matrix.
fn partner(c: &Case) -> Case {
    let g = c.g();
    let host = synthetic_layer(g.rows, g.cols, g.k, g.l, 0, g.layout(), 0.05, 7919 + g.rows as u64).unwrap();
    assert_ne!(host.codes, c.host.codes);
    let lin = TrellisLinear::from_host("up", &host).unwrap();
    Case { host, lin }
}

/// Checks one pair call on `x` (values `xr`): each output has the bits of its matrix's call alone
/// (`single`) and is within the dtype's gate of the f64 reference.
fn check_pair(a: &Case, b: &Case, x: &MlxArray, xr: &[f64], what: &str, pair: Forward2, single: Forward2) {
    let (m, dtype, g) = (x.shape()[0], x.dtype(), *a.g());
    let ys = pair(x, [a, b]).unwrap_or_else(|e| panic!("{what} {g} M {m} {dtype}: {e:#}"));
    for (i, (c, y)) in [a, b].into_iter().zip(ys).enumerate() {
        assert_eq!((y.shape(), y.dtype()), (vec![m, g.cols], dtype), "{what} {g} M {m} matrix {i}");
        let got = to_f64(&y);
        let alone = single(x, [c, c]).unwrap_or_else(|e| panic!("{what} {g} M {m} {dtype} alone: {e:#}"));
        assert!(got == to_f64(&alone[0]), "{what} {g} M {m} {dtype}: matrix {i} differs from its call alone");
        let err = rel_err(&got, &forward_f64(xr, m, &c.host.codes, &c.host.scales, &g).unwrap()).unwrap();
        println!("{what} {g} M {m} {dtype} matrix {i}: relErr {err:.2e}");
        assert!(err < gate(dtype), "{what} {g} M {m} {dtype} matrix {i}: relErr {err:.3e}");
    }
}

/// Two layers' call on `x`: the pair call, or (both layers the same) the single call twice.
type Forward2<'a> = &'a dyn Fn(&MlxArray, [&Case; 2]) -> mlx_trellis::Result<Vec<MlxArray>>;

/// The pair variant (two matrices of one geometry on the same activations in one launch, an MLP's
/// gate and up stored along their outputs) by the plan: on SmolLM2's gate shape at a row count of
/// each of the plan's bands and at the dense path's first, in f32, f16 and bf16; on the small
/// layers at one row count of each kind of launch (in-block B tiles, prescaled, several passes),
/// one dtype each in turn. Every geometry and configuration compiles kernels of its own (the
/// template arguments are baked in), which bounds this test's time, so the small layers' other
/// configurations are `pairs_of_matrices_in_every_configuration`'s.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn pairs_of_matrices_give_their_single_calls_bits() {
    require_cuda();
    let pair: Forward2 = &|x, [a, b]| {
        Ok(down_pair_cuda(x, [a.lin.codes(), b.lin.codes()], [a.lin.scales(), b.lin.scales()], a.g())?.to_vec())
    };
    let single: Forward2 = &|x, [a, _]| Ok(vec![down_cuda(x, a.lin.codes(), a.lin.scales(), a.g())?]);
    let dtypes = [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16];
    let smol = Case::new(576, 1536, 3, CodeLayout::K3Interleaved);
    let b = partner(&smol);
    for m in [1, 7, 9, 17, 65, 128, DENSE_MIN_ROWS] {
        for dtype in dtypes {
            let (x, xr) = smol.x(m, dtype);
            check_pair(&smol, &b, &x, &xr, "planned pair", pair, single);
        }
    }
    for (i, a) in small_layers().iter().enumerate() {
        let b = partner(a);
        for (j, m) in [1, 9, 17, 65].into_iter().enumerate() {
            let dtype = dtypes[(i + j) % dtypes.len()];
            let (x, xr) = a.x(m, dtype);
            check_pair(a, &b, &x, &xr, "planned pair", pair, single);
        }
    }
}

/// The pair variant in every prescaled configuration of the single kernel's test (its pre-pass
/// then converts the activations for both matrices), and with activations converted in the
/// thread blocks (the one-row plans' shape), at one row, one short of a pass and past one.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn pairs_of_matrices_in_every_configuration() {
    require_cuda();
    let layers = small_layers();
    for (layer, dtype, cfg) in pair_configurations(&layers) {
        let a = &layers[layer];
        let b = partner(a);
        let pair: Forward2 = &|x, [a, b]| {
            Ok(down_pair_cuda_with(x, [a.lin.codes(), b.lin.codes()], [a.lin.scales(), b.lin.scales()], a.g(), cfg)?
                .to_vec())
        };
        let single: Forward2 = &|x, [a, _]| Ok(vec![down_cuda_with(x, a.lin.codes(), a.lin.scales(), a.g(), cfg)?]);
        for m in [1, 8 * cfg.mt as usize - 1, 8 * cfg.mt as usize + 3] {
            let (x, xr) = a.x(m, dtype);
            check_pair(a, &b, &x, &xr, &format!("{cfg:?}"), pair, single);
        }
    }
}

/// The pair test's configurations: the prescaled ones, and one that converts activations in the
/// thread blocks, on every layer it fits in f32 and bf16.
fn pair_configurations(layers: &[Case]) -> Vec<(usize, Dtype, CudaDownConfig)> {
    let converted = CudaDownConfig { nc: 4, mt: 1, ks: 1, warps: 4, splits: 3, ..Default::default() };
    let mut cases = prescaled_configurations(layers);
    for (layer, c) in layers.iter().enumerate() {
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            if converted.check(c.g(), dtype).is_ok() {
                cases.push((layer, dtype, converted));
            }
        }
    }
    cases
}

#[test]
fn pair_configurations_fit() {
    // The converted configuration fits all five layers in both dtypes.
    assert_eq!(pair_configurations(&small_layers()).len(), 17 + 10);
}

#[test]
fn a_pair_of_matrices_of_different_geometries_is_refused() {
    // Runs on every back-end: the operands are checked before anything is launched.
    let a = Case::new(64, 512, 2, CodeLayout::RowMajor);
    for b in [Case::new(64, 512, 3, CodeLayout::RowMajor), Case::new(64, 768, 2, CodeLayout::RowMajor)] {
        let x = MlxArray::zeros(&[1, 64], Dtype::Bfloat16).unwrap();
        let err = down_pair_cuda(&x, [a.lin.codes(), b.lin.codes()], [a.lin.scales(), b.lin.scales()], a.g())
            .map(|_| ())
            .unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("codes") && text.contains("CUDA down kernel"), "{text}");
    }
}

/// The warp-specialized down GEMM (`down_ws.cu`) in a shape: `mt` 8-row tiles a pass, `stages`
/// steps in its ring, `ctas` thread blocks a pass, with or without the bias fold, its code words
/// 1 + `mt` % 4 steps ahead (1 to 4 over the tests' shapes), three producer teams where
/// `stages` is a multiple of 3, else one.
fn down_ws(mt: u32, stages: u32, ctas: u32, bias_fold: bool) -> CudaDownWsConfig {
    let teams = if stages.is_multiple_of(3) { 3 } else { 1 };
    CudaDownWsConfig { mt, stages, ctas, bias_fold, lookahead: 1 + mt % 4, teams }
}

/// The warp-specialized down GEMM against the reference on one layer whose input rows are whole
/// blocks of 256: passes of 1, 3, 8, 9, 13 and 16 tiles of 8 rows (one wgmma of N 8-64 or 128, two
/// between), rows not a multiple of 8, two passes (200 rows), 3 to 7 stages, grids of 1, 5, 7
/// and 264 blocks a pass (tiles whole in one block, split between two, or between many, and
/// blocks with no work), one and three producer teams, with and without the bias fold, f16 and
/// bf16; the residual variant; the default shapes at 65, 100 and 128 rows; a zero row.
fn down_ws_matches_the_reference(c: &Case) {
    require_cuda();
    let g = *c.g();
    let shapes = [
        (1, down_ws(1, 4, 264, true)),
        (21, down_ws(3, 5, 5, false)),
        (64, down_ws(8, 3, 1, true)),
        (70, down_ws(9, 7, 7, false)),
        (100, down_ws(13, 6, 264, true)),
        (128, down_ws(16, 4, 5, false)),
        (128, down_ws(16, 4, 264, true)),
        (200, down_ws(13, 3, 7, true)),
    ];
    for (m, cfg) in shapes {
        for cfg in [cfg, CudaDownWsConfig { bias_fold: !cfg.bias_fold, ..cfg }] {
            for dtype in [Dtype::Float16, Dtype::Bfloat16] {
                cfg.check(&g, dtype).unwrap_or_else(|e| panic!("{cfg:?} on {g} {dtype}: {e:#}"));
                check(c, m, dtype, &format!("ws {cfg:?}"), &|x| {
                    down_ws_cuda_with(x, c.lin.codes(), c.lin.scales(), &g, cfg, None)
                });
            }
        }
    }
    for (m, cfg) in [(21, down_ws(3, 5, 5, true)), (128, down_ws(16, 4, 264, false)), (128, down_ws(16, 6, 132, false))]
    {
        for dtype in [Dtype::Float16, Dtype::Bfloat16] {
            check_residual(c, m, dtype, &format!("ws residual {cfg:?}"), &|x, r| {
                down_ws_cuda_with(x, c.lin.codes(), c.lin.scales(), &g, cfg, Some(r))
            });
        }
    }
    for m in [65, 100, 128] {
        let cfg = CudaDownWsConfig::for_rows(m);
        check(c, m, Dtype::Bfloat16, "ws default shape", &|x| {
            down_ws_cuda_with(x, c.lin.codes(), c.lin.scales(), &g, cfg, None)
        });
    }
    // A zero row among seeded ones: its exponent is 0 and its outputs are 0.
    let m = 40;
    let (x, mut xr) = c.x(m, Dtype::Bfloat16);
    xr[..g.rows].iter_mut().for_each(|v| *v = 0.0);
    let zeroed: Vec<f32> = xr.iter().map(|&v| v as f32).collect();
    let x = MlxArray::from_slice(&zeroed, x.shape().as_slice()).unwrap().astype(Dtype::Bfloat16).unwrap();
    let cfg = down_ws(5, 4, 7, true);
    check_on(c, &x, &xr, gate(Dtype::Bfloat16), "ws zero row", &|x| {
        down_ws_cuda_with(x, c.lin.codes(), c.lin.scales(), &g, cfg, None)
    });
}

#[test]
#[ignore = "needs MLX's CUDA back-end on an sm_90 GPU (wgmma)"]
fn down_ws_k3_interleaved_matches_the_reference() {
    down_ws_matches_the_reference(&Case::new(512, 1024, 3, CodeLayout::K3Interleaved));
}

#[test]
#[ignore = "needs MLX's CUDA back-end on an sm_90 GPU (wgmma)"]
fn down_ws_k3_row_major_matches_the_reference() {
    down_ws_matches_the_reference(&Case::new(768, 512, 3, CodeLayout::RowMajor));
}

#[test]
#[ignore = "needs MLX's CUDA back-end on an sm_90 GPU (wgmma)"]
fn down_ws_k2_one_block_matches_the_reference() {
    down_ws_matches_the_reference(&Case::new(256, 256, 2, CodeLayout::RowMajor));
}

#[test]
#[ignore = "needs MLX's CUDA back-end on an sm_90 GPU (wgmma)"]
fn down_ws_k4_l16_matches_the_reference() {
    down_ws_matches_the_reference(&Case::with_state_bits(512, 768, 4, 16, CodeLayout::RowMajor));
}

/// Layers in coded blocks shorter than 256 (what `quantize_model --fit-blocks` writes for an
/// axis 256 does not divide): SmolLM2's attention on axis 0 in blocks of 192 (q and o 576 -> 576,
/// k and v 576 -> 192), k 4 with 16-bit states, input rows that are not a multiple of 8
/// (activations one at a time) in 4 blocks a row, and blocks of 64 and 128. A 3-bit block row of 192 positions is
/// 18 words, so its codes stream in 8-byte copies; the others in 16-byte ones.
fn shorter_block_layers() -> [Case; 5] {
    [
        Case::in_blocks(576, 576, 3, 12, 192, 1),
        Case::in_blocks(576, 192, 2, 12, 192, 2),
        Case::in_blocks(100, 768, 4, 16, 192, 3),
        Case::in_blocks(72, 576, 3, 12, 64, 4),
        Case::in_blocks(40, 384, 4, 16, 128, 5),
    ]
}

#[test]
fn shorter_blocks_take_the_cuda_kernels() {
    // Runs on every back-end: what the kernels serve is decided on the host.
    for c in shorter_block_layers() {
        assert!(mlx_trellis::trellis::cuda::down::supports(c.g()), "{}", c.g());
        assert!(mlx_trellis::trellis::cuda::expand::supports(c.g()), "{}", c.g());
    }
}

/// The planned dispatch (the kernel up to 128 rows, the dense path's expand and matmul from
/// DENSE_MIN_ROWS rows of 16-bit activations) on the shorter-block layers, one test per pair of
/// layers so that their kernel compiles run side by side.
fn shorter_blocks_planned(which: std::ops::Range<usize>) {
    require_cuda();
    for c in &shorter_block_layers()[which] {
        assert_eq!(c.lin.best_path(), ForwardPath::Cuda, "{}", c.g());
        planned_dispatch_on(c);
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn planned_kernel_matches_the_reference_in_blocks_of_192() {
    shorter_blocks_planned(0..2);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn planned_kernel_matches_the_reference_in_blocks_of_192_k4_ragged_rows() {
    shorter_blocks_planned(2..3);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn planned_kernel_matches_the_reference_in_blocks_of_64_and_128() {
    shorter_blocks_planned(3..5);
}

/// Explicit configurations on blocks of 192: thread blocks of a sixth, a third and a half of a
/// coded block, of one and of two coded blocks, with the decode variants, prescaled B tiles on an
/// mbarrier ring, unrolled steps, direct code loads, 1 to 13 splits and steps of 16 to 64 rows.
/// Each entry: the layer's index in `shorter_block_layers()`, the dtype and the configuration.
fn shorter_block_configurations() -> Vec<(usize, Dtype, CudaDownConfig)> {
    let layers = shorter_block_layers();
    let (f32, bf16) = (Dtype::Float32, Dtype::Bfloat16);
    let [base, fold, prescaled] = configuration_kinds();
    let mut cases = Vec::new();
    // (layer, nc, warps, mt, ks, splits, dtype, variant)
    for (i, &(layer, nc, warps, mt, ks, splits, dtype, variant)) in [
        (0usize, 2u32, 1u32, 1u32, 1u32, 13u32, f32, base),
        (0, 2, 2, 2, 2, 5, bf16, fold),
        (0, 2, 3, 4, 4, 1, bf16, prescaled),
        (0, 4, 1, 1, 1, 13, bf16, CudaDownConfig { pack_fma: true, ..fold }),
        (0, 4, 3, 1, 2, 5, f32, CudaDownConfig { step_unroll: StepUnroll::BothRings, ..base }),
        (0, 2, 6, 8, 4, 3, bf16, prescaled),
        (1, 4, 3, 1, 1, 13, bf16, CudaDownConfig { pack_fma: true, step_unroll: StepUnroll::BTileSlots, ..fold }),
        (1, 2, 6, 2, 2, 5, f32, base),
        (1, 4, 3, 1, 1, 9, bf16, CudaDownConfig { direct_codes: true, ..fold }),
        (2, 4, 6, 1, 2, 3, bf16, fold),
        (2, 2, 3, 3, 1, 7, f32, CudaDownConfig { step_unroll: StepUnroll::BTileSlots, ..base }),
        (2, 4, 3, 2, 4, 1, bf16, CudaDownConfig { prescaled: true, ..base }),
        (2, 4, 1, 1, 1, 5, bf16, CudaDownConfig { direct_codes: true, ..base }),
    ]
    .iter()
    .enumerate()
    {
        let cfg = CudaDownConfig { nc, warps, mt, ks, splits, stages: [4, 3, 5][i % 3], ..variant };
        cases.push((layer, dtype, fitted(layers[layer].g(), dtype, cfg)));
    }
    cases
}

/// The explicit-configuration tables' kinds: plain, with the bias fold, and prescaled on an
/// mbarrier ring (one 8-row tile, 16-row steps, 5 splits, 4 stages, for each table to vary).
fn configuration_kinds() -> [CudaDownConfig; 3] {
    let base = CudaDownConfig { mt: 1, ks: 1, splits: 5, stages: 4, ..Default::default() };
    [base, CudaDownConfig { bias_fold: true, ..base }, CudaDownConfig { prescaled: true, mbarriers: true, ..base }]
}

/// `cfg` with no more splits than `g` has steps and the deepest ring, at most `cfg`'s, that fits
/// `g` with `dtype` activations.
fn fitted(g: &mlx_trellis::trellis::TrellisGeometry, dtype: Dtype, cfg: CudaDownConfig) -> CudaDownConfig {
    let cfg = CudaDownConfig { splits: cfg.splits.min(cfg.input_steps(g)), ..cfg };
    cfg.with_deepest_ring(g, dtype).unwrap_or_else(|| panic!("{g} {dtype}: {cfg:?} does not fit"))
}

#[test]
fn shorter_block_configurations_fit() {
    let cases = shorter_block_configurations();
    assert_eq!(cases.len(), 13);
    // Blocks that cover a part of a coded block (0 whole blocks), one and two (of the 768-wide
    // layer's four).
    let layers = shorter_block_layers();
    let tiles: Vec<usize> =
        cases.iter().map(|&(l, _, c)| 16 * (c.nc * c.warps) as usize / layers[l].g().t as usize).collect();
    assert!(tiles.contains(&0) && tiles.contains(&1) && tiles.contains(&2), "{tiles:?}");
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn configurations_in_blocks_of_192_match_the_reference() {
    require_cuda();
    let layers = shorter_block_layers();
    for (layer, dtype, cfg) in shorter_block_configurations() {
        let c = &layers[layer];
        let g = *c.g();
        for m in [1, 8 * cfg.mt as usize + 3] {
            check(c, m, dtype, &format!("{cfg:?}"), &|x| down_cuda_with(x, c.lin.codes(), c.lin.scales(), &g, cfg));
        }
    }
}

/// The pair variant (an MLP's gate and up along their outputs in blocks of 192) and the residual
/// variant on blocks of 192 by the plan, at a row count of each band and the dense path's first.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn pair_and_residual_calls_in_blocks_of_192_match_the_reference() {
    require_cuda();
    let a = Case::in_blocks(576, 576, 3, 12, 192, 11);
    let b = Case::in_blocks(576, 576, 3, 12, 192, 12);
    let pair: Forward2 = &|x, [a, b]| {
        Ok(down_pair_cuda(x, [a.lin.codes(), b.lin.codes()], [a.lin.scales(), b.lin.scales()], a.g())?.to_vec())
    };
    let single: Forward2 = &|x, [a, _]| Ok(vec![down_cuda(x, a.lin.codes(), a.lin.scales(), a.g())?]);
    let g = *a.g();
    for m in [1, 5, 9, 17, 65, DENSE_MIN_ROWS] {
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            let (x, xr) = a.x(m, dtype);
            check_pair(&a, &b, &x, &xr, "planned pair", pair, single);
            check_residual(&a, m, dtype, "down_residual_cuda", &|x, r| {
                down_residual_cuda(x, a.lin.codes(), a.lin.scales(), &g, r)
            });
        }
    }
}

/// Layers coded along rotated outputs (docs/format.md §10) for the rotated-output variant, each
/// with its rotation: SmolLM2's q/o (576 -> 576 in blocks of 192, rotation blocks of 64) and k/v
/// (576 -> 192), 448 logical outputs of 576 stored (the padding cut in the fold), and a T 256
/// layer rotated in blocks of 256 (k 3 interleaved).
fn rotated_output_layers() -> [(Case, Rotation); 4] {
    let padded = Rotation::new(Rotation::seeded(448, 33).unwrap().signs().to_vec(), 64, 33).unwrap();
    [
        (Case::in_blocks(576, 576, 3, 12, 192, 31), Rotation::seeded(576, 31).unwrap()),
        (Case::in_blocks(576, 192, 2, 12, 192, 32), Rotation::seeded(192, 32).unwrap()),
        (Case::in_blocks(200, 576, 4, 16, 192, 33), padded),
        (Case::new(512, 1024, 3, CodeLayout::K3Interleaved), Rotation::seeded(1024, 34).unwrap()),
    ]
}

/// `y [m, stored]`'s logical columns times `Qᵀ` in f64 (the reference of a rotated output).
fn inverse_rotated_f64(y: &[f64], m: usize, stored: usize, r: &Rotation) -> Vec<f64> {
    let n = r.len();
    let mut out = Vec::with_capacity(m * n);
    for row in y.chunks_exact(stored) {
        let mut v = row[..n].to_vec();
        r.inverse_f64(&mut v).unwrap();
        out.extend(v);
    }
    out
}

/// The rotated-output variant on `c` with `cfg` at `m` rows of `dtype` activations: the bits of
/// the kernel's stored output turned back by `rotate.cu`; with a residual, the bits of that
/// rotation in f32 plus the residual in f32, rounded once; both within the dtype's gate of the
/// f64 reference.
fn check_rotated(c: &Case, r: &Rotation, cfg: CudaDownConfig, m: usize, dtype: Dtype) {
    let (g, n) = (*c.g(), r.len());
    let what = format!("{g} rotated in blocks of {} to {n}, {cfg:?}, M {m} {dtype}", r.block());
    let (x, xr) = c.x(m, dtype);
    let (codes, scales) = (c.lin.codes(), c.lin.scales());
    let fused = down_rotated_cuda_with(&x, codes, scales, &g, cfg, r, None).unwrap_or_else(|e| panic!("{what}: {e:#}"));
    assert_eq!((fused.shape(), fused.dtype()), (vec![m, n], dtype), "{what}");
    let stored = down_cuda_with(&x, codes, scales, &g, cfg).unwrap();
    let inverse = Direction::Inverse { stored: g.cols };
    let chain = rotate(&stored, r, inverse).unwrap();
    let got = to_f64(&fused);
    assert!(got == to_f64(&chain), "{what}: differs from the kernel then rotate.cu");
    let want = inverse_rotated_f64(&c.reference(&xr, m), m, g.cols, r);
    let err = rel_err(&got, &want).unwrap();
    println!("{what}: relErr {err:.2e}");
    assert!(err < gate(dtype), "{what}: relErr {err:.3e}");
    // The residual: added in f32 after the rotation, rounded once.
    let (res, rr) = residual_for(&want, m, n, dtype);
    let fused = down_rotated_cuda_with(&x, codes, scales, &g, cfg, r, Some(&res)).unwrap();
    assert_eq!((fused.shape(), fused.dtype()), (vec![m, n], dtype), "{what} + residual");
    let f32 = |a: &MlxArray| a.astype(Dtype::Float32).unwrap();
    let rotated_f32 = rotate(&f32(&stored), r, inverse).unwrap();
    let chain = f32(&res).add(&rotated_f32).unwrap().astype(dtype).unwrap();
    let got = to_f64(&fused);
    assert!(got == to_f64(&chain), "{what}: residual + rotation differs from the f32 chain rounded once");
    let err = rel_err(&got, &plus(&want, &rr)).unwrap();
    assert!(err < gate(dtype), "{what} + residual: relErr {err:.3e}");
}

/// The plan's configuration at each row band on rotated-output layer `layer`, every dtype: each
/// plan's thread blocks hold whole rotation blocks, so the fold rotates (a configuration whose
/// tile does not is refused, `rotations_the_fold_cannot_hold_are_refused`). One test per layer,
/// so that their kernel compiles run side by side.
fn rotated_outputs_by_the_plan(layer: usize) {
    require_cuda();
    let (c, r) = &rotated_output_layers()[layer];
    let mut folded = 0;
    for m in [1, 2, 5, 8, 9, 13, 17, 25, 32, 33, 64, 65, 100] {
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            let cfg = plan_for(c.g(), m, dtype);
            if cfg.rotates_in_fold(c.g(), r.block(), dtype) {
                check_rotated(c, r, cfg, m, dtype);
                folded += 1;
            } else {
                // Such a call runs the kernel, then rotate.cu (the rotation tests' paths).
                let (x, _) = c.x(m, dtype);
                let err = down_rotated_cuda_with(&x, c.lin.codes(), c.lin.scales(), c.g(), cfg, r, None).unwrap_err();
                assert!(err.to_string().contains("cannot be turned back in the fold"), "{err}");
            }
        }
    }
    // Every plan up to 16 rows rotates in the fold (rotated_output_configurations_fit).
    assert!(folded >= 18, "{folded} plans rotate in the fold");
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn rotated_outputs_in_the_fold_give_the_kernel_then_rotate_cus_bits_q_o() {
    rotated_outputs_by_the_plan(0);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn rotated_outputs_in_the_fold_give_the_kernel_then_rotate_cus_bits_k_v() {
    rotated_outputs_by_the_plan(1);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn rotated_outputs_in_the_fold_give_the_kernel_then_rotate_cus_bits_padded() {
    rotated_outputs_by_the_plan(2);
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn rotated_outputs_in_the_fold_give_the_kernel_then_rotate_cus_bits_t256() {
    rotated_outputs_by_the_plan(3);
}

/// Explicit configurations on the rotated-output layers: a part of a coded block (64 positions,
/// one rotation block), several rows staged at a time and passes of up to 64 rows (5 rows of a
/// 192-wide tile at a time), prescaled B tiles on an mbarrier ring, direct code loads, tiles of
/// one and two 256-wide rotation blocks. Each entry: the layer's index, the dtype and the
/// configuration.
fn rotated_output_configurations() -> Vec<(usize, Dtype, CudaDownConfig)> {
    let layers = rotated_output_layers();
    let (f32, bf16) = (Dtype::Float32, Dtype::Bfloat16);
    let [base, fold, prescaled] = configuration_kinds();
    let mut cases = Vec::new();
    // (layer, nc, warps, mt, ks, splits, dtype, kind)
    for &(layer, nc, warps, mt, ks, splits, dtype, variant) in &[
        (0usize, 2u32, 2u32, 1u32, 1u32, 13u32, f32, base),
        (0, 4, 3, 2, 2, 5, bf16, fold),
        (0, 2, 6, 8, 2, 3, bf16, prescaled),
        (1, 4, 1, 1, 1, 9, bf16, CudaDownConfig { direct_codes: true, ..fold }),
        (1, 2, 6, 3, 1, 7, f32, base),
        (2, 4, 3, 4, 2, 3, bf16, prescaled),
        (2, 2, 2, 1, 1, 5, f32, base),
        (3, 8, 4, 1, 1, 16, bf16, CudaDownConfig { pack_fma: true, ..fold }),
        (3, 4, 4, 2, 2, 8, f32, base),
    ] {
        let cfg = CudaDownConfig { nc, warps, mt, ks, splits, ..variant };
        cases.push((layer, dtype, fitted(layers[layer].0.g(), dtype, cfg)));
    }
    cases
}

#[test]
fn rotated_output_configurations_fit() {
    let layers = rotated_output_layers();
    for (layer, dtype, cfg) in rotated_output_configurations() {
        let (c, r) = &layers[layer];
        cfg.check(c.g(), dtype).unwrap();
        assert_eq!(16 * (cfg.nc * cfg.warps) as usize % r.block(), 0, "{cfg:?}: a tile of whole rotation blocks");
        assert!(cfg.rotates_in_fold(c.g(), r.block(), dtype), "{cfg:?} on {} {dtype}", c.g());
    }
    // The plans up to 16 rows rotate in the fold on every layer (rotated_outputs_by_the_plan).
    for (c, r) in &layers {
        for m in 1..=16 {
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                let cfg = plan_for(c.g(), m, dtype);
                assert!(cfg.rotates_in_fold(c.g(), r.block(), dtype), "{} M {m} {dtype}: {cfg:?}", c.g());
            }
        }
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn rotated_outputs_in_every_configuration() {
    require_cuda();
    let layers = rotated_output_layers();
    for (layer, dtype, cfg) in rotated_output_configurations() {
        let (c, r) = &layers[layer];
        for m in [1, 8 * cfg.mt as usize - 1, 8 * cfg.mt as usize + 3] {
            check_rotated(c, r, cfg, m.max(1), dtype);
        }
    }
}

/// A pair of matrices with rotated outputs (a block's k and v) in one launch: each output the
/// bits of its matrix's rotated call alone, at a row count of each band of the plan.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn a_pair_with_rotated_outputs_gives_each_single_calls_bits() {
    require_cuda();
    let (k, rk) = &rotated_output_layers()[1];
    let v = Case::in_blocks(576, 192, 2, 12, 192, 36);
    assert_ne!(k.host.codes, v.host.codes);
    let rv = Rotation::seeded(192, 35).unwrap();
    let g = *k.g();
    for m in [1, 5, 9, 17, 65] {
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            let cfg = plan_for(&g, m, dtype);
            let (x, _) = k.x(m, dtype);
            let [a, b] = down_pair_rotated_cuda_with(
                &x,
                [k.lin.codes(), v.lin.codes()],
                [k.lin.scales(), v.lin.scales()],
                &g,
                cfg,
                [rk, &rv],
            )
            .unwrap_or_else(|e| panic!("{g} M {m} {dtype}: {e:#}"));
            for (y, (c, r)) in [a, b].iter().zip([(k, rk), (&v, &rv)]) {
                let alone = down_rotated_cuda_with(&x, c.lin.codes(), c.lin.scales(), &g, cfg, r, None).unwrap();
                assert!(to_f64(y) == to_f64(&alone), "{g} M {m} {dtype}: a pair output differs from its call alone");
            }
        }
    }
}

#[test]
fn rotations_the_fold_cannot_hold_are_refused() {
    // Runs on every back-end: the launch is refused while it is prepared, before anything runs.
    let layers = rotated_output_layers();
    let (c, r) = &layers[3];
    let g = *c.g();
    let x = MlxArray::zeros(&[1, g.rows], Dtype::Bfloat16).unwrap();
    // 128 positions a thread block: half of a 256-wide rotation block.
    let cfg = CudaDownConfig { nc: 2, warps: 4, mt: 1, ks: 1, splits: 4, ..Default::default() };
    cfg.check(&g, Dtype::Bfloat16).unwrap();
    let err = down_rotated_cuda_with(&x, c.lin.codes(), c.lin.scales(), &g, cfg, r, None).unwrap_err();
    assert!(err.to_string().contains("cannot be turned back in the fold"), "{err}");
    // Two rotations of different blocks for one pair.
    let (k, rk) = &layers[1];
    let other = Rotation::new(vec![1.0; 192], 32, 0).unwrap();
    let x = MlxArray::zeros(&[1, 576], Dtype::Bfloat16).unwrap();
    let kc = plan_for(k.g(), 1, Dtype::Bfloat16);
    let err = down_pair_rotated_cuda_with(
        &x,
        [k.lin.codes(), k.lin.codes()],
        [k.lin.scales(), k.lin.scales()],
        k.g(),
        kc,
        [rk, &other],
    )
    .unwrap_err();
    assert!(err.to_string().contains("one width and block"), "{err}");
    // Signs of another length than the rotation's.
    let res = MlxArray::zeros(&[1, 100], Dtype::Bfloat16).unwrap();
    let err = down_rotated_cuda_with(&x, k.lin.codes(), k.lin.scales(), k.g(), kc, rk, Some(&res)).unwrap_err();
    assert!(err.to_string().contains("residual"), "{err}");
}

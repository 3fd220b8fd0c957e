//! [`CudaDownConfig`]: how one call of the CUDA down kernel (`kernels/cuda/down_mma.cu`) is
//! shaped, the shared memory each shape takes, and the checks that say whether a shape can run a
//! geometry.

use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::trellis::format::TrellisGeometry;

/// How one call of the CUDA down kernel is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CudaDownConfig {
    /// 16-position MMA sub-tiles per warp (2, 4 or 8): a warp covers `16 * nc` outputs.
    pub nc: u32,
    /// 8-row MMA tiles per pass (activation rows per decode: `8 * mt`).
    pub mt: u32,
    /// 16-row chunks of input rows per step (1, 2 or 4): one barrier, one round of copies and
    /// one B tile per step.
    pub ks: u32,
    /// Warps per block (1 to 8); each owns `16 * nc` output positions of one coded block, so a
    /// block of 256-position coded blocks covers `warps * nc / 16` whole ones, or where that is
    /// below 1 a part of one (a half, a quarter, ...: several blocks then share a coded block's
    /// codes); shorter coded blocks likewise (192 positions: 3 warps of NC 4 cover one).
    pub warps: u32,
    /// Input-row splits (their partials folded by the kernel's last block of each tile).
    pub splits: u32,
    /// Depth of the shared-memory ring the codes stream through (2..=6).
    pub stages: u32,
    /// Carry y + 1534 in the fragments and subtract the bias at the end (f16/bf16 activations).
    pub bias_fold: bool,
    /// Pack half of the dp4a decode's code pairs with an IMAD (FMA-heavy pipe) instead of a PRMT
    /// (ALU pipe), which at one row is the decode's limit. Needs `bias_fold`; like the fold it
    /// applies to 16-bit activations only. It costs registers at wide tiles.
    pub pack_fma: bool,
    /// The B operand (activations times the row scales, as f16) comes
    /// from a pre-pass kernel (`kernels/cuda/prescale.cu`) and streams into the code ring with
    /// the codes, one B tile per ring slot, instead of every thread block loading and converting
    /// the activations of each step itself. It costs one more kernel per call and
    /// `stages` B tiles of shared memory instead of two; it pays from two 8-row tiles a pass (9
    /// rows and more, with `mbarriers`).
    pub prescaled: bool,
    /// With `prescaled`: the code ring is synchronised by an mbarrier pair per slot instead of
    /// a block barrier per step. A warp waits only for its own step's data, and before it
    /// refills a slot for every warp to have released it; the ring runs `stages - 2` steps ahead,
    /// so warps may drift up to two steps apart. Needs `stages >= 3`.
    pub mbarriers: bool,
    /// How the block-barrier ring (not `mbarriers`) runs its steps: rolled, or in unrolled rounds
    /// in which slots are constants of each copy of the step (fewer instructions a step, for
    /// more registers).
    pub step_unroll: StepUnroll,
    /// No code ring: each lane loads its own code words from global memory into registers a
    /// step ahead, and the block builds the B tiles of its whole split once before its loop, so
    /// the loop has no barrier (the fused gate·up kernel's way). Not with `prescaled`, rolled
    /// steps only; the B tiles of the longest split's steps must fit the shared memory, which
    /// suits few rows (docs/cuda-down.md §7 lead 8).
    pub direct_codes: bool,
}

/// How the down kernel's block-barrier ring runs its steps ([`CudaDownConfig::step_unroll`]);
/// the kernel's template int `UNROLLED_STEPS`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StepUnroll {
    /// One copy of the step: each step computes its ring slot's and B-tile slot's addresses.
    #[default]
    Rolled,
    /// Unrolled rounds of the B tiles' two slots (two steps; with `prescaled` a B tile rides in
    /// each ring slot, so this is [`StepUnroll::BothRings`]): the B tile's slot is a constant,
    /// the ring's is computed. At one row the same registers as rolled for 7 % fewer
    /// instructions a step at k 3 (docs/cuda-down.md §7 lead 6).
    BTileSlots,
    /// Unrolled rounds in which every ring and B-tile slot comes round once (the ring's depth in
    /// steps, twice that where the B tiles' two slots do not divide it): every slot is a
    /// constant. The planned 5-16-row shapes on an H200 ran 2-12 % faster; the one-row shape
    /// took 128 registers and ran no faster.
    BothRings,
}

impl StepUnroll {
    /// The kernel's template int `UNROLLED_STEPS`.
    pub(crate) fn template_int(self) -> i32 {
        match self {
            StepUnroll::Rolled => 0,
            StepUnroll::BTileSlots => 1,
            StepUnroll::BothRings => 2,
        }
    }
}

impl Default for CudaDownConfig {
    /// A base for explicit configurations (`CudaDownConfig { nc: 2, mt: 8, ..Default::default() }`):
    /// NC 4 tiles in 4-warp blocks, one 8-row tile per pass, 32-row steps, 32 splits, a 4-deep
    /// ring, no option on. Whether a configuration built on it
    /// fits a geometry (enough input rows for its splits, its coded blocks, its shared memory)
    /// is for [`CudaDownConfig::check`] to say.
    fn default() -> Self {
        CudaDownConfig {
            nc: 4,
            mt: 1,
            ks: 2,
            warps: 4,
            splits: 32,
            stages: 4,
            bias_fold: false,
            pack_fma: false,
            prescaled: false,
            mbarriers: false,
            step_unroll: StepUnroll::Rolled,
            direct_codes: false,
        }
    }
}

/// The most shared memory a block of the kernel may take: what a block may opt into on Hopper
/// (227 KB; the kernel's shared memory is dynamic, and MLX raises a kernel's limit above 48 KB).
/// Ampere's A100 allows 163 KB and other recent GPUs 99 KB: there a configuration above the
/// GPU's limit fails at launch with MLX's error.
const SHARED_LIMIT: usize = 227 * 1024;

/// The kernel's static shared memory, which counts against [`SHARED_LIMIT`] too: each pass row's
/// power of two and its inverse (f32, at most 64 rows) and the fold's flag, rounded up.
const STATIC_SHARED: usize = 1024;

/// The static shared memory of the rotated-output variant's fold: up to 1024 f32 sums of a tile
/// (`ROT_ROWS * TILE` in `down_mma.cu`).
const ROTATION_SHARED: usize = 4096;

/// The shared memory the planned configurations keep to: the 48 KB every CUDA
/// GPU gives a block without opting in, where they were measured (up to five of their blocks
/// share an SM).
pub(crate) const PLAN_SHARED_BUDGET: usize = 48 * 1024;

/// The shared memory the planned prescaled 8-warp configurations keep to: their registers hold
/// them to two blocks an SM (docs/cuda-down.md), and two blocks of 112 KB (each with the 1 KB the
/// GPU reserves per block) fit Hopper's 228 KB; one B tile per ring slot.
pub(crate) const WIDE_PLAN_SHARED_BUDGET: usize = 112 * 1024;

impl CudaDownConfig {
    /// The kernel's shared memory: the code ring and the B tiles (`split_x`: f32 activations,
    /// carried as two f16 tiles).
    pub(crate) fn shared_bytes(&self, g: &TrellisGeometry, split_x: bool) -> usize {
        let coded_blocks = self.copied_blocks(g);
        let step_rows = 16 * self.ks as usize;
        // With direct codes no ring (a 16-byte placeholder) and a B tile per step of the
        // longest split.
        let ring = if self.direct_codes {
            16
        } else {
            self.stages as usize * step_rows * (coded_blocks * g.words_per_block() + 4) * 4
        };
        let b_slots = if self.direct_codes {
            self.input_steps(g).div_ceil(self.splits.max(1)) as usize
        } else if self.prescaled {
            self.stages as usize
        } else {
            2
        };
        let b_tiles = b_slots * if split_x { 2 } else { 1 } * 8 * self.mt as usize * (step_rows + 8) * 2;
        ring + b_tiles + self.mbarrier_bytes()
    }

    /// The shared memory a planned configuration of this kind keeps to: prescaled B tiles in
    /// 8-warp blocks (two per SM) take one B tile per ring slot.
    pub(crate) fn plan_shared_budget(&self) -> usize {
        if self.prescaled && self.warps >= 8 {
            WIDE_PLAN_SHARED_BUDGET
        } else {
            PLAN_SHARED_BUDGET
        }
    }

    /// The steps of `16 * ks` input rows that `g`'s rows take: the most splits there can be.
    pub fn input_steps(&self, g: &TrellisGeometry) -> u32 {
        g.rows.div_ceil(16 * self.ks as usize) as u32
    }

    /// Output positions one thread block covers: `16 * nc * warps`.
    pub(crate) fn tile_positions(&self) -> usize {
        16 * (self.nc * self.warps) as usize
    }

    /// Coded blocks of `g` whose codes a thread block copies: the whole ones it covers, or the
    /// one its part of a coded block lies in.
    pub(crate) fn copied_blocks(&self, g: &TrellisGeometry) -> usize {
        (self.tile_positions() / (g.t as usize).max(1)).max(1)
    }

    /// Thread blocks along the output columns of `g` (see [`Self::check`] for the tiles that fit).
    pub(crate) fn column_blocks(&self, g: &TrellisGeometry) -> usize {
        let (tile, t) = (self.tile_positions(), (g.t as usize).max(1));
        if tile >= t {
            g.blocks_per_row() / (tile / t)
        } else {
            g.blocks_per_row() * (t / tile)
        }
    }

    /// Whether a thread block's tile fits `g`'s coded blocks: each warp's `16 * nc` positions lie
    /// in one coded block, and the tile covers whole coded blocks (a divisor of a row's) or one
    /// part of a coded block.
    pub(crate) fn tile_fits(&self, g: &TrellisGeometry) -> bool {
        let (tile, t) = (self.tile_positions(), g.t as usize);
        let whole = t > 0 && tile.is_multiple_of(t) && g.blocks_per_row().is_multiple_of(tile / t);
        t.is_multiple_of(16 * self.nc as usize) && (whole || (tile > 0 && t.is_multiple_of(tile)))
    }

    /// Whether the rotated-output variant of this configuration can turn `g`'s outputs back by a
    /// rotation in blocks of `block` in its fold, for `dtype` activations: each thread block's
    /// tile holds whole rotation blocks, and the fold's staging (a static array of up to 4 KB)
    /// keeps the kernel's shared memory within the 48 KB a kernel has without opting in (on an
    /// H100 a launch of it failed, "invalid argument", from a row count whose plan takes about
    /// 44 KB of dynamic shared memory; this rule is the inference, docs/cuda-down.md §4).
    pub fn rotates_in_fold(&self, g: &TrellisGeometry, block: usize, dtype: Dtype) -> bool {
        let shared = self.shared_bytes(g, dtype == Dtype::Float32) + STATIC_SHARED + ROTATION_SHARED;
        block.is_power_of_two() && self.tile_positions().is_multiple_of(block) && shared <= PLAN_SHARED_BUDGET
    }

    /// The ring's mbarriers: a "full" and an "empty" one a stage, where the ring has them.
    fn mbarrier_bytes(&self) -> usize {
        if self.mbarriers {
            2 * self.stages as usize * 8
        } else {
            0
        }
    }

    /// Activations in a step's B tile: `8 * mt` rows by `16 * ks` input rows.
    fn b_tile_activations(&self) -> u32 {
        8 * self.mt * 16 * self.ks
    }

    /// Activations per load in the kernel (its `VW`): 8 where the rows are a multiple of 8 and a
    /// step's B tile (`8 * mt` rows by `16 * ks`) gives every thread at least 8, else 1.
    fn activations_per_load(&self, g: &TrellisGeometry) -> u32 {
        if g.rows.is_multiple_of(8) && self.b_tile_activations() >= 8 * 32 * self.warps {
            8
        } else {
            1
        }
    }

    /// Whether this configuration can run `g` with `dtype` activations (see [`Self::check`]).
    pub fn fits(&self, g: &TrellisGeometry, dtype: Dtype) -> bool {
        self.check(g, dtype).is_ok()
    }

    /// This configuration with the deepest code ring, at most `self.stages` steps, that makes it
    /// fit `g` with `dtype` activations; `None` if none does.
    #[cfg(any(test, feature = "tuning"))]
    pub fn with_deepest_ring(self, g: &TrellisGeometry, dtype: Dtype) -> Option<CudaDownConfig> {
        (2..=self.stages).rev().map(|stages| CudaDownConfig { stages, ..self }).find(|c| c.fits(g, dtype))
    }

    /// An error naming the first reason this configuration cannot run `g` with `dtype`
    /// activations: a field out of range, a block width that does not divide the coded blocks,
    /// more splits than steps, or more shared memory than a block may take (227 KB).
    pub fn check(&self, g: &TrellisGeometry, dtype: Dtype) -> Result<()> {
        if ![2, 4, 8].contains(&self.nc) {
            invalid!("CUDA down kernel: nc = {} must be 2, 4 or 8", self.nc);
        }
        if !(1..=8).contains(&self.mt) {
            invalid!("CUDA down kernel: mt = {} must be in 1..=8", self.mt);
        }
        if ![1, 2, 4].contains(&self.ks) {
            invalid!("CUDA down kernel: ks = {} must be 1, 2 or 4", self.ks);
        }
        if self.pack_fma && !self.bias_fold {
            invalid!("CUDA down kernel: pack_fma packs the dp4a decode's pairs with the bias fold (needs bias_fold)");
        }
        if self.mbarriers && (!self.prescaled || self.stages < 3) {
            invalid!("CUDA down kernel: mbarriers synchronise the prescaled ring (needs prescaled and stages >= 3, got {} stages)", self.stages);
        }
        if self.step_unroll != StepUnroll::Rolled && self.mbarriers {
            invalid!("CUDA down kernel: step_unroll unrolls the block-barrier ring's steps (not with mbarriers)");
        }
        if self.direct_codes && (self.prescaled || self.step_unroll != StepUnroll::Rolled) {
            invalid!("CUDA down kernel: direct_codes builds its own B tiles in rolled steps (not with prescaled or step_unroll)");
        }
        // Loading activations one at a time, a thread keeps one step row, which needs the block's
        // threads to be a multiple of the step's rows.
        if !self.prescaled && self.activations_per_load(g) == 1 && !(32 * self.warps).is_multiple_of(16 * self.ks) {
            invalid!(
                "CUDA down kernel: {} warps cannot load steps of {} rows of {g} one activation at a time",
                self.warps,
                16 * self.ks
            );
        }
        // Up to 8 warps: 256 threads always fit the register file, whatever the kernel uses.
        if !(1..=8).contains(&self.warps) || self.splits == 0 || !(2..=6).contains(&self.stages) {
            invalid!(
                "CUDA down kernel: {} warps (1 to 8), {} splits, {} stages (2 to 6) are out of range",
                self.warps,
                self.splits,
                self.stages
            );
        }
        // A block covers whole coded blocks (a divisor of the row's) or one part of a coded
        // block, and a warp's positions lie in one coded block.
        if !self.tile_fits(g) {
            invalid!(
                "CUDA down kernel: {} warps of {} sub-tiles cover {} positions, neither a part of a {}-position coded block in warps of whole sub-tiles nor a divisor of the {} coded blocks of {g}",
                self.warps,
                self.nc,
                self.tile_positions(),
                g.t,
                g.blocks_per_row()
            );
        }
        if self.splits > self.input_steps(g) {
            invalid!("CUDA down kernel: {} splits for {} input rows ({}-row steps)", self.splits, g.rows, 16 * self.ks);
        }
        let shared = self.shared_bytes(g, dtype == Dtype::Float32);
        let limit = SHARED_LIMIT - STATIC_SHARED;
        if shared > limit {
            invalid!(
                "CUDA down kernel: {shared} bytes of shared memory for {g} with {dtype} activations (at most {limit} besides the kernel's static {STATIC_SHARED}; use fewer stages, warps or 8-row tiles, or shorter steps)"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trellis::cuda::down::plan::{plan, plan_for};

    #[test]
    fn the_deepest_ring_that_fits_is_found() {
        // k 8: a coded block's row is 64 words. 8 warps of NC 8 cover four coded blocks: in
        // 64-row steps a ring step takes 66.6 KB, so 3 stages fit 227 KB and 4 do not.
        let g = TrellisGeometry::row_major(17408, 8192, 8, 256, 12, 0).unwrap();
        let cfg = CudaDownConfig { nc: 8, warps: 8, ks: 4, stages: 4, ..Default::default() };
        assert!(!cfg.fits(&g, Dtype::Bfloat16));
        assert_eq!(cfg.with_deepest_ring(&g, Dtype::Bfloat16).map(|c| c.stages), Some(3));
        // A shape that fits keeps its ring; one whose steps cannot fit at all finds none.
        let short = CudaDownConfig { ks: 1, ..cfg };
        assert_eq!(short.with_deepest_ring(&g, Dtype::Bfloat16), Some(short));
        let splits = CudaDownConfig { splits: 10_000, ..cfg };
        assert_eq!(splits.with_deepest_ring(&g, Dtype::Bfloat16), None);
    }

    #[test]
    fn fields_out_of_range_are_errors_that_say_so() {
        let g = TrellisGeometry::row_major(200, 1024, 3, 256, 12, 0).unwrap();
        let err = |cfg: CudaDownConfig| cfg.check(&g, Dtype::Bfloat16).unwrap_err().to_string();
        assert!(err(CudaDownConfig { ks: 3, ..plan(&g, 1) }).contains("ks = 3 must be 1, 2 or 4"));
        // Only the tile widths a plan uses: NC 2, 4, 8; up to 8 8-row tiles a pass; 1 to 8 warps.
        for nc in [1, 16, 3] {
            assert!(err(CudaDownConfig { nc, ..plan(&g, 1) }).contains("must be 2, 4 or 8"), "nc {nc}");
        }
        assert!(err(CudaDownConfig { mt: 9, ..plan(&g, 1) }).contains("mt = 9 must be in 1..=8"));
        assert!(err(CudaDownConfig { warps: 16, ..plan(&g, 1) }).contains("16 warps (1 to 8)"));
        // 200 rows are 4 steps of 64: 5 splits would leave one empty.
        let splits = CudaDownConfig { ks: 4, splits: 5, ..plan(&g, 1) };
        assert!(err(splits).contains("5 splits for 200 input rows (64-row steps)"), "{}", err(splits));
        // 100 rows load one activation at a time: one warp's 32 threads cannot keep 64 step rows.
        let odd = TrellisGeometry::row_major(100, 1024, 3, 256, 12, 0).unwrap();
        let one_warp = CudaDownConfig { nc: 8, warps: 1, ks: 4, splits: 1, ..plan(&odd, 1) };
        let e = one_warp.check(&odd, Dtype::Bfloat16).unwrap_err().to_string();
        assert!(e.contains("one activation at a time"), "{e}");
        assert!(CudaDownConfig { ks: 2, ..one_warp }.fits(&odd, Dtype::Bfloat16));
        // A B tile of fewer than 8 activations per thread loads one at a time as well.
        let small_tile = CudaDownConfig { nc: 8, mt: 1, warps: 1, ks: 1, splits: 1, ..plan(&g, 1) };
        assert_eq!(small_tile.activations_per_load(&g), 1);
        assert!(small_tile.fits(&g, Dtype::Bfloat16));
        assert_eq!(CudaDownConfig { ks: 2, ..small_tile }.activations_per_load(&g), 8);
    }

    #[test]
    fn too_much_shared_memory_is_an_error_that_says_so() {
        let g = TrellisGeometry::row_major(17408, 8192, 8, 256, 12, 0).unwrap();
        let cfg = CudaDownConfig { nc: 8, warps: 8, ks: 4, mt: 8, stages: 4, ..Default::default() };
        let err = cfg.check(&g, Dtype::Float32).unwrap_err().to_string();
        assert!(err.contains("bytes of shared memory") && err.contains("at most 231424"), "{err}");
        // Above 48 KB is allowed (dynamic shared memory), but the plans keep to their budgets,
        // where they were measured, for every row count and dtype.
        let big = CudaDownConfig { nc: 8, mt: 4, ks: 1, warps: 8, splits: 8, ..Default::default() };
        assert!(big.shared_bytes(&g, false) > PLAN_SHARED_BUDGET);
        big.check(&g, Dtype::Bfloat16).unwrap();
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            for m in [1, 8, 16, 32, 64, 128] {
                let cfg = plan_for(&g, m, dtype);
                cfg.check(&g, dtype).unwrap();
                assert!(
                    cfg.shared_bytes(&g, dtype == Dtype::Float32) <= cfg.plan_shared_budget(),
                    "M {m} {dtype}: {cfg:?}"
                );
            }
        }
    }

    #[test]
    fn prescaled_b_tiles_take_a_b_tile_per_ring_slot() {
        let g = TrellisGeometry::row_major(200, 1024, 3, 256, 12, 0).unwrap();
        let prescaled = CudaDownConfig { prescaled: true, mbarriers: false, ..plan(&g, 40) };
        prescaled.check(&g, Dtype::Float32).unwrap();
        // One B tile per ring slot instead of two.
        let plain = CudaDownConfig { prescaled: false, ..prescaled };
        let b_tile = 8 * prescaled.mt as usize * (16 * prescaled.ks as usize + 8) * 2;
        assert_eq!(
            prescaled.shared_bytes(&g, false) - plain.shared_bytes(&g, false),
            (prescaled.stages as usize - 2) * b_tile
        );
        // Its ring on mbarriers: a pair of 8-byte mbarriers per slot, 3 stages or more.
        let mbarriers = CudaDownConfig { mbarriers: true, ..prescaled };
        mbarriers.check(&g, Dtype::Bfloat16).unwrap();
        assert_eq!(
            mbarriers.shared_bytes(&g, false) - prescaled.shared_bytes(&g, false),
            16 * prescaled.stages as usize
        );
        for step_unroll in [StepUnroll::BTileSlots, StepUnroll::BothRings] {
            let err = CudaDownConfig { step_unroll, ..mbarriers }.check(&g, Dtype::Bfloat16).unwrap_err().to_string();
            assert!(err.contains("step_unroll unrolls the block-barrier ring"), "{err}");
            CudaDownConfig { step_unroll, ..prescaled }.check(&g, Dtype::Bfloat16).unwrap();
        }
        for cfg in [CudaDownConfig { prescaled: false, ..mbarriers }, CudaDownConfig { stages: 2, ..mbarriers }] {
            let err = cfg.check(&g, Dtype::Bfloat16).unwrap_err().to_string();
            assert!(err.contains("mbarriers synchronise the prescaled ring"), "{err}");
        }
        // Direct code loads build their own B tiles in rolled steps, and size the shared memory
        // by the longest split's steps (no ring).
        let direct = CudaDownConfig { direct_codes: true, splits: 3, ..CudaDownConfig::default() };
        direct.check(&g, Dtype::Bfloat16).unwrap();
        for bad in [CudaDownConfig { prescaled: true, ..direct }, CudaDownConfig { step_unroll: StepUnroll::BTileSlots, ..direct }] {
            let err = bad.check(&g, Dtype::Bfloat16).unwrap_err().to_string();
            assert!(err.contains("direct_codes builds its own B tiles"), "{err}");
        }
        let steps = direct.input_steps(&g) as usize;
        let per_split = steps.div_ceil(direct.splits as usize);
        assert_eq!(direct.shared_bytes(&g, false), 16 + per_split * 8 * (32 + 8) * 2);
    }

    #[test]
    fn pack_fma_needs_the_bias_fold() {
        let g = TrellisGeometry::row_major(200, 1024, 3, 256, 12, 0).unwrap();
        let one = CudaDownConfig { pack_fma: true, ..plan(&g, 1) };
        one.check(&g, Dtype::Bfloat16).unwrap();
        let err = CudaDownConfig { bias_fold: false, ..one }.check(&g, Dtype::Bfloat16).unwrap_err().to_string();
        assert!(err.contains("pack_fma packs the dp4a decode's pairs"), "{err}");
    }

    #[test]
    fn blocks_cover_whole_coded_blocks_or_a_part_of_one() {
        let qwen = TrellisGeometry::row_major(17408, 5120, 3, 256, 12, 0).unwrap();
        let base = CudaDownConfig { mt: 4, ks: 1, splits: 13, ..Default::default() };
        // 20 coded blocks a row: 2 per block -> 10 column blocks; half a block -> 40.
        let two = CudaDownConfig { nc: 4, warps: 8, ..base };
        assert_eq!((two.column_blocks(&qwen), two.copied_blocks(&qwen)), (10, 2));
        let half = CudaDownConfig { nc: 2, mt: 4, warps: 4, ..base };
        half.check(&qwen, Dtype::Bfloat16).unwrap();
        assert_eq!((half.column_blocks(&qwen), half.copied_blocks(&qwen)), (40, 1));
        let one_warp = CudaDownConfig { nc: 2, mt: 4, warps: 1, ..base };
        assert_eq!(one_warp.column_blocks(&qwen), 160);
        // 3 warps of NC 2: 96 positions, not a part of a coded block.
        let err = CudaDownConfig { warps: 3, ..one_warp }.check(&qwen, Dtype::Bfloat16).unwrap_err().to_string();
        assert!(err.contains("cover 96 positions, neither a part of a 256-position coded block"), "{err}");
        // 6 warps of NC 8 cover 3 coded blocks, which do not divide 20.
        let err =
            CudaDownConfig { nc: 8, mt: 1, warps: 6, ..base }.check(&qwen, Dtype::Bfloat16).unwrap_err().to_string();
        assert!(err.contains("nor a divisor of the 20 coded blocks"), "{err}");
        // Blocks of 192: 3 warps of NC 4 cover one; NC 8's 128 positions would cross a block's
        // end, and 4 warps of NC 4 cover 256 positions, neither a part nor whole blocks.
        let q = TrellisGeometry::row_major(576, 576, 3, 192, 12, 0).unwrap();
        let three = CudaDownConfig { nc: 4, mt: 1, warps: 3, splits: 9, ..base };
        three.check(&q, Dtype::Bfloat16).unwrap();
        assert_eq!((three.column_blocks(&q), three.copied_blocks(&q)), (3, 1));
        let one = CudaDownConfig { warps: 1, ..three };
        assert_eq!((one.column_blocks(&q), one.copied_blocks(&q)), (9, 1));
        for bad in [CudaDownConfig { nc: 8, warps: 3, ..three }, CudaDownConfig { warps: 4, ..three }] {
            let err = bad.check(&q, Dtype::Bfloat16).unwrap_err().to_string();
            assert!(err.contains("neither a part of a 192-position coded block"), "{err}");
        }
    }
}

//! Down projections on MLX's CUDA back-end: `kernels/cuda/down_mma.cu`, registered through
//! `mlx_fast_cuda_kernel` and applied with the template ints of a [`CudaDownConfig`]. Like the
//! Metal kernels it writes f32 partial sums `[M, SPLITS, C]` (already scaled by 1/147.8) that
//! one MLX `sum` folds, then casts to the activation dtype.
//!
//! The kernel decodes code values straight into tensor-core fragments (exact f16 integers) and
//! multiplies them with `mma.sync` against the activations times the row scales, or (staged,
//! [`CudaDownConfig::row_warps`]) decodes each step once into shared memory and multiplies from
//! there, optionally on warps of its own that hand the decoded tiles to the multiplying ones
//! ([`CudaDownConfig::producers`]); see the kernel file for the work split. With
//! [`CudaDownConfig::prescaled`] a pre-pass kernel (`kernels/cuda/prescale.cu`) first writes the
//! activations times the row scales as f16, and the kernel streams them in with the codes.
//! [`plan`] picks the configuration for a row count.
//!
//! From [`DENSE_MIN_ROWS`] rows of 16-bit activations [`down_cuda`] instead decodes the layer
//! once to dense weights and runs MLX's matmul ([`down_cuda_dense`]): the decode costs one write
//! of the dense layer whatever the row count, and MLX's matmul then runs at the dense speed,
//! while the fused kernel's decode-and-multiply grows with the rows.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use anyhow::Context;

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::kernel::{CudaKernel, CudaLaunch, LaunchConfig};

use super::codebook::CUDA_HEADER;
use super::expand_cuda::down_cuda_dense;
use super::geometry::{CodeLayout, TrellisGeometry};
use super::launch::{cached_cuda_kernel, check_operands, int, source_variant};

const SOURCE: &str = include_str!("../../kernels/cuda/down_mma.cu");
const HEADER: &str = include_str!("../../kernels/cuda/down_mma.cuh");
const PRESCALE_SOURCE: &str = include_str!("../../kernels/cuda/prescale.cu");

/// Prescaled rows are padded to a multiple of this (whole steps of any `ks`; see prescale.cu).
const PRESCALED_ROW_MULTIPLE: usize = 64;

/// How one call of the CUDA down kernel is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CudaDownConfig {
    /// 16-position MMA sub-tiles per warp (1, 2, 4, 8 or 16): a warp covers `16 * nc` outputs.
    pub nc: u32,
    /// 8-row MMA tiles per pass (activation rows per decode: `8 * mt`).
    pub mt: u32,
    /// 16-row chunks of input rows per step (1, 2 or 4): one barrier, one round of copies and
    /// one B tile per step.
    pub ks: u32,
    /// Warps per block (1 to 8, or 16 with `nc` 1); each owns `16 * nc` output positions, so a
    /// block covers `warps * nc / 16` whole coded blocks, or where that is below 1 a part of one
    /// (a half, a quarter, ...: several blocks then share a coded block's codes).
    pub warps: u32,
    /// Input-row splits (partials folded by MLX's sum).
    pub splits: u32,
    /// Depth of the shared-memory ring the codes stream through (2..=6).
    pub stages: u32,
    /// Byte sums on the tensor cores (u8 MMA) instead of dp4a.
    pub bytesum_mma: bool,
    /// Carry y + 1534 in the fragments and subtract the bias at the end (f16/bf16 activations).
    pub bias_fold: bool,
    /// Read the next step's code bits and B fragments into registers while this step decodes
    /// (needs `stages >= 3` and `ks` 1; more registers). In the staged kernel: decode the next
    /// step into a second shared-memory tile while this one multiplies (one barrier a step
    /// instead of two; needs `stages >= 3`, any `ks`).
    pub prefetch: bool,
    /// Pack half of the dp4a decode's code pairs with an IMAD (FMA-heavy pipe) instead of a PRMT
    /// (ALU pipe), which at one row is the decode's limit. Needs the dp4a decode with the bias
    /// fold (`bytesum_mma` false, `bias_fold` true); like the fold it applies to 16-bit
    /// activations only. It costs registers at wide tiles.
    pub pack_fma: bool,
    /// 0: each warp decodes its weights straight into its MMA fragments. Otherwise the staged
    /// kernel: the block decodes each step into a shared-memory tile first (every weight once,
    /// with the dp4a decode), then its warps, `row_warps` along the pass's rows by
    /// `warps / row_warps` along the positions, multiply their parts of the output from there.
    /// Needs `bytesum_mma`, `bias_fold` and `pack_fma` off, and `row_warps` dividing `warps` and
    /// `mt`.
    pub row_warps: u32,
    /// Staged kernel only: 0, or warps added to the block that copy the codes and decode them
    /// into a ring of shared-memory A tiles (two, three with `prefetch`), while the block's
    /// `warps` build the B tiles and multiply. Named barriers hand each tile over, so the
    /// decode (integer pipes) and the MMAs (tensor pipe) run at the same time on different
    /// warps instead of taking turns. The block then has `warps + producers` warps; see
    /// [`CudaDownConfig::check`] for the shapes whose registers fit.
    pub producers: u32,
    /// Fragment decode only: the B operand (activations times the row scales, as f16) comes
    /// from a pre-pass kernel (`kernels/cuda/prescale.cu`) and streams into the code ring with
    /// the codes, one B tile per ring slot, instead of every thread block loading and converting
    /// the activations of each step itself. It costs one more kernel per call (2-4 µs) and
    /// `stages` B tiles of shared memory instead of two; it pays where many rows make the B
    /// tiles large (17 rows and more, with `mbarriers`). Needs `row_warps` 0 and `prefetch` off.
    pub prescaled: bool,
    /// With `prescaled`: the code ring is synchronised by an mbarrier pair per slot instead of
    /// a block barrier per step. A warp waits only for its own step's data, and before it
    /// refills a slot for every warp to have released it; the ring runs `stages - 2` steps ahead,
    /// so warps may drift up to two steps apart. Needs `stages >= 3`.
    pub mbarriers: bool,
}

impl Default for CudaDownConfig {
    /// A base for explicit configurations (`CudaDownConfig { nc: 2, mt: 8, ..Default::default() }`):
    /// NC 4 tiles in 4-warp blocks, one 8-row tile per pass, 32-row steps, 32 splits, a 4-deep
    /// ring, the fragments' dp4a decode with no option on. Whether a configuration built on it
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
            bytesum_mma: false,
            bias_fold: false,
            prefetch: false,
            pack_fma: false,
            row_warps: 0,
            producers: 0,
            prescaled: false,
            mbarriers: false,
        }
    }
}

/// The most shared memory a block of the kernel may take: what a block may opt into on Hopper
/// (227 KB; the kernel's shared memory is dynamic, and MLX raises a kernel's limit above 48 KB).
/// Ampere's A100 allows 163 KB and other recent GPUs 99 KB: there a configuration above the
/// GPU's limit fails at launch with MLX's error.
const SHARED_LIMIT: usize = 227 * 1024;

/// The shared memory the planned fragment-decode configurations keep to: the 48 KB every CUDA
/// GPU gives a block without opting in, where they were measured (up to five of their blocks
/// share an SM).
const PLAN_SHARED_BUDGET: usize = 48 * 1024;

/// The shared memory the planned staged and prescaled 8-warp configurations keep to: their
/// blocks run two to an SM (128 registers a thread, 8 warps), and two blocks of 112 KB (each with
/// the 1 KB the GPU reserves per block) fit Hopper's 228 KB. At k = 3 the producer-warp shape's
/// 64-row steps take 103 KB at 32 rows with 16-bit activations (two A tiles), and the prescaled
/// 64-row plan 64 KB (one B tile per ring slot).
const STAGED_PLAN_SHARED_BUDGET: usize = 112 * 1024;

impl CudaDownConfig {
    /// The kernel's shared memory: the code ring, the B tiles (`split_x`: f32 activations,
    /// carried as two f16 tiles) and the staged kernel's A tiles.
    fn shared_bytes(&self, g: &TrellisGeometry, split_x: bool) -> usize {
        let coded_blocks = self.copied_blocks();
        let step_rows = 16 * self.ks as usize;
        let ring = self.stages as usize * step_rows * (coded_blocks * 8 * g.k as usize + 4) * 4;
        let b_slots = if self.prescaled {
            self.stages as usize
        } else if self.prefetch && !self.staged() {
            3
        } else {
            2
        };
        let b_tiles = b_slots * if split_x { 2 } else { 1 } * 8 * self.mt as usize * (step_rows + 8) * 2;
        let a_tiles = match (self.staged(), self.specialized(), self.prefetch) {
            (false, _, _) => 0,
            (true, false, false) => 1,
            (true, false, true) | (true, true, false) => 2,
            (true, true, true) => 3,
        };
        let mbarriers = if self.mbarriers { 2 * self.stages as usize * 8 } else { 0 };
        ring + b_tiles + a_tiles * step_rows * (self.tile_positions() + 8) * 2 + mbarriers
    }

    /// The shared memory a planned configuration of this kind keeps to: prescaled B tiles in
    /// 8-warp blocks (two per SM, like the staged kernel's) take one B tile per ring slot.
    fn plan_shared_budget(&self) -> usize {
        if self.staged() || (self.prescaled && self.warps >= 8) {
            STAGED_PLAN_SHARED_BUDGET
        } else {
            PLAN_SHARED_BUDGET
        }
    }

    /// Whether the block decodes each step into shared memory first (`row_warps > 0`).
    pub fn staged(&self) -> bool {
        self.row_warps > 0
    }

    /// Whether producer warps decode while the others multiply (`producers > 0`).
    pub fn specialized(&self) -> bool {
        self.producers > 0
    }

    /// Warps per thread block: the multiplying `warps` and the `producers`.
    pub fn block_warps(&self) -> u32 {
        self.warps + self.producers
    }

    /// The steps of `16 * ks` input rows that `g`'s rows take: the most splits there can be.
    pub fn input_steps(&self, g: &TrellisGeometry) -> u32 {
        g.rows.div_ceil(16 * self.ks as usize) as u32
    }

    /// Output positions one thread block covers: `16 * nc * warps`.
    fn tile_positions(&self) -> usize {
        16 * (self.nc * self.warps) as usize
    }

    /// Coded blocks whose codes a thread block copies: the whole ones it covers, or the one its
    /// part of a coded block lies in.
    fn copied_blocks(&self) -> usize {
        (self.tile_positions() / 256).max(1)
    }

    /// Thread blocks along the output columns of `g` (see [`Self::check`] for the tiles that fit).
    fn column_blocks(&self, g: &TrellisGeometry) -> usize {
        let tile = self.tile_positions();
        if tile >= 256 {
            g.blocks_per_row() / (tile / 256)
        } else {
            g.blocks_per_row() * (256 / tile)
        }
    }

    /// Activations in a step's B tile: `8 * mt` rows by `16 * ks` input rows.
    fn b_tile_activations(&self) -> u32 {
        8 * self.mt * 16 * self.ks
    }

    /// Activations per load in the kernel (its `VW`): 8 where the rows are a multiple of 8 and a
    /// step's B tile (`8 * mt` rows by `16 * ks`) gives every thread at least 8, else 1.
    fn activations_per_load(&self, g: &TrellisGeometry) -> u32 {
        if g.rows % 8 == 0 && self.b_tile_activations() >= 8 * 32 * self.warps {
            8
        } else {
            1
        }
    }

    /// Activations each thread loads and converts per step when they load one at a time.
    fn single_loads_per_thread(&self) -> u32 {
        self.b_tile_activations().div_ceil(32 * self.warps)
    }

    /// Why 16-warp blocks cannot run this configuration on `g`, if they cannot. 512 threads leave
    /// a thread at most 128 registers, and MLX compiles custom kernels without launch bounds, so
    /// only shapes whose register count is known are allowed: NC 1 tiles (one coded block per
    /// block), up to 4 tiles per pass (MT <= 4) with any decode, up to 8 with the u8 MMA byte
    /// sums and no bias fold (its accumulators add 4 registers a tile), and at most 4
    /// activations a thread where they load one at a time. In a survey under NVRTC for `sm_90`
    /// (`kernels/cuda/NOTES.md`) those took at most 105 registers; MT 5 to 8 with the bias fold
    /// took 126 to 160, 8 activations a thread loaded one at a time 132 to 168.
    fn sixteen_warp_problem(&self, g: &TrellisGeometry) -> Option<&'static str> {
        if self.staged() {
            Some("16 warps cannot run the staged kernel")
        } else if self.nc != 1 {
            Some("16 warps need nc = 1")
        } else if self.prefetch {
            Some("16 warps cannot prefetch")
        } else if self.mt > 8 || (self.mt > 4 && (!self.bytesum_mma || self.bias_fold)) {
            Some("16 warps need mt <= 4, or mt <= 8 with the u8 MMA byte sums and no bias fold")
        } else if self.activations_per_load(g) == 1 && self.single_loads_per_thread() > 4 {
            Some("16 warps loading activations one at a time need at most 4 a thread (shorter steps)")
        } else {
            None
        }
    }

    /// Why producer warps cannot run this configuration on `g` with `dtype` activations, if they
    /// cannot. They feed the staged kernel; each decodes whole runs of 8 positions of the same
    /// step rows every step. A block of more than 8 warps leaves a thread at most 168 registers
    /// (12 warps) or 128 (16), and MLX compiles custom kernels without launch bounds, so only
    /// shapes whose register count is known are allowed there: 16-bit activations loaded 8 at a
    /// time, at most 64 accumulators a thread (`nc * mt <= 16`) and 8-row tiles per pass
    /// `mt <= 8`; f32 ones (two B tiles) with `nc * mt <= 8`. In a survey under NVRTC for
    /// `sm_90` (`kernels/cuda/NOTES.md`) those took at most 128 registers, all that 16 warps
    /// leave.
    fn producer_problem(&self, g: &TrellisGeometry, dtype: Dtype) -> Option<&'static str> {
        let groups = 2 * self.nc * self.warps; // runs of 8 positions across the tile
        let runs = 16 * self.ks * groups; // runs per step
        if !self.staged() {
            Some("producer warps feed the staged kernel (row_warps > 0)")
        } else if !(1..=8).contains(&self.producers) || self.warps > 8 {
            Some("producer warps take 1 to 8 warps beside at most 8 multiplying ones")
        } else if (32 * self.producers) % groups != 0 || runs % (32 * self.producers) != 0 {
            Some("the producer warps' threads must split a step's decode runs evenly")
        } else if self.block_warps() <= 8 {
            None
        } else if self.activations_per_load(g) != 8 {
            Some("blocks of more than 8 warps need activations loaded 8 at a time (rows a multiple of 8)")
        } else if dtype == Dtype::Float32 && self.nc * self.mt > 8 {
            Some("blocks of more than 8 warps with f32 activations need nc * mt <= 8")
        } else if self.nc * self.mt > 16 || self.mt > 8 {
            Some("blocks of more than 8 warps need nc * mt <= 16 and mt <= 8")
        } else {
            None
        }
    }

    /// Whether this configuration can run `g` with `dtype` activations (see [`Self::check`]).
    pub fn fits(&self, g: &TrellisGeometry, dtype: Dtype) -> bool {
        self.check(g, dtype).is_ok()
    }

    /// This configuration with the deepest code ring, at most `self.stages` steps, that makes it
    /// fit `g` with `dtype` activations; `None` if none does.
    pub fn with_deepest_ring(self, g: &TrellisGeometry, dtype: Dtype) -> Option<CudaDownConfig> {
        (2..=self.stages).rev().map(|stages| CudaDownConfig { stages, ..self }).find(|c| c.fits(g, dtype))
    }

    /// An error naming the first reason this configuration cannot run `g` with `dtype`
    /// activations: a field out of range, a block width that does not divide the coded blocks,
    /// more splits than steps, or more shared memory than a block may take (227 KB).
    pub fn check(&self, g: &TrellisGeometry, dtype: Dtype) -> Result<()> {
        if ![1, 2, 4, 8, 16].contains(&self.nc) {
            invalid!("CUDA down kernel: nc = {} must be 1, 2, 4, 8 or 16", self.nc);
        }
        if !(1..=16).contains(&self.mt) || self.nc * self.mt > 32 {
            invalid!("CUDA down kernel: mt = {} must be in 1..=16 with nc * mt <= 32 (nc = {})", self.mt, self.nc);
        }
        if ![1, 2, 4].contains(&self.ks) {
            invalid!("CUDA down kernel: ks = {} must be 1, 2 or 4", self.ks);
        }
        if self.prefetch && self.stages < 3 {
            invalid!("CUDA down kernel: prefetch needs stages >= 3 (got {})", self.stages);
        }
        if self.prefetch && !self.staged() && self.ks != 1 {
            invalid!("CUDA down kernel: prefetch pipelines 16-row steps (ks = 1, got {})", self.ks);
        }
        if self.pack_fma && (self.bytesum_mma || !self.bias_fold) {
            invalid!("CUDA down kernel: pack_fma packs the dp4a decode's pairs with the bias fold (needs bytesum_mma false and bias_fold true)");
        }
        if self.mbarriers && (!self.prescaled || self.stages < 3) {
            invalid!("CUDA down kernel: mbarriers synchronise the prescaled ring (needs prescaled and stages >= 3, got {} stages)", self.stages);
        }
        if self.prescaled && (self.staged() || self.prefetch) {
            invalid!("CUDA down kernel: prescaled B tiles stream into the fragment decode without its prefetch (needs row_warps 0 and prefetch off)");
        }
        if self.staged() {
            if self.bytesum_mma || self.bias_fold || self.pack_fma {
                invalid!("CUDA down kernel: the staged kernel (row_warps = {}) decodes with dp4a and needs bytesum_mma, bias_fold and pack_fma off", self.row_warps);
            }
            if self.warps % self.row_warps != 0 || self.mt % self.row_warps != 0 {
                invalid!(
                    "CUDA down kernel: row_warps = {} must divide warps = {} and mt = {} (the staged warps tile the block's output)",
                    self.row_warps,
                    self.warps,
                    self.mt
                );
            }
        }
        // Loading activations one at a time, a thread keeps one step row, which needs the block's
        // threads to be a multiple of the step's rows.
        if !self.prescaled && self.activations_per_load(g) == 1 && (32 * self.warps) % (16 * self.ks) != 0 {
            invalid!(
                "CUDA down kernel: {} warps cannot load steps of {} rows of {g} one activation at a time",
                self.warps,
                16 * self.ks
            );
        }
        // Up to 8 warps: 256 threads always fit the register file, whatever the kernel uses.
        let warps_ok = (1..=8).contains(&self.warps) || self.warps == 16;
        if !warps_ok || self.splits == 0 || !(2..=6).contains(&self.stages) {
            invalid!(
                "CUDA down kernel: {} warps (1 to 8, or 16), {} splits, {} stages (2 to 6) are out of range",
                self.warps,
                self.splits,
                self.stages
            );
        }
        if self.specialized() {
            if let Some(problem) = self.producer_problem(g, dtype) {
                invalid!(
                    "CUDA down kernel: {problem} (producers = {}, warps = {}, nc = {}, mt = {}, ks = {}, {g}, {dtype} activations)",
                    self.producers,
                    self.warps,
                    self.nc,
                    self.mt,
                    self.ks
                );
            }
        }
        if self.warps == 16 {
            if let Some(problem) = self.sixteen_warp_problem(g) {
                invalid!("CUDA down kernel: {problem} (nc = {}, mt = {}, ks = {}, {g})", self.nc, self.mt, self.ks);
            }
        }
        // A block covers whole coded blocks (a divisor of the row's) or one part of a coded block.
        let tile = self.tile_positions();
        let whole = tile % 256 == 0 && g.blocks_per_row() % (tile / 256) == 0;
        if !whole && 256 % tile != 0 {
            invalid!(
                "CUDA down kernel: {} warps of {} sub-tiles cover {tile} positions, neither a part of a coded block nor a divisor of the {} coded blocks of {g}",
                self.warps,
                self.nc,
                g.blocks_per_row()
            );
        }
        if self.splits > self.input_steps(g) {
            invalid!("CUDA down kernel: {} splits for {} input rows ({}-row steps)", self.splits, g.rows, 16 * self.ks);
        }
        let shared = self.shared_bytes(g, dtype == Dtype::Float32);
        if shared > SHARED_LIMIT {
            invalid!(
                "CUDA down kernel: {shared} bytes of shared memory for {g} with {dtype} activations (at most {SHARED_LIMIT}; use fewer stages, warps or 8-row tiles, shorter steps, or no prefetch)"
            );
        }
        Ok(())
    }
}

/// Whether the CUDA kernel serves this geometry: axis 0, T = 256, L <= 16, k in 2..=8.
pub fn supports(g: &TrellisGeometry) -> bool {
    g.axis == 0 && g.t == 256 && g.l <= 16 && (2..=8).contains(&g.k) && g.cols % 256 == 0
}

/// An error naming the geometry where [`supports`] says no.
fn require_supported(g: &TrellisGeometry) -> Result<()> {
    if !supports(g) {
        invalid!("CUDA down kernel: unsupported geometry {g} (needs axis 0, T 256, L <= 16, k 2..=8)");
    }
    Ok(())
}

/// The configuration for `m` rows of 16-bit activations: [`plan_for`] with bf16.
pub fn plan(g: &TrellisGeometry, m: usize) -> CudaDownConfig {
    plan_for(g, m, Dtype::Bfloat16)
}

/// The configuration for `m` activation rows of `dtype` (measured on an H200 at the Qwen down
/// shape; see the README's benchmark section), fitted to the geometry.
pub fn plan_for(g: &TrellisGeometry, m: usize, dtype: Dtype) -> CudaDownConfig {
    // (sub-tiles per warp, 8-row tiles per pass, 16-row chunks per step, coded blocks per thread
    // block, splits, bias fold, IMAD pack, staged warps along the rows, producer warps,
    // prescaled B tiles on an mbarrier ring), chosen with bf16 activations by the kernel's own
    // duration on an H200 at the Qwen down shape (Nsight Compute, one kernel at a time:
    // `scripts/cuda.sh latency`), which is what a model's chain of dependent layers waits for.
    // kernels/cuda/NOTES.md keeps the measurements behind each choice and the plans they replaced.
    // Up to 16 rows the decode is everything: small blocks hide its latency, and dp4a with the
    // bias fold beats the u8 MMA byte sums, whose fixed latency a warp waits out; 4-warp blocks
    // of narrow tiles (72 registers a thread at 2-8 rows) beat fewer, wider warps. At one row
    // the ALU pipe limits the decode, so half of the code pairs are packed on FMA-heavy instead
    // (`pack_fma`). Steps of 32 or 64 input rows spread each step's barrier and copies over more
    // decode. Fewer splits from 9 rows, so that the blocks fill whole waves of the GPU: 19 at
    // 9-16 rows (380 blocks, one wave at three or four blocks per SM), 13 from 17; MLX's fold of
    // the partials is then shorter too. Prescaled B tiles saved about 2 µs alone at 1-16 rows,
    // no more than their pre-pass costs (and queued, its launch lost more at 4 and 8 rows).
    // From 17 rows the MMAs and the B tiles are most of the kernel: 8-warp blocks (NC 2, 128
    // registers, two blocks per SM, no bias fold: its accumulators would take 168) decode each
    // weight once into the registers that multiply it, with the B tiles from the pre-pass
    // kernel streamed into the code ring (`prescaled`) and the ring on mbarriers (`mbarriers`),
    // so that the warps drift apart and their decode and MMA phases overlap. Kernel alone, k 3:
    // 35.6 µs at 24 rows and 38.0 at 32 (+ 2.2-2.4 µs of pre-pass) against 39.6 and 41.7 for
    // the staged kernel with producer warps; 48.3 at 64 rows against 53.4 with a block barrier
    // per step and 61.2 with the B tiles built in the block. A pass holds just the call's rows
    // (MT = M / 8 rounded up, one kernel per MT); above 64 rows passes of up to 64 share the
    // rows evenly (72 rows: two passes of 40, not 64 + 8), 94.3-95.9 µs at 128 rows.
    // f32 activations keep the B tiles in the block (the prescaled residue tiles took the 64-row
    // shape to 146 registers, one block per SM) and at 17-32 rows the staged kernel with
    // producer warps: 4 warps multiply while 4 more decode 64-row steps into two A tiles.
    let tiles = m.div_ceil(8).max(1);
    let pass_tiles = tiles.div_ceil(tiles.div_ceil(8)) as u32; // 8-row tiles a pass, passes of up to 8
    let (nc, mt, ks, blocks, splits, bias_fold, pack_fma, row_warps, producers, prescaled) = match m {
        0..=1 => (8, 1, 1, 2, 64, true, true, 0, 0, false),
        2..=8 => (4, 1, 2, 1, 32, true, false, 0, 0, false),
        9..=16 => (4, 2, 4, 1, 19, true, false, 0, 0, false),
        // f32 activations keep the producer warps here (their prescaled residue tiles would
        // double the B tiles).
        17..=32 if dtype == Dtype::Float32 => (4, tiles as u32, 4, 1, 13, false, false, 1, 4, false),
        17..=64 => (2, tiles as u32, 4, 1, 13, false, false, 0, 0, true),
        // Up to DENSE_MIN_ROWS rows of 16-bit activations, f32 ones, and explicit calls (f32:
        // two passes of 64 rows took 119.4 µs at 128 rows against 138.8 for one pass of 16-row
        // tiles with the u8 MMA byte sums).
        _ => (2, pass_tiles, 4, 1, 13, false, false, 0, 0, true),
    };
    let mut cfg = CudaDownConfig {
        nc,
        mt,
        ks,
        warps: 16 * blocks / nc,
        splits,
        stages: 4,
        bytesum_mma: false,
        // The bias fold takes one HADD2 per pair of weights off the fragments' dp4a decode;
        // the kernel applies it to 16-bit activations only.
        bias_fold,
        prefetch: false,
        pack_fma,
        row_warps,
        producers,
        prescaled: prescaled && dtype != Dtype::Float32,
        mbarriers: prescaled && dtype != Dtype::Float32,
    };
    // Fit the geometry: a block covers a divisor of the coded blocks per row, and wide codes
    // (k >= 5) or f32 activations must still fit the budget: fewer coded blocks per block
    // first, then a shallower ring, shorter steps (rows that are not a multiple of 8 also need a
    // step's rows to divide the block's threads). No more splits than steps.
    while cfg.copied_blocks() > 1
        && (g.blocks_per_row() % cfg.copied_blocks() != 0
            || cfg.shared_bytes(g, dtype == Dtype::Float32) > cfg.plan_shared_budget())
    {
        cfg.warps /= 2;
        // The staged warps along the rows must still divide the warps (all powers of two).
        cfg.row_warps = cfg.row_warps.min(cfg.warps);
    }
    let with_steps = |ks: u32, stages: u32| {
        // The mbarrier ring needs 3 stages; a shallower ring keeps the block barrier.
        let c = CudaDownConfig { ks, stages, mbarriers: cfg.mbarriers && stages >= 3, ..cfg };
        CudaDownConfig { splits: c.splits.min(c.input_steps(g)), ..c }
    };
    std::iter::successors(Some(cfg.ks), |&ks| (ks > 1).then_some(ks / 2))
        .flat_map(|ks| (2..=cfg.stages).rev().map(move |stages| with_steps(ks, stages)))
        .find(|c| c.fits(g, dtype) && c.shared_bytes(g, dtype == Dtype::Float32) <= c.plan_shared_budget())
        // No fit leaves the planned configuration, whose check then names the problem.
        .unwrap_or_else(|| with_steps(cfg.ks, cfg.stages))
}

/// The body and header of one decode's source (`staged`: the staged decode, else the fragment
/// one): the kernel files without the other decode's `TRELLIS_DOWN_STAGED` sections, cut once.
fn variant_source(staged: bool) -> Result<&'static (String, String)> {
    static SOURCES: [OnceLock<(String, String)>; 2] = [OnceLock::new(), OnceLock::new()];
    let cell = &SOURCES[usize::from(staged)];
    if let Some(texts) = cell.get() {
        return Ok(texts);
    }
    let cut = |text: &str, file: &str| {
        source_variant(text, "TRELLIS_DOWN_STAGED", staged).with_context(|| format!("CUDA down kernel source {file}"))
    };
    let texts = (cut(SOURCE, "down_mma.cu")?, cut(HEADER, "down_mma.cuh")?);
    Ok(cell.get_or_init(|| texts))
}

/// The kernel of one decode (`staged` or the fragment one) registered with `shared_memory`
/// bytes of dynamic shared memory, one per decode and size (MLX takes the size when a kernel is
/// registered; it is a function of the template arguments, so each compiled instantiation
/// always launches with the same size).
fn kernel(staged: bool, shared_memory: usize) -> Result<&'static CudaKernel> {
    type Cells = BTreeMap<(bool, usize), &'static OnceLock<CudaKernel>>;
    static KERNELS: Mutex<Cells> = Mutex::new(BTreeMap::new());
    let cell = *KERNELS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry((staged, shared_memory))
        .or_insert_with(|| Box::leak(Box::new(OnceLock::new())));
    let (body, header) = variant_source(staged)?;
    let io: (&[&str], &[&str]) = (&["x", "codes", "scales"], &["partial"]);
    let name = if staged { "mlx_trellis_down_mma_staged" } else { "mlx_trellis_down_mma" };
    cached_cuda_kernel(cell, name, io, body, &[CUDA_HEADER, header], shared_memory)
}

/// Rows of 16-bit activations from which [`down_cuda`] decodes the layer to dense weights and
/// runs MLX's matmul instead of the fused kernel. On an H200 at the Qwen down shape the decode,
/// the matmul and cuBLAS's split-K reduction take about 62 + 54 + 5 µs whatever the row count;
/// the fused call (pre-pass, kernel in passes of up to 64 rows, MLX's fold and the cast) took
/// 91.2 µs at 72 rows, 96.2 at 96 and 112.8 at 128 against 119.9-122.4 for the dense path, and
/// 139.8 against 121.8 at 144 (`bench_down --paths` under Nsight Compute, one kernel at a time;
/// see the README's benchmark section). Up to 128 rows the fused kernel is ahead, and it needs
/// no scratch.
/// The dense path needs `2 * in * out` bytes of scratch per call (178 MB for the Qwen down
/// projection). f32 activations always take the fused kernel: MLX multiplies f32 in TF32 on CUDA
/// by default, below the f32 accuracy the fused kernel keeps.
pub const DENSE_MIN_ROWS: usize = 129;

/// Whether [`down_cuda`] takes the dense path for `m` rows of `dtype` activations.
pub fn uses_dense(m: usize, dtype: Dtype) -> bool {
    m >= DENSE_MIN_ROWS && matches!(dtype, Dtype::Float16 | Dtype::Bfloat16)
}

/// `x2 [M, in] · W -> [M, out]` in `x2`'s dtype: the fused kernel with the configuration
/// [`plan`] picks, or from [`DENSE_MIN_ROWS`] rows of 16-bit activations [`down_cuda_dense`].
///
/// `codes` must start on a 16-byte boundary: the kernel streams it with 16-byte asynchronous
/// copies. Arrays MLX allocates (loaded, created or computed, and so every `TrellisLinear`'s)
/// do; a view that starts inside another array's buffer may not, and must be copied first
/// ([`MlxArray::deep_copy`]). Activations and scales may be such views: the kernel checks their
/// alignment and loads them one at a time when they are not aligned.
pub fn down_cuda(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    require_supported(g)?;
    let m = x2.shape().first().copied().unwrap_or(0);
    if uses_dense(m, x2.dtype()) {
        return down_cuda_dense(x2, codes, scales, g);
    }
    down_cuda_with(x2, codes, scales, g, plan_for(g, m, x2.dtype()))
}

/// [`down_cuda`] with an explicit configuration (for tuning; every valid configuration gives the
/// same sums up to f32 rounding order).
pub fn down_cuda_with(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    cfg: CudaDownConfig,
) -> Result<MlxArray> {
    down_cuda_partials(x2, codes, scales, g, cfg)?.sum_axes(&[1], false)?.astype(x2.dtype())
}

/// The kernel's f32 partial sums `[M, SPLITS, C]` before MLX folds them (for profiling).
pub fn down_cuda_partials(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    cfg: CudaDownConfig,
) -> Result<MlxArray> {
    require_supported(g)?;
    let m = check_operands("CUDA down kernel", x2, codes, scales, g)?;
    let prepared = prepared_launch(g, cfg, m, x2.dtype())?;
    let b = match &prepared.prescale {
        Some((prescale, launch)) => {
            prescale.apply_prepared(&[x2, scales], launch).context("CUDA down kernel: prescaled activations")?.remove(0)
        }
        None => x2.clone(),
    };
    Ok(prepared.kernel.apply_prepared(&[&b, codes, scales], &prepared.launch)?.remove(0))
}

/// The pre-pass kernel of prescaled configurations (`kernels/cuda/prescale.cu`).
fn prescale_kernel() -> Result<&'static CudaKernel> {
    static KERNEL: OnceLock<CudaKernel> = OnceLock::new();
    let io: (&[&str], &[&str]) = (&["x", "scales"], &["x_scaled"]);
    cached_cuda_kernel(&KERNEL, "mlx_trellis_prescale", io, PRESCALE_SOURCE, &[], 0)
}

/// One call's launches, prepared once (see [`prepared_launch`]): the down kernel, and for a
/// prescaled configuration the pre-pass whose output it reads in place of the activations.
struct PreparedDown {
    kernel: &'static CudaKernel,
    launch: Arc<CudaLaunch>,
    prescale: Option<(&'static CudaKernel, Arc<CudaLaunch>)>,
}

/// The kernel and its launch for `m` rows of `dtype` activations, checked and converted once
/// per geometry, configuration, row count and dtype: a model makes the same few calls many
/// times, and building the 19 template arguments at every call cost about 4 µs of host time.
fn prepared_launch(g: &TrellisGeometry, cfg: CudaDownConfig, m: usize, dtype: Dtype) -> Result<Arc<PreparedDown>> {
    type Launches = HashMap<(TrellisGeometry, CudaDownConfig, usize, Dtype), Arc<PreparedDown>>;
    // Bounded: a runner that calls with many row counts rebuilds from scratch now and then.
    const MAX_LAUNCHES: usize = 1024;
    static LAUNCHES: OnceLock<Mutex<Launches>> = OnceLock::new();
    let launches = LAUNCHES.get_or_init(Default::default);
    let key = (*g, cfg, m, dtype);
    if let Some(prepared) = launches.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
        return Ok(Arc::clone(prepared));
    }
    cfg.check(g, dtype)?;
    // Prescaled activations: [sets * m, row_pad] f16 (the f32 residues are the second set).
    let row_pad = g.rows.next_multiple_of(PRESCALED_ROW_MULTIPLE);
    let sets = if dtype == Dtype::Float32 { 2 } else { 1 };
    // The kernel indexes them with 32-bit offsets, and the pre-pass runs one grid row per
    // activation row (CUDA's grid y is at most 65535).
    if cfg.prescaled && (sets * m * row_pad > i32::MAX as usize || m > 65535) {
        invalid!("CUDA down kernel: {m} rows of {dtype} activations of {g} are too many for prescaled B tiles (at most 65535 rows and 2^31 - 1 f16 values; {sets} x {m} x {row_pad} here)");
    }
    let kernel = kernel(cfg.staged(), cfg.shared_bytes(g, dtype == Dtype::Float32))?;
    let passes = m.div_ceil(8 * cfg.mt as usize);
    let ctas = cfg.column_blocks(g);
    let threads = 32 * cfg.block_warps() as usize;
    let launch = LaunchConfig::new([threads, ctas, cfg.splits as usize * passes], [threads, 1, 1])
        .output(&[m, cfg.splits as usize, g.cols], Dtype::Float32)
        // Prescaled activations are f16 whatever the call's dtype.
        .template_dtype("T", if cfg.prescaled { Dtype::Float16 } else { dtype })
        .template_int("R", int("CUDA down kernel", g.rows)?)
        .template_int("C", int("CUDA down kernel", g.cols)?)
        .template_int("K", g.k as i32)
        .template_int("L", g.l as i32)
        .template_int("NC", cfg.nc as i32)
        .template_int("MT", cfg.mt as i32)
        .template_int("KS", cfg.ks as i32)
        .template_int("WARPS", cfg.warps as i32)
        .template_int("SPLITS", cfg.splits as i32)
        .template_int("STAGES", cfg.stages as i32)
        .template_bool("INTERLEAVE", g.layout() == CodeLayout::K3Interleaved)
        .template_bool("SPLIT_X", dtype == Dtype::Float32)
        .template_bool("BYTESUM_MMA", cfg.bytesum_mma)
        .template_bool("BIAS_FOLD", cfg.bias_fold && dtype != Dtype::Float32)
        .template_bool("PREFETCH", cfg.prefetch)
        .template_bool("PACK_FMA", cfg.pack_fma && dtype != Dtype::Float32)
        .template_int("ROW_WARPS", cfg.row_warps as i32)
        .template_int("PRODUCERS", cfg.producers as i32)
        .template_bool("PRESCALED", cfg.prescaled)
        .template_bool("MBARRIERS", cfg.mbarriers);
    let launch = Arc::new(kernel.prepare(&launch)?);
    let prescale = if cfg.prescaled {
        // A thread converts 8 activations (see prescale.cu).
        let pre = LaunchConfig::new([row_pad / 8, m, 1], [128, 1, 1])
            .output(&[sets * m, row_pad], Dtype::Float16)
            .template_dtype("T", dtype)
            .template_int("R", int("CUDA prescale kernel", g.rows)?)
            .template_int("R_PAD", int("CUDA prescale kernel", row_pad)?)
            .template_bool("SPLIT_X", dtype == Dtype::Float32);
        let kernel = prescale_kernel()?;
        Some((kernel, Arc::new(kernel.prepare(&pre)?)))
    } else {
        None
    };
    let prepared = Arc::new(PreparedDown { kernel, launch, prescale });
    let mut launches = launches.lock().unwrap_or_else(PoisonError::into_inner);
    if launches.len() >= MAX_LAUNCHES {
        launches.clear();
    }
    launches.insert(key, Arc::clone(&prepared));
    Ok(prepared)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fragment kernel with the u8 MMA byte sums in 4-warp blocks of 4 8-row tiles (the
    /// 32-row plan before the staged kernel took those rows), a base for explicit shapes.
    fn u8_mma_fragments() -> CudaDownConfig {
        CudaDownConfig { mt: 4, ks: 4, splits: 13, bytesum_mma: true, ..Default::default() }
    }

    #[test]
    fn every_planned_configuration_is_valid() {
        let qwen = TrellisGeometry::row_major(17408, 5120, 3, 256, 12, 0).unwrap();
        let mut geometries = vec![qwen, qwen.interleaved().unwrap()];
        // Every served k on the Qwen shape (k 5..8 need the shared-memory fitting), and small
        // shapes whose coded blocks per row shrink the blocks.
        geometries.extend((2..=8).map(|k| TrellisGeometry::row_major(17408, 5120, k, 256, 12, 0).unwrap()));
        let small = [(200, 1024, 3), (88, 512, 4), (16, 256, 2), (17, 768, 2), (40, 768, 8)];
        geometries.extend(small.iter().map(|&(r, c, k)| TrellisGeometry::row_major(r, c, k, 256, 12, 0).unwrap()));
        for g in geometries {
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                for m in 1..=200 {
                    let cfg = plan_for(&g, m, dtype);
                    cfg.check(&g, dtype).unwrap_or_else(|e| panic!("{g} M {m} {dtype}: {cfg:?}: {e:#}"));
                    // The fragment kernel's prefetch holds a second B fragment set in registers,
                    // which f32 activations double; the staged prefetch's second step is in shared
                    // memory (f32 at the Qwen shape: 154 registers with it, 158 without).
                    let register_prefetch = cfg.prefetch && !cfg.staged();
                    assert!(!(register_prefetch && dtype == Dtype::Float32), "{g} M {m}: f32 prefetch");
                }
            }
        }
        // The measured plan is unchanged where it fits (k <= 4).
        let one = plan(&qwen, 1);
        assert_eq!((one.warps, one.splits, one.ks, one.pack_fma), (4, 64, 1, true));
        let staged32 = plan_for(&qwen, 32, Dtype::Float32);
        assert_eq!(
            (staged32.nc, staged32.mt, staged32.ks, staged32.warps, staged32.row_warps, staged32.producers),
            (4, 4, 4, 4, 1, 4)
        );
        assert!(!staged32.prefetch && staged32.block_warps() == 8);
        let wide = plan(&qwen, 64);
        assert_eq!(
            (wide.nc, wide.mt, wide.ks, wide.stages, wide.splits, wide.warps, wide.row_warps, wide.bias_fold),
            (2, 8, 4, 4, 13, 8, 0, false)
        );
        // Prescaled B tiles on an mbarrier ring from 17 rows of 16-bit activations only, in
        // passes that share the rows evenly above 64.
        for (m, prescaled, mt) in [
            (1, false, 1),
            (8, false, 1),
            (16, false, 2),
            (17, true, 3),
            (32, true, 4),
            (33, true, 5),
            (64, true, 8),
            (72, true, 5),
            (96, true, 6),
            (128, true, 8),
            (200, true, 7),
        ] {
            let cfg = plan(&qwen, m);
            assert_eq!((cfg.prescaled, cfg.mbarriers, cfg.mt), (prescaled, prescaled, mt), "M {m}");
            let f32 = plan_for(&qwen, m, Dtype::Float32);
            assert!(!f32.prescaled && !f32.mbarriers, "M {m} f32");
        }
    }

    #[test]
    fn each_decode_registers_only_its_own_sections() {
        let (fragment, staged) = (variant_source(false).unwrap(), variant_source(true).unwrap());
        for (text, file) in [(SOURCE, "down_mma.cu"), (HEADER, "down_mma.cuh")] {
            assert!(text.contains("TRELLIS_DOWN_STAGED"), "{file} has no sections");
        }
        for ((body, header), own, other) in [
            (fragment, ["decode_and_multiply", "mma_bytesum"], ["decode_to_tile", "named_sync"]),
            (staged, ["decode_to_tile", "named_sync"], ["decode_and_multiply", "mma_bytesum"]),
        ] {
            let text = format!("{header}{body}");
            let mut code = text.lines().filter(|l| !l.trim_start().starts_with("//"));
            assert!(code.all(|l| !l.contains("TRELLIS_DOWN_STAGED")));
            assert!(own.iter().all(|f| text.contains(f)) && !other.iter().any(|f| text.contains(f)), "{own:?}");
            // Both decodes share the copies, the B tiles and the code runs.
            assert!(text.contains("auto store_b") && text.contains("struct CodeRun"));
            // Registered compacted (text outside the compactor's plain subset would go as written).
            assert!(
                crate::kernel::compact_plain_cpp(body).is_some() && crate::kernel::compact_plain_cpp(header).is_some()
            );
        }
    }

    #[test]
    fn the_deepest_ring_that_fits_is_found() {
        // k 8: a coded block's row is 64 words. 64-row steps over four coded blocks: a ring
        // step takes 66.6 KB, so 3 stages fit 227 KB and 4 do not.
        let g = TrellisGeometry::row_major(17408, 8192, 8, 256, 12, 0).unwrap();
        let cfg = CudaDownConfig { nc: 16, warps: 4, ks: 4, stages: 4, ..Default::default() };
        assert!(!cfg.fits(&g, Dtype::Bfloat16));
        assert_eq!(cfg.with_deepest_ring(&g, Dtype::Bfloat16).map(|c| c.stages), Some(3));
        // Nothing fits: 8 coded blocks per thread block in 64-row steps (133 KB a ring step).
        let wide = CudaDownConfig { warps: 8, ..cfg };
        assert_eq!(wide.with_deepest_ring(&g, Dtype::Bfloat16), None);
    }

    #[test]
    fn steps_out_of_range_are_errors_that_say_so() {
        let g = TrellisGeometry::row_major(200, 1024, 3, 256, 12, 0).unwrap();
        let err = |cfg: CudaDownConfig| cfg.check(&g, Dtype::Bfloat16).unwrap_err().to_string();
        assert!(err(CudaDownConfig { ks: 3, ..plan(&g, 1) }).contains("ks = 3 must be 1, 2 or 4"));
        let pf = CudaDownConfig { ks: 2, prefetch: true, ..plan(&g, 1) };
        assert!(err(pf).contains("prefetch pipelines 16-row steps"), "{}", err(pf));
        // 200 rows are 4 steps of 64: 5 splits would leave one empty.
        let splits = CudaDownConfig { ks: 4, splits: 5, ..plan(&g, 1) };
        assert!(err(splits).contains("5 splits for 200 input rows (64-row steps)"), "{}", err(splits));
        // 100 rows load one activation at a time: one warp's 32 threads cannot keep 64 step rows.
        let odd = TrellisGeometry::row_major(100, 1024, 3, 256, 12, 0).unwrap();
        let one_warp = CudaDownConfig { nc: 16, warps: 1, ks: 4, splits: 1, ..plan(&odd, 1) };
        let e = one_warp.check(&odd, Dtype::Bfloat16).unwrap_err().to_string();
        assert!(e.contains("one activation at a time"), "{e}");
        assert!(CudaDownConfig { ks: 2, ..one_warp }.fits(&odd, Dtype::Bfloat16));
        // A B tile of fewer than 8 activations per thread loads one at a time as well (rows a
        // multiple of 8 then always fit: the tile is smaller than 8 threads' worth per row).
        let small_tile = CudaDownConfig { nc: 16, mt: 1, warps: 1, ks: 1, splits: 1, ..plan(&g, 1) };
        assert_eq!(small_tile.activations_per_load(&g), 1);
        assert!(small_tile.fits(&g, Dtype::Bfloat16));
        assert_eq!(CudaDownConfig { ks: 2, ..small_tile }.activations_per_load(&g), 8);
    }

    #[test]
    fn too_much_shared_memory_is_an_error_that_says_so() {
        let g = TrellisGeometry::row_major(17408, 8192, 8, 256, 12, 0).unwrap();
        let cfg = CudaDownConfig { nc: 16, warps: 8, ks: 4, stages: 2, ..Default::default() };
        let err = cfg.check(&g, Dtype::Bfloat16).unwrap_err().to_string();
        assert!(err.contains("bytes of shared memory") && err.contains("232448"), "{err}");
        // Above 48 KB is allowed (dynamic shared memory), but the plans keep to their budgets,
        // where they were measured, for every row count and dtype.
        let big = CudaDownConfig { nc: 8, mt: 4, ks: 1, warps: 8, splits: 8, bytesum_mma: true, ..Default::default() };
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
    fn the_staged_plan_fits_its_budget() {
        // 17-32 rows of f32 activations: the staged kernel with producer warps in 64-row steps
        // and two A tiles; shallower rings or shorter steps fit the staged budget for every code
        // width.
        for (k, l) in [(2, 12), (3, 12), (4, 12), (8, 16)] {
            let g = TrellisGeometry::row_major(17408, 5120, k, 256, l, 0).unwrap();
            for m in [17, 32] {
                let cfg = plan_for(&g, m, Dtype::Float32);
                assert!(cfg.staged() && cfg.specialized() && !cfg.prefetch, "k {k} M {m}: {cfg:?}");
                let bytes = cfg.shared_bytes(&g, true);
                assert!(bytes > PLAN_SHARED_BUDGET && bytes <= STAGED_PLAN_SHARED_BUDGET, "k {k} M {m}: {bytes}");
            }
        }
        let qwen = TrellisGeometry::row_major(17408, 5120, 3, 256, 12, 0).unwrap();
        let planned = plan_for(&qwen, 32, Dtype::Float32);
        assert_eq!((planned.ks, planned.stages), (4, 4));
        // The prescaled 64-row plan: four ring slots of codes and B tiles, and their mbarriers.
        assert_eq!(plan_for(&qwen, 64, Dtype::Bfloat16).shared_bytes(&qwen, false), 65536 + 4 * 16);
        // Fragment plans never prefetch and keep to 48 KB, but for prescaled B tiles in 8-warp
        // blocks (one B tile per ring slot); from 17 rows a pass holds just the call's rows (or
        // an even share of them), without the bias fold, in 64-row steps of 8-warp blocks.
        for m in [1, 8, 16, 17, 32, 33, 48, 64, 72, 128] {
            let cfg = plan_for(&qwen, m, Dtype::Bfloat16);
            let budget = if cfg.prescaled && cfg.warps >= 8 { STAGED_PLAN_SHARED_BUDGET } else { PLAN_SHARED_BUDGET };
            assert!(!cfg.staged() && !cfg.prefetch && cfg.shared_bytes(&qwen, false) <= budget, "{cfg:?}");
            if m > 16 {
                let tiles = m.div_ceil(8);
                let mt = tiles.div_ceil(tiles.div_ceil(8)) as u32;
                assert_eq!((cfg.nc, cfg.mt, cfg.ks, cfg.warps, cfg.bias_fold), (2, mt, 4, 8, false), "M {m}: {cfg:?}");
            }
        }
    }

    #[test]
    fn prescaled_b_tiles_need_the_fragment_decode_without_its_prefetch() {
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
        for cfg in [CudaDownConfig { prescaled: false, ..mbarriers }, CudaDownConfig { stages: 2, ..mbarriers }] {
            let err = cfg.check(&g, Dtype::Bfloat16).unwrap_err().to_string();
            assert!(err.contains("mbarriers synchronise the prescaled ring"), "{err}");
        }
        let staged = CudaDownConfig { row_warps: 2, ..prescaled };
        let prefetch = CudaDownConfig { prefetch: true, ks: 1, ..prescaled };
        for cfg in [staged, prefetch] {
            let err = cfg.check(&g, Dtype::Bfloat16).unwrap_err().to_string();
            assert!(err.contains("prescaled B tiles stream into the fragment decode"), "{err}");
        }
    }

    #[test]
    fn too_many_rows_for_prescaled_b_tiles_is_an_error_that_says_so() {
        // Caught while the launch is prepared, before anything runs (so on every back-end).
        let g = TrellisGeometry::row_major(16, 256, 2, 256, 12, 0).unwrap();
        let cfg = CudaDownConfig { nc: 2, mt: 8, ks: 1, warps: 8, splits: 1, prescaled: true, ..Default::default() };
        cfg.check(&g, Dtype::Float32).unwrap();
        let err = prepared_launch(&g, cfg, 65536, Dtype::Float32).err().expect("65536 rows").to_string();
        assert!(err.contains("too many for prescaled B tiles") && err.contains("65536 rows"), "{err}");
    }

    #[test]
    fn pack_fma_needs_the_dp4a_decode_with_the_bias_fold() {
        let g = TrellisGeometry::row_major(200, 1024, 3, 256, 12, 0).unwrap();
        let one = CudaDownConfig { pack_fma: true, ..plan(&g, 1) };
        one.check(&g, Dtype::Bfloat16).unwrap();
        for cfg in
            [CudaDownConfig { bias_fold: false, ..one }, CudaDownConfig { bytesum_mma: true, bias_fold: false, ..one }]
        {
            let err = cfg.check(&g, Dtype::Bfloat16).unwrap_err().to_string();
            assert!(err.contains("pack_fma packs the dp4a decode's pairs"), "{err}");
        }
    }

    #[test]
    fn sixteen_warp_blocks_take_only_shapes_of_known_registers() {
        let qwen = TrellisGeometry::row_major(17408, 5120, 3, 256, 12, 0).unwrap();
        // The u8 MMA byte sums without the bias fold (the 32-row plan before the staged kernel).
        let one_pass = CudaDownConfig { nc: 1, mt: 8, ks: 4, warps: 16, splits: 16, ..u8_mma_fragments() };
        assert!(one_pass.bytesum_mma && !one_pass.bias_fold);
        one_pass.check(&qwen, Dtype::Bfloat16).unwrap();
        CudaDownConfig { mt: 4, bytesum_mma: false, bias_fold: true, ..one_pass }
            .check(&qwen, Dtype::Bfloat16)
            .unwrap();
        let err = |cfg: CudaDownConfig, g: &TrellisGeometry| cfg.check(g, Dtype::Bfloat16).unwrap_err().to_string();
        let dp4a = CudaDownConfig { bytesum_mma: false, bias_fold: true, ..one_pass };
        assert!(err(dp4a, &qwen).contains("16 warps need mt <= 4, or mt <= 8 with the u8 MMA"), "{}", err(dp4a, &qwen));
        // The bias fold's accumulators push 8-row tiles past 128 registers (160 at ks 4).
        let folded = CudaDownConfig { bias_fold: true, ..one_pass };
        assert!(err(folded, &qwen).contains("and no bias fold"), "{}", err(folded, &qwen));
        CudaDownConfig { mt: 4, ..folded }.check(&qwen, Dtype::Bfloat16).unwrap();
        let wide = CudaDownConfig { nc: 2, mt: 4, ..one_pass };
        assert!(err(wide, &qwen).contains("16 warps need nc = 1"), "{}", err(wide, &qwen));
        let pf = CudaDownConfig { ks: 1, prefetch: true, ..one_pass };
        assert!(err(pf, &qwen).contains("16 warps cannot prefetch"), "{}", err(pf, &qwen));
        // 100 rows load one activation at a time: 64-row steps of 64 rows give each of 512
        // threads 8, 32-row steps 4.
        let odd = TrellisGeometry::row_major(100, 1024, 3, 256, 12, 0).unwrap();
        let odd_pass = CudaDownConfig { splits: 1, ..one_pass };
        assert!(err(odd_pass, &odd).contains("at most 4 a thread"), "{}", err(odd_pass, &odd));
        CudaDownConfig { ks: 2, ..odd_pass }.check(&odd, Dtype::Bfloat16).unwrap();
        // Fewer warps cover a part of a coded block; 32 warps are out of range.
        CudaDownConfig { warps: 8, ..one_pass }.check(&qwen, Dtype::Bfloat16).unwrap();
        assert!(err(CudaDownConfig { warps: 32, ..one_pass }, &qwen).contains("32 warps (1 to 8, or 16)"));
    }

    #[test]
    fn blocks_cover_whole_coded_blocks_or_a_part_of_one() {
        let qwen = TrellisGeometry::row_major(17408, 5120, 3, 256, 12, 0).unwrap();
        let base = CudaDownConfig { ks: 1, ..u8_mma_fragments() };
        // 20 coded blocks a row: 2 per block -> 10 column blocks; half a block -> 40.
        let two = CudaDownConfig { nc: 4, warps: 8, ..base };
        assert_eq!((two.column_blocks(&qwen), two.copied_blocks()), (10, 2));
        let half = CudaDownConfig { nc: 1, mt: 4, warps: 8, ..base };
        half.check(&qwen, Dtype::Bfloat16).unwrap();
        assert_eq!((half.column_blocks(&qwen), half.copied_blocks()), (40, 1));
        let one_warp = CudaDownConfig { nc: 1, mt: 4, warps: 1, ..base };
        assert_eq!(one_warp.column_blocks(&qwen), 320);
        // 3 warps of NC 1: 48 positions, not a part of a coded block.
        let err = CudaDownConfig { warps: 3, ..one_warp }.check(&qwen, Dtype::Bfloat16).unwrap_err().to_string();
        assert!(err.contains("cover 48 positions, neither a part of a coded block"), "{err}");
        // 3 warps of NC 16 cover 3 coded blocks, which do not divide 20.
        let err =
            CudaDownConfig { nc: 16, mt: 1, warps: 3, ..base }.check(&qwen, Dtype::Bfloat16).unwrap_err().to_string();
        assert!(err.contains("nor a divisor of the 20 coded blocks"), "{err}");
    }

    #[test]
    fn producer_warps_are_checked() {
        let qwen = TrellisGeometry::row_major(17408, 5120, 3, 256, 12, 0).unwrap().interleaved().unwrap();
        let staged = CudaDownConfig { nc: 2, mt: 8, ks: 4, warps: 8, splits: 13, row_warps: 2, ..Default::default() };
        let fed = CudaDownConfig { producers: 8, ..staged };
        fed.check(&qwen, Dtype::Bfloat16).unwrap();
        assert_eq!(fed.block_warps(), 16);
        // Two A tiles, three with the prefetch; the plain staged kernel has one (two with it).
        let a_tile = 64 * (256 + 8) * 2;
        assert_eq!(fed.shared_bytes(&qwen, false) - staged.shared_bytes(&qwen, false), a_tile);
        let three = CudaDownConfig { prefetch: true, ..fed };
        assert_eq!(three.shared_bytes(&qwen, false) - staged.shared_bytes(&qwen, false), 2 * a_tile);
        let err = |cfg: CudaDownConfig, g: &TrellisGeometry, dtype: Dtype| cfg.check(g, dtype).unwrap_err().to_string();
        let bf16 = Dtype::Bfloat16;
        let fragments = CudaDownConfig { producers: 4, ..u8_mma_fragments() };
        assert!(err(fragments, &qwen, bf16).contains("producer warps feed the staged kernel"));
        assert!(err(CudaDownConfig { producers: 9, ..fed }, &qwen, bf16).contains("1 to 8 warps"));
        assert!(err(CudaDownConfig { warps: 0, ..fed }, &qwen, bf16).contains("0 warps (1 to 8, or 16)"));
        // 3 producer warps (96 threads) cannot split a step's 64 x 32 runs of 8 positions evenly.
        assert!(err(CudaDownConfig { producers: 3, ..fed }, &qwen, bf16).contains("split a step's decode runs evenly"));
        // Above 8 warps only shapes whose registers are known: not f32 at nc * mt 16, not one
        // activation a load (rows not a multiple of 8), not 16 8-row tiles.
        let f32_err = err(fed, &qwen, Dtype::Float32);
        assert!(f32_err.contains("f32 activations need nc * mt <= 8"), "{f32_err}");
        CudaDownConfig { mt: 4, row_warps: 1, ..fed }.check(&qwen, Dtype::Float32).unwrap();
        let odd = TrellisGeometry::row_major(100, 1024, 3, 256, 12, 0).unwrap();
        let odd_fed = CudaDownConfig { splits: 1, ..fed };
        assert!(err(odd_fed, &odd, bf16).contains("activations loaded 8 at a time"), "{}", err(odd_fed, &odd, bf16));
        let wide = CudaDownConfig { nc: 1, mt: 16, row_warps: 4, ..fed };
        assert!(err(wide, &qwen, bf16).contains("nc * mt <= 16 and mt <= 8"), "{}", err(wide, &qwen, bf16));
        // Up to 8 warps in all, any registers fit: f32 at nc * mt 16, one activation a load.
        let small = CudaDownConfig { nc: 4, warps: 4, mt: 4, row_warps: 1, producers: 4, ..staged };
        small.check(&qwen, Dtype::Float32).unwrap();
        CudaDownConfig { ks: 2, splits: 1, ..small }.check(&odd, bf16).unwrap();
    }

    #[test]
    fn staged_configurations_are_checked() {
        let qwen = TrellisGeometry::row_major(17408, 5120, 3, 256, 12, 0).unwrap();
        let staged = CudaDownConfig { nc: 1, mt: 8, warps: 8, splits: 13, row_warps: 2, ..Default::default() };
        staged.check(&qwen, Dtype::Bfloat16).unwrap();
        staged.check(&qwen, Dtype::Float32).unwrap();
        let err = |cfg: CudaDownConfig| cfg.check(&qwen, Dtype::Bfloat16).unwrap_err().to_string();
        for other in [
            CudaDownConfig { bytesum_mma: true, ..staged },
            CudaDownConfig { bias_fold: true, ..staged },
            CudaDownConfig { bias_fold: true, pack_fma: true, ..staged },
        ] {
            assert!(
                err(other).contains(
                    "staged kernel (row_warps = 2) decodes with dp4a and needs bytesum_mma, bias_fold and pack_fma off"
                ),
                "{}",
                err(other)
            );
        }
        // The staged prefetch (a second A tile) takes any steps, and three stages.
        let pipelined = CudaDownConfig { prefetch: true, ..staged };
        pipelined.check(&qwen, Dtype::Bfloat16).unwrap();
        assert_eq!(pipelined.shared_bytes(&qwen, false) - staged.shared_bytes(&qwen, false), 32 * 136 * 2);
        assert!(err(CudaDownConfig { stages: 2, ..pipelined }).contains("prefetch needs stages >= 3"));
        // The warps along the rows divide the warps and the 8-row tiles.
        assert!(
            err(CudaDownConfig { row_warps: 3, ..staged }).contains("row_warps = 3 must divide warps = 8 and mt = 8")
        );
        assert!(err(CudaDownConfig { mt: 2, row_warps: 4, ..staged }).contains("must divide"));
        assert!(err(CudaDownConfig { warps: 16, ..staged }).contains("16 warps cannot run the staged kernel"));
        // The A tile counts in the shared memory: 64-row steps of 128 positions take 17 KB on
        // top of the ring and the B tiles (65 KB in all: above 48 KB, allowed).
        let long = CudaDownConfig { ks: 4, ..staged };
        assert!(long.fits(&qwen, Dtype::Bfloat16) && long.shared_bytes(&qwen, false) > PLAN_SHARED_BUDGET);
        assert_eq!(
            long.shared_bytes(&qwen, false) - CudaDownConfig { row_warps: 0, ..long }.shared_bytes(&qwen, false),
            64 * 136 * 2
        );
        assert_eq!(
            CudaDownConfig { ks: 4, row_warps: 0, ..staged }
                .with_deepest_ring(&qwen, Dtype::Bfloat16)
                .map(|c| c.stages),
            Some(4)
        );
    }

    #[test]
    fn prefetch_needs_three_stages() {
        let g = TrellisGeometry::row_major(200, 1024, 3, 256, 12, 0).unwrap();
        let cfg = CudaDownConfig { stages: 2, prefetch: true, ..plan(&g, 128) };
        let err = cfg.check(&g, Dtype::Bfloat16).unwrap_err().to_string();
        assert!(err.contains("prefetch needs stages >= 3"), "{err}");
    }
}

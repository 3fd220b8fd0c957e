//! The down projection as a warp-specialized decode-once GEMM on Hopper's warpgroup MMA
//! (`kernels/cuda/down_ws.cu`): producer warps decode each step's 64 code rows of a 64-output tile
//! into shared memory, a consumer warpgroup multiplies them (transposed) with `wgmma` against the
//! pre-pass's activations times the row scales, brought by the copy engine. Each weight is decoded
//! once a pass of up to 128 rows, where the fragment kernel (`down_mma.cu`) decodes once a pass of
//! up to 64. Its shapes (`CudaDownWsConfig`) and its call (`run`).
//!
//! Not in the plan yet: at 96 and 128 rows it runs Qwen3-14B's MLP chain level with the fragment
//! kernel's two passes on an H200, though alone (Nsight Compute) it takes 112 µs where that takes
//! 140 (docs/cuda-down.md §7).

use std::sync::Arc;

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, ErrorContext, Result};
use crate::kernel::registry::{self, KernelKey, KernelText, LaunchCache};
use crate::kernel::sources;
use crate::kernel::variant::source_variant;
use crate::kernel::{CudaKernel, LaunchBounds, LaunchConfig};
use crate::trellis::checks::check_operands;
use crate::trellis::cuda::gate_up::plan::warpgroup_mma;
use crate::trellis::cuda::prescale::{self, PrePass, PrePassOutput};
use crate::trellis::format::{CodeLayout, TrellisGeometry};

use super::launch::{geometry_args, PreparedDown};

/// Steps of code words a producer of [`CudaDownWsConfig::for_rows`] has in flight ahead of its
/// decode: the words come from L2 (the four tiles of a block column each read a quarter of every
/// row's block), whose latency one step's decode may not cover (not measured).
const WS_LOOKAHEAD: u32 = 2;

/// Producer teams of four warps [`CudaDownWsConfig::for_rows`] gives a block: with three, one
/// block an SM, each team decodes every third step.
pub const WS_TEAMS: u32 = 3;

/// Thread blocks a pass with one producer team: two on each of an H200's 132 SMs (the launch
/// bounds hold a block to 128 registers a thread, and `WS_SHARED_BUDGET` keeps two blocks'
/// shared memory within an SM's); with three teams, one on each.
pub const WS_CTAS: u32 = 264;

/// Shared memory a block of one producer team keeps to: two blocks (and the 1 KB the GPU
/// reserves each) in Hopper's 228 KB.
const WS_SHARED_BUDGET: usize = 112 * 1024;

/// The most dynamic shared memory a block may take (Hopper's opt-in limit).
const DYNAMIC_SHARED_LIMIT: usize = 227 * 1024;

/// The section flag of the residual variant.
const RESIDUAL_FLAG: &str = "TRELLIS_RESIDUAL";

/// How one call of the kernel is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CudaDownWsConfig {
    /// 8-row tiles of a pass (1..=16): the `wgmma`'s N is `8 mt`.
    pub mt: u32,
    /// Steps of 64 input rows in the shared-memory ring (3..=7).
    pub stages: u32,
    /// Thread blocks a pass (stream-K over the pass's tiles and input blocks).
    pub ctas: u32,
    /// Carry y + 1534 in the code values and subtract 1534 times each row's sum at the end.
    pub bias_fold: bool,
    /// Steps whose code words a producer has in flight beyond the one it decodes (1 to 4).
    pub lookahead: u32,
    /// Producer teams of four warps (1 or 3), each decoding every `teams`-th step; `stages` a
    /// multiple of it.
    pub teams: u32,
}

impl CudaDownWsConfig {
    /// `m` rows: as few passes of up to 128 rows as hold them, the rows shared out evenly,
    /// [`WS_TEAMS`] producer teams, the bias fold. With one team, as many stages as
    /// `WS_SHARED_BUDGET` allows (at most 7) and [`WS_CTAS`] blocks; with three, six stages and
    /// one block an SM.
    pub fn for_rows(m: usize) -> CudaDownWsConfig {
        CudaDownWsConfig::with_teams(m, WS_TEAMS)
    }

    /// [`CudaDownWsConfig::for_rows`] with `teams` producer teams (1 or 3).
    pub fn with_teams(m: usize, teams: u32) -> CudaDownWsConfig {
        let passes = m.div_ceil(128).max(1);
        let mt = m.div_ceil(passes).div_ceil(8).clamp(1, 16) as u32;
        let base = CudaDownWsConfig { mt, stages: 3, ctas: WS_CTAS, bias_fold: true, lookahead: WS_LOOKAHEAD, teams };
        if teams > 1 {
            return CudaDownWsConfig { stages: 6, ctas: WS_CTAS / 2, ..base };
        }
        let stages = (3..=7).rev().find(|&s| CudaDownWsConfig { stages: s, ..base }.shared_bytes() <= WS_SHARED_BUDGET);
        CudaDownWsConfig { stages: stages.unwrap_or(3), ..base }
    }

    /// The threads of a block: a consumer warpgroup and `teams` producer teams of four warps.
    pub fn threads(&self) -> usize {
        128 * (1 + self.teams as usize)
    }

    /// Activation rows a pass.
    pub fn pass_rows(&self) -> usize {
        8 * self.mt as usize
    }

    /// The kernel's dynamic shared memory: the stages (8 KB of code values and the pass's rows of
    /// 64 inputs each), each producer team's code-word ring (`lookahead + 1` slots of 2 x 3 words
    /// for each of its 128 threads), the rows' factors and biases, the stages' mbarriers and the
    /// fold's flag.
    pub fn shared_bytes(&self) -> usize {
        let (rows, stages) = (self.pass_rows(), self.stages as usize);
        let word_ring = self.teams as usize * (self.lookahead as usize + 1) * 2 * 3 * 128 * 4;
        stages * (64 * 64 * 2 + rows * 64 * 2) + word_ring + 2 * rows * 4 + 8 * stages + 16
    }

    /// An error naming the first reason this shape cannot run `g` with `dtype` activations.
    pub fn check(&self, g: &TrellisGeometry, dtype: Dtype) -> Result<()> {
        let what = "CUDA down warp-specialized GEMM";
        if dtype == Dtype::Float32 {
            invalid!("{what}: for 16-bit activations (got {dtype}); f32 keeps the fragment kernel");
        }
        if !(1..=16).contains(&self.mt)
            || !(3..=7).contains(&self.stages)
            || !(1..=65535).contains(&self.ctas)
            || !(1..=4).contains(&self.lookahead)
            || !matches!(self.teams, 1 | 3)
        {
            invalid!(
                "{what}: mt = {} (1..=16), stages = {} (3..=7), ctas = {} (1..=65535), lookahead = {} (1..=4) or teams = {} (1 or 3) out of range",
                self.mt,
                self.stages,
                self.ctas,
                self.lookahead,
                self.teams
            );
        }
        if !self.stages.is_multiple_of(self.teams) {
            invalid!(
                "{what}: stages = {} is not a multiple of teams = {} (each stage is filled by one team)",
                self.stages,
                self.teams
            );
        }
        if !serves(g) {
            invalid!("{what}: unsupported geometry {g} (needs axis 0, T 256, L <= 16, k 2..=4, rows and columns multiples of 256)");
        }
        let shared = self.shared_bytes();
        if shared > DYNAMIC_SHARED_LIMIT {
            invalid!(
                "{what}: {shared} bytes of shared memory (mt = {}, stages = {}; at most {DYNAMIC_SHARED_LIMIT})",
                self.mt,
                self.stages
            );
        }
        Ok(())
    }
}

/// Whether the kernel serves `g`: the down kernel's geometries (`super::supports`) in coded
/// blocks of 256 whose input rows are whole blocks of 256 (a step is 64 of a block's rows, and
/// the pre-pass's image is of whole blocks).
pub fn serves(g: &TrellisGeometry) -> bool {
    super::supports(g) && g.t == 256 && g.rows.is_multiple_of(256)
}

/// The kernel, registered once per variant, shared-memory size and block size: blocks of 256
/// threads (one producer team) two an SM, of 512 (three) one.
fn kernel(residual: bool, shared_memory: usize, threads: usize) -> Result<&'static CudaKernel> {
    let bounds = LaunchBounds { threads: threads as u32, min_blocks: if threads > 256 { 1 } else { 2 } };
    let key = KernelKey {
        family: "down_ws",
        variant: if residual { "residual" } else { "" },
        shared_memory,
        launch_bounds: Some(bounds),
    };
    registry::cuda(key, || {
        Ok(KernelText {
            inputs: if residual {
                &["x", "x_exp", "x_sum", "counters", "codes", "residual"]
            } else {
                &["x", "x_exp", "x_sum", "counters", "codes"]
            },
            outputs: &["y", "partials"],
            body: source_variant(sources::CUDA_DOWN_WS, RESIDUAL_FLAG, residual)
                .context("CUDA down kernel source down_ws.cu")?,
            header: [
                sources::CUDA_CODEBOOK,
                sources::CUDA_FRAGMENT,
                sources::CUDA_DOWN_MMA_HEADER,
                sources::CUDA_WGMMA,
                sources::CUDA_STREAM_K,
            ]
            .join("\n"),
        })
    })
}

/// `x2 [M, in] · W` (plus `residual`, added before the one rounding, where given) with `cfg`: the
/// pre-pass (the rows times the scales as f16 in the image order, their exponents and sums, the
/// zeroed fold counters), then the kernel. Returns the output and the kernel's partial sums.
pub(crate) fn run(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    cfg: CudaDownWsConfig,
    residual: Option<&MlxArray>,
) -> Result<(MlxArray, MlxArray)> {
    let m = check_operands("CUDA down warp-specialized GEMM", x2, codes, scales, g)?;
    if let Some(r) = residual {
        super::check_down_residual(x2, g, r)?;
    }
    let prepared = prepared_launch(g, cfg, m, x2.dtype(), residual.is_some())?;
    let prescale::PrePassArrays { x_scaled: x_image, counters, x_exp, x_sum } =
        prescale::run(false, &[x2, scales], &prepared.pre_pass, "CUDA down warp-specialized GEMM")?;
    let mut inputs = vec![&x_image, &x_exp, &x_sum, &counters, codes];
    inputs.extend(residual);
    let mut ys = prepared.kernel.apply_prepared(&inputs, &prepared.launch)?;
    let partials = ys.pop().expect("an output and the partials");
    Ok((ys.remove(0), partials))
}

/// One call's shape: what its launches are prepared for, and their cache's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Call {
    g: TrellisGeometry,
    cfg: CudaDownWsConfig,
    m: usize,
    dtype: Dtype,
    residual: bool,
}

fn prepared_launch(
    g: &TrellisGeometry,
    cfg: CudaDownWsConfig,
    m: usize,
    dtype: Dtype,
    residual: bool,
) -> Result<Arc<PreparedDown>> {
    static LAUNCHES: LaunchCache<Call, PreparedDown> = LaunchCache::new(256);
    let call = Call { g: *g, cfg, m, dtype, residual };
    LAUNCHES.get_or_build(call, || prepare(call))
}

/// [`prepared_launch`]'s work on a miss: `cfg.ctas` blocks of a consumer warpgroup and
/// `cfg.teams` producer teams for each pass of `8 cfg.mt` rows (two blocks an SM with one team,
/// one with three); its scratch for the parts of tiles its blocks share; the pre-pass with a fold
/// counter for each 64-output tile of each pass.
fn prepare(Call { g, cfg, m, dtype, residual }: Call) -> Result<PreparedDown> {
    let what = "CUDA down warp-specialized GEMM";
    cfg.check(&g, dtype)?;
    if !warpgroup_mma() {
        invalid!("{what}: needs a GPU with Hopper's warpgroup MMA (compute capability 9.0)");
    }
    let passes = m.div_ceil(cfg.pass_rows()).max(1);
    let tiles = g.cols / 64;
    let (Some(counters), Some(partials), Some(image)) = (
        tiles.checked_mul(passes),
        passes.checked_mul(cfg.ctas as usize).and_then(|n| n.checked_mul(2 * 128 * 4 * cfg.mt as usize)),
        passes.checked_mul(cfg.pass_rows()).and_then(|n| n.checked_mul(g.rows)),
    ) else {
        invalid!("{what}: {m} rows of {g} overflow the launch's sizes");
    };
    if [counters, partials, image].iter().any(|&n| i32::try_from(n).is_err()) || passes > 65535 {
        invalid!("{what}: {m} rows of {g} overflow the launch's sizes ({counters} counters, {partials} partial sums, {image} activations, {passes} passes)");
    }
    let threads = cfg.threads();
    let kernel = kernel(residual, cfg.shared_bytes(), threads)?;
    let launch = LaunchConfig::new([threads, cfg.ctas as usize, passes], [threads, 1, 1])
        .output(&[m, g.cols], dtype)
        .output(&[partials], Dtype::Float32)
        .template_dtype("Y", dtype);
    let launch = geometry_args(launch, &g, what)?
        .template_int("MT", cfg.mt as i32)
        .template_int("STAGES", cfg.stages as i32)
        .template_int("LOOKAHEAD", cfg.lookahead as i32)
        .template_int("TEAMS", cfg.teams as i32)
        .template_bool("INTERLEAVE", g.layout() == CodeLayout::K3Interleaved)
        .template_bool("BIAS_FOLD", cfg.bias_fold);
    let launch = kernel.prepare(&launch)?;
    let pre_pass = PrePass {
        m,
        width: g.rows,
        row_pad: g.rows,
        dtype,
        counters,
        row_scales: true,
        output: PrePassOutput::Activations,
        pair: false,
        row_sums: cfg.bias_fold,
        wgmma_order: false,
        image_rows: cfg.pass_rows(),
    }
    .prepare()?;
    Ok(PreparedDown { kernel, launch, pre_pass })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen_down(k: u32) -> TrellisGeometry {
        TrellisGeometry::row_major(17408, 5120, k, 256, 12.max(k), 0).unwrap()
    }

    #[test]
    fn every_row_count_gets_a_shape_that_runs_in_whole_passes() {
        for g in [qwen_down(2), qwen_down(3), qwen_down(3).interleaved().unwrap(), qwen_down(4)] {
            assert!(serves(&g));
            for m in 1..=300 {
                for teams in [1, 3] {
                    let cfg = CudaDownWsConfig::with_teams(m, teams);
                    cfg.check(&g, Dtype::Bfloat16).unwrap();
                    // As few passes as hold the rows, in whole 8-row tiles.
                    let passes = m.div_ceil(cfg.pass_rows());
                    assert_eq!(passes, m.div_ceil(128), "M {m}");
                    assert!(passes * cfg.pass_rows() < m + 8 * passes, "M {m}");
                    let budget = if teams == 1 { WS_SHARED_BUDGET } else { DYNAMIC_SHARED_LIMIT };
                    assert!(cfg.shared_bytes() <= budget);
                }
            }
        }
    }

    #[test]
    fn stages_fill_the_budget_and_passes_share_the_rows() {
        // One team, 128 rows: 24 KB a stage, four stages; 64 rows: 16 KB, six.
        let one = |m| CudaDownWsConfig::with_teams(m, 1);
        assert_eq!((one(128).stages, one(64).stages, one(8).stages), (4, 6, 7));
        assert_eq!(one(128).shared_bytes(), 4 * (8192 + 16384) + 3 * 3072 + 1024 + 32 + 16);
        // Three teams: six stages, a word ring each, one block an SM.
        let three = CudaDownWsConfig::with_teams(128, 3);
        assert_eq!((three.stages, three.ctas, three.threads()), (6, WS_CTAS / 2, 512));
        assert_eq!(three.shared_bytes(), 6 * (8192 + 16384) + 3 * 3 * 3072 + 1024 + 48 + 16);
        // 200 rows: two passes of 104.
        let two = CudaDownWsConfig::for_rows(200);
        assert_eq!((two.mt, two.pass_rows()), (13, 104));
        assert_eq!(CudaDownWsConfig::for_rows(128).lookahead, 2);
    }

    #[test]
    fn shapes_and_geometries_it_cannot_run_are_errors_that_say_so() {
        let g = qwen_down(3);
        let ok = CudaDownWsConfig::for_rows(128);
        let err =
            |cfg: CudaDownWsConfig, g: &TrellisGeometry, dtype: Dtype| cfg.check(g, dtype).unwrap_err().to_string();
        assert!(err(ok, &g, Dtype::Float32).contains("16-bit activations"));
        assert!(err(CudaDownWsConfig { mt: 17, ..ok }, &g, Dtype::Bfloat16).contains("mt = 17"));
        assert!(err(CudaDownWsConfig { stages: 2, ..ok }, &g, Dtype::Bfloat16).contains("stages = 2"));
        assert!(err(CudaDownWsConfig { ctas: 0, ..ok }, &g, Dtype::Bfloat16).contains("ctas = 0"));
        assert!(err(CudaDownWsConfig { lookahead: 5, ..ok }, &g, Dtype::Bfloat16).contains("lookahead = 5"));
        assert!(err(CudaDownWsConfig { teams: 2, ..ok }, &g, Dtype::Bfloat16).contains("teams = 2"));
        let three = CudaDownWsConfig::with_teams(128, 3);
        assert!(err(CudaDownWsConfig { stages: 4, ..three }, &g, Dtype::Bfloat16).contains("not a multiple of teams"));
        // Input rows not a multiple of 256, and an axis-1 geometry.
        let ragged = TrellisGeometry::row_major(17400, 5120, 3, 256, 12, 0).unwrap();
        assert!(!serves(&ragged) && err(ok, &ragged, Dtype::Bfloat16).contains("unsupported geometry"));
        let axis1 = TrellisGeometry::row_major(5120, 17408, 3, 256, 12, 1).unwrap();
        assert!(!serves(&axis1) && err(ok, &axis1, Dtype::Bfloat16).contains("unsupported geometry"));
        // Coded blocks of 192, which the fragment kernel serves.
        let short = TrellisGeometry::row_major(17408, 5376, 3, 192, 12, 0).unwrap();
        assert!(super::super::supports(&short) && !serves(&short));
        assert!(err(ok, &short, Dtype::Bfloat16).contains("unsupported geometry"));
    }
}

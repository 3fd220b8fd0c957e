//! The encoder: dense weights to trellis codes with a tail-biting Viterbi (docs/format.md §8).
//!
//! # What it computes
//!
//! For every stored row `r` of the matrix to code (see [`stored_from_linear`] for which matrix is
//! stored on which axis):
//!
//! 1. `scale[r] = f16(RMS(row) / RMS(lut))`, where `RMS(lut)` is taken over the `2^L` values of
//!    [`lut1mad`] ([`lut_rms`]). A row whose scale would fall below f16's normal range
//!    (`2^-14`; an all-zero row included) gets scale 0 and decodes to exact zeros (see
//!    `row_scale`).
//! 2. `x = row / f32(scale[r])` (0 for a row of scale 0), coded block by block (`T = 256`
//!    weights per block).
//! 3. Each block is the minimum squared-error path through the bitshift trellis: `2^L` states,
//!    the successor of state `p` under the `k`-bit symbol `b` is `((p << k) | b) mod 2^L`, and
//!    state `s` emits `value(s)` (the f32 [`lut1mad`] entry). Tail-biting as QTIP does it: the
//!    block rotated by `T/2` is coded with a free start state, the state it takes at rotated
//!    index `T/2` (original position 0) is kept, and the block is coded again in its own order
//!    with the first state's top `L-k` bits and the last state's low `L-k` bits both pinned to
//!    that state's top `L-k` bits. The pinned path therefore satisfies the format's shift
//!    relation cyclically (`state_0 >> k == state_{T-1} & (2^(L-k) - 1)`), and since
//!    `T*k >= L` every pinned end state is reachable, so the second pass always closes.
//! 4. Symbol `state_t & (2^k - 1)` is packed at bit `(T-1-t)*k`. Every block is then decoded
//!    back through [`block_state`](crate::trellis::reference::block_state) (the format's literal window definition, wrap included) and
//!    compared with the Viterbi's states at every position; a mismatch is an error, never
//!    emitted codes. The reported reconstruction is `value(decoded state) * f32(scale)`, exactly
//!    what [`expand`](crate::trellis::reference::expand) decodes from the codes.
//!
//! # Cost and layout of the search
//!
//! One pass over a block is `T` steps over `2^L` states with `2^k` branches each. The
//! predecessors of a new state `s` are the `2^k` states `(s >> k) | (j << (L-k))`, so the cost
//! array (indexed by state) splits into `2^k` contiguous chunks of `2^(L-k)` entries, and the
//! cheapest predecessor of every group `h = s >> k` is an element-wise minimum over those chunks
//! (a vector minimum). All `2^k` states of a group continue from that minimum and add their own
//! emission `(x_t - value(s))^2`. Instead of backpointers the pass keeps each step's group minima
//! (`T * 2^(L-k)` f32 per block and thread, allocated once: 512 KiB at L = 12, k = 3; 16 MiB at
//! L = 16, k = 2); the traceback recomputes the `2^k` candidate costs of the one group on the
//! path with the same f32 operations and takes the one the minimum came from, which keeps the
//! forward loop free of argmin bookkeeping. Path costs are f32: the vector minima run twice as
//! wide as in f64, and a block's costs stay small (the row is normalised, so a path costs about
//! `T * mse`, far from where f32 rounding could change a decision that matters). A block costs
//! two passes of about `T * 2^L * 4` float operations (timings in `docs/encoder.md`).
//!
//! # Where the search runs
//!
//! [`EncoderConfig::backend`] picks the CPU threads or, on MLX's CUDA back-end, the kernel in
//! [`viterbi_cuda`] (one thread block per block, `L <= 15`). The kernel forms every path cost
//! with the same separately rounded f32 operations as the CPU search here and breaks ties the same
//! way, so both give the same states; the packing, the check of every block and the
//! reconstruction run on the CPU threads either way. The rows go to the GPU in chunks of at most
//! 65,536 blocks.
//!
//! # Hessian-weighted coding and bit allocation
//!
//! [`encode_linear_ldlq`] chooses the codes against the layer's input second moment `H`
//! (LDLQ / BlockLDLQ; algorithm, damping, guard and fallbacks in [`ldlq`]), minimising the
//! output error `tr(E H Eᵀ)` ([`proxy_error`]) instead of the plain squared error; every block it
//! codes goes through the same search dispatch as [`encode`]. [`allocate`] picks bits per weight
//! per tensor from a budget of stored bits.
//!
//! # Determinism
//!
//! Every block is coded by the same sequence of f32 operations whatever thread runs it; threads
//! take whole rows and write only that row's slots; the mean squared error is summed in
//! row-major order after all rows are done. The same input and configuration give the same bytes
//! for any thread count and either backend. Ties go to the lowest predecessor index `j` and, for
//! the final state, to the lowest state.

use std::sync::mpsc;
use std::sync::Mutex;

use half::f16;

use crate::alloc::{try_filled, try_with_capacity};
use crate::device::{backend, Backend};
use crate::error::{invalid, Error, ErrorContext, Result};

use super::cuda::viterbi as viterbi_cuda;
use super::format::codebook::lut1mad;
use super::format::{row_major_to_interleaved, CodeLayout, HostLayer, TrellisGeometry};

pub mod allocate;
mod block;
pub mod hessian;
pub mod ldlq;
mod linear;
mod norms;
mod parallel;
mod quality;
mod search;

use block::BlockCoder;
pub use hessian::{proxy_error, rotate_hessian, ProxyError};
#[doc(hidden)]
pub use ldlq::encode_linear_ldlq_with_targets;
pub use ldlq::{
    encode_linear_ldlq, encode_linear_ldlq_lockstep, encode_linear_ldlq_with_progress, LdlqConfig, LdlqEncoded,
    LdlqOutcome, LdlqProblem,
};
pub use linear::{choose_axis, code_linear, fitting_block_len, AxisChoice, CodedLinear, RotationSpec};
pub use norms::match_row_norms;
pub use quality::{quality, Quality, RELATIVE_MSE_BOUND};

/// The block length every shipped model uses, the encoder's default and the only one the GPU
/// kernels and the CUDA block search serve.
pub const BLOCK_LEN: u32 = 256;

/// The longest block the encoder accepts. Shorter blocks than [`BLOCK_LEN`] code an axis that is
/// not whole 256-weight blocks without padding (576 = 3 × 192); the host path and the generic
/// path serve them, the GPU kernels do not (docs/format.md §10).
pub const MAX_BLOCK_LEN: u32 = 1024;

/// How to code a matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncoderConfig {
    /// Bits per weight, 1..=8 with `t * k % 32 == 0`.
    pub k: u32,
    /// Trellis state bits, 8..=16 and greater than `k`.
    pub l: u32,
    /// Block length in weights: [`BLOCK_LEN`] (256, the default) or any length up to
    /// [`MAX_BLOCK_LEN`] whose `t * k` bits are whole 32-bit words (so at least 32, twice the
    /// largest `l`: the tail-biting search fixes `l - k` bits at each end of a block's cycle).
    pub t: u32,
    /// 0: the stored matrix is `Wᵀ [in, out]` (down projections); 1: it is `W [out, in]`.
    pub axis: u32,
    /// The layout of the produced codes. [`CodeLayout::K3Interleaved`] needs `k = 3`, `L = 12`,
    /// `axis = 0`, `T = 256` and a column count that is a multiple of 512.
    pub layout: CodeLayout,
    /// Worker threads; `None` uses [`std::thread::available_parallelism`]. The output does not
    /// depend on it.
    pub threads: Option<usize>,
    /// Where the block search runs. The output does not depend on it either.
    pub backend: EncoderBackend,
    /// The incoherence rotation of the coded axis that [`code_linear`] applies before coding
    /// (docs/format.md §10); `None` codes the weights as given. [`encode`] and [`encode_linear`] code
    /// the matrix they are given and refuse a rotation here (their result could not record it).
    pub rotation: Option<RotationSpec>,
}

/// Where the encoder's block search runs. Both searches perform the same f32 operations and
/// break ties the same way, so they produce the same bytes; packing, the check of every block
/// and the reconstruction run on the CPU threads in both cases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EncoderBackend {
    /// CUDA when the loaded MLX has its CUDA back-end, `L` is at most [`viterbi_cuda::MAX_L`]
    /// and `T` is [`BLOCK_LEN`]; the CPU otherwise.
    #[default]
    Auto,
    /// The multi-threaded CPU search.
    Cpu,
    /// The CUDA kernel (`kernels/cuda/viterbi.cu`); an error without CUDA or above
    /// [`viterbi_cuda::MAX_L`].
    Cuda,
}

impl EncoderConfig {
    /// `k` bits per weight and `l` state bits, with `T = 256`, axis 0, row-major codes, one
    /// thread per available core and the block search on CUDA where it can run.
    pub fn new(k: u32, l: u32) -> EncoderConfig {
        EncoderConfig {
            k,
            l,
            t: BLOCK_LEN,
            axis: 0,
            layout: CodeLayout::RowMajor,
            threads: None,
            backend: EncoderBackend::Auto,
            rotation: None,
        }
    }

    /// Checks every parameter; each error names the one it rejects.
    pub fn validate(&self) -> Result<()> {
        let EncoderConfig { k, l, t, axis, layout, threads, backend, rotation: _ } = *self;
        if !(1..=MAX_BLOCK_LEN).contains(&t) {
            invalid!("encoder: block length T = {t} is outside 1..={MAX_BLOCK_LEN}");
        }
        if !(1..=8).contains(&k) {
            invalid!("encoder: k = {k} bits per weight is outside 1..=8");
        }
        if (t * k) % 32 != 0 {
            invalid!("encoder: k = {k} bits per weight does not fill whole 32-bit words per block (T*k % 32 != 0 with T = {t})");
        }
        if !(8..=16).contains(&l) {
            invalid!("encoder: L = {l} state bits is outside 8..=16");
        }
        if l <= k {
            invalid!("encoder: L = {l} state bits must be greater than k = {k}");
        }
        if axis > 1 {
            invalid!("encoder: axis = {axis} must be 0 (stored [in, out]) or 1 (stored [out, in])");
        }
        if layout == CodeLayout::K3Interleaved && (k != 3 || l != 12 || axis != 0 || t != BLOCK_LEN) {
            invalid!(
                "encoder: layout K3Interleaved needs k = 3, L = 12, axis = 0, T = {BLOCK_LEN} (got k = {k}, L = {l}, axis = {axis}, T = {t})"
            );
        }
        if threads == Some(0) {
            invalid!("encoder: threads = 0; use None for one per core or a positive count");
        }
        if backend == EncoderBackend::Cuda && !viterbi_cuda::supports(k, l) {
            invalid!("encoder: the CUDA search serves L <= {} (got L = {l}); use the CPU backend", viterbi_cuda::MAX_L);
        }
        if backend == EncoderBackend::Cuda && t != BLOCK_LEN {
            invalid!("encoder: the CUDA search serves T = {BLOCK_LEN} (got T = {t}); use the CPU backend");
        }
        Ok(())
    }

    /// Checks that a dense linear weight `[out_features, in_features]` can be coded with this
    /// configuration, in the linear layer's terms: the coded axis (the output features on axis 0,
    /// the input features on axis 1) must be a whole number of `T`-weight blocks.
    pub fn check_linear(&self, out_features: usize, in_features: usize) -> Result<()> {
        self.validate()?;
        let (coded, name, other) = match self.axis {
            0 => (out_features, "out_features", "axis 0 stores Wᵀ [in, out] and codes along the output features"),
            _ => (in_features, "in_features", "axis 1 stores W [out, in] and codes along the input features"),
        };
        if coded == 0 || coded % self.t as usize != 0 {
            invalid!(
                "encoder: {name} = {coded} is not a positive multiple of the block length T = {} ({other})",
                self.t
            );
        }
        if out_features == 0 || in_features == 0 {
            invalid!("encoder: the linear weight [out {out_features}, in {in_features}] is empty");
        }
        Ok(())
    }

    /// Whether the block search runs on CUDA (see [`EncoderBackend`]).
    pub fn searches_on_cuda(&self) -> bool {
        match self.backend {
            EncoderBackend::Cpu => false,
            EncoderBackend::Cuda => true,
            EncoderBackend::Auto => {
                self.t == BLOCK_LEN && viterbi_cuda::supports(self.k, self.l) && backend() == Backend::Cuda
            }
        }
    }

    fn thread_count(&self, rows: usize) -> usize {
        let wanted = self.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        wanted.clamp(1, rows.max(1))
    }
}

/// The result of coding a matrix.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// Codes (in the configured layout), one f16 scale per stored row, and the geometry.
    pub layer: HostLayer,
    /// The decoded stored matrix `[rows, cols]` (padded columns included), row-major:
    /// `value(state) * f32(scale)` for the states the codes hold. Bit for bit what
    /// [`expand`](crate::trellis::reference::expand) returns for `layer`.
    pub reconstruction: Vec<f32>,
    /// Mean squared error of `reconstruction` against the input over the logical columns, in
    /// f64, summed in row-major order.
    pub mse: f64,
    /// The logical columns of each stored row (the stored columns past them are padding; equal
    /// to the stored columns when nothing was padded).
    pub logical_cols: usize,
}

/// The RMS of the `2^l` values of [`lut1mad`] (computed in f64), the denominator of the scales.
pub fn lut_rms(l: u32) -> Result<f64> {
    Ok(rms(&lut1mad(l)?))
}

/// The mean squared error of `reconstruction` against `weights` (both `[rows, cols]`) over the
/// first `logical` columns of each row, in f64, summed in row-major order.
fn logical_mse(weights: &[f32], reconstruction: &[f32], cols: usize, logical: usize) -> f64 {
    let sq: f64 = weights
        .chunks_exact(cols)
        .zip(reconstruction.chunks_exact(cols))
        .flat_map(|(w, q)| w[..logical].iter().zip(&q[..logical]))
        .map(|(&w, &q)| (w as f64 - q as f64).powi(2))
        .sum();
    sq / (weights.len() / cols * logical) as f64
}

/// The RMS of `values`, computed in f64.
fn rms(values: &[f32]) -> f64 {
    (values.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / values.len() as f64).sqrt()
}

/// The stored matrix for a dense linear weight `w` `[out_features, in_features]` (row-major):
/// for `axis = 0` its transpose `Wᵀ [in, out]` (rows are input features), for `axis = 1` a copy
/// of `W [out, in]` (rows are output features). Returns `(stored, rows, cols)`.
pub fn stored_from_linear(
    w: &[f32],
    out_features: usize,
    in_features: usize,
    axis: u32,
) -> Result<(Vec<f32>, usize, usize)> {
    if out_features.checked_mul(in_features) != Some(w.len()) {
        invalid!("encoder: the linear weight has {} values, expected [out {out_features}, in {in_features}]", w.len());
    }
    match axis {
        0 => {
            let mut stored =
                try_filled(w.len(), 0f32, || format!("the stored matrix [{in_features}, {out_features}]"))?;
            for (o, row) in w.chunks_exact(in_features.max(1)).enumerate() {
                for (i, &v) in row.iter().enumerate() {
                    stored[i * out_features + o] = v;
                }
            }
            Ok((stored, in_features, out_features))
        }
        1 => {
            let mut stored =
                try_with_capacity(w.len(), || format!("the stored matrix [{out_features}, {in_features}]"))?;
            stored.extend_from_slice(w);
            Ok((stored, out_features, in_features))
        }
        _ => invalid!("encoder: axis = {axis} must be 0 (stored [in, out]) or 1 (stored [out, in])"),
    }
}

/// Codes a dense linear weight `w` `[out_features, in_features]` (row-major) along
/// `cfg.axis`, transposing first for axis 0 ([`stored_from_linear`]). The reconstruction is in
/// the stored orientation (`[in, out]` for axis 0).
pub fn encode_linear(w: &[f32], out_features: usize, in_features: usize, cfg: &EncoderConfig) -> Result<Encoded> {
    cfg.validate()?;
    let (stored, rows, cols) = stored_from_linear(w, out_features, in_features, cfg.axis)?;
    cfg.check_linear(out_features, in_features)?;
    encode(&stored, rows, cols, cfg)
}

/// Codes the stored matrix `weights` `[rows, cols]` (row-major; `Wᵀ [in, out]` for axis 0,
/// `W [out, in]` for axis 1), each row along its columns.
pub fn encode(weights: &[f32], rows: usize, cols: usize, cfg: &EncoderConfig) -> Result<Encoded> {
    encode_with_progress(weights, rows, cols, cfg, &mut |_, _| {})
}

/// [`encode`], calling `progress(rows_done, rows)` on the calling thread after every finished
/// row (in completion order).
pub fn encode_with_progress(
    weights: &[f32],
    rows: usize,
    cols: usize,
    cfg: &EncoderConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Encoded> {
    encode_inner(weights, rows, cols, cols, cfg, BlockSearch::Viterbi, progress)
}

/// Codes the stored matrix `weights` `[rows, logical_cols]` (row-major) whose rows need not be
/// whole blocks (docs/format.md §10): each row is padded with zeros to the next multiple of `T`, the
/// padded positions are free in the block search (zero weight in its squared error) and left
/// out of the row's scale (the RMS of the logical columns) and of the reported mean squared
/// error. With `logical_cols` a multiple of `T` this is [`encode`]. The block search runs on the
/// CPU threads when there is padding (the CUDA search has no per-position weights).
pub fn encode_padded(
    weights: &[f32],
    rows: usize,
    logical_cols: usize,
    cfg: &EncoderConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Encoded> {
    cfg.validate()?;
    let t = cfg.t as usize;
    if rows.checked_mul(logical_cols) != Some(weights.len()) {
        invalid!("encoder: {} weights given for {rows} rows x {logical_cols} columns", weights.len());
    }
    if logical_cols == 0 {
        invalid!("encoder: the matrix is empty ({rows} rows x 0 columns)");
    }
    if logical_cols.is_multiple_of(t) {
        return encode_with_progress(weights, rows, logical_cols, cfg, progress);
    }
    let Some(cols) = logical_cols.div_ceil(t).checked_mul(t) else {
        invalid!("encoder: {logical_cols} columns padded to whole blocks overflow");
    };
    let Some(total) = rows.checked_mul(cols) else {
        invalid!("encoder: {rows} rows x {cols} padded columns overflow");
    };
    let mut padded = try_filled(total, 0f32, || format!("the padded matrix [{rows}, {cols}]"))?;
    for (dst, src) in padded.chunks_exact_mut(cols).zip(weights.chunks_exact(logical_cols)) {
        dst[..logical_cols].copy_from_slice(src);
    }
    encode_inner(&padded, rows, cols, logical_cols, cfg, BlockSearch::Viterbi, progress)
}

/// Which block search the encoder runs. Only [`BlockSearch::Viterbi`] is the encoder; the others
/// are deliberately broken searches that tests use to show the quality thresholds have teeth.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockSearch {
    /// The tail-biting Viterbi (the real encoder).
    Viterbi,
    /// A plain f64 tail-biting Viterbi written without any of the fast path's tricks.
    ReferenceViterbi,
    /// Best state for the first weight, then the best successor at each step (no search).
    Greedy,
    /// The forward pass of the Viterbi, then each step's individually best state instead of a
    /// traceback (not a path).
    NoTraceback,
    /// The Viterbi without tail-biting: free start and end states, so the first positions'
    /// windows (which wrap to the block's end) decode to states the search did not choose.
    NoTailBiting,
    /// A Viterbi over the wrong trellis: new symbols enter at the top of the state
    /// (`(p >> k) | (b << (L-k))`), packed as the format expects.
    WrongSuccessor,
}

/// [`encode`] with a chosen block search; see [`BlockSearch`]. For tests.
#[doc(hidden)]
pub fn encode_with_search(
    weights: &[f32],
    rows: usize,
    cols: usize,
    cfg: &EncoderConfig,
    search: BlockSearch,
) -> Result<Encoded> {
    encode_inner(weights, rows, cols, cols, cfg, search, &mut |_, _| {})
}

/// The states the block search `search` chooses for one already normalised block `x` of
/// `T = x.len()` values (what the encoder codes after dividing by the row's scale). For tests.
#[doc(hidden)]
pub fn block_path(x: &[f32], k: u32, l: u32, search: BlockSearch) -> Result<Vec<u32>> {
    let t = block_len_of(x)?;
    EncoderConfig { t, ..EncoderConfig::new(k, l) }.validate()?;
    let lut = lut1mad(l)?;
    let mut coder = BlockCoder::new(k, l, t, &lut, search, true);
    coder.x.copy_from_slice(x);
    coder.search_block();
    Ok(coder.states)
}

/// The states the weighted block search chooses for one normalised block `x` of `T = x.len()`
/// values whose squared error at position `i` weighs `weights[i]` (finite, non-negative; 0 on
/// padding, which the search may then fill with anything). For tests.
#[doc(hidden)]
pub fn block_path_weighted(x: &[f32], weights: &[f32], k: u32, l: u32) -> Result<Vec<u32>> {
    let t = block_len_of(x)?;
    EncoderConfig { t, ..EncoderConfig::new(k, l) }.validate()?;
    if weights.len() != x.len() {
        invalid!("block_path_weighted: a block of {} values has {} weights", x.len(), weights.len());
    }
    if let Some(w) = weights.iter().find(|w| !(w.is_finite() && **w >= 0.0)) {
        invalid!("block_path_weighted: a weight is {w} (weights are finite and at least 0)");
    }
    let lut = lut1mad(l)?;
    let mut coder = BlockCoder::new(k, l, t, &lut, BlockSearch::Viterbi, true);
    coder.x.copy_from_slice(x);
    coder.weigh_block(weights);
    coder.search_block();
    Ok(coder.states)
}

/// The block length of one block `x`, refused above [`MAX_BLOCK_LEN`].
fn block_len_of(x: &[f32]) -> Result<u32> {
    match u32::try_from(x.len()) {
        Ok(t) if t <= MAX_BLOCK_LEN => Ok(t),
        _ => invalid!("a block of {} values is longer than T = {MAX_BLOCK_LEN}", x.len()),
    }
}

/// Codes `weights` `[rows, cols]`, of which the first `logical` columns of each row are real and
/// the rest padding (free in the search, out of the scale and the error).
fn encode_inner(
    weights: &[f32],
    rows: usize,
    cols: usize,
    logical: usize,
    cfg: &EncoderConfig,
    search: BlockSearch,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Encoded> {
    cfg.validate()?;
    if cfg.rotation.is_some() {
        invalid!("encoder: a rotation is applied by code_linear, which records it; encode codes the matrix as given (set rotation: None)");
    }
    let t = cfg.t as usize;
    if rows == 0 || cols == 0 {
        invalid!("encoder: the matrix is empty ({rows} rows x {cols} columns)");
    }
    if rows.checked_mul(cols) != Some(weights.len()) {
        invalid!("encoder: {} weights given for {rows} rows x {cols} columns", weights.len());
    }
    if !cols.is_multiple_of(t) {
        invalid!("encoder: {cols} columns are not a whole number of {t}-weight blocks (cols % T != 0)");
    }
    if let Some(i) = weights.iter().position(|v| !v.is_finite()) {
        invalid!(
            "encoder: weight at row {}, column {} is {} (the input must be finite)",
            i / cols,
            i % cols,
            weights[i]
        );
    }
    let row_major = TrellisGeometry::row_major(rows, cols, cfg.k, cfg.t, cfg.l, cfg.axis)?;
    let geometry = match cfg.layout {
        CodeLayout::RowMajor => row_major,
        CodeLayout::K3Interleaved => row_major.interleaved()?,
    };

    let lut = lut1mad(cfg.l)?;
    let lut_rms = rms(&lut);
    if logical == 0 || logical > cols {
        invalid!("encoder: {logical} logical columns of {cols} stored columns");
    }
    let scales = weights
        .chunks_exact(cols)
        .enumerate()
        .map(|(r, row)| row_scale(&row[..logical], lut_rms, r))
        .collect::<Result<Vec<f16>>>()?;
    // Zero weight on the padded columns: the search may emit anything there.
    let column_weights: Option<Vec<f32>> =
        (logical < cols).then(|| (0..cols).map(|c| if c < logical { 1.0 } else { 0.0 }).collect());

    // The geometry's checks keep these sizes in range; the allocations may still fail.
    let mut codes = try_filled(row_major.code_words(), 0u32, || format!("the codes of {geometry}"))?;
    let mut reconstruction = try_filled(rows * cols, 0f32, || format!("the reconstruction of {geometry}"))?;
    let rows_of = RowsOf { weights, codes: &mut codes, reconstruction: &mut reconstruction, scales: &scales, cols };
    search_and_code(rows_of, column_weights.as_deref(), cfg, &lut, search, progress)?;

    let mse = logical_mse(weights, &reconstruction, cols, logical);
    let codes = match cfg.layout {
        CodeLayout::RowMajor => codes,
        CodeLayout::K3Interleaved => row_major_to_interleaved(&codes, rows, cols)?,
    };
    Ok(Encoded { layer: HostLayer { codes, scales, geometry }, reconstruction, mse, logical_cols: logical })
}

/// Codes the rows of `all` with their given scales through the configured search: the CUDA
/// kernel for [`BlockSearch::Viterbi`] where [`EncoderConfig::searches_on_cuda`] and every
/// position weighs 1, the CPU threads otherwise. `column_weights` (one per column of `all`'s
/// rows, `None`: all 1) weights each position's squared error, 0 on padding; the CUDA search has
/// no per-position weights, so weighted rows search on the CPU. Every caller that codes rows goes
/// through here, so all of them search on the same back-end with the same bytes as a result.
fn search_and_code(
    all: RowsOf<'_>,
    column_weights: Option<&[f32]>,
    cfg: &EncoderConfig,
    lut: &[f32],
    search: BlockSearch,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<()> {
    if let Some(w) = column_weights {
        if w.len() != all.cols {
            invalid!("encoder: {} column weights for rows of {} columns", w.len(), all.cols);
        }
    }
    if search == BlockSearch::Viterbi && cfg.searches_on_cuda() && column_weights.is_none() {
        search_on_cuda(all, cfg, lut, progress)
    } else {
        let rows = all.scales.len();
        code_rows(all, 0, None, column_weights, cfg, lut, search, &mut |done| progress(done, rows))
    }
}

/// Blocks per CUDA launch: bounds the host and device copies of a launch (64 MiB of f32 input).
const CUDA_CHUNK_BLOCKS: usize = 1 << 16;

/// A range of stored rows: their weights, code words, reconstruction and scales.
struct RowsOf<'a> {
    weights: &'a [f32],
    codes: &'a mut [u32],
    reconstruction: &'a mut [f32],
    scales: &'a [f16],
    cols: usize,
}

/// Runs the block search on CUDA, a chunk of rows per launch, and finishes each chunk's rows
/// (packing, the check, the reconstruction) on the CPU threads.
fn search_on_cuda(
    all: RowsOf<'_>,
    cfg: &EncoderConfig,
    lut: &[f32],
    progress: &mut dyn FnMut(usize, usize),
) -> Result<()> {
    let RowsOf { weights, codes, reconstruction, scales, cols } = all;
    let rows = scales.len();
    let rows_per_chunk = (CUDA_CHUNK_BLOCKS * cfg.t as usize / cols).max(1);
    let words_per_row = codes.len() / rows;
    let chunks = weights
        .chunks(rows_per_chunk * cols)
        .zip(codes.chunks_mut(rows_per_chunk * words_per_row))
        .zip(reconstruction.chunks_mut(rows_per_chunk * cols))
        .zip(scales.chunks(rows_per_chunk));
    for (chunk, (((weights, codes), reconstruction), scales)) in chunks.enumerate() {
        let first_row = chunk * rows_per_chunk;
        // The same f32 division as the CPU search's, so both search the same values.
        let x: Vec<f32> = weights
            .chunks_exact(cols)
            .zip(scales)
            .flat_map(|(row, scale)| {
                let scale = scale.to_f32();
                row.iter().map(move |&w| normalised(w, scale))
            })
            .collect();
        let states = viterbi_cuda::search_blocks(&x, cfg.k, cfg.l, lut).with_context(|| {
            format!("encoder: CUDA search of stored rows {first_row}..{}", first_row + scales.len())
        })?;
        let rows_of = RowsOf { weights, codes, reconstruction, scales, cols };
        code_rows(rows_of, first_row, Some(&states), None, cfg, lut, BlockSearch::Viterbi, &mut |done| {
            progress(first_row + done, rows)
        })?;
    }
    Ok(())
}

/// Codes the rows of `all` (the first of which is stored row `first_row`) on the configured
/// number of threads, with the states `given` (one per weight of these rows) or, without them,
/// the block search `search` (its squared error weighted per column by `column_weights`, where
/// given). Calls `progress(rows_done)` after every finished row.
#[allow(clippy::too_many_arguments)]
fn code_rows(
    all: RowsOf<'_>,
    first_row: usize,
    given: Option<&[u16]>,
    column_weights: Option<&[f32]>,
    cfg: &EncoderConfig,
    lut: &[f32],
    search: BlockSearch,
    progress: &mut dyn FnMut(usize),
) -> Result<()> {
    let RowsOf { weights, codes, reconstruction, scales, cols } = all;
    let rows = scales.len();
    let words_per_row = codes.len() / rows;
    let work = Mutex::new(
        weights
            .chunks_exact(cols)
            .zip(codes.chunks_exact_mut(words_per_row))
            .zip(reconstruction.chunks_exact_mut(cols))
            .zip(scales)
            .enumerate(),
    );
    let threads = cfg.thread_count(rows);
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let failures: Vec<(usize, Error)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (work, done_tx) = (&work, done_tx.clone());
                scope.spawn(move || {
                    let mut coder = BlockCoder::new(cfg.k, cfg.l, cfg.t, lut, search, given.is_none())
                        .with_column_weights(column_weights);
                    let mut failures = Vec::new();
                    // The guard is consumed inside `and_then`, so the lock is held only to take a
                    // row. A poisoned lock means another worker panicked; its join reports it.
                    while let Some((r, (((row, row_codes), row_rec), scale))) =
                        work.lock().ok().and_then(|mut w| w.next())
                    {
                        let row_states = given.map(|g| &g[r * cols..(r + 1) * cols]);
                        if let Err(e) = coder.code_row(row, scale.to_f32(), row_states, row_codes, row_rec) {
                            failures.push((first_row + r, e));
                        }
                        let _ = done_tx.send(());
                    }
                    failures
                })
            })
            .collect();
        drop(done_tx);
        let mut done = 0;
        for () in done_rx {
            done += 1;
            progress(done);
        }
        handles.into_iter().flat_map(|h| h.join().expect("encoder worker panicked")).collect()
    });
    match failures.into_iter().min_by_key(|(r, _)| *r) {
        Some((r, e)) => Err(e.context(format!("encoder: stored row {r}"))),
        None => Ok(()),
    }
}

/// The scale of one stored row, the one function that decides it: `f16(RMS(row) / lut_rms)`.
///
/// A row whose scale would fall below f16's normal range (`RMS(row) / lut_rms < 2^-14`, an
/// all-zero row included) gets scale 0 and decodes to exact zeros: f16 cannot hold a smaller
/// scale to its 11 significant bits, and a coarse subnormal one would decode the row to noise
/// many times larger than the row. Such a row's error is its own energy (relative error 1, never
/// more), below `(2^-14 · lut_rms)²` per weight. Too large a row (the scale overflows f16) is an
/// error.
fn row_scale(row: &[f32], lut_rms: f64, r: usize) -> Result<f16> {
    let sum_sq: f64 = row.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let rms = (sum_sq / row.len().max(1) as f64).sqrt();
    let ideal = rms / lut_rms;
    if ideal < f64::from(f16::MIN_POSITIVE) {
        return Ok(f16::ZERO);
    }
    let scale = f16::from_f64(ideal);
    if scale.is_infinite() {
        invalid!("encoder: row {r} has RMS {rms:e}, too large for an f16 scale");
    }
    Ok(scale)
}

/// A weight divided by its row's scale, the value the block search codes; 0 in a row of scale 0
/// (see [`row_scale`]), whose codes decode to zeros whatever they hold.
fn normalised(w: f32, scale: f32) -> f32 {
    if scale == 0.0 {
        0.0
    } else {
        w / scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trellis::synthetic::gaussian;

    #[test]
    fn the_fast_search_matches_the_reference_search() {
        for k in [2u32, 3, 4] {
            let l = 8;
            let x = gaussian(4 * 256, 7 + k as u64).unwrap();
            let cfg = EncoderConfig::new(k, l);
            let fast = encode(&x, 4, 256, &cfg).unwrap();
            let slow = encode_with_search(&x, 4, 256, &cfg, BlockSearch::ReferenceViterbi).unwrap();
            assert!((fast.mse - slow.mse).abs() <= 1e-3 * slow.mse, "k {k}: fast {} reference {}", fast.mse, slow.mse);
        }
    }
}

//! The encoder: dense weights to trellis codes with a tail-biting Viterbi (spec §8).
//!
//! # What it computes
//!
//! For every stored row `r` of the matrix to code (see [`stored_from_linear`] for which matrix is
//! stored on which axis):
//!
//! 1. `scale[r] = f16(RMS(row) / RMS(lut))`, where `RMS(lut)` is taken over the `2^L` values of
//!    [`lut1mad`] ([`lut_rms`]). An all-zero row gets 1.0; a row so small that its scale would
//!    round to zero gets the smallest positive f16 instead (so the division below stays finite).
//! 2. `x = row / f32(scale[r])`, coded block by block (`T = 256` weights per block).
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
//!    back through [`block_state`] (the format's literal window definition, wrap included) and
//!    compared with the Viterbi's states at every position; a mismatch is an error, never
//!    emitted codes. The reported reconstruction is `value(decoded state) * f32(scale)`, exactly
//!    what [`expand`](super::reference::expand) decodes from the codes.
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
//! two passes of about `T * 2^L * 4` float operations; on one core of a 2.4 GHz x86-64 (SSE2,
//! the default target) a pass takes about 0.25 ns per state and step.
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

use crate::device::{backend, Backend};
use crate::error::{invalid, Error, ErrorContext, Result};

use super::cuda::viterbi as viterbi_cuda;
use super::format::codebook::{lut1mad, words_per_block};
use super::format::{row_major_to_interleaved, CodeLayout, HostLayer, TrellisGeometry};
use super::reference::block_state;

/// The block length every shipped model uses and the only one the encoder accepts.
pub const BLOCK_LEN: u32 = 256;

/// The cost of a start state a pinned pass may not use. Finite, so that adding emissions to it
/// stays ordered and never makes a NaN; far above any real path cost.
const FORBIDDEN: f32 = 1e30;

/// How to code a matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncoderConfig {
    /// Bits per weight, 1..=8 with `t * k % 32 == 0`.
    pub k: u32,
    /// Trellis state bits, 8..=16 and greater than `k`.
    pub l: u32,
    /// Block length in weights; must be [`BLOCK_LEN`] (256).
    pub t: u32,
    /// 0: the stored matrix is `Wᵀ [in, out]` (down projections); 1: it is `W [out, in]`.
    pub axis: u32,
    /// The layout of the produced codes. [`CodeLayout::K3Interleaved`] needs `k = 3`, `L = 12`,
    /// `axis = 0` and a column count that is a multiple of 512.
    pub layout: CodeLayout,
    /// Worker threads; `None` uses [`std::thread::available_parallelism`]. The output does not
    /// depend on it.
    pub threads: Option<usize>,
    /// Where the block search runs. The output does not depend on it either.
    pub backend: EncoderBackend,
}

/// Where the encoder's block search runs. Both searches perform the same f32 operations and
/// break ties the same way, so they produce the same bytes; packing, the check of every block
/// and the reconstruction run on the CPU threads in both cases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EncoderBackend {
    /// CUDA when the loaded MLX has its CUDA back-end and `L` is at most
    /// [`viterbi_cuda::MAX_L`]; the CPU otherwise.
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
        }
    }

    /// Checks every parameter; each error names the one it rejects.
    pub fn validate(&self) -> Result<()> {
        let EncoderConfig { k, l, t, axis, layout, threads, backend } = *self;
        if t != BLOCK_LEN {
            invalid!("encoder: block length T = {t} is not supported (T must be {BLOCK_LEN})");
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
        if layout == CodeLayout::K3Interleaved && (k != 3 || l != 12 || axis != 0) {
            invalid!(
                "encoder: layout K3Interleaved needs k = 3, L = 12, axis = 0 (got k = {k}, L = {l}, axis = {axis})"
            );
        }
        if threads == Some(0) {
            invalid!("encoder: threads = 0; use None for one per core or a positive count");
        }
        if backend == EncoderBackend::Cuda && !viterbi_cuda::supports(k, l) {
            invalid!("encoder: the CUDA search serves L <= {} (got L = {l}); use the CPU backend", viterbi_cuda::MAX_L);
        }
        Ok(())
    }

    /// Whether the block search runs on CUDA (see [`EncoderBackend`]).
    pub fn searches_on_cuda(&self) -> bool {
        match self.backend {
            EncoderBackend::Cpu => false,
            EncoderBackend::Cuda => true,
            EncoderBackend::Auto => viterbi_cuda::supports(self.k, self.l) && backend() == Backend::Cuda,
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
    /// The decoded stored matrix `[rows, cols]`, row-major: `value(state) * f32(scale)` for the
    /// states the codes hold. Bit for bit what [`expand`](super::reference::expand) returns for
    /// `layer`.
    pub reconstruction: Vec<f32>,
    /// Mean squared error of `reconstruction` against the input, in f64, summed in row-major
    /// order.
    pub mse: f64,
}

/// The RMS of the `2^l` values of [`lut1mad`] (computed in f64), the denominator of the scales.
pub fn lut_rms(l: u32) -> f64 {
    rms(&lut1mad(l))
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
    if w.len() != out_features * in_features {
        invalid!("encoder: the linear weight has {} values, expected [out {out_features}, in {in_features}]", w.len());
    }
    match axis {
        0 => {
            let mut stored = vec![0f32; w.len()];
            for (o, row) in w.chunks_exact(in_features.max(1)).enumerate() {
                for (i, &v) in row.iter().enumerate() {
                    stored[i * out_features + o] = v;
                }
            }
            Ok((stored, in_features, out_features))
        }
        1 => Ok((w.to_vec(), out_features, in_features)),
        _ => invalid!("encoder: axis = {axis} must be 0 (stored [in, out]) or 1 (stored [out, in])"),
    }
}

/// Codes a dense linear weight `w` `[out_features, in_features]` (row-major) along
/// `cfg.axis`, transposing first for axis 0 ([`stored_from_linear`]). The reconstruction is in
/// the stored orientation (`[in, out]` for axis 0).
pub fn encode_linear(w: &[f32], out_features: usize, in_features: usize, cfg: &EncoderConfig) -> Result<Encoded> {
    cfg.validate()?;
    let (stored, rows, cols) = stored_from_linear(w, out_features, in_features, cfg.axis)?;
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
    encode_inner(weights, rows, cols, cfg, BlockSearch::Viterbi, progress)
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
    encode_inner(weights, rows, cols, cfg, search, &mut |_, _| {})
}

/// The states the block search `search` chooses for one already normalised block `x` of
/// `T = 256` values (what the encoder codes after dividing by the row's scale). For tests.
#[doc(hidden)]
pub fn block_path(x: &[f32], k: u32, l: u32, search: BlockSearch) -> Result<Vec<u32>> {
    EncoderConfig::new(k, l).validate()?;
    if x.len() != BLOCK_LEN as usize {
        invalid!("block_path: a block has {BLOCK_LEN} values, got {}", x.len());
    }
    let lut = lut1mad(l);
    let mut coder = BlockCoder::new(k, l, BLOCK_LEN, &lut, search, true);
    coder.x.copy_from_slice(x);
    coder.search_block();
    Ok(coder.states)
}

fn encode_inner(
    weights: &[f32],
    rows: usize,
    cols: usize,
    cfg: &EncoderConfig,
    search: BlockSearch,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Encoded> {
    cfg.validate()?;
    let t = cfg.t as usize;
    if rows == 0 || cols == 0 {
        invalid!("encoder: the matrix is empty ({rows} rows x {cols} columns)");
    }
    if weights.len() != rows * cols {
        invalid!(
            "encoder: {} weights given for {rows} rows x {cols} columns ({} expected)",
            weights.len(),
            rows * cols
        );
    }
    if cols % t != 0 {
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

    let lut = lut1mad(cfg.l);
    let lut_rms = rms(&lut);
    let scales = weights
        .chunks_exact(cols)
        .enumerate()
        .map(|(r, row)| row_scale(row, lut_rms, r))
        .collect::<Result<Vec<f16>>>()?;

    let words_per_row = cols / t * words_per_block(cfg.t, cfg.k) as usize;
    let mut codes = vec![0u32; rows * words_per_row];
    let mut reconstruction = vec![0f32; rows * cols];
    let rows_of = RowsOf { weights, codes: &mut codes, reconstruction: &mut reconstruction, scales: &scales, cols };
    if search == BlockSearch::Viterbi && cfg.searches_on_cuda() {
        search_on_cuda(rows_of, cfg, &lut, progress)?;
    } else {
        code_rows(rows_of, 0, None, cfg, &lut, search, &mut |done| progress(done, rows))?;
    }

    let sq: f64 = weights.iter().zip(&reconstruction).map(|(&w, &q)| (w as f64 - q as f64).powi(2)).sum();
    let mse = sq / (rows * cols) as f64;
    let codes = match cfg.layout {
        CodeLayout::RowMajor => codes,
        CodeLayout::K3Interleaved => row_major_to_interleaved(&codes, rows, cols)?,
    };
    Ok(Encoded { layer: HostLayer { codes, scales, geometry }, reconstruction, mse })
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
                row.iter().map(move |&w| w / scale)
            })
            .collect();
        let states = viterbi_cuda::search_blocks(&x, cfg.k, cfg.l, lut).with_context(|| {
            format!("encoder: CUDA search of stored rows {first_row}..{}", first_row + scales.len())
        })?;
        let rows_of = RowsOf { weights, codes, reconstruction, scales, cols };
        code_rows(rows_of, first_row, Some(&states), cfg, lut, BlockSearch::Viterbi, &mut |done| {
            progress(first_row + done, rows)
        })?;
    }
    Ok(())
}

/// Codes the rows of `all` (the first of which is stored row `first_row`) on the configured
/// number of threads, with the states `given` (one per weight of these rows) or, without them,
/// the block search `search`. Calls `progress(rows_done)` after every finished row.
fn code_rows(
    all: RowsOf<'_>,
    first_row: usize,
    given: Option<&[u16]>,
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
                    let mut coder = BlockCoder::new(cfg.k, cfg.l, cfg.t, lut, search, given.is_none());
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

/// `f16(RMS(row) / lut_rms)`; 1.0 for an all-zero row; never zero or infinite.
fn row_scale(row: &[f32], lut_rms: f64, r: usize) -> Result<f16> {
    let sum_sq: f64 = row.iter().map(|&v| (v as f64) * (v as f64)).sum();
    if sum_sq == 0.0 {
        return Ok(f16::ONE);
    }
    let scale = f16::from_f64((sum_sq / row.len() as f64).sqrt() / lut_rms);
    if scale.is_infinite() {
        invalid!("encoder: row {r} has RMS {:e}, too large for an f16 scale", (sum_sq / row.len() as f64).sqrt());
    }
    // A nonzero row whose scale underflows f16 keeps the smallest positive one.
    Ok(if scale == f16::ZERO { f16::from_bits(1) } else { scale })
}

/// Per-thread state: the search's scratch buffers, allocated once and reused for every block.
struct BlockCoder<'a> {
    k: u32,
    l: u32,
    t: usize,
    lut: &'a [f32],
    search: BlockSearch,
    trellis: Trellis,
    /// The block to code, divided by the row's scale.
    x: Vec<f32>,
    /// The same block rotated by `T/2` (the first tail-biting pass).
    rotated: Vec<f32>,
    /// One state per position.
    states: Vec<u32>,
}

impl<'a> BlockCoder<'a> {
    /// A coder for blocks of `t` weights; `searches` is false when the states come from
    /// elsewhere (then the trellis buffers are not allocated).
    fn new(k: u32, l: u32, t: u32, lut: &'a [f32], search: BlockSearch, searches: bool) -> BlockCoder<'a> {
        let t = t as usize;
        let fast = searches && search == BlockSearch::Viterbi;
        let trellis = Trellis::new(k, l, if fast { t } else { 0 });
        BlockCoder { k, l, t, lut, search, trellis, x: vec![0.0; t], rotated: vec![0.0; t], states: vec![0; t] }
    }

    /// Runs the configured search on the normalised block in `self.x`, leaving the path in
    /// `self.states`.
    fn search_block(&mut self) {
        let (t, k) = (self.t, self.k);
        let half = t / 2;
        self.rotated[..t - half].copy_from_slice(&self.x[half..]);
        self.rotated[t - half..].copy_from_slice(&self.x[..half]);
        match self.search {
            BlockSearch::Viterbi => {
                // Tail-biting: the rotated pass picks the state of original position 0 (rotated
                // index T/2); the second pass keeps its top L-k bits at both ends of the cycle.
                self.trellis.search(k, &self.rotated, self.lut, None, &mut self.states);
                let pinned = self.states[t - half] >> k;
                self.trellis.search(k, &self.x, self.lut, Some(pinned), &mut self.states);
            }
            other => broken::search(other, &self.x, &self.rotated, self.lut, k, self.l, &mut self.states),
        }
    }

    /// Codes one stored row: fills its code words (row-major) and its reconstruction. With
    /// `given`, the row's states come from there instead of the search.
    fn code_row(
        &mut self,
        row: &[f32],
        scale: f32,
        given: Option<&[u16]>,
        codes: &mut [u32],
        reconstruction: &mut [f32],
    ) -> Result<()> {
        let (t, k, l) = (self.t, self.k, self.l);
        let wpb = codes.len() / (row.len() / t);
        let must_agree = matches!(self.search, BlockSearch::Viterbi | BlockSearch::ReferenceViterbi);
        for (b, ((block, words), rec)) in
            row.chunks_exact(t).zip(codes.chunks_exact_mut(wpb)).zip(reconstruction.chunks_exact_mut(t)).enumerate()
        {
            match given {
                Some(states) => {
                    for (s, &g) in self.states.iter_mut().zip(&states[b * t..(b + 1) * t]) {
                        *s = u32::from(g);
                    }
                }
                None => {
                    for (xi, &w) in self.x.iter_mut().zip(block) {
                        *xi = w / scale;
                    }
                    self.search_block();
                }
            }
            pack_symbols(&self.states, k, words);
            for (pos, (out, &state)) in rec.iter_mut().zip(&self.states).enumerate() {
                let decoded = block_state(words, pos, k, l);
                if must_agree && decoded != state {
                    invalid!(
                        "block {b}, position {pos}: the packed codes decode to state {decoded:#x} but the search chose {state:#x} (internal error: the path is not cyclic)"
                    );
                }
                *out = self.lut[decoded as usize] * scale;
            }
        }
        Ok(())
    }
}

/// Packs symbol `states[t] & (2^k - 1)` at bit `(T-1-t)*k` of the block's words.
fn pack_symbols(states: &[u32], k: u32, words: &mut [u32]) {
    words.fill(0);
    let t_len = states.len();
    let symbol_mask = (1u32 << k) - 1;
    for (t, &state) in states.iter().enumerate() {
        let symbol = state & symbol_mask;
        let bit = (t_len - 1 - t) * k as usize;
        let (word, offset) = (bit >> 5, bit & 31);
        words[word] |= symbol << offset;
        if offset + k as usize > 32 {
            words[word + 1] |= symbol >> (32 - offset);
        }
    }
}

/// The fast Viterbi over one block: cost arrays and per-step group minima, reused across blocks.
struct Trellis {
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

impl Trellis {
    fn new(k: u32, l: u32, t: usize) -> Trellis {
        let (states, groups) = if t == 0 { (0, 0) } else { (1usize << l, 1usize << (l - k)) };
        Trellis { l, cost: vec![0.0; states], next: vec![0.0; states], best: vec![0.0; t * groups] }
    }

    /// The minimum squared-error path for `x` into `states`. With `pin = Some(p)`, the first
    /// state must satisfy `s >> k == p` and the last `s & (2^(L-k) - 1) == p` (tail-biting).
    fn search(&mut self, k: u32, x: &[f32], lut: &[f32], pin: Option<u32>, states: &mut [u32]) {
        // Monomorphised per k so the branch loops have compile-time lengths and vectorise.
        match k {
            1 => self.search_k::<1>(x, lut, pin, states),
            2 => self.search_k::<2>(x, lut, pin, states),
            3 => self.search_k::<3>(x, lut, pin, states),
            4 => self.search_k::<4>(x, lut, pin, states),
            5 => self.search_k::<5>(x, lut, pin, states),
            6 => self.search_k::<6>(x, lut, pin, states),
            7 => self.search_k::<7>(x, lut, pin, states),
            8 => self.search_k::<8>(x, lut, pin, states),
            k => unreachable!("k = {k} passed validation"),
        }
    }

    fn search_k<const K: u32>(&mut self, x: &[f32], lut: &[f32], pin: Option<u32>, states: &mut [u32]) {
        let branches = 1usize << K;
        let groups = 1usize << (self.l - K);
        let steps = x.len();
        // Step 0: the emission alone, or forbidden outside the pinned start group.
        let start_cost = |s: usize| match pin {
            Some(p) if (s >> K) as u32 != p => FORBIDDEN,
            _ => branch_cost(0.0, x[0], lut[s]),
        };
        for (s, c) in self.cost.iter_mut().enumerate() {
            *c = start_cost(s);
        }
        for (step, &xt) in x.iter().enumerate().skip(1) {
            // Two loop shapes compute the same values; which compiles to tighter vector code
            // depends on k and the target's vector width (measured: the tiled shape wins for
            // k = 2, 3 on plain x86-64 and for every k >= 2 with AVX2; it needs k >= 2).
            if K >= 2 && (K <= 3 || cfg!(target_feature = "avx2")) {
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
                    branch_cost(self.best[prev * groups + (p >> K)], x[prev], lut[p])
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
mod broken {
    use super::BlockSearch;

    /// Runs `search` on the block `x` (and its rotation by `T/2`) into `states`.
    pub(super) fn search(
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
    use crate::trellis::synthetic::gaussian;

    #[test]
    fn packed_symbols_decode_to_a_cyclic_path() {
        // A hand-made cyclic path: any symbol string read as windows.
        let (k, l, t) = (3u32, 12u32, 256usize);
        let symbols: Vec<u32> = (0..t as u32).map(|i| (i * 5 + 1) % 8).collect();
        let states: Vec<u32> =
            (0..t).map(|pos| (0..4).fold(0u32, |s, i| s | (symbols[(pos + t - i) % t] << (3 * i))) & 0xFFF).collect();
        let mut words = vec![0u32; 24];
        pack_symbols(&states, k, &mut words);
        for (pos, &s) in states.iter().enumerate() {
            assert_eq!(block_state(&words, pos, k, l), s, "position {pos}");
        }
    }

    #[test]
    fn the_fast_search_matches_the_reference_search() {
        for k in [2u32, 3, 4] {
            let l = 8;
            let x = gaussian(4 * 256, 7 + k as u64);
            let cfg = EncoderConfig::new(k, l);
            let fast = encode(&x, 4, 256, &cfg).unwrap();
            let slow = encode_with_search(&x, 4, 256, &cfg, BlockSearch::ReferenceViterbi).unwrap();
            assert!((fast.mse - slow.mse).abs() <= 1e-3 * slow.mse, "k {k}: fast {} reference {}", fast.mse, slow.mse);
        }
    }

    /// Runs 20 steps of both loop shapes from the same start and compares every cost.
    fn compare_step_shapes<const K: u32>(l: u32) {
        let lut = lut1mad(l);
        let x = gaussian(256, 11 + K as u64);
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
        let lut = lut1mad(l);
        let x = gaussian(256, 3);
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

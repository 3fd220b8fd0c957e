// Down projection y[m, c] = sum_r x[m, r] * scale[r] * y(state(r, c)) / 147.8 on the tensor
// cores, for trellis codes of either layout (coded blocks of BLOCK_LEN = T positions, T K / 32
// words per block row, L <= 16; the 3-bit block interleave has T = 256).
//
// The MMA computes D[position, m] += W^T[position, r] * X^T[r, m] in m16n8k16 tiles: A holds
// code values y decoded straight into f16 registers (exact: |y| <= 510), B holds x * scale as
// f16 (f32 activations as an f16 hi + lo pair, two MMAs), accumulation is f32. TRELLIS_RCP is
// applied once per output when the partial sums are written (folding it into x * scale would
// push small activations into f16's subnormal range).
//
// Magnitudes. Before the conversion to f16 each activation row's products are multiplied by a
// power of two 2^e that brings their largest |x * scale| into f16's range (row_exponent in
// fragment.cuh), and the f32 sums are multiplied by 2^-e when written: exact, so activations of
// any magnitude an f32 holds keep f16's relative precision, where a plain conversion would
// round products above 65504 to infinity and those below 6e-8 to zero. e comes from the
// pre-pass (prescale.cu: the row's largest |x * scale|, one thread block a row) in x_exp; with
// PRESCALED the pre-pass has also applied it, otherwise store_b does. (A pass over the block's
// own slice of the row before the main loop made ptxas allocate the main loop's registers
// differently: 16 % more instructions in it at one row, NVRTC sm_90.)
//
// Work split. A block of WARPS warps owns TILE = 16 NC WARPS consecutive output positions (warp
// w: positions [16 NC w, 16 NC (w + 1)) of the tile, inside one coded block): CB = TILE / T
// whole coded blocks, or where TILE < T one of the PARTS = T / TILE parts of a coded block
// (blockIdx.y = coded block group * PARTS + part). It also owns one split of the input rows (SPLITS per pass) and
// one pass of 8 * MT activation rows (blockIdx.z = pass * SPLITS + split). It walks its split in
// steps of 16 KS rows (KS 16-row chunks); every step's codes (16 KS rows of its CB coded blocks,
// a part's whole block: the windows wrap around inside it) stream into a STAGES-deep
// shared-memory ring with cp.async, and the step's B tile (x * scale as f16, 8 MT x 16 KS) is
// built once per block in shared memory (double-buffered) and read with ldmatrix. One barrier
// per step: more chunks per step spread its fixed costs (the barrier, the copies, the B tile)
// over more decode, and let the compiler read chunk c + 1's code bits while chunk c decodes.
// Parts let a tile of few warps keep many rows per pass (its accumulators) with several blocks
// per SM, whose barriers then fall at different times. Each warp writes its own columns of the
// f32 partials [M, SPLITS, C]; the last block of each column tile to finish folds the splits
// (see the kernel's end).
//
// Decoding. Lane 4 g + q decodes output positions [p0, p0 + 2 NC) of its warp's tile
// (p0 = 2 NC g) for four rows of each step: one contiguous run of 2 NC K bits of each row's
// block (plus L - K bits of the last window, wrapping inside the block), read from shared
// memory as a few words and realigned to bit 0; every window is then one shift or funnel shift
// and one mask. Sub-tile s maps A row g to position p0 + 2s and A row g + 8 to p0 + 2s + 1.
// The byte sums are taken with dp4a (decode rows 2q, 2q+1, 2q+8, 2q+9).
//
// With BIAS_FOLD the A fragments carry y + 1534 (what the f16 exponent trick yields, one f16
// subtraction per pair fewer) and the kernel subtracts 1534 * sum_r B[r, m] at the end, taken by
// one extra MMA per step against an all-ones A. Products stay exact; the f32 accumulators hold
// larger partial sums, so this is for f16/bf16 activations only.
//
// With PACK_FMA (dp4a decode with BIAS_FOLD only) half of the code pairs are packed into their
// f16x2 register by an IMAD, on the FMA-heavy pipe, instead of a PRMT on the ALU pipe, which at
// one row is the decode's limit (see code_pair_dp4a_fma).
//
// Activations and scales are loaded 8 at a time (16-byte loads for 16-bit activations) where R
// is a multiple of 8 and both pointers are 16-byte aligned, one at a time otherwise.
//
// With PRESCALED the B tiles come ready-made: `x` is then the output of
// prescale.cu, x * scale as f16 ([M, R_PAD], with the f32 residues as M more rows), and each
// step's B tile streams into a slot of its own next to the step's codes in the ring, with the
// same cp.async round. The block then neither loads nor converts activations. At 64 rows that
// work (two 16-byte loads held in registers across the step, their conversion and stores) is
// what the kernel waits for, not the decode, which hides behind the MMAs (docs/cuda-down.md).
// Everything a prescaled step reads then arrives by cp.async, so with MBARRIERS the ring needs
// no block barrier: per slot a "full" mbarrier (each thread's cp.async.mbarrier.arrive fires
// once its copies have landed) and an "empty" one (each thread arrives after reading the slot).
// A warp waits only for its own step, the ring runs STAGES - 2 steps ahead so that warps may
// drift two steps apart, and their decode and MMA phases stop falling in step.
//
// The activation row count M is read at run time (x_shape[0]): one compiled kernel serves every
// M of a geometry and configuration. Template ints: R, C, K, L, BLOCK_LEN (T: 256, or a shorter
// block that divides C, a multiple of 64), NC (16-position sub-tiles per warp), MT (8-row MMA
// tiles per pass), KS (16-row chunks per step), WARPS, SPLITS, STAGES. A block row of T K / 32
// words streams in 16-byte copies where that is a whole number of them, else in 8-byte copies
// (T 192 at k 3: 18 words).
// The kernel folds its partials itself (see its end): it takes a fourth input, counters (u32,
// one per column tile and pass, zero), and writes y [M, C] in Y besides the f32 partials. Its
// fifth input, x_exp (f16 [M], integers), holds the rows' exponents from the pre-pass; with
// BLOCK_EXP (not PRESCALED) each block finds them over its own split of the inputs instead and
// x_exp is not read: then no pre-pass runs, and the counters come zeroed from the kernel before
// (the fused gate·up·SwiGLU's TRELLIS_FEED variant, gate_up.cu).
// Template bools: INTERLEAVE (3-bit block interleave), SPLIT_X (f32 activations as hi + lo),
// BIAS_FOLD, PACK_FMA, PRESCALED, MBARRIERS (prescaled ring synchronised by per-slot mbarriers
// instead of a block barrier per step), BLOCK_EXP. Template int UNROLLED_STEPS: the block-barrier
// ring's step loop rolled (0), in unrolled rounds of the B tiles' slots (1: the B tile's slot a
// constant of each copy of the step, the ring's computed) or of both rings (2: every slot a
// constant). Template types: T (activation dtype; f16 with PRESCALED), Y (the output's).
//
// With DIRECT_CODES (not PRESCALED, rolled steps) there is no code ring and no barrier in the
// main loop: each lane loads its own run's words of its four rows straight from global memory
// into registers, a step ahead (the fused gate·up kernel's way, gate_up.cu), and the block's B
// tiles for its whole split are built once before the loop (B tile slot i holds step i's), so
// the warps drift apart freely. For few rows, where the split's activations are a few hundred
// per row (docs/cuda-down.md §7 lead 8).
//
// The pair variant (its sections under TRELLIS_PAIR, registered as a text of its own) runs two
// matrices of one geometry and configuration on the same activations in one launch: an MLP's
// gate and up stored along their outputs, which otherwise take a launch and a pre-pass each for
// a grid that at one row leaves the GPU mostly idle. It takes two more inputs, codes_b and
// scales_b, and writes the second's output to a second output, y_b; grid y holds both
// matrices' column tiles (the second's after the first's), the counters one per tile of both,
// and x_exp, the prescaled rows and the partials the first matrix's then the second's.
//
// The residual variant (its sections under TRELLIS_RESIDUAL; one matrix) takes a sixth input,
// residual [M, C] in Y, and its fold writes y = residual + x W, added in f32 before the
// output's one rounding: a model's residual stream after its down projection, without a launch
// of its own for the add.
//
// The rotated-output variant (its sections under TRELLIS_ROTATE_OUT; with one matrix, the
// residual or the pair) writes the layer's logical output of a matrix coded along its rotated
// outputs (docs/format.md §10): y[:, :N] · Qᵀ, Q = diag(signs) · blockdiag(H_RB / √RB), in
// place of the stored one, and so saves the launch of rotate.cu after it. It takes one more
// input, signs (f32 [N]; the pair a second, signs_b), and template ints N (the logical output
// columns, a multiple of RB, at most C), RB (the rotation's block, a power of two dividing
// TILE, so that a column tile holds whole rotation blocks) and SCALE_BITS (1/√RB's f32 bits, as
// the host computes it); y (and y_b, and the residual) are [M, N]. The fold stages the tile's
// sums rounded to Y in shared memory, as the stored output would hold them, and runs on them
// rotate.cu's arithmetic in its order (hadamard.cuh's butterflies in f32, then the scale, then
// the sign): the bits of rotate.cu on this kernel's stored output. A residual is added in f32
// after the rotation, before the one rounding that follows it.
#if TRELLIS_PAIR
  constexpr int MATS = 2;  // matrices of the launch: the pair variant's prescaled x holds both's rows
#else
  constexpr int MATS = 1;
#endif
  const int M = PRESCALED ? x_shape[0] / ((SPLIT_X ? 2 : 1) * MATS) : x_shape[0];
  // 65536 (M >= 0), as a value the compiler cannot fold: see code_pair_dp4a_fma.
  const unsigned lift = 65536u + ((unsigned)M >> 31);
  constexpr int WPB = BLOCK_LEN * K / 32;         // words per coded block
  constexpr int NPOS = 2 * NC;                    // positions per lane
  using LaneRun = trellis_cuda::CodeRun<K, L, NPOS, BLOCK_LEN>;
  constexpr int NWR = LaneRun::NWR;               // realigned words per row
  constexpr int TILE = 16 * NC * WARPS;           // output positions per thread block
  constexpr int PARTS = TILE < BLOCK_LEN ? BLOCK_LEN / TILE : 1;  // thread blocks per coded block
  constexpr int CB = TILE < BLOCK_LEN ? 1 : TILE / BLOCK_LEN;     // coded blocks copied per thread block
  constexpr int STEP_ROWS = 16 * KS;
  constexpr int STEPS = (R + STEP_ROWS - 1) / STEP_ROWS;
  constexpr int A_PITCH = CB * WPB + 4;           // words per ring row (+4: fewer bank conflicts, 8-byte aligned)
  constexpr int COPY_WORDS = WPB % 4 == 0 ? 4 : 2;  // words per asynchronous copy (16 or 8 bytes)
  constexpr int CHUNKS = STEP_ROWS * CB * (WPB / COPY_WORDS);  // copies per step
  constexpr int THREADS = WARPS * 32;
  constexpr int B_ROWS = 8 * MT;
  constexpr int B_PITCH = STEP_ROWS + 8;          // halfs per B row: + 8 for conflict-free ldmatrix
  // Activations per load: 8 (16-byte loads) where a step's B tile gives every thread at least 8,
  // else 1, so that with few rows the conversions spread over many lanes instead of a few lanes
  // doing 8 each while their block waits at the step's barrier. The host's check mirrors this
  // (CudaDownConfig::activations_per_load).
  constexpr int VW = R % 8 == 0 && B_ROWS * STEP_ROWS >= 8 * THREADS ? 8 : 1;
  constexpr int B_LOADS = B_ROWS * STEP_ROWS / VW;
  constexpr int B_PER_THREAD = (B_LOADS + THREADS - 1) / THREADS;
  static_assert(TILE % BLOCK_LEN == 0 || BLOCK_LEN % TILE == 0, "a block covers whole coded blocks or a part of one");
  static_assert(BLOCK_LEN % (16 * NC) == 0 && C % BLOCK_LEN == 0, "a warp's positions lie in one coded block");
  static_assert(WPB % 2 == 0, "block rows of whole 8-byte words (T a multiple of 64)");
  static_assert(!INTERLEAVE || BLOCK_LEN == 256, "the 3-bit block interleave pairs 256-weight blocks");
  static_assert(!PACK_FMA || BIAS_FOLD, "PACK_FMA packs the dp4a decode's biased pairs");
  static_assert(!(BIAS_FOLD && SPLIT_X), "the bias fold is for 16-bit activations");
  static_assert(PRESCALED || THREADS % (STEP_ROWS / VW) == 0, "a thread loads the same step rows in every B row");

  // B tiles in flight: with PRESCALED one per ring slot, copied with the slot's codes.
  // With DIRECT_CODES one per step of the longest split: the split's whole strip.
  constexpr int SPLIT_STEPS = (STEPS + SPLITS - 1) / SPLITS;
  constexpr int B_SLOTS = DIRECT_CODES ? SPLIT_STEPS : PRESCALED ? STAGES : 2;
  static_assert(!DIRECT_CODES || (!PRESCALED && UNROLLED_STEPS == 0), "DIRECT_CODES builds its own B tiles, in rolled steps");
  // Prescaled rows are padded to whole steps of any KS: the host's PRESCALED_ROW_MULTIPLE (64,
  // src/trellis/cuda/down/mod.rs), which also sizes prescale.cu's output.
  constexpr int R_PAD = (R + 63) / 64 * 64;
  static_assert(!MBARRIERS || (PRESCALED && STAGES >= 3), "MBARRIERS runs the prescaled ring, 3 stages or more");
  static_assert(UNROLLED_STEPS >= 0 && UNROLLED_STEPS <= 2, "UNROLLED_STEPS: 0 rolled, 1 rounds of the B tiles' slots, 2 of both rings");
  // Shared memory, all of it dynamic: the code ring and the B tiles (every part's size a
  // multiple of 16 bytes). The host passes the parts' total (CudaDownConfig::shared_bytes), and
  // MLX raises the kernel's limit above 48 KB.
  // DIRECT_CODES keeps no ring (one 16-byte placeholder: the host sizes it so too).
  using Ring = unsigned[DIRECT_CODES ? 1 : STAGES][DIRECT_CODES ? 1 : STEP_ROWS][DIRECT_CODES ? 4 : A_PITCH];
  using BTiles = __half[B_SLOTS][SPLIT_X ? 2 : 1][B_ROWS][B_PITCH];
  static_assert(sizeof(Ring) % 16 == 0 && sizeof(BTiles) % 16 == 0, "16-byte parts");
  extern __shared__ __align__(16) unsigned char shared_base[];
  Ring& ring = *reinterpret_cast<Ring*>(shared_base);
  BTiles& b_tile = *reinterpret_cast<BTiles*>(shared_base + sizeof(Ring));
  // With MBARRIERS: per ring slot a "full" and an "empty" mbarrier.
  unsigned long long* full_bar = reinterpret_cast<unsigned long long*>(shared_base + sizeof(Ring) + sizeof(BTiles));
  unsigned long long* empty_bar = full_bar + STAGES;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int split = blockIdx.z % SPLITS, pass = blockIdx.z / SPLITS;
  // This block's matrix and its operands: in the pair variant grid y's second half runs the
  // second matrix (see the top).
#if TRELLIS_PAIR
  const bool second = blockIdx.y >= gridDim.y / 2;
  const int tile_y = second ? blockIdx.y - gridDim.y / 2 : blockIdx.y;
  const uint32_t* const mat_codes = second ? codes_b : codes;
  const __half* const mat_scales = second ? scales_b : scales;
  const auto* const mat_x = PRESCALED && second ? x + (size_t)(SPLIT_X ? 2 : 1) * M * R_PAD : x;
  const __half* const mat_x_exp = second ? x_exp + M : x_exp;
  float* const mat_partial = second ? partial + (size_t)M * SPLITS * C : partial;
  auto* const mat_y = second ? y_b : y;
#if TRELLIS_ROTATE_OUT
  const float* const mat_signs = second ? signs_b : signs;
#endif
#else
  const int tile_y = blockIdx.y;
  const uint32_t* const mat_codes = codes;
  const __half* const mat_scales = scales;
  const auto* const mat_x = x;
  const __half* const mat_x_exp = x_exp;
  float* const mat_partial = partial;
  auto* const mat_y = y;
#if TRELLIS_ROTATE_OUT
  const float* const mat_signs = signs;
#endif
#endif
  const int first_block = tile_y / PARTS * CB;
  const int m_base = pass * B_ROWS;
  // Split s walks steps [s * STEPS / SPLITS, (s + 1) * STEPS / SPLITS): no split is empty, and
  // the longest is one step longer than the shortest.
  const int step_begin = (int)((long long)split * STEPS / SPLITS);
  const int steps = (int)((long long)(split + 1) * STEPS / SPLITS) - step_begin;

  // This lane's tile: coded block `cb` of the block's CB, positions [p0, p0 + NPOS).
  const int tile_pos = tile_y % PARTS * TILE + warp * 16 * NC;
  const int cb = tile_pos / BLOCK_LEN;
  const int p0 = tile_pos % BLOCK_LEN + g * NPOS;
  const LaneRun lane_run(cb, p0);
  int decode_row[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) decode_row[i] = 2 * q + (i & 1) + 8 * (i >> 1);

  // Per-thread copy plan, fixed for the whole split: chunk u of every step goes to the
  // same ring offset from a source that moves 16 rows per step (rows past R are zero-filled, not
  // read).
  constexpr int ROW_STRIDE = INTERLEAVE ? 48 : (C / BLOCK_LEN) * WPB;  // words between consecutive rows
  constexpr int COPIES = (CHUNKS + THREADS - 1) / THREADS;
  const int r_begin = step_begin * STEP_ROWS;
  // The destinations are slot 0's, as shared-window addresses found once: per step only the
  // slot's offset is added (a generic-to-shared conversion a step made ptxas rebuild the
  // window's base each time).
  const uint32_t* copy_src[COPIES];
  unsigned copy_dst_shared[COPIES];
  int copy_row[COPIES];
#pragma unroll
  for (int u = 0; u < COPIES; ++u) {
    const int c = tid + u * THREADS;
    const int row = c / (CB * (WPB / COPY_WORDS)), rest = c % (CB * (WPB / COPY_WORDS));
    const int b = rest / (WPB / COPY_WORDS), j = rest % (WPB / COPY_WORDS), blk = first_block + b;
    copy_row[u] = c < CHUNKS ? r_begin + row : R;  // R: never read
    copy_dst_shared[u] = (unsigned)__cvta_generic_to_shared(&ring[0][0][0] + row * A_PITCH + b * WPB + COPY_WORDS * j);
    copy_src[u] = mat_codes + (INTERLEAVE ? ((size_t)(blk >> 1) * R + r_begin + row) * 48 + (blk & 1) * 24
                                      : ((size_t)(r_begin + row) * (C / BLOCK_LEN) + blk) * WPB) + COPY_WORDS * j;
  }
  // With PRESCALED, copy u of a step's B tile is 8 prescaled activations: row m_base + row of
  // set `set` (the f32 residues are set 1), from step row 8 j. Rows past M are never copied
  // (they are zeroed once), and the prescaled rows are padded with zeros to whole steps. Offsets
  // in halfs (the host keeps the prescaled array below 2^31 elements): source -1 copies nothing.
  constexpr int B_SETS = SPLIT_X ? 2 : 1;
  constexpr int B_CHUNKS = PRESCALED ? B_SETS * B_ROWS * (STEP_ROWS / 8) : 0;
  constexpr int B_COPIES = (B_CHUNKS + THREADS - 1) / THREADS;
  int b_copy_src[B_COPIES > 0 ? B_COPIES : 1], b_copy_dst[B_COPIES > 0 ? B_COPIES : 1];
#pragma unroll
  for (int u = 0; u < B_COPIES; ++u) {
    const int c = tid + u * THREADS;
    const int set = c / (B_ROWS * (STEP_ROWS / 8)), rest = c % (B_ROWS * (STEP_ROWS / 8));
    const int row = rest / (STEP_ROWS / 8), j = rest % (STEP_ROWS / 8);
    b_copy_src[u] = c < B_CHUNKS && m_base + row < M ? (set * M + m_base + row) * R_PAD + r_begin + 8 * j : -1;
    b_copy_dst[u] = (set * B_ROWS + row) * B_PITCH + 8 * j;
  }
  // Step i's codes, and with PRESCALED its B tile, into ring slot `slot`.
  auto copy_codes = [&](int i, int slot) {
#pragma unroll
    for (int u = 0; u < COPIES; ++u) {
      if (tid + u * THREADS < CHUNKS) {
        const unsigned dst = copy_dst_shared[u] + slot * (unsigned)sizeof(ring[0]);
        const uint32_t* src = copy_src[u] + (size_t)i * STEP_ROWS * ROW_STRIDE;
        if (COPY_WORDS == 4)
          trellis_cuda::cp_async16_zfill_at(dst, src, copy_row[u] + STEP_ROWS * i < R);
        else
          trellis_cuda::cp_async8_zfill_at(dst, src, copy_row[u] + STEP_ROWS * i < R);
      }
    }
#pragma unroll
    for (int u = 0; u < B_COPIES; ++u) {
      if (b_copy_src[u] >= 0)
        trellis_cuda::cp_async16_zfill(&b_tile[slot][0][0][0] + b_copy_dst[u], mat_x + b_copy_src[u] + STEP_ROWS * i, true);
    }
  };
  // The power of two of each row of the pass (1 past M), from the pre-pass's exponents, or with
  // BLOCK_EXP from the largest |x * scale| of the row over this block's split (its partial sums
  // are unlifted before they are written, so splits need not share a power); row_unlift undoes
  // it on the sums.
  __shared__ float row_lift[B_ROWS], row_unlift[B_ROWS];
  static_assert(!(BLOCK_EXP && PRESCALED), "prescaled activations come lifted by the pre-pass");
  if (BLOCK_EXP) {
    // Each thread's largest products over its inputs of the split, for every row of the pass
    // (independent loads in flight together), then folded in shared memory (non-negative floats
    // order as their bits). Shaped so: with the warps' shuffles, or with the loop in a function
    // of its own, ptxas allocated the main loop differently (80 registers instead of 96 and 18 %
    // more instructions in it at one row, NVRTC sm_90); so it is unchanged.
    __shared__ unsigned split_amax[B_ROWS];
    for (int t = tid; t < B_ROWS; t += THREADS) split_amax[t] = 0u;
    const int r_end = min(R, (step_begin + steps) * STEP_ROWS);
    float amax[B_ROWS];
#pragma unroll
    for (int t = 0; t < B_ROWS; ++t) amax[t] = 0.0f;
    for (int r = r_begin + tid; r < r_end; r += THREADS) {
      const float s = __half2float(mat_scales[r]);
#pragma unroll
      for (int t = 0; t < B_ROWS; ++t)
        if (m_base + t < M) amax[t] = fmaxf(amax[t], fabsf(float(mat_x[(size_t)(m_base + t) * R + r]) * s));
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < B_ROWS; ++t)
      if (m_base + t < M) atomicMax(&split_amax[t], __float_as_uint(amax[t]));
    __syncthreads();
    for (int t = tid; t < B_ROWS; t += THREADS) {
      const int e = m_base + t < M ? trellis_cuda::row_exponent(__uint_as_float(split_amax[t])) : 0;
      row_lift[t] = trellis_cuda::pow2(e), row_unlift[t] = trellis_cuda::pow2(-e);
    }
  } else {
    for (int t = tid; t < B_ROWS; t += THREADS) {
      const int e = m_base + t < M ? (int)__half2float(mat_x_exp[m_base + t]) : 0;
      row_lift[t] = trellis_cuda::pow2(e), row_unlift[t] = trellis_cuda::pow2(-e);
    }
  }
  __syncthreads();  // the rows' powers, before store_b and the partials' writes read them

  // Per-thread B plan: load e = b_lane + u * THREADS of every step is VW activations (row
  // e / (STEP_ROWS / VW) of the pass, step rows kk..kk + VW - 1). THREADS is a multiple of the
  // loads per B row, so kk is the same for all of a thread's loads and one set of VW scales
  // serves them. Consecutive loads go to different warps (b_lane): with few rows, a block's B
  // work would otherwise all fall on warp 0 and its scheduler. Rows past M are zero-filled once
  // and never loaded or converted.
  const int b_lane = lane * WARPS + warp;
  const int b_kk = b_lane % (STEP_ROWS / VW) * VW;
  const T* b_x[B_PER_THREAD];
  int b_row[B_PER_THREAD];
  bool b_live[B_PER_THREAD];
  bool b_any = false;  // whether this thread loads anything (and so needs scales)
#pragma unroll
  for (int u = 0; u < B_PER_THREAD; ++u) {
    const int e = b_lane + u * THREADS, m = m_base + e / (STEP_ROWS / VW);
    b_live[u] = e < B_LOADS && m < M;
    b_any = b_any || b_live[u];
    b_row[u] = b_live[u] ? r_begin + b_kk : R;  // R: never read
    b_x[u] = mat_x + (size_t)(m < M ? m : 0) * R + r_begin + b_kk;
  }
  // Each load's row's power of two, read once for 16-bit activations (in the loop it cost the
  // one-row k 2 plan 13 more instructions a step); f32 ones read it from shared memory in
  // store_b (held in registers, it took their one-row plan from 80 to 97 registers, fewer
  // blocks per SM). NVRTC sm_90 counts.
  float b_lift[B_PER_THREAD];
#pragma unroll
  for (int u = 0; u < B_PER_THREAD; ++u)
    b_lift[u] = SPLIT_X ? 1.0f : row_lift[min((b_lane + u * THREADS) / (STEP_ROWS / VW), B_ROWS - 1)];
  // 16-byte loads need 16-byte aligned rows: MLX's buffers are, a view into one may not be.
  const bool vector_loads = VW == 8 && ((reinterpret_cast<size_t>(mat_x) | reinterpret_cast<size_t>(mat_scales)) & 15) == 0;
  // Step `i`'s activations and scales as loaded (this thread's share of the B tile), held in the
  // 16-byte words a vector load returns (activations and f16 scales packed as in memory);
  // store_b unpacks, multiplies and converts them. Nothing in load_b reads a loaded register:
  // in-order issue waits at the first instruction that does, and next to the loads that is a
  // full global-memory latency at the top of every step instead of one hidden by the decode.
  // That holds for unpacking too: with one register per value here, the compiler joined the
  // two load paths below by unpacking the vector loads' words right after them
  // (docs/cuda-down.md). Loads one at a time write their values into the same words, so the
  // paths join without unpacking.
  constexpr int X_WORDS = (VW * (int)sizeof(T) + 15) / 16;  // 16-byte words of a load's activations
  struct BLoad {
    uint4 x[B_PER_THREAD][X_WORDS];
    uint4 s;  // VW f16 scales
  };
  auto load_b = [&](int i, BLoad& v) {
    // Only threads with live rows read scales: with few rows most threads have none, and their
    // scale reads would cost more L1 traffic than the activations themselves.
    const int r = b_any ? r_begin + b_kk + STEP_ROWS * i : R;  // every load's first step row
    const uint4 zero = make_uint4(0, 0, 0, 0);
    if (vector_loads) {
      // R % 8 == 0 here, so 8 rows starting at a multiple of 8 are all in or all out.
      v.s = r < R ? *reinterpret_cast<const uint4*>(mat_scales + r) : zero;
#pragma unroll
      for (int u = 0; u < B_PER_THREAD; ++u) {
        const uint4* src = reinterpret_cast<const uint4*>(b_x[u] + STEP_ROWS * i);
#pragma unroll
        for (int w = 0; w < X_WORDS; ++w) v.x[u][w] = b_row[u] + STEP_ROWS * i < R ? src[w] : zero;
      }
    } else {
      __half* s = reinterpret_cast<__half*>(&v.s);
#pragma unroll
      for (int j = 0; j < VW; ++j) s[j] = r + j < R ? mat_scales[r + j] : __half(0.0f);
#pragma unroll
      for (int u = 0; u < B_PER_THREAD; ++u) {
        T* xs = reinterpret_cast<T*>(v.x[u]);
#pragma unroll
        for (int j = 0; j < VW; ++j) xs[j] = b_row[u] + STEP_ROWS * i + j < R ? b_x[u][STEP_ROWS * i + j] : T(0.0f);
      }
    }
  };
  auto store_b = [&](int slot, const BLoad& v) {
    const __half* s = reinterpret_cast<const __half*>(&v.s);
#pragma unroll
    for (int u = 0; u < B_PER_THREAD; ++u) {
      const int e = b_lane + u * THREADS;
      if (b_live[u]) {
        const T* xs = reinterpret_cast<const T*>(v.x[u]);
        const float lift = SPLIT_X ? row_lift[e / (STEP_ROWS / VW)] : b_lift[u];
        alignas(16) __half hi[VW], lo[VW];  // read back as one uint4 when VW == 8
#pragma unroll
        for (int j = 0; j < VW; ++j) {
          const float xv = float(xs[j]) * __half2float(s[j]) * lift;
          hi[j] = __float2half_rn(xv);
          lo[j] = __float2half_rn(xv - __half2float(hi[j]));
        }
        __half* row = &b_tile[slot][0][e / (STEP_ROWS / VW)][b_kk];
        if (VW == 8) {
          *reinterpret_cast<uint4*>(row) = *reinterpret_cast<const uint4*>(hi);
          if (SPLIT_X) *reinterpret_cast<uint4*>(&b_tile[slot][SPLIT_X ? 1 : 0][e / (STEP_ROWS / VW)][b_kk]) = *reinterpret_cast<const uint4*>(lo);
        } else {
          row[0] = hi[0];
          if (SPLIT_X) b_tile[slot][SPLIT_X ? 1 : 0][e / (STEP_ROWS / VW)][b_kk] = lo[0];
        }
      }
    }
  };
  float acc[NC][MT][4];
  float bias_acc[MT][4];
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) bias_acc[t][e] = 0.0f;
#pragma unroll
  for (int t = 0; t < MT; ++t) {
#pragma unroll
    for (int s = 0; s < NC; ++s)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[s][t][e] = 0.0f;
  }

  // Step pieces: B fragments of a B tile slot, this lane's code bits of a ring slot, and the
  // decode + MMAs of one step from those registers.
  // B fragments of the pass's MT 8-row tiles (and the f32 residue tiles).
  auto read_b_fragments = [&](int bslot, int chunk, unsigned (&b_hi)[MT][2], unsigned (&b_lo)[MT][2]) {
    const int col = 16 * chunk + (lane >> 3 & 1) * 8;
#pragma unroll
    for (int t = 0; t < MT; t += 2) {
      const int mat = lane >> 3, row = lane & 7;
      if (t + 1 < MT) {
        unsigned r[4];
        trellis_cuda::ldmatrix_x4(r, &b_tile[bslot][0][8 * (t + (mat >> 1)) + row][col]);
        b_hi[t][0] = r[0], b_hi[t][1] = r[1], b_hi[t + 1][0] = r[2], b_hi[t + 1][1] = r[3];
        if (SPLIT_X) {
          trellis_cuda::ldmatrix_x4(r, &b_tile[bslot][SPLIT_X ? 1 : 0][8 * (t + (mat >> 1)) + row][col]);
          b_lo[t][0] = r[0], b_lo[t][1] = r[1], b_lo[t + 1][0] = r[2], b_lo[t + 1][1] = r[3];
        }
      } else {
        unsigned r[2];
        trellis_cuda::ldmatrix_x2(r, &b_tile[bslot][0][8 * t + row][col]);
        b_hi[t][0] = r[0], b_hi[t][1] = r[1];
        if (SPLIT_X) {
          trellis_cuda::ldmatrix_x2(r, &b_tile[bslot][SPLIT_X ? 1 : 0][8 * t + row][col]);
          b_lo[t][0] = r[0], b_lo[t][1] = r[1];
        }
      }
    }
  };
  auto read_code_bits = [&](int slot, int chunk, unsigned (&w)[4][NWR]) {
    // This lane's bits of its four rows, realigned so that position p0 + NPOS - 1 is at bit 0.
#pragma unroll
    for (int k = 0; k < 4; ++k) lane_run.read(ring[slot][16 * chunk + decode_row[k]], w[k]);
  };
  auto decode_and_multiply = [&](const unsigned (&w)[4][NWR], const unsigned (&b_hi)[MT][2],
                                 const unsigned (&b_lo)[MT][2]) {
#pragma unroll
    for (int s = 0; s < NC; ++s) {
      // Positions p0 + 2s (A row g) and p0 + 2s + 1 (A row g + 8) sit at these realigned bits.
      const int b0 = (NPOS - 1 - 2 * s) * K, b1 = (NPOS - 2 - 2 * s) * K;
      unsigned a[4];
      a[0] = trellis_cuda::code_pair_dp4a<!BIAS_FOLD>(trellis_cuda::window<L>(w[0], b0), trellis_cuda::window<L>(w[1], b0));
      // With PACK_FMA half of the pairs (a[1], a[3]) are packed by an IMAD instead of a PRMT.
      a[1] = PACK_FMA ? trellis_cuda::code_pair_dp4a_fma(trellis_cuda::window<L>(w[0], b1), trellis_cuda::window<L>(w[1], b1), lift)
                      : trellis_cuda::code_pair_dp4a<!BIAS_FOLD>(trellis_cuda::window<L>(w[0], b1), trellis_cuda::window<L>(w[1], b1));
      a[2] = trellis_cuda::code_pair_dp4a<!BIAS_FOLD>(trellis_cuda::window<L>(w[2], b0), trellis_cuda::window<L>(w[3], b0));
      a[3] = PACK_FMA ? trellis_cuda::code_pair_dp4a_fma(trellis_cuda::window<L>(w[2], b1), trellis_cuda::window<L>(w[3], b1), lift)
                      : trellis_cuda::code_pair_dp4a<!BIAS_FOLD>(trellis_cuda::window<L>(w[2], b1), trellis_cuda::window<L>(w[3], b1));
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        trellis_cuda::mma_16816(acc[s][t], a, b_hi[t]);
        if (SPLIT_X) trellis_cuda::mma_16816(acc[s][t], a, b_lo[t]);
      }
    }
    if (BIAS_FOLD) {
      const unsigned ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};
#pragma unroll
      for (int t = 0; t < MT; ++t) trellis_cuda::mma_16816(bias_acc[t], ones, b_hi[t]);
    }
  };

  // Prologue: STAGES - 1 steps of codes in flight; the rows of the B tiles past M zeroed; the
  // first B tile built.
  auto prime_ring = [&]() {
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
      if (i < steps) copy_codes(i, i);
      trellis_cuda::cp_async_commit();
    }
  };
  auto zero_b_tiles = [&]() {
    constexpr int WORDS = sizeof(BTiles) / 16;
    for (int j = tid; j < WORDS; j += THREADS) reinterpret_cast<uint4*>(&b_tile[0][0][0][0])[j] = make_uint4(0, 0, 0, 0);
  };
  // With MBARRIERS the ring runs STAGES - 2 steps ahead: step i + STAGES - 2 refills the slot of
  // step i - 2, so warps may drift up to two steps apart.
  constexpr int MBAR_LEAD = STAGES - 2;
  if constexpr (MBARRIERS) {
    if (tid == 0) {
#pragma unroll
      for (int s = 0; s < STAGES; ++s) trellis_cuda::mbar_init(&full_bar[s], THREADS), trellis_cuda::mbar_init(&empty_bar[s], THREADS);
    }
    if (m_base + B_ROWS > M) zero_b_tiles();
    __syncthreads();  // the mbarriers and the zeroed rows, before any copy or wait
#pragma unroll
    for (int i = 0; i < MBAR_LEAD; ++i) {
      if (i < steps) {
        copy_codes(i, i);
        trellis_cuda::mbar_arrive_on_copies(&full_bar[i]);
      }
    }
  } else if constexpr (DIRECT_CODES) {
    // The split's whole strip of B tiles, once (rows past M, R or the split zero): element kk of
    // row t is step kk / STEP_ROWS's B tile, column kk % STEP_ROWS. Rows outer, so that a row's
    // loads are issued together and dead rows only store zeros.
    constexpr int SPAN = SPLIT_STEPS * STEP_ROWS;
    const int span = steps * STEP_ROWS;
#pragma unroll
    for (int t = 0; t < B_ROWS; ++t) {
      const bool live_row = m_base + t < M;
      const T* xr = mat_x + (size_t)(live_row ? m_base + t : 0) * R + r_begin;
      const float lift = row_lift[t];
#pragma unroll
      for (int kk0 = 0; kk0 < SPAN; kk0 += THREADS) {
        const int kk = kk0 + tid;
        if (kk0 + THREADS > SPAN && kk >= SPAN) break;
        float xv = 0.0f;
        if (live_row && kk < span && r_begin + kk < R) xv = float(xr[kk]) * __half2float(mat_scales[r_begin + kk]) * lift;
        const __half hi = __float2half_rn(xv);
        b_tile[kk / STEP_ROWS][0][t][kk % STEP_ROWS] = hi;
        if (SPLIT_X) b_tile[kk / STEP_ROWS][SPLIT_X ? 1 : 0][t][kk % STEP_ROWS] = __float2half_rn(xv - __half2float(hi));
      }
    }
    __syncthreads();  // the strip, before any warp reads it
  } else if constexpr (PRESCALED) {
    // The B tiles' rows past M are zeroed before any copy into the rows below M is issued.
    if (m_base + B_ROWS > M) {
      zero_b_tiles();
      __syncthreads();
    }
    prime_ring();
  } else {
    prime_ring();
    if (m_base + B_ROWS > M) {
      zero_b_tiles();
      __syncthreads();  // before any thread writes its rows below
    }
    if (steps > 0) {
      BLoad v;
      load_b(0, v);
      store_b(0, v);
    }
  }

  if constexpr (MBARRIERS) {
    // No block barrier: a thread waits for its step's slot to be full (every thread's copies
    // landed) and, before refilling a slot, for every thread to have released it.
    for (int i = 0; i < steps; ++i) {
      const int j = i + MBAR_LEAD;
      if (j < steps) {
        if (j >= STAGES) trellis_cuda::mbar_wait(&empty_bar[j % STAGES], (unsigned)(j / STAGES - 1) & 1u);
        copy_codes(j, j % STAGES);
        trellis_cuda::mbar_arrive_on_copies(&full_bar[j % STAGES]);
      }
      trellis_cuda::mbar_wait(&full_bar[i % STAGES], (unsigned)(i / STAGES) & 1u);
#pragma unroll
      for (int c = 0; c < KS; ++c) {
        unsigned w[4][NWR], b_hi[MT][2], b_lo[MT][2];
        read_b_fragments(i % STAGES, c, b_hi, b_lo);
        read_code_bits(i % STAGES, c, w);
        decode_and_multiply(w, b_hi, b_lo);
      }
      trellis_cuda::mbar_arrive(&empty_bar[i % STAGES]);
    }
  } else if constexpr (DIRECT_CODES) {
    // No barrier: each lane reads its run's words of its four rows (2q + 0, 1, 8, 9 of each
    // chunk) from global memory, step i + 1's while step i decodes, into the other of two sets
    // of registers (the loop unrolled by two, so that neither set is copied).
    constexpr int NWL = LaneRun::NWL;
    constexpr int STEP_WORDS = STEP_ROWS * ROW_STRIDE;  // words between two steps' rows
    const uint32_t* run_words[NWL];  // word j of the run in the lane's first row of step 0
#pragma unroll
    for (int j = 0; j < NWL; ++j) {
      const int b = lane_run.word_at[j] / WPB, w = lane_run.word_at[j] % WPB, blk = first_block + b;
      run_words[j] = mat_codes + (INTERLEAVE ? ((size_t)(blk >> 1) * R + r_begin + 2 * q) * 48 + (blk & 1) * 24 + w
                                             : ((size_t)(r_begin + 2 * q) * (C / BLOCK_LEN) + blk) * WPB + w);
    }
    using Raw = unsigned[KS][4][NWL];
    auto load_codes = [&](int i, Raw& raw) {
#pragma unroll
      for (int c = 0; c < KS; ++c)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int row = 16 * c + decode_row[k] - 2 * q;  // 16 c + 0, 1, 8 or 9
          // Rows past R (the last step of a ragged R) read nothing: their B tile rows are zero.
          const bool in = R % STEP_ROWS == 0 || r_begin + STEP_ROWS * i + 2 * q + row < R;
#pragma unroll
          for (int j = 0; j < NWL; ++j)
            raw[c][k][j] = in ? run_words[j][(size_t)i * STEP_WORDS + row * ROW_STRIDE] : 0u;
        }
    };
    auto direct_step = [&](int i, const Raw& cur, Raw& next) {
      if (i + 1 < steps) load_codes(i + 1, next);
#pragma unroll
      for (int c = 0; c < KS; ++c) {
        unsigned w[4][NWR], b_hi[MT][2], b_lo[MT][2];
        read_b_fragments(i, c, b_hi, b_lo);
#pragma unroll
        for (int k = 0; k < 4; ++k) lane_run.realign(cur[c][k], w[k]);
        decode_and_multiply(w, b_hi, b_lo);
      }
    };
    Raw raw_a, raw_b;
    if (steps > 0) load_codes(0, raw_a);
    for (int i = 0; i < steps; i += 2) {
      direct_step(i, raw_a, raw_b);
      if (i + 1 < steps) direct_step(i + 1, raw_b, raw_a);
    }
  } else {
    // Step i of the block-barrier ring; s and sb are i, or where the steps run in unrolled
    // rounds its place in the round (i mod the round's length, a constant of each copy of the
    // body): s names the ring's slot, sb the B tiles'.
    auto step = [&](int i, int s, int sb) {
      BLoad v_next;
      if (!PRESCALED && i + 1 < steps) load_b(i + 1, v_next);  // in flight while this step decodes
      trellis_cuda::cp_async_wait<STAGES - 2>();
      __syncthreads();  // step i's codes and B tile are visible; slot (i - 1) % STAGES is free
      if (i + STAGES - 1 < steps) copy_codes(i + STAGES - 1, (s + STAGES - 1) % STAGES);
      trellis_cuda::cp_async_commit();
#pragma unroll
      for (int c = 0; c < KS; ++c) {
        unsigned w[4][NWR], b_hi[MT][2], b_lo[MT][2];
        read_b_fragments(sb % B_SLOTS, c, b_hi, b_lo);
        read_code_bits(s % STAGES, c, w);
        decode_and_multiply(w, b_hi, b_lo);
      }
      // Slot (i + 1) % 2 was last read in step i - 1, before this step's barrier.
      if (!PRESCALED && i + 1 < steps) store_b((sb + 1) % B_SLOTS, v_next);
    };
    if (UNROLLED_STEPS != 0) {
      // Unrolled rounds in which the B tiles' slots (B_SLOTS steps), or both rings' slots (STAGES
      // steps, 2 STAGES where the B tiles' two slots do not divide it), cycle whole: each such
      // slot's address folds into its loads' offsets instead of being computed each step. Fewer
      // instructions a step; the longer round holds more registers (docs/cuda-down.md §7 lead 6
      // says where each wins).
      constexpr int ROUND = UNROLLED_STEPS == 1 ? B_SLOTS : STAGES % B_SLOTS == 0 ? STAGES : STAGES * B_SLOTS;
      constexpr bool RING_SLOT_CONSTANT = ROUND % STAGES == 0;
      for (int i0 = 0; i0 < steps; i0 += ROUND) {
#pragma unroll
        for (int s = 0; s < ROUND; ++s) {
          if (i0 + s >= steps) break;
          step(i0 + s, RING_SLOT_CONSTANT ? s : i0 + s, s);
        }
      }
    } else {
      for (int i = 0; i < steps; ++i) step(i, i, i);
    }
  }
  trellis_cuda::cp_async_wait<0>();

  {
    // Write this warp's partial sums: d0/d2 are (m = 8t + 2q, positions j0/j0 + 1), d1/d3 the
    // same positions of m + 1, so each pair is one 8-byte store.
    const size_t col0 = (size_t)(first_block + cb) * BLOCK_LEN + p0;
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      const int m = m_base + 8 * t + 2 * q;
      const float unlift[2] = {row_unlift[8 * t + 2 * q], row_unlift[8 * t + 2 * q + 1]};
#pragma unroll
      for (int s = 0; s < NC; ++s) {
        float d[4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
          d[e] = (acc[s][t][e] - (BIAS_FOLD ? 1534.0f * bias_acc[t][e] : 0.0f)) * TRELLIS_RCP * unlift[e & 1];
        float* out = mat_partial + ((size_t)m * SPLITS + split) * C + col0 + 2 * s;
        if (m < M) *reinterpret_cast<float2*>(out) = make_float2(d[0], d[2]);
        if (m + 1 < M) *reinterpret_cast<float2*>(out + (size_t)SPLITS * C) = make_float2(d[1], d[3]);
      }
    }
  }
  // The fold in the same launch: the last thread block of a column tile and pass to finish adds
  // the tile's SPLITS partial sums in split order (the same bits whatever order the blocks
  // finish in) and writes y in Y. `counters` (one per tile and pass) is zeroed for each call, so
  // two calls in flight never share one; the fences order every block's partial stores before
  // its count, and the count before the last block's loads (L2, not the L1 of another SM).
  __shared__ bool last_block;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    unsigned* count = const_cast<unsigned*>(counters) + blockIdx.y + gridDim.y * pass;
    last_block = atomicAdd(count, 1u) == SPLITS - 1;
  }
  __syncthreads();
  if (last_block) {
    __threadfence();
    const size_t tile0 = (size_t)first_block * BLOCK_LEN + tile_y % PARTS * TILE;
    const int rows = min(B_ROWS, M - m_base);
#if TRELLIS_ROTATE_OUT
    // ROT_ROWS rows of the tile at a time (4 KB of f32 at most): each row's sums rounded to Y,
    // then the butterflies of every RB-wide block at once (strides below RB never pair two
    // blocks), then the scale and the signs; columns past N (a stored padding) are not written.
    // The staging is a static array of its own, so the host takes this variant only where the
    // kernel's dynamic and static shared memory together stay within the 48 KB a kernel has
    // without opting in (CudaDownConfig::rotates_in_fold). (Staging in the code ring instead,
    // once the main loop is done with it, gave other bits than the kernel then rotate.cu for
    // one configuration on an H100, not understood: docs/cuda-down.md §4.)
    static_assert(TILE % RB == 0 && (RB & (RB - 1)) == 0 && N % RB == 0 && N <= C, "a tile holds whole rotation blocks");
    constexpr int ROT_ROWS = TILE >= 1024 ? 1 : (1024 / TILE < B_ROWS ? 1024 / TILE : B_ROWS);
    __shared__ float rot[ROT_ROWS * TILE];
    const float rot_scale = __int_as_float(SCALE_BITS);
    for (int r0 = 0; r0 < rows; r0 += ROT_ROWS) {
      const int nr = min(ROT_ROWS, rows - r0);
      for (int e = tid; e < nr * (TILE / 4); e += THREADS) {
        const int r = e / (TILE / 4), c = 4 * (e % (TILE / 4));
        const float* p = mat_partial + (size_t)(m_base + r0 + r) * SPLITS * C + tile0 + c;
        float4 s = __ldcg(reinterpret_cast<const float4*>(p));
        for (int sp = 1; sp < SPLITS; ++sp) {
          const float4 v = __ldcg(reinterpret_cast<const float4*>(p + (size_t)sp * C));
          s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
        }
        float* b = rot + r * TILE + c;
        b[0] = float(Y(s.x)), b[1] = float(Y(s.y)), b[2] = float(Y(s.z)), b[3] = float(Y(s.w));
      }
      __syncthreads();
#pragma unroll
      for (int h = 1; h < RB; h <<= 1) {
        trellis_cuda::butterfly_stage<ROT_ROWS * TILE, THREADS>(rot, h, tid);
        __syncthreads();
      }
      for (int e = tid; e < nr * TILE; e += THREADS) {
        const int m = m_base + r0 + e / TILE;
        const size_t col = tile0 + e % TILE;
        if (col >= N) continue;
        float v = rot[e] * rot_scale * mat_signs[col];
#if TRELLIS_RESIDUAL
        v = float(residual[(size_t)m * N + col]) + v;
#endif
        mat_y[(size_t)m * N + col] = Y(v);
      }
      __syncthreads();
    }
#else
    for (int e = tid; e < rows * (TILE / 4); e += THREADS) {
      const int m = m_base + e / (TILE / 4);
      const size_t col = tile0 + 4 * (e % (TILE / 4));
      const float* p = mat_partial + (size_t)m * SPLITS * C + col;
      float4 s = __ldcg(reinterpret_cast<const float4*>(p));
      for (int sp = 1; sp < SPLITS; ++sp) {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(p + (size_t)sp * C));
        s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
      }
#if TRELLIS_RESIDUAL
      const auto* res = residual + (size_t)m * C + col;
      s.x += float(res[0]), s.y += float(res[1]), s.z += float(res[2]), s.w += float(res[3]);
#endif
      Y* out = mat_y + (size_t)m * C + col;
      out[0] = Y(s.x), out[1] = Y(s.y), out[2] = Y(s.z), out[3] = Y(s.w);
    }
#endif
  }

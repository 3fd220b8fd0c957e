// The decode-once GEMM of the axis-1 projections for many activation rows: the same products as
// gate_up.cu, y[m, o] = scale[o] / 147.8 * sum_i x[m, i] * y(state(o, i)) for row-major codes
// [OUT, IN * K / 32] (T = 256 positions a block, 8 K words, L <= 16), and the same variants: one
// projection, its residual variant (TRELLIS_RESIDUAL: y = residual + x W, added in f32 and
// rounded once) and the fused gate·up·SwiGLU (TRELLIS_FUSED: gate and up of the same rows, of
// widths K and KU, y = silu(gate) * up).
//
// Why a second kernel. gate_up.cu's warps split the blocks of the same 16 output rows, and each
// lane reads and converts its own activations from global memory: every thread block reads all
// of a pass's activations again (Qwen3-14B's gate·up at 64 rows: 1,088 blocks of 16 rows, 713 MB),
// and 64 rows of two accumulator sets and their fragments take 208 registers (two blocks an SM).
// Here the warps of a thread block own different 16-row output tiles and share the activations:
// the block stages each block of 256 inputs of the pass's rows in shared memory once (cp.async,
// while the block before it is multiplied), and each warp decodes its weights straight into the
// MMA's A fragment (axis_one.cuh's chunk_fragment, gate_up.cu's positions) and multiplies each
// fragment against all the pass's 8 MT rows, their B fragments read from shared memory. Every
// weight is decoded once a pass, as in gate_up.cu; what changes is who reads the activations.
//
// Activations: f16 [M, IN], each row already multiplied by its power of two 2^e into f16's
// range, e in x_exp [M] (f16, integers): the pre-pass's hand-over (prescale.cu, ROW_SCALES
// false) of bf16 or f16 rows, so x is a whole buffer of MLX's (16-byte aligned) and every row
// start is too (IN is a multiple of 256). The outputs are multiplied by 2^-e, exactly.
//
// Shared memory (dynamic; the host's gemm_shared_bytes): two stages, each SPLIT_K parts (one a
// split) of the pass's 8 MT ROW_SPLIT rows of 288 halves:
// position 64 q + j of a block at half 72 q + j of its row, so a row's four quarters lie 144
// bytes apart and rows 576 bytes (64 mod 128) apart, and each 8-lane phase of a warp's 16-byte B
// loads (lane 4 g + q: row g, quarter q) covers 8 different 16-byte bank groups. Then the pass's
// rows' factors 2^-e and, with BIAS_FOLD, their biases 1534 x_sum (8 MT ROW_SPLIT floats each).
// With ROW_SPLIT > 1, then the fragments the warps of a tile hand each other: [TILES][2][CHUNKS]
// [NMAT][32] uint4 (CHUNKS, the chunks of a step: 2, or 4 at ROW_SPLIT 4). After the main loop
// the stages hold the splits' sums (SPLIT_K > 1: [SPLIT_K - 1][TILES][NMAT MT 4][32] floats, which
// fit in them). No static shared memory.
//
// Work split. A thread block has TILES = WARPS / (SPLIT_K ROW_SPLIT) output tiles of 16 rows,
// SPLIT_K (or ROW_SPLIT, below) warps each. Thread block (y, z) owns output rows
// [16 TILES y, 16 TILES (y + 1)) (warp w the tile 16 TILES y + 16 (w % TILES)) and activation rows
// [8 MT ROW_SPLIT z, 8 MT ROW_SPLIT (z + 1)) (rows past M are zero-filled in shared memory and
// not written). Warp w takes every SPLIT_K-th block of 256
// inputs from block w / TILES (its split), so that a layer has SPLIT_K times the warps of its
// tiles: each warp's chain is shorter, and a grid of few tiles (9-32 rows on Qwen3-14B: 1,088
// warps, under half a wave) fills more of the GPU. Each iteration stages SPLIT_K blocks, one a
// split. At the end the splits' sums meet in shared memory (split 0 adds the others', in split
// order). With SPLIT_K 1 every warp runs every block of its rows and no sums leave a warp. Output
// rows past OUT read row OUT - 1 and are not written, and a warp whose whole tile is past OUT
// only stages.
//
// Row split (ROW_SPLIT > 1, SPLIT_K 1). ROW_SPLIT warps share a 16-row output tile and a pass of
// 8 MT ROW_SPLIT rows: warp part p = w / TILES multiplies rows [8 MT p, 8 MT (p + 1)) of the pass,
// and each chunk's A fragment is decoded by one warp of the tile only (chunk c + p of each step of
// CHUNKS chunks, a step ahead), handed to the others through shared memory (one STS.128 and
// CHUNKS LDS.128 a matrix a lane per step, behind a named barrier of the tile's warps). So a pass
// of 128 rows decodes each weight once, where two passes of 64 rows decode it twice, and a pass
// of 64 rows has twice the warps, each with half the accumulators. Not planned: it measured
// slower than the plan at 64 and 128 rows (docs/cuda-mlp.md, "A row split").
//
// With BIAS_FOLD the fragments carry y + 1534 (the dp4a result as it is: no HSUB2), and the
// epilogue subtracts 1534 x_sum[m], the pre-pass's sum of row m's f16 activations (prescale.cu's
// ROW_SUMS); products and sums are exact or f32 either way, so only the f32 roundings differ.
//
// Template ints: K, L, MT (1..8), WARPS, SPLIT_K and ROW_SPLIT (1, 2 or 4; one of them 1; their
// product dividing WARPS), and in the fused variant KU.
// Template bools: PREFETCH (the code words read one block ahead; see the main loop), BIAS_FOLD. Template type: Y (the
// output dtype). Inputs: x [M, IN] f16, x_exp [M] f16, x_sum [M] f32 (read with BIAS_FOLD),
// codes [OUT, IN K / 32], scales [OUT] (f16), in the fused
// variant up_codes [OUT, IN KU / 32] and up_scales [OUT], in the residual variant residual
// [M, OUT] in Y. Output: y [M, OUT] in Y. Grid: [32 WARPS, ceil(OUT / (16 TILES)),
// ceil(M / (8 MT ROW_SPLIT))] threads (TILES = WARPS / (SPLIT_K ROW_SPLIT)), blocks of 32 WARPS.
// With the TRELLIS_FEED sections as well (the fused variant that feeds the down kernel, as
// gate_up.cu's) the kernel also writes `counters` (u32 [COUNTERS], template int COUNTERS),
// zeroed: the fold counters of the down kernel's launch that follows, whose BLOCK_EXP
// configurations then need no pre-pass launch (down_mma.cu).
  const int M = x_shape[0];
  const int IN = x_shape[1];
  const int OUT = scales_shape[0];
#if TRELLIS_FEED
  if (blockIdx.z == 0) {
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < COUNTERS; i += gridDim.y * blockDim.x) counters[i] = 0u;
  }
#endif
#if TRELLIS_FUSED
  constexpr int NMAT = 2;  // gate, up
  constexpr int K_UP = KU;
#else
  constexpr int NMAT = 1;
  constexpr int K_UP = K;
#endif
  // The lane's code words (axis_one.cuh): Lanes::k_of(a), matrix a's bits per weight (0: gate
  // or the only one, 1: up; constant once a is unrolled), and Lanes::RUN words a run.
  using Lanes = trellis_cuda::LaneRuns<NMAT, 1, K, K_UP>;
  constexpr int WARP_ROWS = 8 * MT;                      // activation rows a warp multiplies
  constexpr int ROWS = WARP_ROWS * ROW_SPLIT;            // activation rows of a pass
  constexpr int ROW_HALVES = 288;                        // a staged row: four quarters of 64 + 8 halves
  constexpr int PART = ROWS * ROW_HALVES;                // halves of one split's block of a stage
  constexpr int STAGE = SPLIT_K * PART;                  // halves a stage
  constexpr int TILES = WARPS / (SPLIT_K * ROW_SPLIT);   // output tiles a thread block
  constexpr int CHUNKS = ROW_SPLIT == 4 ? 4 : 2;         // chunks of 16 inputs a step
  static_assert(L <= 16 && L >= K && L >= K_UP, "L-bit windows");
  static_assert(MT >= 1 && MT <= 8, "1 to 8 tiles of 8 rows a warp");
  static_assert(SPLIT_K >= 1 && WARPS % SPLIT_K == 0, "SPLIT_K warps a tile");
  static_assert((ROW_SPLIT == 1 || ROW_SPLIT == 2 || ROW_SPLIT == 4) && (SPLIT_K == 1 || ROW_SPLIT == 1) &&
                    WARPS % (SPLIT_K * ROW_SPLIT) == 0 && TILES <= 15,
                "ROW_SPLIT warps a tile, each a named barrier");
  const int NB = IN / 256;                         // blocks per row
  const int STEPS = (NB + SPLIT_K - 1) / SPLIT_K;  // main-loop iterations: SPLIT_K blocks each

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  // (Without a split the same code as before it: tile = warp, split = part = 0.)
  const int tile = SPLIT_K * ROW_SPLIT == 1 ? warp : warp % TILES;
  const int split = SPLIT_K == 1 ? 0 : warp / TILES, part = ROW_SPLIT == 1 ? 0 : warp / TILES;
  const int row0 = (blockIdx.y * TILES + tile) * 16;  // this warp's output tile
  const int m_base = blockIdx.z * ROWS;                // the pass's first row
  const int w_base = part * WARP_ROWS;                 // this warp's first row of the pass
  const bool busy = row0 < OUT;

  extern __shared__ __align__(16) unsigned char shared_base[];
  __half* const stages = reinterpret_cast<__half*>(shared_base);     // [2][ROWS][ROW_HALVES]
  float* const unlift = reinterpret_cast<float*>(stages + 2 * STAGE);  // [ROWS]
  float* const row_bias = unlift + ROWS;                               // [ROWS], BIAS_FOLD
  // [TILES][2][CHUNKS][NMAT][32], ROW_SPLIT > 1 (16-byte aligned: ROWS is a multiple of 8).
  uint4* const handed = reinterpret_cast<uint4*>(row_bias + ROWS) + tile * (2 * CHUNKS * NMAT * 32);

#if TRELLIS_FUSED
  const unsigned* const mats[NMAT] = {codes, up_codes};
  const __half* mat_scales[NMAT] = {scales, up_scales};
#else
  const unsigned* const mats[NMAT] = {codes};
  const __half* mat_scales[NMAT] = {scales};
#endif
  const Lanes lane_runs(mats, row0, OUT, NB, lane);
  using Runs = typename Lanes::Runs;

  // Step b's blocks of the pass's rows (split s's block SPLIT_K b + s into part s) into stage st
  // as one cp.async group: 32 pieces of 16 bytes a row, rows past M zero-filled (nothing read);
  // a block past the last is not staged (its split's warps skip that step).
  auto stage = [&](int b, int st) {
    __half* const dst = stages + st * STAGE;
#pragma unroll
    for (int s = 0; s < SPLIT_K; ++s) {
      const int blk = SPLIT_K * b + s;
      if (SPLIT_K > 1 && blk >= NB) break;
      for (int i = threadIdx.x; i < ROWS * 32; i += 32 * WARPS) {
        const int r = i >> 5, p = 8 * (i & 31);
        const bool live = m_base + r < M;
        const __half* src = x + (size_t)(live ? m_base + r : 0) * IN + 256 * blk + p;
        trellis_cuda::cp_async16_zfill(dst + s * PART + r * ROW_HALVES + 72 * (p >> 6) + (p & 63), src, live);
      }
    }
    trellis_cuda::cp_async_commit();
  };

  // The pass's rows' factors (seen by all after the first barrier below).
  trellis_cuda::gemm_row_factors<BIAS_FOLD, 32 * WARPS>(unlift, row_bias, x_exp, x_sum, m_base, M, ROWS);

  float acc[NMAT][MT][4] = {};
  // The tile's warps meet at barrier 1 + tile (0 is __syncthreads'), ROW_SPLIT warps of them.
  auto tile_barrier = [&]() { asm volatile("bar.sync %0, %1;\n" ::"r"(1 + tile), "n"(32 * ROW_SPLIT) : "memory"); };

  // With PREFETCH a block's code words are read one block ahead, into registers (w_next), and
  // arrive while the block before is multiplied; without it they are read in two halves where
  // the block before is done with them (in the chunk loop below): fused, k 3, MT 8, NVRTC
  // 13.0.88, 174 registers with BIAS_FOLD against 182 (two 3-warp blocks an SM either way: a
  // scheduler's registers hold two warps of either).
  // Step b's block of this warp is SPLIT_K b + split (kb below); a `busy` warp with one reads
  // its code words (`has(kb)`: always, without a split).
  auto has = [&](int kb) { return SPLIT_K == 1 || kb < NB; };
  Runs w;
  stage(0, 0);
  if (busy && has(split)) lane_runs.load(split, w);
  for (int b = 0; b < STEPS; ++b) {
    const int kb = SPLIT_K * b + split, kb_next = kb + SPLIT_K;
    // The next step's activations (into the stage every warp finished with at the last
    // barrier), in flight while this step is multiplied.
    Runs w_next;
    if (b + 1 < STEPS) {
      stage(b + 1, (b + 1) & 1);
      if (PREFETCH && busy && has(kb_next)) lane_runs.load(kb_next, w_next);
    } else {
      trellis_cuda::cp_async_commit();  // an empty group: the wait below counts one behind
    }
    if (!PREFETCH && busy && b > 0 && has(kb)) lane_runs.load_words(kb, w, 0, 0, 1, 0);
    trellis_cuda::cp_async_wait<1>();
    __syncthreads();
    if (busy && has(kb)) {
      // Lane (g, q) reads row 8 t + g, quarter q: chunk c's B fragment is positions 64 q + 4 c
      // + 0..3 of the row, so one 16-byte load gives chunks c and c + 1.
      const __half* const xs = stages + (b & 1) * STAGE + split * PART + (w_base + g) * ROW_HALVES + 72 * q;
#pragma unroll
      for (int c = 0; c < 16; c += CHUNKS) {
        // Without PREFETCH the next block's words are read in two halves, each where this
        // block's are done with: chunks 0-7 read bits from 32 k up (words k..2k), chunks 8-15
        // bits below 31 k + L <= 32 (k + 1) (words 0..k).
        if (!PREFETCH && c == 8 && b + 1 < STEPS && has(kb_next)) lane_runs.load_words(kb_next, w, 1, 1, 2, 0);
        unsigned f[NMAT][CHUNKS][4];
        if (ROW_SPLIT == 1) {
#pragma unroll
          for (int a = 0; a < NMAT; ++a)
#pragma unroll
            for (int h = 0; h < CHUNKS; ++h)
              trellis_cuda::chunk_fragment<L, !BIAS_FOLD, false>(w[a][0][0], w[a][0][1], Lanes::k_of(a), c + h, 0u,
                                                                 f[a][h]);
        } else {
          // Step c's chunks from the slots of buffer (c / CHUNKS) & 1, where each warp of the tile
          // put its own (chunk c + part) a step before (the first step's just before it); then
          // this warp's chunk of the next step into the other buffer, its decode in flight with
          // this step's MMAs. Two buffers, one barrier a step: a warp writes a buffer again only
          // after the barrier of the step after its last reading, which every warp of the tile
          // reaches done reading it.
          auto decode_mine = [&](int step_chunk, uint4* slots) {
            // (One branch a part: the chunk, and so every window's bit offset, a constant.)
#pragma unroll
            for (int p = 0; p < ROW_SPLIT; ++p) {
              if (p != part) continue;
#pragma unroll
              for (int a = 0; a < NMAT; ++a) {
                unsigned d[4];
                trellis_cuda::chunk_fragment<L, !BIAS_FOLD, false>(w[a][0][0], w[a][0][1], Lanes::k_of(a),
                                                                   step_chunk + p, 0u, d);
                slots[(p * NMAT + a) * 32 + lane] = make_uint4(d[0], d[1], d[2], d[3]);
              }
            }
          };
          uint4* const slots = handed + ((c / CHUNKS) & 1) * (CHUNKS * NMAT * 32);
          if (c == 0) decode_mine(0, slots);
          tile_barrier();
#pragma unroll
          for (int h = 0; h < CHUNKS; ++h)
#pragma unroll
            for (int a = 0; a < NMAT; ++a) {
              const uint4 d = slots[(h * NMAT + a) * 32 + lane];
              f[a][h][0] = d.x, f[a][h][1] = d.y, f[a][h][2] = d.z, f[a][h][3] = d.w;
            }
          if (c + CHUNKS < 16) decode_mine(c + CHUNKS, handed + ((c / CHUNKS + 1) & 1) * (CHUNKS * NMAT * 32));
        }
#pragma unroll
        for (int t = 0; t < MT; ++t) {
#pragma unroll
          for (int h = 0; h < CHUNKS; h += 2) {
            const uint4 v = *reinterpret_cast<const uint4*>(xs + 8 * t * ROW_HALVES + 4 * (c + h));
            const unsigned b_lo[2] = {v.x, v.y}, b_hi[2] = {v.z, v.w};
#pragma unroll
            for (int a = 0; a < NMAT; ++a) {
              trellis_cuda::mma_16816(acc[a][t], f[a][h], b_lo);
              trellis_cuda::mma_16816(acc[a][t], f[a][h + 1], b_hi);
            }
          }
        }
      }
      if (PREFETCH) {
#pragma unroll
        for (int a = 0; a < NMAT; ++a)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < Lanes::RUN; ++j)
              if (j <= 2 * Lanes::k_of(a)) w[a][0][h][j] = w_next[a][0][h][j];
      }
    }
    __syncthreads();  // every warp is done with this stage before it is staged again
  }
  if (SPLIT_K > 1) {
    // The splits' sums meet in the stages, which every warp is done with (the barrier above),
    // lane-major: a warp's stores and loads are whole 128-byte lines.
    float* const sums = reinterpret_cast<float*>(stages);
    constexpr int SLOTS = NMAT * MT * 4;
    if (busy && split > 0) {
      float* const mine = sums + ((split - 1) * TILES + tile) * SLOTS * 32 + lane;
#pragma unroll
      for (int a = 0; a < NMAT; ++a)
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) mine[((a * MT + t) * 4 + e) * 32] = acc[a][t][e];
    }
    __syncthreads();
    if (split > 0) return;
    for (int s = 1; s < SPLIT_K; ++s) {
      const float* const theirs = sums + ((s - 1) * TILES + tile) * SLOTS * 32 + lane;
#pragma unroll
      for (int a = 0; a < NMAT; ++a)
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[a][t][e] += theirs[((a * MT + t) * 4 + e) * 32];
    }
  }
  if (!busy) return;

  trellis_cuda::gemm_outputs<NMAT, MT, BIAS_FOLD>(
      acc, mat_scales, row0, OUT, m_base + w_base, M, unlift + w_base, row_bias + w_base, lane, [&](int m, int o, const float (&v)[NMAT]) {
#if TRELLIS_FUSED
        const float out = trellis_cuda::silu_times(v[0], v[1]);
#else
        const float out = v[0];
#endif
#if TRELLIS_RESIDUAL
        y[(size_t)m * OUT + o] = Y(out + float(residual[(size_t)m * OUT + o]));
#else
        y[(size_t)m * OUT + o] = Y(out);
#endif
      });

// The decode-once GEMM on Hopper's warpgroup MMA: the same products and variants as
// gate_up_gemm.cu (one projection, TRELLIS_RESIDUAL, TRELLIS_FUSED gate·up·SwiGLU of widths K
// and KU), y[m, o] = scale[o] / 147.8 * sum_i x[m, i] * y(state(o, i)) for row-major codes
// [OUT, IN * K / 32] (T = 256 positions a block, 8 K words, L <= 16).
//
// Why a third kernel. gate_up_gemm.cu's warps multiply each decoded A fragment against the
// pass's 8 MT rows with MT mma.sync each, their B fragments loaded from shared memory by every
// warp: at 64 rows 256 HMMA and 76 LDS of a warp's 1,509 main-loop instructions a block, and
// the tensor pipe at mma.sync's rate. Here the four warps of a warpgroup own four consecutive
// 16-row output tiles (64 rows: wgmma's M) and, for each chunk of 16 inputs, issue one
// wgmma.m64n(8 MT)k16 per matrix with their A fragments in registers (the same decode,
// axis_one.cuh's chunk_fragment) and B read by the tensor cores straight from the staged
// activations: no B loads, no per-row-tile MMAs, and the multiply runs asynchronously while
// the next chunk is decoded.
//
// Activations: f16 [M, IN] from the pre-pass (prescale.cu with WGMMA_ORDER: each row brought
// into f16's range by its power of two 2^e, e in x_exp [M], and each block of 256 inputs stored
// in the order the fragments take them: position 64 q + 4 c + 2 h + e at index 16 c + 8 h + 2 q
// + e, so that chunk c's K-half h of a row is 16 contiguous bytes, one core matrix row). The
// outputs are multiplied by 2^-e, exactly. With BIAS_FOLD the fragments carry y + 1534 and the
// epilogue subtracts 1534 x_sum[m] (the pre-pass's row sums), as in gate_up_gemm.cu.
//
// Shared memory (dynamic; the host's wgmma_shared_bytes): two stages of the pass's 8 MT rows of
// a block of 256 inputs as core matrices (8 rows of 16 bytes, 128 contiguous bytes): piece p = 2 c
// + h of row r at byte 128 ((r / 8) 32 + p) + 16 (r % 8), so chunk c's B is two core matrices
// 128 bytes apart along K and 4096 along N (no swizzle); then the rows' factors 2^-e and biases.
//
// Work split. Thread block (y, z) of WARPS warps (4 or 8: one or two warpgroups) owns output
// rows [16 WARPS y, 16 WARPS (y + 1)) (warp w the tile 16 WARPS y + 16 w) and activation rows
// [8 MT z, 8 MT (z + 1)) (rows past M zero-filled in shared memory, not written). Every warp takes
// part in its warpgroup's wgmmas: output rows past OUT decode row OUT - 1 and are not written.
//
// Template ints: K, L, MT (1..8), WARPS (4 or 8), and in the fused variant KU. Template bool:
// BIAS_FOLD. Template type: Y (the output dtype). Inputs: x [M, IN] f16 (the order above),
// x_exp [M] f16, x_sum [M] f32 (read with BIAS_FOLD), codes [OUT, IN K / 32], scales [OUT] (f16),
// in the fused variant up_codes [OUT, IN KU / 32] and up_scales [OUT], in the residual variant
// residual [M, OUT] in Y. Output: y [M, OUT] in Y. Grid: [32 WARPS, ceil(OUT / (16 WARPS)),
// ceil(M / (8 MT))] threads, blocks of 32 WARPS.
  const int M = x_shape[0];
  const int IN = x_shape[1];
  const int OUT = scales_shape[0];
#if TRELLIS_FUSED
  constexpr int NMAT = 2;  // gate, up
  constexpr int K_UP = KU;
#else
  constexpr int NMAT = 1;
  constexpr int K_UP = K;
#endif
  using Lanes = trellis_cuda::LaneRuns<NMAT, 1, K, K_UP>;
  constexpr int ROWS = 8 * MT;               // activation rows of a pass
  constexpr int STAGE_BYTES = ROWS * 512;    // a block of 256 inputs of the pass's rows
  constexpr unsigned K_STRIDE = 128;         // chunk c's two K-halves, one core matrix apart
  constexpr unsigned N_STRIDE = 32 * 128;    // the next 8 rows: a row group's 32 pieces
  static_assert(L <= 16 && L >= K && L >= K_UP, "L-bit windows");
  static_assert(MT >= 1 && MT <= 8, "1 to 8 tiles of 8 rows a pass");
  static_assert(WARPS == 4 || WARPS == 8, "whole warpgroups");
  const int NB = IN / 256;  // blocks per row

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = (blockIdx.y * WARPS + warp) * 16;  // this warp's output tile
  const int m_base = blockIdx.z * ROWS;

  extern __shared__ __align__(128) unsigned char shared_base[];
  float* const unlift = reinterpret_cast<float*>(shared_base + 2 * STAGE_BYTES);  // [ROWS]
  float* const row_bias = unlift + ROWS;                                          // [ROWS], BIAS_FOLD
  const unsigned stages_addr = static_cast<unsigned>(__cvta_generic_to_shared(shared_base));

#if TRELLIS_FUSED
  const unsigned* const mats[NMAT] = {codes, up_codes};
  const __half* mat_scales[NMAT] = {scales, up_scales};
#else
  const unsigned* const mats[NMAT] = {codes};
  const __half* mat_scales[NMAT] = {scales};
#endif
  const Lanes lane_runs(mats, row0, OUT, NB, lane);
  using Runs = typename Lanes::Runs;

  // Block b of the pass's rows into stage s as one cp.async group of 16-byte pieces, rows past
  // M zero-filled (nothing read). Piece i: bit 0 the piece's low bit, bits 1-3 the row within its
  // group of 8, the rest the piece's other bits and the row group: 8 lanes fill one 128-byte core
  // matrix, and each row is read 64 contiguous bytes at a time.
  auto stage = [&](int b, int s) {
    for (int i = threadIdx.x; i < ROWS * 32; i += 32 * WARPS) {
      const int p = (i & 1) | (((i >> 4) & 15) << 1);
      const int r = ((i >> 1) & 7) | ((i >> 8) << 3);
      const bool live = m_base + r < M;
      const __half* src = x + (size_t)(live ? m_base + r : 0) * IN + 256 * b + 8 * p;
      trellis_cuda::cp_async16_zfill(shared_base + s * STAGE_BYTES + 128 * ((r >> 3) * 32 + p) + 16 * (r & 7), src, live);
    }
    trellis_cuda::cp_async_commit();
  };

  // The pass's rows' factors (seen by all after the first barrier below).
  trellis_cuda::gemm_row_factors<BIAS_FOLD, 32 * WARPS>(unlift, row_bias, x_exp, x_sum, m_base, M, ROWS);

  float acc[NMAT][MT][4] = {};

  // The code words come in two halves, as in gate_up_gemm.cu without PREFETCH: words k+1..2k of
  // the next block once chunk 7 is decoded, words 0..k at the next block's start.
  Runs w;
  stage(0, 0);
  lane_runs.load(0, w);
  for (int b = 0; b < NB; ++b) {
    if (b + 1 < NB) {
      stage(b + 1, (b + 1) & 1);
    } else {
      trellis_cuda::cp_async_commit();  // an empty group: the wait below counts one behind
    }
    if (b > 0) lane_runs.load_words(b, w, 0, 0, 1, 0);
    trellis_cuda::cp_async_wait<1>();
    trellis_cuda::fence_proxy_async_shared();  // this block's copies, for the tensor cores
    __syncthreads();
    const unsigned long long desc = trellis_cuda::no_swizzle_descriptor(stages_addr + (b & 1) * STAGE_BYTES, K_STRIDE, N_STRIDE);
    // Two sets of A fragments: chunk c's are read by its wgmmas until the wait after chunk c + 1's
    // are issued, while chunk c + 1 is decoded into the other set. (Two chunks or four a commit
    // group, or two groups in flight, measured the same in the MLP chain: docs/cuda-mlp.md.)
    unsigned f[2][NMAT][4];
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      if (c == 8 && b + 1 < NB) lane_runs.load_words(b + 1, w, 1, 1, 2, 0);
#pragma unroll
      for (int a = 0; a < NMAT; ++a)
        trellis_cuda::chunk_fragment<L, !BIAS_FOLD, false>(w[a][0][0], w[a][0][1], Lanes::k_of(a), c, 0u, f[c & 1][a]);
      trellis_cuda::wgmma_fence();
#pragma unroll
      for (int a = 0; a < NMAT; ++a)
        trellis_cuda::wgmma_rs<MT>(acc[a], f[c & 1][a], desc + (2 * c * K_STRIDE >> 4));
      trellis_cuda::wgmma_commit();
      trellis_cuda::wgmma_wait<1>();
    }
    trellis_cuda::wgmma_wait<0>();  // this stage's reads done before it is staged again
    __syncthreads();
  }

  trellis_cuda::gemm_outputs<NMAT, MT, BIAS_FOLD>(
      acc, mat_scales, row0, OUT, m_base, M, unlift, row_bias, lane, [&](int m, int o, const float (&v)[NMAT]) {
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

// The warp-specialized decode-once GEMM on Hopper's warpgroup MMA: the same products and variants
// as gate_up_gemm.cu (one projection, TRELLIS_RESIDUAL, TRELLIS_FUSED gate·up·SwiGLU of widths K
// and KU), y[m, o] = scale[o] / 147.8 * sum_i x[m, i] * y(state(o, i)) for row-major codes
// [OUT, IN * K / 32] (T = 256 positions a block, 8 K words, L <= 16), for up to 128 rows a pass.
//
// Why a fourth kernel. gate_up_gemm.cu's warps decode and multiply in one chain each, and at 64
// rows run 1.5 warps a scheduler (174 registers of accumulators and code words), latency-bound;
// passes of more rows need more accumulators still. gate_up_wgmma.cu's warpgroups decode into
// their own A registers, so each wgmma waits for the slowest of four warps' code words. Here the
// two jobs are different warps: producer warps decode code values into shared memory (and copy
// the activations there, two steps ahead), a consumer warpgroup only issues wgmmas with both
// operands read from shared memory by the tensor cores, and a ring of STAGES stages between them
// lets the decode of one step run while the tensor cores multiply the ones before. Each weight
// is decoded once per pass of up to 128 rows.
//
// Activations: f16 [M, IN] from the pre-pass (prescale.cu's hand-over in the natural order: each
// row brought into f16's range by its power of two 2^e, e in x_exp [M]); the outputs are
// multiplied by 2^-e, exactly. With BIAS_FOLD the code values carry y + 1534 and the epilogue
// subtracts 1534 x_sum[m] (the pre-pass's row sums), as in gate_up_gemm.cu.
//
// A step is 64 inputs of one block of 256: positions 64 q + 16 sub + i (q 0..3, i 0..15) of
// block b, sub 0..3. Its K order: slice q (one wgmma's k16), half h (one core matrix's 8 K) at
// i = 8 h + j. Both operands are K-major core matrices (8 rows of 16 bytes, 128 contiguous bytes)
// without swizzle, [q][row group][h]: K-halves 128 bytes apart, row groups 256. So a row's 8
// values of a half are 16 contiguous bytes in the activations (one cp.async) and 8 consecutive
// positions of one lane's run of code words (one STS.128).
//
// Shared memory (dynamic; the host's ws_shared_bytes): STAGES stages, each NMAT matrices' 64
// output rows of the step (8 KB each), then the pass's 8 MT rows of it (128 bytes a row); then
// the rows' factors 2^-e and biases (4 bytes each), then one word for the fold's flag.
//
// Warps. Warps 0-3 are the consumer warpgroup; warps 4 .. 4 + 4 NMAT - 1 the producers, warp
// 4 + 4 a + t decoding rows [16 t, 16 t + 16) of matrix a's 64-row tile (lane l: rows g and
// g + 8, g = l % 8, positions 64 (l / 8) + 16 sub .. + 15 of its run: lanes 0-7 fill one core
// matrix, conflict-free) and copying its share of the step's activations. Named barriers: FULL
// (1 + s) and EMPTY (1 + STAGES + s) of stage s, all the block's threads (producers arrive on
// FULL and wait on EMPTY, the consumer the other way round); 15, the consumer warpgroup's own.
//
// Work split: stream-K. A pass's work is its tiles of 64 output rows times the NB blocks of
// inputs, tile-major; thread block c of gridDim.y takes units [c U / G, (c + 1) U / G) (U units, G
// blocks), so that every SM gets the same number of weights to decode whatever the tile count.
// A tile whose units one block holds entirely is written directly. A tile split between blocks
// is folded: each part stores its accumulators in `partials` (slot 0 of its block: the part at
// the start of the block's range; slot 1: the one at its end), counts itself on the tile's
// counter, and the last to arrive adds the parts in block order (the same f32 sums whichever
// arrives last) and writes the tile. The counters ([passes][tiles] u32) come zeroed from the
// pre-pass.
//
// Output rows past OUT read row OUT - 1 and are not written; activation rows past M are
// zero-filled in shared memory and not written.
//
// Template ints: K, L, MT (1..16: wgmma's N is 8 MT, as two wgmmas above 8), STAGES (4..7),
// and in the fused variant KU (WARPS, which the launch passes to every axis-1 kernel, is
// 4 + 4 NMAT here and not read). Template bool: BIAS_FOLD. Template type: Y (the output dtype).
// Inputs: x [M, IN] f16, x_exp [M] f16, x_sum [M] f32 (read with BIAS_FOLD), counters
// [passes tiles] u32, codes [OUT, IN K / 32], scales [OUT] (f16), in the fused variant up_codes
// [OUT, IN KU / 32] and up_scales [OUT], in the residual variant residual [M, OUT] in Y.
// Outputs: y [M, OUT] in Y, partials [passes, G, 2, 128 NMAT MT 4] f32 (scratch). Grid:
// [32 (4 + 4 NMAT), G, ceil(M / (8 MT))] threads, blocks of 32 (4 + 4 NMAT).
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
  constexpr int ROWS = 8 * MT;               // activation rows of a pass
  constexpr int PRODUCERS = 4 * NMAT;        // decoding warps: one a matrix's 16-row tile
  constexpr int THREADS = 32 * (4 + PRODUCERS);
  constexpr int A_BYTES = 64 * 64 * 2;       // one matrix's 64 rows of a step's 64 inputs
  constexpr int STAGE_BYTES = NMAT * A_BYTES + ROWS * 64 * 2;
  constexpr int NREG = NMAT * MT * 4;        // a consumer thread's accumulators
  constexpr int N_LO = MT < 8 ? MT : 8;      // 8-row tiles of the first wgmma, the rest the second's
  constexpr int N_HI = MT > 8 ? MT - 8 : 1;  // (1 where there is no second: its code is cut)
  constexpr int CONSUMER_BARRIER = 15;
  static_assert(L <= 16 && L >= K && L >= K_UP, "L-bit windows");
  static_assert(MT >= 1 && MT <= 16, "1 to 16 tiles of 8 rows a pass");
  constexpr int COPY_AHEAD = 2;              // steps the activation copies run ahead of the decode
  // A producer waits for stage j + COPY_AHEAD as it starts step j; the consumer frees step i once
  // it has issued step i + 1: so STAGES - COPY_AHEAD >= 2, or each waits for the other.
  static_assert(STAGES >= COPY_AHEAD + 2 && 2 * STAGES < CONSUMER_BARRIER, "two named barriers a stage");
  const int NB = IN / 256;  // blocks per row
  const int tiles = (OUT + 63) / 64;
  const long long units = (long long)tiles * NB;
  const int G = gridDim.y, cta = blockIdx.y, pass = blockIdx.z;
  const int m_base = pass * ROWS;
  auto range_start = [&](int c) { return (long long)c * units / G; };
  // The block whose range holds unit u.
  auto block_of = [&](long long u) {
    int c = (int)(u * G / units);
    while (c + 1 < G && range_start(c + 1) <= u) ++c;
    while (c > 0 && range_start(c) > u) --c;
    return c;
  };
  const long long u_begin = range_start(cta), u_end = range_start(cta + 1);
  const int steps_total = (int)(u_end - u_begin) * 4;

  extern __shared__ __align__(128) unsigned char shared_base[];
  float* const unlift = reinterpret_cast<float*>(shared_base + STAGES * STAGE_BYTES);  // [ROWS]
  float* const row_bias = unlift + ROWS;                                                // [ROWS]
  unsigned* const last_flag = reinterpret_cast<unsigned*>(row_bias + ROWS);
  const unsigned stages_addr = static_cast<unsigned>(__cvta_generic_to_shared(shared_base));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  if (warp >= 4) {
    // A producer: matrix a's rows [16 t, 16 t + 16) of each tile, and a share of the activations.
    const int a = (warp - 4) >> 2, t = (warp - 4) & 3, ptid = threadIdx.x - 128;
    const int g = lane & 7, q = lane >> 3;
    // This thread's pieces of each step's activations, the same every step but for the inputs'
    // offset: piece i is row 8 rg + (i >> 1) % 8 of the pass, half i % 2, slice (i >> 4) / MT and
    // row group rg = (i >> 4) % MT (consecutive threads fill a core matrix).
    constexpr int PIECES = (ROWS * 8 + 32 * PRODUCERS - 1) / (32 * PRODUCERS);
    const __half* piece_src[PIECES];
    unsigned piece_dst[PIECES];
    bool piece_live[PIECES];
#pragma unroll
    for (int k = 0; k < PIECES; ++k) {
      const int i = ptid + k * 32 * PRODUCERS;
      const int h = i & 1, r8 = (i >> 1) & 7, rg = (i >> 4) % MT, qb = (i >> 4) / MT;
      const int r = 8 * rg + r8;
      piece_live[k] = i < ROWS * 8 && m_base + r < M;
      piece_src[k] = x + (size_t)(piece_live[k] ? m_base + r : 0) * IN + 64 * qb + 8 * h;
      piece_dst[k] = NMAT * A_BYTES + qb * (MT * 256) + rg * 256 + h * 128 + r8 * 16;
    }
    // The next step's activations into its stage, one cp.async group (rows past M zero-filled,
    // nothing read): issued COPY_AHEAD steps before the step is decoded, so that their latency is
    // spent on the decode of the steps between. Steps run over the block's units in order: step j
    // is quarter j % 4 of block (u_begin + j / 4) % NB of whichever tile, counted here without a
    // division.
    int copy_j = 0, copy_b = (int)(u_begin % NB), copy_sub = 0;
    auto copy_next = [&]() {
      if (copy_j < steps_total) {
        if (copy_j >= STAGES) trellis_cuda::named_sync(1 + STAGES + copy_j % STAGES, THREADS);  // EMPTY
        unsigned char* const stage = shared_base + (copy_j % STAGES) * STAGE_BYTES;
        const int offset = 256 * copy_b + 16 * copy_sub;
#pragma unroll
        for (int k = 0; k < PIECES; ++k)
          if (PIECES * 32 * PRODUCERS == ROWS * 8 || ptid + k * 32 * PRODUCERS < ROWS * 8)
            trellis_cuda::cp_async16_zfill(stage + piece_dst[k], piece_src[k] + offset, piece_live[k]);
      }
      trellis_cuda::cp_async_commit();  // empty past the last step: the waits count groups
      ++copy_j;
      if (++copy_sub == 4) copy_sub = 0, copy_b = copy_b + 1 == NB ? 0 : copy_b + 1;
    };
    auto produce = [&](auto width, const unsigned* mat) {
      constexpr int KA = decltype(width)::value;
      using Lanes = trellis_cuda::LaneRuns<1, 1, KA, KA>;
      using Runs = typename Lanes::Runs;
      const unsigned* const mats[1] = {mat};
      int step = 0;
      for (int j = 0; j < COPY_AHEAD; ++j) copy_next();
      for (long long u = u_begin; u < u_end;) {
        const int tile = (int)(u / NB), kb0 = (int)(u % NB);
        const int kb1 = (int)min((long long)NB, kb0 + (u_end - u));
        // LaneRuns' lane 4 g + q: rows g and g + 8, positions [64 q, 64 q + 64).
        const Lanes lanes(mats, 64 * tile + 16 * t, OUT, NB, 4 * g + q);
        Runs w, next;
        lanes.load(kb0, w);
        for (int b = kb0; b < kb1; ++b) {
          if (b + 1 < kb1) lanes.load(b + 1, next);  // in flight across this block's steps
#pragma unroll
          for (int sub = 0; sub < 4; ++sub, ++step) {
            // The stage is free: its EMPTY barrier was met when its copies were issued.
            copy_next();  // step + COPY_AHEAD's
            unsigned char* const stage = shared_base + (step % STAGES) * STAGE_BYTES;
            // The step's code values: rows g (run 0) and g + 8 (run 1), halves h of slice q.
#pragma unroll
            for (int half = 0; half < 2; ++half)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const int p0 = 16 * sub + 8 * h;  // the half's first position in the run
                unsigned v[4];
#pragma unroll
                for (int r = 0; r < 4; ++r)
                  v[r] = trellis_cuda::code_pair_dp4a<!BIAS_FOLD>(
                      trellis_cuda::window<L>(w[0][0][half], (63 - p0 - 2 * r) * KA),
                      trellis_cuda::window<L>(w[0][0][half], (62 - p0 - 2 * r) * KA));
                *reinterpret_cast<uint4*>(stage + a * A_BYTES + q * 2048 + (2 * t + half) * 256 + h * 128 + g * 16) =
                    make_uint4(v[0], v[1], v[2], v[3]);
              }
            trellis_cuda::cp_async_wait<COPY_AHEAD>();  // this step's copies (the later ones in flight)
            trellis_cuda::fence_proxy_async_shared();    // the step's writes, for the tensor cores
            trellis_cuda::named_arrive(1 + step % STAGES, THREADS);  // FULL
          }
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
#pragma unroll
            for (int i = 0; i < Lanes::RUN; ++i) w[0][0][hh][i] = next[0][0][hh][i];
        }
        u += kb1 - kb0;
      }
    };
    if (a == 0) produce(trellis_cuda::IntConstant<K>{}, codes);
#if TRELLIS_FUSED
    else produce(trellis_cuda::IntConstant<KU>{}, up_codes);
#endif
    return;
  }

  // The consumer warpgroup.
  const int tid = threadIdx.x;
#if TRELLIS_FUSED
  const __half* mat_scales[NMAT] = {scales, up_scales};
#else
  const __half* mat_scales[NMAT] = {scales};
#endif
  trellis_cuda::gemm_row_factors<BIAS_FOLD, 128>(unlift, row_bias, x_exp, x_sum, m_base, M, ROWS);
  trellis_cuda::named_sync(CONSUMER_BARRIER, 128);

  auto write_tile = [&](const float (&acc)[NMAT][MT][4], int row0) {
    trellis_cuda::gemm_outputs<NMAT, MT, BIAS_FOLD>(
        acc, mat_scales, row0, OUT, m_base, M, unlift, row_bias, lane, [&](int m, int o, const float (&v)[NMAT]) {
#if TRELLIS_FUSED
          const float out = v[0] / (1.0f + __expf(-v[0])) * v[1];
#else
          const float out = v[0];
#endif
#if TRELLIS_RESIDUAL
          y[(size_t)m * OUT + o] = Y(out + float(residual[(size_t)m * OUT + o]));
#else
          y[(size_t)m * OUT + o] = Y(out);
#endif
        });
  };
  // Stage i is free again once its wgmmas are done: the producers wait for it STAGES steps on.
  int step = 0, released = 0;
  auto release_before = [&](int end) {
    for (; released < end; ++released)
      if (released + STAGES < steps_total) trellis_cuda::named_arrive(1 + STAGES + released % STAGES, THREADS);
  };
  for (long long u = u_begin; u < u_end;) {
    const int tile = (int)(u / NB), kb0 = (int)(u % NB);
    const int kb1 = (int)min((long long)NB, kb0 + (u_end - u));
    float acc[NMAT][MT][4];
#pragma unroll
    for (int a = 0; a < NMAT; ++a)
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[a][i][e] = 0.0f;
    for (int j = 0; j < 4 * (kb1 - kb0); ++j, ++step) {
      const int s = step % STAGES;
      trellis_cuda::named_sync(1 + s, THREADS);  // FULL
      trellis_cuda::wgmma_fence();
      const unsigned stage = stages_addr + s * STAGE_BYTES;
#pragma unroll
      for (int qb = 0; qb < 4; ++qb) {
        const unsigned long long desc_b =
            trellis_cuda::no_swizzle_descriptor(stage + NMAT * A_BYTES + qb * (MT * 256), 128, 256);
#pragma unroll
        for (int a = 0; a < NMAT; ++a) {
          const unsigned long long desc_a = trellis_cuda::no_swizzle_descriptor(stage + a * A_BYTES + qb * 2048, 128, 256);
          trellis_cuda::wgmma_ss<N_LO>(reinterpret_cast<float(&)[N_LO][4]>(acc[a][0]), desc_a, desc_b);
          if constexpr (MT > 8)
            trellis_cuda::wgmma_ss<N_HI>(reinterpret_cast<float(&)[N_HI][4]>(acc[a][N_LO % MT]), desc_a,
                                         desc_b + ((8 * 256) >> 4));
        }
      }
      trellis_cuda::wgmma_commit();
      trellis_cuda::wgmma_wait<1>();
      release_before(step);
    }
    trellis_cuda::wgmma_wait<0>();
    release_before(step);

    const int row0 = 64 * tile + 16 * warp;
    if (kb0 == 0 && kb1 == NB) {
      write_tile(acc, row0);
    } else {
      // Fold: this part's accumulators into its slot, then the last part of the tile adds all.
      const int slot = u == u_begin ? 0 : 1;
      float* const mine = partials + (((size_t)pass * G + cta) * 2 + slot) * (NREG * 128);
      const float* flat = &acc[0][0][0];
#pragma unroll
      for (int r = 0; r < NREG / 4; ++r)
        reinterpret_cast<float4*>(mine)[r * 128 + tid] = make_float4(flat[4 * r], flat[4 * r + 1], flat[4 * r + 2], flat[4 * r + 3]);
      __threadfence();
      trellis_cuda::named_sync(CONSUMER_BARRIER, 128);
      unsigned* const counter = const_cast<unsigned*>(counters) + (size_t)pass * tiles + tile;
      if (tid == 0) *last_flag = atomicAdd(counter, 1u);
      trellis_cuda::named_sync(CONSUMER_BARRIER, 128);
      // The tile's parts: the blocks from the one holding its first unit to the one holding its
      // last, less those with no units (a grid of more blocks than units).
      const long long t0 = (long long)tile * NB;
      const int first = block_of(t0), last = block_of(t0 + NB - 1);
      unsigned parts = 0;
      for (int c = first; c <= last; ++c) parts += range_start(c + 1) > range_start(c);
      if (*last_flag == parts - 1) {
        __threadfence();
        float* sum = &acc[0][0][0];
        for (int c = first; c <= last; ++c) {
          const long long start = range_start(c);
          if (range_start(c + 1) == start) continue;
          const int their_slot = (start >= t0 ? start : t0) == start ? 0 : 1;
          const float4* part = reinterpret_cast<const float4*>(partials + (((size_t)pass * G + c) * 2 + their_slot) * (NREG * 128));
#pragma unroll
          for (int r = 0; r < NREG / 4; ++r) {
            const float4 v = __ldcg(part + r * 128 + tid);
            if (c == first) {
              sum[4 * r] = v.x, sum[4 * r + 1] = v.y, sum[4 * r + 2] = v.z, sum[4 * r + 3] = v.w;
            } else {
              sum[4 * r] += v.x, sum[4 * r + 1] += v.y, sum[4 * r + 2] += v.z, sum[4 * r + 3] += v.w;
            }
          }
        }
        write_tile(acc, row0);
      }
      trellis_cuda::named_sync(CONSUMER_BARRIER, 128);  // the flag is read before the next fold writes it
    }
    u += kb1 - kb0;
  }

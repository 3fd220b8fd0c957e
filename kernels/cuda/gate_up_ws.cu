// The warp-specialized decode-once GEMM on Hopper's warpgroup MMA: the same products and variants
// as gate_up_gemm.cu (one projection, TRELLIS_RESIDUAL, TRELLIS_FUSED gate·up·SwiGLU of widths K
// and KU), y[m, o] = scale[o] / 147.8 * sum_i x[m, i] * y(state(o, i)) for row-major codes
// [OUT, IN * K / 32] (T = 256 positions a block, 8 K words, L <= 16), for up to 128 rows a pass.
//
// Why a fourth kernel. gate_up_gemm.cu's warps decode and multiply in one chain each, and at 64
// rows run 1.5 warps a scheduler (174 registers of accumulators and code words), latency-bound;
// passes of more rows need more accumulators still. gate_up_wgmma.cu's warpgroups decode into
// their own A registers, so each wgmma waits for the slowest of four warps' code words. Here the
// two jobs are different warps: producer warps decode code values into shared memory, a consumer
// warpgroup only issues wgmmas with both operands read from shared memory by the tensor cores
// (and has the copy engine bring each step's activations), and a ring of STAGES stages between
// them lets the decode of one step run while the tensor cores multiply the ones before. Each
// weight is decoded once per pass of up to 128 rows.
//
// Activations: f16 from the pre-pass (prescale.cu's hand-over in the image order: each row
// brought into f16's range by its power of two 2^e, e in x_exp [M]; each step's 8 MT rows of 64
// inputs stored as the stage holds them, 16 MT contiguous KB, so that one bulk copy brings a
// step; rows past M of the last pass are zeros, multiplied and not written). The outputs are
// multiplied by 2^-e, exactly. With BIAS_FOLD the code values carry y + 1534 and the epilogue
// subtracts 1534 x_sum[m] (the pre-pass's row sums), as in gate_up_gemm.cu.
//
// A step is 64 inputs of one block of 256: positions 64 q + 16 sub + i (q 0..3, i 0..15) of
// block b, sub 0..3. Its K order: slice q (one wgmma's k16), half h (one core matrix's 8 K) at
// i = 8 h + j. Both operands are K-major core matrices (8 rows of 16 bytes, 128 contiguous bytes)
// without swizzle, [q][row group][h]: K-halves 128 bytes apart, row groups 256. So a row's 8
// values of a half are 8 consecutive positions of one lane's run of code words (one STS.128).
//
// Why the copy engine brings the activations. When the producers copied them with cp.async,
// each producer waited every step for its copies' shared-memory writes before its proxy fence
// and for its copy instructions to release their address registers, and a warp's decode stalled
// behind them (Nsight Compute: docs/cuda-mlp.md). A bulk copy is issued by one thread, holds no
// registers, writes through the async proxy that the tensor cores read (no proxy fence) and
// completes on the stage's mbarrier, on which the consumer waits.
//
// The consumer's step is short: the copies free the producers, so the consumer's own
// instructions bound a step. Its descriptors are stage 0's plus constant offsets (uniform
// registers, no per-step encoding), 128 rows are one m64n128k16 wgmma a slice and matrix, and in
// the fused variant the producers hand 16 registers each to the consumer (setmaxnreg), whose 128
// accumulators otherwise spill its loop counters.
//
// Shared memory (dynamic; the host's ws_shared_bytes): STAGES stages, each NMAT matrices' 64
// output rows of the step (8 KB each), then the pass's 8 MT rows of it (128 bytes a row); then
// the rows' factors 2^-e and biases (4 bytes each), the stages' mbarriers (8 bytes each), then
// one word for the fold's flag.
//
// Warps. Warps 0-3 are the consumer warpgroup; warps 4 .. 4 + 4 NMAT - 1 the producers, warp
// 4 + 4 a + t decoding rows [16 t, 16 t + 16) of matrix a's 64-row tile (lane l: rows g and
// g + 8, g = l % 8, positions 64 (l / 8) + 16 sub .. + 15 of its run: lanes 0-7 fill one core
// matrix, conflict-free). Named barriers: FULL (1 + s) and EMPTY (1 + STAGES + s) of stage s,
// all the block's threads (producers arrive on FULL and wait on EMPTY, the consumer the other way
// round); 15, the consumer warpgroup's own. The activations' mbarrier of stage s: the consumer's
// thread 0 arrives with the copy's byte count, the copy engine completes it.
//
// Work split: stream-K (stream_k.cuh). A pass's work is its tiles of 64 output rows times the NB
// blocks of inputs, tile-major, shared evenly by the gridDim.y thread blocks; a tile split between
// blocks is folded by the last of its parts to finish. The counters ([passes][tiles] u32) come
// zeroed from the pre-pass.
//
// Output rows past OUT read row OUT - 1 and are not written; activation rows past M are the
// pre-pass's zeros and not written.
//
// Template ints: K, L, MT (1..16: wgmma's N is 8 MT, as two wgmmas from 9 to 15), STAGES
// (4..7), and in the fused variant KU (WARPS, which the launch passes to every axis-1 kernel, is
// 4 + 4 NMAT here and not read). Template bool: BIAS_FOLD. Template type: Y (the output dtype).
// Inputs: x [passes 8 MT, IN] f16 (the image order), x_exp [M] f16, x_sum [M] f32 (read with
// BIAS_FOLD), counters [passes tiles] u32, codes [OUT, IN K / 32], scales [OUT] (f16), in the
// fused variant up_codes [OUT, IN KU / 32] and up_scales [OUT], in the residual variant residual
// [M, OUT] in Y.
// Outputs: y [M, OUT] in Y, partials [passes, G, 2, 128 NMAT MT 4] f32 (scratch). Grid:
// [32 (4 + 4 NMAT), G, ceil(M / (8 MT))] threads, blocks of 32 (4 + 4 NMAT).
  const int M = x_exp_shape[0];  // x holds whole passes
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
  // 8-row tiles of the first wgmma (all of them up to 8 and at 16), the rest the second's (1 where
  // there is no second: its code is cut).
  constexpr int N_LO = MT <= 8 || MT == 16 ? MT : 8;
  constexpr int N_HI = MT > N_LO ? MT - N_LO : 1;
  constexpr int CONSUMER_BARRIER = 15;
  // Registers a thread after the fused variant's hand-over (setmaxnreg): the launch bounds give
  // each of its 12 warps 168 (ptxas allocates a kernel with setmaxnreg its bound's maximum: 168
  // at every MT, NVRTC 13.0.88), the eight producers keep 152 for their decode and the consumer's
  // four take what they hand back, 200 (the single projection's 8 warps have all they need at
  // launch).
  constexpr int LAUNCH_REGISTERS = 168, PRODUCER_REGISTERS = 152;
  constexpr int CONSUMER_REGISTERS = LAUNCH_REGISTERS + (LAUNCH_REGISTERS - PRODUCER_REGISTERS) * PRODUCERS / 4;
  static_assert(L <= 16 && L >= K && L >= K_UP, "L-bit windows");
  static_assert(MT >= 1 && MT <= 16, "1 to 16 tiles of 8 rows a pass");
  constexpr int X_BYTES = ROWS * 64 * 2;      // a step's activations: one bulk copy
  // The consumer frees step i once it has issued step i + 1, and copies step i + STAGES - 1's
  // activations into step i - 1's stage then.
  static_assert(STAGES >= 3 && 2 * STAGES < CONSUMER_BARRIER, "two named barriers a stage");
  const int NB = IN / 256;  // blocks per row
  const int tiles = (OUT + 63) / 64;
  const int cta = blockIdx.y, pass = blockIdx.z;
  const trellis_cuda::StreamK sk{(long long)tiles * NB, (int)gridDim.y};
  const int m_base = pass * ROWS;
  const long long u_begin = sk.start(cta), u_end = sk.start(cta + 1);
  const int steps_total = (int)(u_end - u_begin) * 4;

  extern __shared__ __align__(128) unsigned char shared_base[];
  float* const unlift = reinterpret_cast<float*>(shared_base + STAGES * STAGE_BYTES);  // [ROWS]
  float* const row_bias = unlift + ROWS;                                                // [ROWS]
  // The stages' mbarriers, on which each step's activations land (8-byte aligned: ROWS is even).
  const unsigned x_full_addr = static_cast<unsigned>(__cvta_generic_to_shared(row_bias + ROWS));
  unsigned* const last_flag = reinterpret_cast<unsigned*>(row_bias + ROWS + 2 * STAGES);
  const unsigned stages_addr = static_cast<unsigned>(__cvta_generic_to_shared(shared_base));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  if (warp >= 4) {
    // A producer: matrix a's rows [16 t, 16 t + 16) of each tile. It hands registers it does not
    // need to the consumer (which holds 128 accumulators at 128 rows).
    if constexpr (NMAT == 2) trellis_cuda::set_max_registers<PRODUCER_REGISTERS, false>();
    const int a = (warp - 4) >> 2, t = (warp - 4) & 3;
    const int g = lane & 7, q = lane >> 3;
    auto produce = [&](auto width, const unsigned* mat) {
      constexpr int KA = decltype(width)::value;
      using Lanes = trellis_cuda::LaneRuns<1, 1, KA, KA>;
      using Runs = typename Lanes::Runs;
      const unsigned* const mats[1] = {mat};
      int step = 0;
      bool stored = false;  // step - 1's code values are stored and not yet handed over
      // Step j's code values, for the tensor cores: the proxy fence, then FULL. A step is handed
      // over once the next one of its tile is decoded, so that the fence finds its stores done
      // instead of waiting for them (it did: 15 % of the producers' samples at 128 rows,
      // docs/cuda-mlp.md); a tile's last step at once, for the consumer's epilogue.
      auto hand_over = [&](int j) {
        trellis_cuda::fence_proxy_async_shared();
        trellis_cuda::named_arrive(1 + j % STAGES, THREADS);  // FULL
        stored = false;
      };
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
            // The step's code values: rows g (run 0) and g + 8 (run 1), halves h of slice q.
            uint4 v[2][2];
#pragma unroll
            for (int half = 0; half < 2; ++half)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const int p0 = 16 * sub + 8 * h;  // the half's first position in the run
                unsigned pair[4];
#pragma unroll
                for (int r = 0; r < 4; ++r)
                  pair[r] = trellis_cuda::code_pair_dp4a<!BIAS_FOLD>(
                      trellis_cuda::window<L>(w[0][0][half], (63 - p0 - 2 * r) * KA),
                      trellis_cuda::window<L>(w[0][0][half], (62 - p0 - 2 * r) * KA));
                v[half][h] = make_uint4(pair[0], pair[1], pair[2], pair[3]);
              }
            // The previous step's stores are done by now: its proxy fence does not wait for them.
            if (stored) hand_over(step - 1);
            // The stage is free once the consumer's wgmmas of step - STAGES are done.
            if (step >= STAGES) trellis_cuda::named_sync(1 + STAGES + step % STAGES, THREADS);  // EMPTY
            unsigned char* const stage = shared_base + (step % STAGES) * STAGE_BYTES;
#pragma unroll
            for (int half = 0; half < 2; ++half)
#pragma unroll
              for (int h = 0; h < 2; ++h)
                *reinterpret_cast<uint4*>(stage + a * A_BYTES + q * 2048 + (2 * t + half) * 256 + h * 128 + g * 16) = v[half][h];
            stored = true;
          }
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
#pragma unroll
            for (int i = 0; i < Lanes::RUN; ++i) w[0][0][hh][i] = next[0][0][hh][i];
        }
        hand_over(step - 1);
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
  if constexpr (NMAT == 2) trellis_cuda::set_max_registers<CONSUMER_REGISTERS, true>();
  const int tid = threadIdx.x;
#if TRELLIS_FUSED
  const __half* mat_scales[NMAT] = {scales, up_scales};
#else
  const __half* mat_scales[NMAT] = {scales};
#endif
  trellis_cuda::gemm_row_factors<BIAS_FOLD, 128>(unlift, row_bias, x_exp, x_sum, m_base, M, ROWS);
  // The activations of each step: one bulk copy of the pre-pass's image of the step (its 8 MT
  // rows of 64 inputs as the stage holds them) into its stage once it is free.
  const trellis_cuda::ActivationRing<STAGES, STAGE_BYTES, NMAT * A_BYTES, X_BYTES> activations{
      x, stages_addr, x_full_addr, NB, pass, steps_total, tid};
  activations.init();
  trellis_cuda::named_sync(CONSUMER_BARRIER, 128);
  activations.prologue((int)(u_begin % NB));
  // The operands' descriptors at stage 0; a step adds its stage's offset and its slice's (the
  // address field is the descriptor's low 14 bits, and shared addresses stay below 2^18 bytes).
  const unsigned long long desc_a0 = trellis_cuda::no_swizzle_descriptor(stages_addr, 128, 256);
  const unsigned long long desc_b0 = trellis_cuda::no_swizzle_descriptor(stages_addr + NMAT * A_BYTES, 128, 256);

  auto write_tile = [&](float (&acc)[NMAT][MT][4], int row0) {
    trellis_cuda::gemm_outputs_batched<NMAT, MT, BIAS_FOLD>(
        acc, mat_scales, row0, OUT, m_base, M, unlift, row_bias, lane,
        [&](const float (&v)[NMAT]) {
#if TRELLIS_FUSED
          return trellis_cuda::silu_times(v[0], v[1]);
#else
          return v[0];
#endif
        },
        [&](int m, int o, float out) {
#if TRELLIS_RESIDUAL
          y[(size_t)m * OUT + o] = Y(out + float(residual[(size_t)m * OUT + o]));
#else
          y[(size_t)m * OUT + o] = Y(out);
#endif
        });
  };
  // Stage i is free again once its wgmmas are done: the producers wait for it STAGES steps on,
  // and the activations of step i + STAGES go into it.
  int step = 0, s = 0, released = 0;  // steps begun, the current step's stage, steps released
  unsigned parity = 0;                  // of the stage's mbarrier phase: its use count % 2
  // Step `step` - 1 (of stage `s_prev`) is done: the producers may write its stage again.
  auto release_previous = [&](int s_prev) {
    if (released < step) {
      if (step - 1 + STAGES < steps_total) trellis_cuda::named_arrive(1 + STAGES + s_prev, THREADS);
      released = step;
    }
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
      trellis_cuda::mbarrier_wait(x_full_addr + 8 * s, parity);  // the step's activations
      trellis_cuda::named_sync(1 + s, THREADS);                  // FULL: the step's code values
      trellis_cuda::wgmma_fence();
      const unsigned stage_offset = s * (STAGE_BYTES >> 4);
#pragma unroll
      for (int qb = 0; qb < 4; ++qb) {
        const unsigned long long desc_b = desc_b0 + (stage_offset + ((qb * MT * 256) >> 4));
#pragma unroll
        for (int a = 0; a < NMAT; ++a) {
          const unsigned long long desc_a = desc_a0 + (stage_offset + ((a * A_BYTES + qb * 2048) >> 4));
          trellis_cuda::wgmma_ss<N_LO>(reinterpret_cast<float(&)[N_LO][4]>(acc[a][0]), desc_a, desc_b);
          if constexpr (MT > N_LO)
            trellis_cuda::wgmma_ss<N_HI>(reinterpret_cast<float(&)[N_HI][4]>(acc[a][N_LO % MT]), desc_a,
                                         desc_b + ((N_LO * 256) >> 4));
        }
      }
      trellis_cuda::wgmma_commit();
      trellis_cuda::wgmma_wait<1>();
      // Step - 1 is done: its stage takes step + STAGES - 1's activations.
      const int ahead = (j & 3) + STAGES - 1, s_prev = s == 0 ? STAGES - 1 : s - 1;
      release_previous(s_prev);
      activations.copy_step(step + STAGES - 1, kb0 + (j >> 2) + (ahead >> 2), ahead & 3, s_prev);
      if (++s == STAGES) s = 0, parity ^= 1;
    }
    trellis_cuda::wgmma_wait<0>();
    release_previous(s == 0 ? STAGES - 1 : s - 1);  // the tile's last step, step - 1 now

    const int row0 = 64 * tile + 16 * warp;
    if (kb0 == 0 && kb1 == NB) {
      write_tile(acc, row0);
    } else {
      trellis_cuda::fold_split_tile<NREG / 4>(
          sk, [&](int r) -> float(&)[4] { return acc[r / MT][r % MT]; }, partials, counters, last_flag, pass, cta, tile,
          tiles, NB, u == u_begin, tid, CONSUMER_BARRIER, [&] { write_tile(acc, row0); });
    }
    u += kb1 - kb0;
  }

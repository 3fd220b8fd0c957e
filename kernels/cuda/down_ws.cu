// The down projection as a warp-specialized decode-once GEMM on Hopper's warpgroup MMA (the design
// of gate_up_ws.cu, for axis 0): y[m, c] = 1 / 147.8 sum_r x[m, r] scale[r] y(state(r, c)) for
// codes of either layout (T = 256 positions a block, 8 K words, L <= 16; INTERLEAVE: the 3-bit
// block interleave), up to 128 activation rows a pass, each weight decoded once a pass.
//
// The GEMM. D[c, m] += A[c, r] B[r, m]: A is the weights transposed (the GEMM's M is the outputs c,
// its K the code rows r), B the activations times the row scales. Code values come from a run of
// consecutive positions of one code row, which here are consecutive outputs: each 16-byte group of
// 8 positions is one row of an MN-major core matrix (8 K rows of 8 M values, 128 contiguous
// bytes), which wgmma reads with A's transpose bit. The row scales are in B: the pre-pass
// (prescale.cu, ROW_SCALES) hands over f16(x[m, r] scale[r] 2^e[m]) in the image order of the
// stages (IMAGE_ROWS), as for gate_up_ws.cu, and the outputs are multiplied by 2^-e / 147.8.
// With BIAS_FOLD the code values carry y + 1534 and the epilogue subtracts 1534 x_sum[m] (the
// pre-pass's sums of the converted rows).
//
// A step is 64 code rows of one block of 256 rows: rows 256 b + 64 q + 16 sub + 8 h + j (slice q,
// one wgmma's k16; K-half h; j < 8), the order of the pre-pass's image, whose step (b, sub) holds
// the same inputs of the pass's rows. A tile is 64 consecutive outputs, a quarter of a block
// column: A of a step is [q][8-output group][h][j][8 outputs], core matrices 256 bytes apart
// along M and 128 along K.
//
// Warps. Warps 0-3 are the consumer warpgroup, then TEAMS producer teams of four warps; team t
// decodes the steps s with s % TEAMS == t. Its warp q decodes slice q of the step, lane l code
// rows 16 sub + j and 16 sub + 8 + j (j = l % 8) of it, outputs 16 (l / 8) .. + 15 of the tile:
// two runs of 16 positions, copied from global memory (L2: the four tiles of a block column read
// each row's block) into the thread's own slots of its team's word ring LOOKAHEAD of the team's
// steps ahead (cp.async), realigned (CodeRun) and decoded into four 16-byte stores. Named
// barriers FULL (1 + s) and EMPTY (1 + STAGES + s) of stage s and the consumer's own (15); the
// stage's mbarrier for the activations' bulk copy; the producers hand a step over once the next
// is decoded (see gate_up_ws.cu), or with three teams at once. With one team, two blocks an SM
// (the host's launch bounds): each holds one consumer warpgroup, so one block's epilogue runs
// while the other's multiplies; with three, one block of 512 threads an SM.
//
// Work split: stream-K over a pass's tiles of 64 outputs times the NB blocks of input rows,
// tile-major, and the fold of split tiles (partials, counters zeroed by the pre-pass): stream_k.cuh,
// as gate_up_ws.cu. With TRELLIS_RESIDUAL the outputs are residual + x W, added in f32 before the
// one rounding.
//
// Shared memory (dynamic; the host's shared_bytes): STAGES stages of the step's A (8 KB) then the
// pass's 8 MT rows of it (128 bytes a row); each team's code-word ring (LOOKAHEAD + 1 slots of
// 2 x 3 words a producer thread, 3072 bytes a slot); the rows' factors 2^-e / 147.8 and biases
// (4 bytes each), the stages' mbarriers (8 bytes each), one word for the fold's flag.
//
// Template ints: R (input rows, a multiple of 256), C (outputs, a multiple of 256), K, L, MT
// (1..16), STAGES (3..7), LOOKAHEAD (1..4: steps of code words in flight beyond the one
// decoding), TEAMS (1 or 3; STAGES a multiple of it). Template bools: INTERLEAVE, BIAS_FOLD.
// Template type: Y.
// Inputs: x [passes 8 MT, R] f16 (the image order), x_exp [M] f16, x_sum [M] f32 (read with
// BIAS_FOLD), counters [passes tiles] u32, codes, in the residual variant residual [M, C] in Y.
// Outputs: y [M, C] in Y, partials [passes, G, 2, 128 MT 4] f32 (scratch). Grid:
// [128 (1 + TEAMS), G, ceil(M / (8 MT))] threads, blocks of 128 (1 + TEAMS).
  const int M = x_exp_shape[0];  // x holds whole passes
  constexpr int ROWS = 8 * MT;    // activation rows of a pass
  // Producer teams of four warps, each for every TEAMS-th step: with three (one block an SM), each
  // producer warp has three times as long for a step as with one (two blocks an SM, whose four
  // producer warps issued one instruction in 3.7 cycles of a scheduler, latency-bound at two
  // warps a scheduler; docs/cuda-down.md §7, lead 5).
  constexpr int STEP_THREADS = 256;  // a step's barriers: the consumer and one team
  static_assert(TEAMS == 1 || TEAMS == 3, "one or three producer teams");
  static_assert(STAGES % TEAMS == 0, "each stage always filled by the same team");
  constexpr int WPB = 8 * K;      // words per coded block
  constexpr int A_BYTES = 64 * 64 * 2;
  constexpr int X_BYTES = ROWS * 64 * 2;  // a step's activations: one bulk copy
  constexpr int STAGE_BYTES = A_BYTES + X_BYTES;
  constexpr int N_LO = MT <= 8 || MT == 16 ? MT : 8;
  constexpr int N_HI = MT > N_LO ? MT - N_LO : 1;
  constexpr int CONSUMER_BARRIER = 15;
  constexpr int NB = R / 256;     // blocks of input rows
  constexpr int TILES = C / 64;
  static_assert(R % 256 == 0 && C % 256 == 0, "whole blocks of rows and columns");
  static_assert(L <= 16 && L >= K, "L-bit windows");
  static_assert(!INTERLEAVE || (K == 3 && C % 512 == 0), "the 3-bit interleave pairs blocks");
  static_assert(MT >= 1 && MT <= 16, "1 to 16 tiles of 8 rows a pass");
  static_assert(STAGES >= 3 && 2 * STAGES < CONSUMER_BARRIER, "two named barriers a stage");
  static_assert(LOOKAHEAD >= 1 && LOOKAHEAD <= 4, "code words one to four steps ahead");
  using Run = trellis_cuda::CodeRun<K, L, 16>;
  static_assert(Run::NWL <= 3, "the word ring holds three words a run");
  const int cta = blockIdx.y, pass = blockIdx.z;
  const trellis_cuda::StreamK sk{(long long)TILES * NB, (int)gridDim.y};
  const int m_base = pass * ROWS;
  const long long u_begin = sk.start(cta), u_end = sk.start(cta + 1);
  const int steps_total = (int)(u_end - u_begin) * 4;

  extern __shared__ __align__(128) unsigned char shared_base[];
  // [TEAMS][LOOKAHEAD + 1][2][3][128]: each producer thread's code words, word-major (no bank
  // conflicts).
  unsigned* const word_ring = reinterpret_cast<unsigned*>(shared_base + STAGES * STAGE_BYTES);
  constexpr int WORD_SLOT = 2 * 3 * 128;
  float* const row_factor = reinterpret_cast<float*>(word_ring + TEAMS * (LOOKAHEAD + 1) * WORD_SLOT);  // [ROWS]
  float* const row_bias = row_factor + ROWS;  // [ROWS]
  const unsigned x_full_addr = static_cast<unsigned>(__cvta_generic_to_shared(row_bias + ROWS));
  unsigned* const last_flag = reinterpret_cast<unsigned*>(row_bias + ROWS + 2 * STAGES);
  const unsigned stages_addr = static_cast<unsigned>(__cvta_generic_to_shared(shared_base));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  if (warp >= 4) {
    // Team `team` produces the steps s with s % TEAMS == team.
    const int team = (warp - 4) >> 2, q = (warp - 4) & 3, j = lane & 7, group = lane >> 3;
    const int ptid = (threadIdx.x - 128) & 127;
    unsigned* const team_ring = word_ring + team * (LOOKAHEAD + 1) * WORD_SLOT;
    // The words of code row r's block column cb (either layout), the run's first word at run.word_at.
    auto block_words = [&](int r, int cb) {
      return INTERLEAVE ? codes + ((size_t)(cb >> 1) * R + r) * 48 + (cb & 1) * 24 : codes + ((size_t)r * (C / 256) + cb) * WPB;
    };
    int step0 = 0;        // the segment's first step
    int last = -1;        // the team's last step whose values are stored and not yet handed over
    auto hand_over = [&]() {
      trellis_cuda::fence_proxy_async_shared();
      trellis_cuda::named_arrive(1 + last % STAGES, STEP_THREADS);  // FULL
      last = -1;
    };
    for (long long u = u_begin; u < u_end;) {
      const int tile = (int)(u / NB), kb0 = (int)(u % NB);
      const int kb1 = (int)min((long long)NB, kb0 + (u_end - u));
      const int cb = tile >> 2, step_end = step0 + 4 * (kb1 - kb0);
      const Run run(0, 64 * (tile & 3) + 16 * group);
      // Step s's two runs, copied into its slot of the team's word ring. Code words travel by
      // cp.async: a register load would hold the proxy fence and the barriers after it until its
      // word arrived (a scoreboard wait), which left each step at L2's latency
      // (docs/cuda-down.md §7, lead 5).
      auto copy = [&](int s) {
        const int b = kb0 + (s - step0) / 4, sub = (s - step0) % 4;
        unsigned* const slot = team_ring + (s / TEAMS) % (LOOKAHEAD + 1) * WORD_SLOT + ptid;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const unsigned* const row = block_words(256 * b + 64 * q + 16 * sub + 8 * h + j, cb);
#pragma unroll
          for (int i = 0; i < Run::NWL; ++i) trellis_cuda::cp_async4(slot + (h * 3 + i) * 128, row + run.word_at[i]);
        }
      };
      // Step s if it is in the segment, then a commit: one group a team step, empty past the
      // segment's end, so that a wait for all but the last LOOKAHEAD groups is a wait for the
      // step being decoded.
      auto copy_if_in = [&](int s) {
        if (s < step_end) copy(s);
        trellis_cuda::cp_async_commit();
      };
      const int first = step0 + (team - step0 % TEAMS + TEAMS) % TEAMS;  // the team's first step
#pragma unroll
      for (int d = 0; d < LOOKAHEAD; ++d) copy_if_in(first + d * TEAMS);
      for (int s = first; s < step_end; s += TEAMS) {
        copy_if_in(s + LOOKAHEAD * TEAMS);
        trellis_cuda::cp_async_wait_own<LOOKAHEAD>();
        const unsigned* const slot_words = team_ring + (s / TEAMS) % (LOOKAHEAD + 1) * WORD_SLOT + ptid;
        uint4 v[2][2];  // [h][8-output group of the lane's two]
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          unsigned raw[Run::NWL], w[Run::NWR];
#pragma unroll
          for (int i = 0; i < Run::NWL; ++i) raw[i] = slot_words[(h * 3 + i) * 128];
          run.realign(raw, w);
          // Position 16 group + i's window starts at bit (15 - i) K.
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            unsigned pair[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int i = 8 * half + 2 * e;
              pair[e] = trellis_cuda::code_pair_dp4a<!BIAS_FOLD>(trellis_cuda::window<L>(w, (15 - i) * K),
                                                                 trellis_cuda::window<L>(w, (14 - i) * K));
            }
            v[h][half] = make_uint4(pair[0], pair[1], pair[2], pair[3]);
          }
        }
        if (last >= 0) hand_over();
        if (s >= STAGES) trellis_cuda::named_sync(1 + STAGES + s % STAGES, STEP_THREADS);  // EMPTY
        unsigned char* const a_stage = shared_base + (s % STAGES) * STAGE_BYTES + q * 2048;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int half = 0; half < 2; ++half)
            *reinterpret_cast<uint4*>(a_stage + (2 * group + half) * 256 + h * 128 + j * 16) = v[h][half];
        last = s;
        // One team hands a step over once it has decoded its next (above); with three, each team's
        // next step is three steps later, so the step goes at once.
        if (TEAMS > 1) hand_over();
      }
      // A segment's last step at once (the consumer's epilogue waits for it).
      if (last >= 0) hand_over();
      step0 = step_end;
      u += kb1 - kb0;
    }
    return;
  }

  // The consumer warpgroup.
  const int tid = threadIdx.x;
  trellis_cuda::gemm_row_factors<BIAS_FOLD, 128>(row_factor, row_bias, x_exp, x_sum, m_base, M, ROWS, TRELLIS_RCP);
  const trellis_cuda::ActivationRing<STAGES, STAGE_BYTES, A_BYTES, X_BYTES> activations{
      x, stages_addr, x_full_addr, NB, pass, steps_total, tid};
  activations.init();
  trellis_cuda::named_sync(CONSUMER_BARRIER, 128);
  activations.prologue((int)(u_begin % NB));
  const unsigned long long desc_a0 = trellis_cuda::no_swizzle_descriptor(stages_addr, 128, 256);
  const unsigned long long desc_b0 = trellis_cuda::no_swizzle_descriptor(stages_addr + A_BYTES, 128, 256);

  // Output c0 + g + 8 (e >> 1), activation row m_base + 8 t + 2 q + (e & 1) of d[t][e].
  auto write_tile = [&](const float (&acc)[MT][4], int c0) {
    const int g = lane >> 2, qq = lane & 3;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = c0 + g + 8 * (e >> 1);
#if TRELLIS_RESIDUAL
      // The column's residuals, all loaded before its first store: loaded beside their stores
      // (which the compiler cannot tell apart from them), each waited a round trip to L2.
      float res[MT];
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const int m = m_base + 8 * t + 2 * qq + (e & 1);
        res[t] = m < M ? float(residual[(size_t)m * C + c]) : 0.0f;
      }
#endif
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const int i = 8 * t + 2 * qq + (e & 1), m = m_base + i;
        if (m >= M) continue;
        const float out = (acc[t][e] - (BIAS_FOLD ? row_bias[i] : 0.0f)) * row_factor[i];
#if TRELLIS_RESIDUAL
        y[(size_t)m * C + c] = Y(out + res[t]);
#else
        y[(size_t)m * C + c] = Y(out);
#endif
      }
    }
  };
  int step = 0, s = 0, released = 0;
  unsigned parity = 0;
  auto release_previous = [&](int s_prev) {
    if (released < step) {
      if (step - 1 + STAGES < steps_total) trellis_cuda::named_arrive(1 + STAGES + s_prev, STEP_THREADS);
      released = step;
    }
  };
  for (long long u = u_begin; u < u_end;) {
    const int tile = (int)(u / NB), kb0 = (int)(u % NB);
    const int kb1 = (int)min((long long)NB, kb0 + (u_end - u));
    float acc[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
    for (int jj = 0; jj < 4 * (kb1 - kb0); ++jj, ++step) {
      trellis_cuda::mbarrier_wait(x_full_addr + 8 * s, parity);  // the step's activations
      trellis_cuda::named_sync(1 + s, STEP_THREADS);             // FULL: the step's code values
      trellis_cuda::wgmma_fence();
      const unsigned stage_offset = s * (STAGE_BYTES >> 4);
#pragma unroll
      for (int qb = 0; qb < 4; ++qb) {
        const unsigned long long desc_a = desc_a0 + (stage_offset + ((qb * 2048) >> 4));
        const unsigned long long desc_b = desc_b0 + (stage_offset + ((qb * MT * 256) >> 4));
        trellis_cuda::wgmma_ss<N_LO, true>(reinterpret_cast<float(&)[N_LO][4]>(acc[0]), desc_a, desc_b);
        if constexpr (MT > N_LO)
          trellis_cuda::wgmma_ss<N_HI, true>(reinterpret_cast<float(&)[N_HI][4]>(acc[N_LO % MT]), desc_a,
                                             desc_b + ((N_LO * 256) >> 4));
      }
      trellis_cuda::wgmma_commit();
      trellis_cuda::wgmma_wait<1>();
      const int ahead = (jj & 3) + STAGES - 1, s_prev = s == 0 ? STAGES - 1 : s - 1;
      release_previous(s_prev);
      activations.copy_step(step + STAGES - 1, kb0 + (jj >> 2) + (ahead >> 2), ahead & 3, s_prev);
      if (++s == STAGES) s = 0, parity ^= 1;
    }
    trellis_cuda::wgmma_wait<0>();
    release_previous(s == 0 ? STAGES - 1 : s - 1);

    const int c0 = 64 * tile + 16 * warp;
    if (kb0 == 0 && kb1 == NB) {
      write_tile(acc, c0);
    } else {
      trellis_cuda::fold_split_tile<MT>(
          sk, [&](int r) -> float(&)[4] { return acc[r]; }, partials, counters, last_flag, pass, cta, tile, TILES, NB,
          u == u_begin, tid, CONSUMER_BARRIER, [&] { write_tile(acc, c0); });
    }
    u += kb1 - kb0;
  }

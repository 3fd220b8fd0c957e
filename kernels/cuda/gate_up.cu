// Axis-1 projections (an MLP's gate and up, and every projection stored [out, in]) on the tensor
// cores: y[m, o] = scale[o] / 147.8 * sum_i x[m, i] * y(state(o, i)) for row-major codes
// [OUT, IN * K / 32] (T = 256 positions a block, 8 K words, L <= 16). With the TRELLIS_FUSED
// sections (the fused variant) the kernel runs the gate and up projections of the same rows at
// once, on the same activation fragments, and writes y = silu(gate) * up.
//
// The MMA computes D[o, m] += A[o, i] * B[i, m] in m16n8k16 tiles: A holds code values y decoded
// straight into f16 registers (exact: |y| <= 510), B the activations as f16 (f32 ones as an f16
// hi + lo pair, two MMAs), accumulation is f32. The reduction runs inside each output row, so
// the scale and 1/147.8 apply once per output and no partial sum leaves the thread block: one
// launch writes y in T.
//
// Positions. An MMA sums over its 16 k-columns in any order, so the kernel takes the order that
// makes every lane's weights one contiguous run of its rows' blocks: lane 4 g + q decodes
// positions [64 q, 64 q + 64) of output rows g and g + 8 of a 16-row tile, k-columns 2q, 2q + 1,
// 2q + 8, 2q + 9 of chunk c (0..15) being positions 64 q + 4 c + 0..3, and its B fragments hold
// the activations of the same positions. A lane's run is 64 K bits plus the L - K bits of its
// last window: the 2 K + 1 words from word 2 K (3 - q) of the block (the last one wrapping to
// word 0 where q = 0), read straight from global memory, so the main loop has no shared memory
// and no barrier. Every window is one shift or funnel shift and one mask.
//
// Work split. A thread block of WARPS warps owns 16 RT output rows (RT tiles) and one pass of
// 8 MT activation rows (blockIdx.z); its warps split the IN / 256 blocks of the rows evenly
// (warp w: [w NB / WARPS, (w + 1) NB / WARPS)) and warp 0 adds the others' sums from shared
// memory in warp order at the end. Each warp reads the next block's code words while it decodes
// the current one.
//
// With BIAS_FOLD (16-bit activations) the fragments carry y + 1534 (the dp4a result as is) and
// the kernel subtracts 1534 * sum_i x[m, i], taken by one MMA per chunk against an all-ones A.
// With PACK_FMA (and BIAS_FOLD) half of the pairs are packed by an IMAD on the FMA-heavy pipe
// instead of a PRMT on the ALU pipe, which at one row is the decode's limit.
//
// Magnitudes. The activations reach the tensor cores as f16 (range 6e-8 ... 65504), so each
// activation row is first multiplied by a power of two 2^e that brings its largest |x| into
// f16's range (row_exponent in fragment.cuh), and the row's outputs by 2^-e before they are
// written: exact, so activations of any magnitude an f32 or a bf16 holds keep f16's relative
// precision instead of rounding to infinity or zero. With LIFT (bf16 or f32 activations read as
// they are) the block finds e itself, in one pass over the whole row before its main loop; with
// HANDED the activations are the pre-pass's (prescale.cu: f16 already multiplied by 2^e) and e
// comes in x_exp (f16 [M], integers); f16 activations read as they are need neither (they are
// f16 numbers already, exactly).
//
// With STAGE (16-bit activations, a pass of at most a few rows) each thread block first copies
// its pass's rows into dynamic shared memory as the f16 numbers the MMAs take (lifted by their
// powers of two), in the same pass that finds the powers of two: the main loop then reads its
// B fragments with one shared-memory load per chunk pair, with no conversion and no global-memory
// latency at the start of each block (Nsight Compute at one row: the first use of a global
// activation load was the kernel's largest single stall). A row holds 8 halves of padding after
// every 64 positions and 32 at its end, so the four lanes of a row, and two rows, read different
// banks; the host sizes the memory (rows * (IN + IN / 8 + 32) halves).
//
// Activations load 8 at a time (16-byte loads) where x starts on a 16-byte boundary (MLX's
// buffers do; a view may not), one at a time otherwise. Rows past M are zero and never loaded;
// output rows past OUT read row OUT - 1 and are not written.
//
// The widths IN (x_shape[1]) and OUT (scales_shape[0]) and the row count M (x_shape[0]) are read
// at run time: one compiled kernel serves every layer of a bit width and shape. Template ints:
// K, L, MT, RT, WARPS, and in the fused variant KU, the up projection's bits per weight (K is
// the gate's): artifacts that allocate bits per tensor give gate and up different widths of the
// same rows, inputs, T and L, and one launch serves them; every per-matrix width below is a
// compile-time constant once the loops over the matrices are unrolled, so KU = K compiles to
// the code of one width. Template bools: SPLIT_X (f32 activations as hi + lo), BIAS_FOLD,
// PACK_FMA, LIFT and HANDED (the rows' powers of two, above), STAGE (above). Template types: T (activations
// as the kernel reads them: f32, f16 or bf16; the host hands bf16 activations of many rows over
// as the pre-pass's f16), Y (the output dtype). Inputs: x [M, IN], x_exp [M] (f16, read with
// HANDED only), codes [OUT, IN K / 32], scales [OUT] (f16), and in the fused variant up_codes
// [OUT, IN KU / 32] and up_scales [OUT]. Output: y [M, OUT] in Y.
// With the TRELLIS_FEED sections as well (the fused variant that feeds the down kernel) the kernel
// also writes `counters` (u32 [COUNTERS], template int COUNTERS), zeroed: the fold counters of
// the down kernel's launch that follows, whose BLOCK_EXP configurations then need no pre-pass
// launch (down_mma.cu).
// With the TRELLIS_RESIDUAL sections (the single projection's residual variant) the kernel
// takes residual [M, OUT] in Y and writes y = residual + x W, added in f32 and rounded once: a
// model's residual stream after its down projection, without a launch of its own for the add.
  const int M = x_shape[0];
  const int IN = x_shape[1];
  const int OUT = scales_shape[0];
#if TRELLIS_FEED
  if (blockIdx.z == 0) {
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < COUNTERS; i += gridDim.y * blockDim.x) counters[i] = 0u;
  }
#endif
  // 65536 (M >= 0), as a value the compiler cannot fold: see code_pair_dp4a_fma.
  const unsigned lift = 65536u + ((unsigned)M >> 31);
#if TRELLIS_FUSED
  constexpr int NMAT = 2;               // gate, up
  constexpr int K_UP = KU;
#else
  constexpr int NMAT = 1;
  constexpr int K_UP = K;
#endif
  // The lane's code words (axis_one.cuh): Lanes::k_of(a), matrix a's bits per weight (0: gate
  // or the only one, 1: up; constant once a is unrolled), and Lanes::RUN words a run.
  using Lanes = trellis_cuda::LaneRuns<NMAT, RT, K, K_UP>;
  const int NB = IN / 256;              // blocks per row
  constexpr int ROWS = 16 * RT;         // output rows per thread block
  constexpr int SETS = SPLIT_X ? 2 : 1; // f16 B sets (f32: hi, lo)
  static_assert(L <= 16 && L >= K && L >= K_UP, "L-bit windows");
  static_assert(!PACK_FMA || BIAS_FOLD, "PACK_FMA packs the biased pairs");
  static_assert(!(BIAS_FOLD && SPLIT_X), "the bias fold is for 16-bit activations");

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int row0 = blockIdx.y * ROWS;
  const int m_base = blockIdx.z * 8 * MT;
  const int b_begin = warp * NB / WARPS, b_end = (warp + 1) * NB / WARPS;

  // This lane's rows of each matrix and its runs of their blocks (axis_one.cuh).
#if TRELLIS_FUSED
  const unsigned* const mats[NMAT] = {codes, up_codes};
  const __half* mat_scales[NMAT] = {scales, up_scales};
#else
  const unsigned* const mats[NMAT] = {codes};
  const __half* mat_scales[NMAT] = {scales};
#endif
  const Lanes lane_runs(mats, row0, OUT, NB, lane);
  using Runs = typename Lanes::Runs;

  // B: lane (g, q) of 8-row tile t holds activation row m_base + 8 t + g at the lane's positions.
  const bool vector_loads = (reinterpret_cast<size_t>(x) & 15) == 0;
  const T* x_rows[MT];
  bool live[MT];
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    const int m = m_base + 8 * t + g;
    live[t] = m < M;
    x_rows[t] = x + (size_t)(live[t] ? m : 0) * IN + 64 * q;
  }
  // Each row's power of two: e of row m_base + i in row_exp[i] (0 past M, and without LIFT or
  // HANDED). With LIFT every thread of the block strides the row (16-byte loads where aligned)
  // and the warps fold their largest |x| in shared memory (non-negative floats order as their
  // bits).
  static_assert(!(LIFT && HANDED), "the pre-pass's activations are lifted already");
  static_assert(!(STAGE && SPLIT_X), "the staged rows are f16: 16-bit activations");
  static_assert(sizeof(T) == 2 || !STAGE, "the staged rows are f16: 16-bit activations");
  // The staged rows (STAGE): row i of the pass at stage + i * PITCH, position p at p + p / 64 * 8.
  extern __shared__ __align__(16) unsigned char shared_base[];
  __half* const stage = reinterpret_cast<__half*>(shared_base);
  const int PITCH = IN + IN / 8 + 32;
  const int stage_rows = min(8 * MT, M - m_base);
  __shared__ int row_exp[8 * MT];
  __shared__ unsigned row_amax[8 * MT];
  if (LIFT || STAGE) {
    for (int i = threadIdx.x; i < 8 * MT; i += 32 * WARPS) row_amax[i] = 0u;
    __syncthreads();
    for (int i = 0; i < 8 * MT && m_base + i < M; ++i) {
      const T* xr = x + (size_t)(m_base + i) * IN;
      float amax = 0.0f;
      for (int j = 8 * threadIdx.x; j < IN; j += 8 * 32 * WARPS) {
        alignas(16) T xs[8];
        if (vector_loads) {
#pragma unroll
          for (int w = 0; w < (int)sizeof(xs) / 16; ++w) reinterpret_cast<uint4*>(xs)[w] = reinterpret_cast<const uint4*>(xr + j)[w];
        } else {
#pragma unroll
          for (int k = 0; k < 8; ++k) xs[k] = xr[j + k];
        }
        if (STAGE) *reinterpret_cast<uint4*>(stage + i * PITCH + j + j / 64 * 8) = *reinterpret_cast<const uint4*>(xs);
        if (LIFT) {
#pragma unroll
          for (int k = 0; k < 8; ++k) amax = fmaxf(amax, fabsf(float(xs[k])));
        }
      }
      if (LIFT) {
        amax = trellis_cuda::warp_max(amax);
        if (lane == 0) atomicMax(&row_amax[i], __float_as_uint(amax));
      }
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < 8 * MT; i += 32 * WARPS) {
    const bool in = m_base + i < M;
    row_exp[i] = HANDED && in ? (int)__half2float(x_exp[m_base + i]) : LIFT && in ? trellis_cuda::row_exponent(__uint_as_float(row_amax[i])) : 0;
  }
  __syncthreads();
  // This lane's rows' factors: 2^e for the activations it converts (LIFT).
  float x_lift[MT];
#pragma unroll
  for (int t = 0; t < MT; ++t) x_lift[t] = trellis_cuda::pow2(row_exp[8 * t + g]);
  // The staged rows as the f16 numbers the MMAs take: each thread converts the words it copied
  // (T is f16 without LIFT: copied as they are).
  if (STAGE && LIFT) {
    for (int i = 0; i < stage_rows; ++i) {
      const float lift_i = trellis_cuda::pow2(row_exp[i]);
      for (int j = 8 * threadIdx.x; j < IN; j += 8 * 32 * WARPS) {
        uint4* word = reinterpret_cast<uint4*>(stage + i * PITCH + j + j / 64 * 8);
        alignas(16) T xs[8];
        *reinterpret_cast<uint4*>(xs) = *word;
        unsigned h[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          const __half2 v = __float22half2_rn(make_float2(float(xs[2 * p]) * lift_i, float(xs[2 * p + 1]) * lift_i));
          h[p] = *reinterpret_cast<const unsigned*>(&v);
        }
        *word = make_uint4(h[0], h[1], h[2], h[3]);
      }
    }
  }
  if (STAGE) __syncthreads();
  // This lane's staged row of each 8-row tile (STAGE); a row past M reads the pass's first (load_b).
  int stage_row_at[MT];
#pragma unroll
  for (int t = 0; t < MT; ++t) stage_row_at[t] = (live[t] ? 8 * t + g : 0) * PITCH;
  // The B fragments of chunks c and c + 1 (c even) of block b for every tile and set.
  // `vec`: IntConstant<1> where the activations take 16-byte loads (vector_loads), a choice made
  // once outside the main loop, which otherwise issued both load paths predicated.
  auto load_b = [&](int b, int c, unsigned (&bf)[2][MT][SETS][2], auto vec) {
    if (STAGE) {
      // Positions 64 q + 4 c + 0..7 of block b: 16 contiguous bytes of the staged row. A lane of
      // a row past M reads the pass's first row instead of zeros: an MMA's output column depends
      // on its own B column only, and those columns are never written, while a select between a
      // load and zeros compiled to a branch around each chunk pair's load.
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        // Position p at p + p / 64 * 8: block b's group q from b * 288 + q * 72.
        const uint4 v = *reinterpret_cast<const uint4*>(stage + stage_row_at[t] + b * 288 + q * 72 + 4 * c);
        bf[0][t][0][0] = v.x;
        bf[0][t][0][1] = v.y;
        bf[1][t][0][0] = v.z;
        bf[1][t][0][1] = v.w;
      }
    } else {
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        alignas(16) T xs[8];
        const T* src = x_rows[t] + b * 256 + 4 * c;
        // A lane of a row past M reads row 0 (x_rows), as the staged path does: its MMA columns
        // are never written.
        if constexpr (decltype(vec)::value == 1) {
#pragma unroll
          for (int w = 0; w < (int)sizeof(xs) / 16; ++w) reinterpret_cast<uint4*>(xs)[w] = reinterpret_cast<const uint4*>(src)[w];
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) xs[j] = src[j];
        }
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          const __half2 hi = LIFT ? __float22half2_rn(make_float2(float(xs[2 * p]) * x_lift[t], float(xs[2 * p + 1]) * x_lift[t]))
                                  : trellis_cuda::half2_of(xs[2 * p], xs[2 * p + 1]);
          bf[p >> 1][t][0][p & 1] = *reinterpret_cast<const unsigned*>(&hi);
          if (SPLIT_X) {
            const float2 v = make_float2(float(xs[2 * p]) * x_lift[t], float(xs[2 * p + 1]) * x_lift[t]);
            const float2 hf = __half22float2(hi);
            const __half2 lo = __float22half2_rn(make_float2(v.x - hf.x, v.y - hf.y));
            bf[p >> 1][t][SPLIT_X ? 1 : 0][p & 1] = *reinterpret_cast<const unsigned*>(&lo);
          }
        }
      }
    }
  };

  float acc[NMAT][RT][MT][4];
  float bias[MT][4];
#pragma unroll
  for (int t = 0; t < MT; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      bias[t][e] = 0.0f;
#pragma unroll
      for (int a = 0; a < NMAT; ++a)
#pragma unroll
        for (int r = 0; r < RT; ++r) acc[a][r][t][e] = 0.0f;
    }
  }

  // Chunk c of a block: position 64 q + 4 c + j of the lane's rows sits at run bit (63 - 4 c - j) k.
  auto multiply_chunk = [&](const Runs& w, int c, const unsigned (&bc)[MT][SETS][2]) {
#pragma unroll
    for (int a = 0; a < NMAT; ++a)
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        unsigned f[4];
        trellis_cuda::chunk_fragment<L, !BIAS_FOLD, PACK_FMA>(w[a][r][0], w[a][r][1], Lanes::k_of(a), c, lift, f);
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
          for (int s = 0; s < SETS; ++s) trellis_cuda::mma_16816(acc[a][r][t], f, bc[t][s]);
      }
    if (BIAS_FOLD) {
      const unsigned ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};
#pragma unroll
      for (int t = 0; t < MT; ++t) trellis_cuda::mma_16816(bias[t], ones, bc[t][0]);
    }
  };

  // A block's code words are read in two halves, each where the block before is done with
  // those registers (as the GEMM's, gate_up_gemm.cu): chunks 0-7 read bits from 32 k up (words
  // k..2k), chunks 8-15 bits below 31 k + L <= 32 (k + 1) (words 0..k). So words 0..k are read
  // at the block's start, for its chunk 7 on, and words k+1..2k of the next block at chunk 8,
  // for that block's start: each half a block ahead of its use, without a second set of
  // registers for the next block's words or the copies into this block's at its end.
  auto main_loop = [&](auto vec) {
    Runs w;
    if (b_begin < b_end) lane_runs.load(b_begin, w);
    for (int b = b_begin; b < b_end; ++b) {
      if (b > b_begin) lane_runs.load_words(b, w, 0, 0, 1, 0);
#pragma unroll
      for (int c = 0; c < 16; c += 2) {
        if (c == 8 && b + 1 < b_end) lane_runs.load_words(b + 1, w, 1, 1, 2, 0);
        unsigned bf[2][MT][SETS][2];
        load_b(b, c, bf, vec);
        multiply_chunk(w, c, bf[0]);
        multiply_chunk(w, c + 1, bf[1]);
      }
    }
  };
  if (STAGE || vector_loads) {
    main_loop(trellis_cuda::IntConstant<1>{});
  } else {
    main_loop(trellis_cuda::IntConstant<0>{});
  }

  // Warp 0 adds the other warps' sums in warp order (a fixed order: the same bits every run).
  constexpr int SLOTS = NMAT * RT * MT * 4 + (BIAS_FOLD ? MT * 4 : 0);
  __shared__ float partial[WARPS > 1 ? WARPS - 1 : 1][SLOTS][32];
  auto slot = [&](int i) -> float& {
    constexpr int ACC = NMAT * RT * MT * 4;
    return i < ACC ? (&acc[0][0][0][0])[i] : (&bias[0][0])[i - ACC];
  };
  if (WARPS > 1) {
    if (warp > 0) {
#pragma unroll
      for (int i = 0; i < SLOTS; ++i) partial[warp - 1][i][lane] = slot(i);
    }
    __syncthreads();
    if (warp > 0) return;
#pragma unroll
    for (int v = 0; v < WARPS - 1; ++v)
#pragma unroll
      for (int i = 0; i < SLOTS; ++i) slot(i) += partial[v][i][lane];
  }

  // d[e] of tile (r, t) is output row 16 r + g + 8 (e >> 1), activation row 8 t + 2 q + (e & 1).
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int o = row0 + 16 * r + g + 8 * (e >> 1);
      if (o >= OUT) continue;
      float s[NMAT];
#pragma unroll
      for (int a = 0; a < NMAT; ++a) s[a] = __half2float(mat_scales[a][o]) * TRELLIS_RCP;
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const int m = m_base + 8 * t + 2 * q + (e & 1);
        if (m >= M) continue;
        const float unlift = trellis_cuda::pow2(-row_exp[8 * t + 2 * q + (e & 1)]);
        float v[NMAT];
#pragma unroll
        for (int a = 0; a < NMAT; ++a) v[a] = (acc[a][r][t][e] - (BIAS_FOLD ? 1534.0f * bias[t][e] : 0.0f)) * s[a] * unlift;
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
      }
    }

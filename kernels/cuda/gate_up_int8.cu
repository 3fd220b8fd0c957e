// Axis-1 projections (stored [out, in]) at one to eight activation rows, with the activations as
// two int8 terms on the tensor cores: y[m, o] = scale[o] / 147.8 * sum_i x[m, i] * y(state(o, i))
// for row-major codes [OUT, IN * K / 32] (T = 256 positions a block, 8 K words, L <= 16). The
// variants are gate_up.cu's: the fused gate·up·SwiGLU under TRELLIS_FUSED (y = silu(gate) * up,
// gate of K bits and up of KU), the residual add under TRELLIS_RESIDUAL (y = residual + x W,
// rounded once).
//
// Why. A code value is bytesum(lcg(state)) - 510. The fragment kernel (gate_up.cu) turns each
// into an f16 (a dp4a into f16's mantissa, a PRMT to pack two) for an f16 MMA: about 6.2
// instructions a weight. Here the LCG's output itself is the A operand of a u8 x s8 MMA
// (m16n8k32: four k-columns of one row per register are that weight's four bytes), and the B
// operand an int8 activation in all four bytes, so the MMA adds q * bytesum: a weight costs its
// L-bit window (a shift or funnel shift and a mask), the LCG's IMAD, and a quarter of an MMA per
// activation term. The 510 folds into the integer sums' start (below).
//
// Two terms. Each activation is s (q1 + q2 / 254) with q1, q2 int8: per 256-input block of a
// row, s = amax / 127 and q1 = rint(x / s), and q2 = rint(254 (x - s q1) / s), the first term's
// error in a step 254 times finer. One int8 term alone leaves an error of about 0.55 % of the
// row's size (rms, Gaussian rows): fused gate·up·SwiGLU outputs then miss a 1e-2 relErr gate.
// Two terms leave 1 / 254 of that, below a bf16 output's own rounding, and cost one more MMA per
// four weights on the otherwise idle tensor pipe: by instruction counts the ALU pipe stays the
// limit (measured, the kernel is not bound by its issue: docs/cuda-mlp.md).
//
// Quantization. Before its main loop every thread block quantizes the call's rows into shared
// memory, a warp per block of a row (8 inputs a lane): each block is first multiplied by the
// power of two that brings its largest |x| into [2^14, 2^15) (row_exponent in fragment.cuh;
// exact), so activations of any magnitude keep their precision. Shared memory holds, per term
// and row, each q as the word (q, q, q, q) (68 words for each 64 inputs: padding, so the four
// lanes of a row reading at once start on different banks), and per row and block the scale s
// (times the power of two back) and each term's bias -510 * sum q, which starts the MMA's
// integer sums of the block: exact (at most 256 * 127 * 1020 in size). Non-finite activations
// give their block a NaN scale, so the outputs they reach are NaN.
//
// Positions. An MMA sums its 32 k-columns (eight weights of four bytes) in any order, so the
// kernel takes the order that keeps each lane's weights one contiguous run of its rows' blocks,
// as in gate_up.cu: lane 4 g + q decodes positions [64 q, 64 q + 64) of rows g and g + 8 of
// each 16-row tile; in chunk c (0..31) of a block its A registers hold positions 64 q + 2 c
// (k-columns 4 q..4 q + 3) and 64 q + 2 c + 1 (16 + 4 q..), and its B registers the same
// positions of activation row g. A lane's run is read straight from global memory (2 K + 1
// words; see gate_up.cu) at the start of each block: reading the next block's words while
// decoding the current one, as gate_up.cu does, takes 128 registers here (four blocks of 4 warps
// an SM) against 96 (five) without, so the resident warps are left to cover the loads' latency.
//
// Work split. A thread block of WARPS warps owns 16 RT output rows and splits each row's
// IN / 256 blocks among its warps; after each block a lane adds s times its integer sums in f32.
// Warp 0 adds the other warps' sums in warp order (the same bits every run) and writes the rows.
//
// Template ints: K, L, RT, WARPS, R (the activation rows: M, 1 to 8), and in the fused variant
// KU. Template types: T (the activations: f16 or bf16), Y (the output). Inputs: x [R, IN],
// codes [OUT, IN K / 32], scales [OUT] (f16), and in the fused variant up_codes and up_scales,
// in the residual variant residual [R, OUT] in Y. Output: y [R, OUT] in Y. Dynamic shared
// memory (the host's int8_shared_bytes): the larger of R * (2 * (IN / 256 * 272 + 16) * 4 +
// IN / 256 * 12) bytes (the tables) and (WARPS - 1) * NMAT * RT * 4 * 32 floats (the warps' sums,
// which reuse the tables once every warp has left the main loop: at one row of 5120 inputs the
// block then takes 42.9 KB instead of 45.9, and five blocks fit an SM's 228 KB instead of four);
// no static shared memory.
  const int IN = x_shape[1];
  const int OUT = scales_shape[0];
#if TRELLIS_FUSED
  constexpr int NMAT = 2;  // gate, up
  constexpr int K_UP = KU;
#else
  constexpr int NMAT = 1;
  constexpr int K_UP = K;
#endif
  // The lane's code words (axis_one.cuh): Lanes::k_of(a), matrix a's bits per weight.
  using Lanes = trellis_cuda::LaneRuns<NMAT, RT, K, K_UP>;
  constexpr int ROWS = 16 * RT;       // output rows per thread block
  static_assert(L <= 16 && L >= K && L >= K_UP, "L-bit windows");
  static_assert(R >= 1 && R <= 8, "one to eight activation rows");
  const int NB = IN / 256;           // blocks per row
  const int SPW = NB * 272 + 16;     // words of a row's table (16 of padding between rows)

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int row0 = blockIdx.y * ROWS;
  const int b_begin = warp * NB / WARPS, b_end = (warp + 1) * NB / WARPS;

  extern __shared__ __align__(16) unsigned char shared_base[];
  unsigned* table = reinterpret_cast<unsigned*>(shared_base);             // [2][R][SPW]
  int2* block_bias = reinterpret_cast<int2*>(table + 2 * R * SPW);        // [R][NB]: terms 1, 2
  float* block_scale = reinterpret_cast<float*>(block_bias + R * NB);     // [R][NB]
  // The other warps' sums for warp 0 ([WARPS - 1][SLOTS][32], SLOTS below), over the tables once
  // the main loop is done: dynamic like the rest, as static shared memory on top of up to 48 KB
  // of dynamic would exceed a block's default limit, which MLX raises only for dynamic sizes
  // above it.
  float* partial = reinterpret_cast<float*>(shared_base);

  // Quantization: a warp per block of a row, 8 inputs a lane (16-byte loads where x is aligned).
  const bool vector_loads = (reinterpret_cast<size_t>(x) & 15) == 0;
  for (int gi = warp; gi < R * NB; gi += WARPS) {
    const int r = gi / NB, b = gi % NB;
    const T* src = x + (size_t)r * IN + 256 * b + 8 * lane;
    alignas(16) T xs[8];
    if (vector_loads) {
      *reinterpret_cast<uint4*>(xs) = *reinterpret_cast<const uint4*>(src);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) xs[j] = src[j];
    }
    float v[8], amax = 0.0f;
    bool finite = true;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[j] = float(xs[j]);
      amax = fmaxf(amax, fabsf(v[j]));
      finite = finite && fabsf(v[j]) <= 3.402823466e38f;
    }
    amax = trellis_cuda::warp_max(amax);
    const bool bad = __any_sync(0xffffffffu, !finite);
    const int e = trellis_cuda::row_exponent(amax);
    const float lift = trellis_cuda::pow2(e), lifted_max = amax * lift;
    const bool live = lifted_max > 0.0f && !bad;
    const float step = lifted_max * (1.0f / 127.0f);
    const float inv = live ? 127.0f / lifted_max : 0.0f, fine = live ? 254.0f / step : 0.0f;
    unsigned words[2][8];
    int sum1 = 0, sum2 = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float xl = v[j] * lift;
      const int q1 = max(-127, min(127, __float2int_rn(xl * inv)));
      const int q2 = max(-127, min(127, __float2int_rn((xl - float(q1) * step) * fine)));
      sum1 += q1, sum2 += q2;
      words[0][j] = (unsigned)(q1 & 0xff) * 0x01010101u;
      words[1][j] = (unsigned)(q2 & 0xff) * 0x01010101u;
    }
    sum1 = __reduce_add_sync(0xffffffffu, sum1);
    sum2 = __reduce_add_sync(0xffffffffu, sum2);
    // Input 8 lane + j of the block: word 272 b + 8 lane + 4 (lane / 8) + j of the row's table.
#pragma unroll
    for (int term = 0; term < 2; ++term) {
      uint4* dst = reinterpret_cast<uint4*>(table + (term * R + r) * SPW + 272 * b + 8 * lane + 4 * (lane >> 3));
      dst[0] = make_uint4(words[term][0], words[term][1], words[term][2], words[term][3]);
      dst[1] = make_uint4(words[term][4], words[term][5], words[term][6], words[term][7]);
    }
    if (lane == 0) {
      // The scale in the activations' own units (2^-e back; exact), NaN for a non-finite block.
      block_scale[gi] = bad ? __int_as_float(0x7fc00000) : step * trellis_cuda::pow2(-e);
      block_bias[gi] = make_int2(-510 * sum1, -510 * sum2);
    }
  }
  __syncthreads();

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
  auto load_runs = [&](int b, Runs& w) { lane_runs.load(b, w); };

  // The lane's f32 sums: matrix a, tile t, D element e (output row g + 8 (e >> 1) of the tile,
  // activation row 2 q + (e & 1)).
  float acc[NMAT][RT][4];
#pragma unroll
  for (int a = 0; a < NMAT; ++a)
#pragma unroll
    for (int t = 0; t < RT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[a][t][e] = 0.0f;
  // B: activation row g's table words from the lane's first position. Lanes past the call's
  // rows read row 0's (the same words as lane q: a broadcast); their D columns are never used
  // (their scale is 0 and they are not written). The activation rows of this lane's D elements.
  const int b_row = g < R ? g : 0;
  const unsigned* b_rows[2] = {table + b_row * SPW + 68 * q, table + (R + b_row) * SPW + 68 * q};
  const int d_row[2] = {2 * q, 2 * q + 1};

  for (int b = b_begin; b < b_end; ++b) {
    Runs w;
    load_runs(b, w);
    // The block's integer sums start at each term's bias (zero past the call's rows).
    int sum[2][NMAT][RT][4];
    int2 bias[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) bias[i] = d_row[i] < R ? block_bias[d_row[i] * NB + b] : make_int2(0, 0);
#pragma unroll
    for (int a = 0; a < NMAT; ++a)
#pragma unroll
      for (int t = 0; t < RT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[0][a][t][e] = bias[e & 1].x, sum[1][a][t][e] = bias[e & 1].y;
#pragma unroll
    for (int c = 0; c < 32; c += 2) {
      // Positions 2 c .. 2 c + 3 of the lane's run in both terms (chunks c and c + 1).
      uint4 bq[2];
#pragma unroll
      for (int term = 0; term < 2; ++term) bq[term] = *reinterpret_cast<const uint4*>(b_rows[term] + 272 * b + 2 * c);
#pragma unroll
      for (int cc = 0; cc < 2; ++cc)
#pragma unroll
        for (int a = 0; a < NMAT; ++a)
#pragma unroll
          for (int t = 0; t < RT; ++t) {
            // Position 2 (c + cc) + i of the run (i = 0: k-columns 4 q.., 1: 16 + 4 q..) sits at
            // run bit (63 - 2 (c + cc) - i) k.
            const int ka = Lanes::k_of(a), p = 2 * (c + cc);
            unsigned bytes[4];
            bytes[0] = trellis_cuda::lcg(trellis_cuda::window<L>(w[a][t][0], (63 - p) * ka));
            bytes[1] = trellis_cuda::lcg(trellis_cuda::window<L>(w[a][t][1], (63 - p) * ka));
            bytes[2] = trellis_cuda::lcg(trellis_cuda::window<L>(w[a][t][0], (62 - p) * ka));
            bytes[3] = trellis_cuda::lcg(trellis_cuda::window<L>(w[a][t][1], (62 - p) * ka));
#pragma unroll
            for (int term = 0; term < 2; ++term) {
              const unsigned b0 = cc == 0 ? bq[term].x : bq[term].z, b1 = cc == 0 ? bq[term].y : bq[term].w;
              trellis_cuda::mma_u8s8(sum[term][a][t], bytes, b0, b1);
            }
          }
    }
    // s times the block's sums, each term in its own unit.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float s = d_row[i] < R ? block_scale[d_row[i] * NB + b] : 0.0f;
      const float s_fine = s * (1.0f / 254.0f);
#pragma unroll
      for (int a = 0; a < NMAT; ++a)
#pragma unroll
        for (int t = 0; t < RT; ++t)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int e = 2 * h + i;
            acc[a][t][e] += s * float(sum[0][a][t][e]) + s_fine * float(sum[1][a][t][e]);
          }
    }
  }

  // Warp 0 adds the other warps' sums in warp order (a fixed order: the same bits every run).
  constexpr int SLOTS = NMAT * RT * 4;
  float* slots = &acc[0][0][0];
  if (WARPS > 1) {
    __syncthreads();  // every warp is done with the tables
    if (warp > 0) {
#pragma unroll
      for (int i = 0; i < SLOTS; ++i) partial[((warp - 1) * SLOTS + i) * 32 + lane] = slots[i];
    }
    __syncthreads();
    if (warp > 0) return;
#pragma unroll
    for (int v = 0; v < WARPS - 1; ++v)
#pragma unroll
      for (int i = 0; i < SLOTS; ++i) slots[i] += partial[(v * SLOTS + i) * 32 + lane];
  }

#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int o = row0 + 16 * t + g + 8 * (e >> 1), m = d_row[e & 1];
      if (o >= OUT || m >= R) continue;
      float v[NMAT];
#pragma unroll
      for (int a = 0; a < NMAT; ++a) v[a] = acc[a][t][e] * (__half2float(mat_scales[a][o]) * TRELLIS_RCP);
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

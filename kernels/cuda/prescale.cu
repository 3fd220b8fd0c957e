// Activations ready-made for the tensor cores as f16, one thread block per activation row:
// x_scaled[m, r] = f16(x[m, r] * scale[r] * 2^e[m]), with the row's power of two e[m] (f16's
// range, see row_exponent in fragment.cuh) chosen from the row's largest |x * scale| and written
// to x_exp[m] (an integer, exact as an f16). Two callers:
// - the down kernel's PRESCALED mode (down_mma.cu, ROW_SCALES true), which then streams its B
//   tiles with cp.async instead of loading and converting activations in every thread block
//   (each of a row's column blocks did that work again), and undoes 2^e[m] on its sums;
// - the axis-1 kernel's hand-over of bf16 activations of many rows (gate_up.cu, ROW_SCALES
//   false: no scales, x_scaled = f16(x * 2^e)), converted once per call instead of once per row
//   tile of the layer.
//
// Rows are padded with zeros to R_PAD (a multiple of 64: whole steps of any step length). With
// SPLIT_X (f32 activations) rows M..2M - 1 hold the residues f16(x * scale * 2^e - hi), as the
// down kernel itself splits them. The arithmetic is the kernel's own: one f32 product, an exact
// power of two, rounded to f16.
//
// Thread block m (grid row m) loads its row once, 8 activations a thread at a time, all of a
// thread's groups in flight together (up to 8 groups; a wider row's rest is loaded again for the
// conversion): 16-byte loads where R is a multiple of 8 and both inputs are 16-byte aligned
// (then 8 activations are all in or all past R), one at a time otherwise. It folds the largest
// |x * scale| across the block, then converts the groups it holds; one 16-byte store per set.
// Block 0 also zeroes the down kernel's COUNTERS fold counters (its fourth input), so that a
// prescaled call needs no launch of its own for them (COUNTERS 0: none).
// Without WRITE_X only the exponents are written (and the counters zeroed): the down kernel's
// other configurations convert their activations in the thread block, with these exponents.
// With ROW_SUMS (and WRITE_X, not SPLIT_X) x_sum[m] (x_sum [2 M] in the pair variant) is the sum
// of the row's converted f16 values in f32: the decode-once GEMM's fragments carry y + 1534, and
// it subtracts 1534 x_sum (gate_up_gemm.cu's BIAS_FOLD).
// With WGMMA_ORDER (16-bit rows, R = R_PAD a multiple of 256) each block of 256 converted values
// is stored in the order gate_up_wgmma.cu's tensor cores read it: position 64 q + 4 c + 2 h + e of
// the block at index 16 c + 8 h + 2 q + e (c < 16, h, e < 2, q < 4), so that the 8 values of chunk
// c's K-half h are 16 contiguous bytes; 8 consecutive positions are then four pairs, stored 4
// bytes each.
// With IMAGE_ROWS (16-bit rows, R = R_PAD a multiple of 256; 0: off) the converted rows are
// stored as the warp-specialized GEMM's stages hold them (gate_up_ws.cu), so that one bulk copy
// brings a step: for each pass of IMAGE_ROWS rows, each block b of 256 inputs and each quarter
// sub, the pass's rows' positions 64 q + 16 sub + 8 h + j of the block (q < 4, h < 2, j < 8) at
// q (IMAGE_ROWS 16) + (row / 8) 128 + h 64 + (row % 8) 8 + j halves into the step's 64 IMAGE_ROWS:
// 8 consecutive positions are one 16-byte store. The grid then also runs the last pass's rows
// past M, which store zeros (and nothing else).
// Template ints: R, R_PAD, COUNTERS, IMAGE_ROWS, THREADS. Template bools: SPLIT_X, ROW_SCALES (multiply
// by scales; false: `scales` is not read), WRITE_X, ROW_SUMS, WGMMA_ORDER. Template type: T
// (activation dtype). Grid [THREADS, min(G, 65535), ceil(G / 65535)] threads, G = M (with
// IMAGE_ROWS, M rounded up to a whole pass) (row m = blockIdx.y + gridDim.y blockIdx.z: grid y
// holds at most 65535), blocks of THREADS, a whole number of warps (at most 32).
// The pair variant (sections under TRELLIS_PAIR; the down kernel's pair of matrices) takes a
// second scale vector, scales_b, and runs 2 M grid rows: rows M..2M - 1 are the activations
// again times scales_b, whose exponents and converted rows follow the first set's (x_exp [2 M],
// x_scaled [2 sets M, R_PAD]).
  const int M = x_shape[0];
  const int grid_row = blockIdx.y + gridDim.y * blockIdx.z;
#if TRELLIS_PAIR
  if (grid_row >= 2 * M) return;
  const bool second = grid_row >= M;
  const int m = second ? grid_row - M : grid_row;
  const __half* const mat_scales = second ? scales_b : scales;
  __half* const mat_x_scaled = second ? x_scaled + (size_t)(SPLIT_X ? 2 : 1) * M * R_PAD : x_scaled;
  __half* const mat_x_exp = second ? x_exp + M : x_exp;
  float* const mat_x_sum = second ? x_sum + M : x_sum;
#else
  const int m = grid_row;
  if (m >= (IMAGE_ROWS > 0 ? (M + IMAGE_ROWS - 1) / IMAGE_ROWS * IMAGE_ROWS : M)) return;
  const __half* const mat_scales = scales;
  __half* const mat_x_scaled = x_scaled;
  __half* const mat_x_exp = x_exp;
  float* const mat_x_sum = x_sum;
#endif
  const int tid = threadIdx.x;
  static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps, at most 32");
  if (grid_row == 0) {
    for (int i = tid; i < COUNTERS; i += THREADS) counters[i] = 0u;
  }
  static_assert(IMAGE_ROWS == 0 ||
                    (IMAGE_ROWS % 8 == 0 && WRITE_X && !SPLIT_X && !WGMMA_ORDER && R == R_PAD && R % 256 == 0),
                "the image order is of 16-bit rows of whole 256-input blocks");
  // Where positions [r0, r0 + 8) of row `row` go in the image order (halves).
  auto image = [](int row, int r0) {
    constexpr int PASS = IMAGE_ROWS > 0 ? IMAGE_ROWS : 1;
    const int p = row / PASS, r = row % PASS, p0 = r0 & 255;
    return (((size_t)p * (R / 256) + (r0 >> 8)) * 4 + ((p0 >> 4) & 3)) * (PASS * 64) + (p0 >> 6) * (PASS * 16) +
           (r >> 3) * 128 + ((p0 >> 3) & 1) * 64 + (r & 7) * 8;
  };
#if !TRELLIS_PAIR
  if (IMAGE_ROWS > 0 && m >= M) {
    for (int r0 = 8 * tid; r0 < R; r0 += 8 * THREADS)
      *reinterpret_cast<uint4*>(x_scaled + image(m, r0)) = make_uint4(0u, 0u, 0u, 0u);
    return;
  }
#endif
  constexpr int X_WORDS = 8 * (int)sizeof(T) / 16;  // 16-byte words of 8 activations
  const bool vector_loads =
      R % 8 == 0 && ((reinterpret_cast<size_t>(x) | (ROW_SCALES ? reinterpret_cast<size_t>(mat_scales) : 0)) & 15) == 0;
  // Activations [r0, r0 + 8) of row m and their scales as loaded (0 past R), in the 16-byte
  // words a vector load returns.
  struct Group {
    uint4 x[X_WORDS];
    uint4 s;
  };
  auto fetch = [&](int r0, Group& g) {
    if (vector_loads) {
      const bool in = r0 < R;
#pragma unroll
      for (int w = 0; w < X_WORDS; ++w)
        g.x[w] = in ? reinterpret_cast<const uint4*>(x + (size_t)m * R + r0)[w] : make_uint4(0, 0, 0, 0);
      if (ROW_SCALES) g.s = in ? *reinterpret_cast<const uint4*>(mat_scales + r0) : make_uint4(0, 0, 0, 0);
    } else {
      T* xs = reinterpret_cast<T*>(g.x);
      __half* s = reinterpret_cast<__half*>(&g.s);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        xs[j] = r0 + j < R ? x[(size_t)m * R + r0 + j] : T(0.0f);
        if (ROW_SCALES) s[j] = r0 + j < R ? mat_scales[r0 + j] : __half(0.0f);
      }
    }
  };
  // The products of a group's activations with their scales.
  auto products = [&](const Group& g, float (&v)[8]) {
    const T* xs = reinterpret_cast<const T*>(g.x);
    const __half* s = reinterpret_cast<const __half*>(&g.s);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = ROW_SCALES ? float(xs[j]) * __half2float(s[j]) : float(xs[j]);
  };
  // Thread tid covers groups r0 = 8 (tid + i THREADS), i = 0, 1, ... below R_PAD. The first
  // CACHED of them are loaded together, all in flight at once, and kept in registers for the
  // conversion; a loop that loaded one group after another waited a memory latency per group
  // (17408 inputs: five), and read each group twice. Wider rows load the rest as before.
  constexpr int GROUPS = (R_PAD / 8 + THREADS - 1) / THREADS;  // groups of the thread with the most
  constexpr int CACHED = GROUPS < 8 ? GROUPS : 8;
  Group cache[CACHED];
#pragma unroll
  for (int i = 0; i < CACHED; ++i) {
    const int r0 = 8 * (tid + i * THREADS);
    if (r0 < R_PAD) fetch(r0, cache[i]);
  }
  // visit(r0, v) for each of the thread's groups in ascending order, with the products of its
  // activations and scales (0 past R): the cached groups, then the rest loaded one at a time.
  auto each_group = [&](auto&& visit) {
#pragma unroll
    for (int i = 0; i < CACHED; ++i) {
      const int r0 = 8 * (tid + i * THREADS);
      if (r0 < R_PAD) {
        float v[8];
        products(cache[i], v);
        visit(r0, v);
      }
    }
    for (int r0 = 8 * (tid + CACHED * THREADS); r0 < R_PAD; r0 += 8 * THREADS) {
      Group g;
      float v[8];
      fetch(r0, g);
      products(g, v);
      visit(r0, v);
    }
  };
  // The row's largest |x * scale|, folded over the block's warps: each warp's maximum through
  // shared memory, then every warp folds them by shuffles (not one read a warp, in turn).
  __shared__ float warp_fold[32];
  constexpr int WARPS = THREADS / 32;
  const int lane = tid & 31;
  float amax = 0.0f;
  each_group([&](int, const float(&v)[8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
  });
  amax = trellis_cuda::warp_max(amax);
  if (lane == 0) warp_fold[tid >> 5] = amax;
  __syncthreads();
  amax = trellis_cuda::warp_max(lane < WARPS ? warp_fold[lane] : 0.0f);
  const int e = trellis_cuda::row_exponent(amax);
  const float lift = trellis_cuda::pow2(e);
  if (tid == 0) mat_x_exp[m] = __float2half((float)e);
  static_assert(!ROW_SUMS || (WRITE_X && !SPLIT_X), "row sums are of the converted 16-bit rows");
  static_assert(!WGMMA_ORDER || (WRITE_X && !SPLIT_X && R == R_PAD && R % 256 == 0), "whole blocks of 16-bit rows");
  float sum = 0.0f;
  // One of the thread's groups (in ascending order: the order its row sum adds them in).
  auto convert = [&](int r0, const float (&v)[8]) {
    alignas(16) __half hi[8], lo[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float p = v[j] * lift;
      hi[j] = __float2half_rn(p);
      lo[j] = __float2half_rn(p - __half2float(hi[j]));
      if (ROW_SUMS) sum += __half2float(hi[j]);
    }
    if (WGMMA_ORDER) {
      // Positions r0 .. r0 + 7 of their block: quarter q, chunks c0 and c0 + 1.
      const int p0 = r0 & 255, q = p0 >> 6, c0 = (p0 & 63) >> 2;
      __half* const block = mat_x_scaled + (size_t)m * R_PAD + (r0 - p0);
#pragma unroll
      for (int j = 0; j < 8; j += 2)
        *reinterpret_cast<unsigned*>(block + 16 * (c0 + (j >> 2)) + 8 * ((j >> 1) & 1) + 2 * q) =
            *reinterpret_cast<const unsigned*>(hi + j);
    } else if (IMAGE_ROWS > 0) {
      *reinterpret_cast<uint4*>(mat_x_scaled + image(m, r0)) = *reinterpret_cast<const uint4*>(hi);
    } else {
      *reinterpret_cast<uint4*>(mat_x_scaled + (size_t)m * R_PAD + r0) = *reinterpret_cast<const uint4*>(hi);
    }
    if (SPLIT_X) *reinterpret_cast<uint4*>(mat_x_scaled + ((size_t)M + m) * R_PAD + r0) = *reinterpret_cast<const uint4*>(lo);
  };
  if (WRITE_X) each_group(convert);
  if (ROW_SUMS) {
    sum = trellis_cuda::warp_sum(sum);
    __syncthreads();  // every warp has read warp_fold
    if (lane == 0) warp_fold[tid >> 5] = sum;
    __syncthreads();
    if (tid < 32) {
      sum = trellis_cuda::warp_sum(lane < WARPS ? warp_fold[lane] : 0.0f);
      if (tid == 0) mat_x_sum[m] = sum;
    }
  }

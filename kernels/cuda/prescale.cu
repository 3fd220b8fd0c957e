// The down kernel's B operand ready-made: x_scaled[m, r] = f16(x[m, r] * scale[r]) for the
// down kernel's PRESCALED mode (down_mma.cu), which then streams its B tiles with cp.async
// instead of loading and converting activations in every thread block (each of a row's column
// blocks did that work again).
//
// Rows are padded with zeros to R_PAD (a multiple of 64: whole steps of any step length). With
// SPLIT_X (f32 activations) rows M..2M - 1 hold the residues f16(x * scale - hi), as the kernel
// itself splits them. The arithmetic is the kernel's own: one f32 product, rounded to f16.
//
// Thread t of grid row m converts activations [8 t, 8 t + 8) of row m: 16-byte loads where R is
// a multiple of 8 and both inputs are 16-byte aligned (then 8 activations are all in or all past
// R), one at a time otherwise; one 16-byte store per set (eight activations a thread: one was
// slower, docs/cuda-down.md). Grid [R_PAD / 8, M].
// It also zeroes the down kernel's COUNTERS fold counters (its fourth input), so that a
// prescaled call needs no launch of its own for them.
// Template ints: R, R_PAD, COUNTERS. Template bool: SPLIT_X. Template type: T (activation dtype).
  const int M = x_shape[0];
  const int r0 = 8 * (blockIdx.x * blockDim.x + threadIdx.x);
  const int m = blockIdx.y;
  if (m == 0) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < COUNTERS; i += gridDim.x * blockDim.x) counters[i] = 0u;
  }
  if (r0 >= R_PAD) return;
  constexpr int X_WORDS = 8 * (int)sizeof(T) / 16;  // 16-byte words of 8 activations
  const bool vector_loads = R % 8 == 0 && ((reinterpret_cast<size_t>(x) | reinterpret_cast<size_t>(scales)) & 15) == 0;
  alignas(16) T xs[8];
  alignas(16) __half s[8];
  if (vector_loads) {
    const bool in = r0 < R;
#pragma unroll
    for (int w = 0; w < X_WORDS; ++w)
      reinterpret_cast<uint4*>(xs)[w] = in ? reinterpret_cast<const uint4*>(x + (size_t)m * R + r0)[w] : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(s) = in ? *reinterpret_cast<const uint4*>(scales + r0) : make_uint4(0, 0, 0, 0);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      xs[j] = r0 + j < R ? x[(size_t)m * R + r0 + j] : T(0.0f);
      s[j] = r0 + j < R ? scales[r0 + j] : __half(0.0f);
    }
  }
  alignas(16) __half hi[8], lo[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float v = float(xs[j]) * __half2float(s[j]);
    hi[j] = __float2half_rn(v);
    lo[j] = __float2half_rn(v - __half2float(hi[j]));
  }
  *reinterpret_cast<uint4*>(x_scaled + (size_t)m * R_PAD + r0) = *reinterpret_cast<const uint4*>(hi);
  if (SPLIT_X) *reinterpret_cast<uint4*>(x_scaled + ((size_t)M + m) * R_PAD + r0) = *reinterpret_cast<const uint4*>(lo);

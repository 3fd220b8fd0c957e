// The coded axis's rotation in one launch (docs/format.md §10): y = x · Q or y = x · Qᵀ, with
// Q = diag(signs) · blockdiag(H_B / √B), computed in f32 whatever T is and rounded to T once.
// It replaces MLX's four kernels of the same arithmetic (a copy to f32, the signs' multiply,
// hadamard_transform, a copy back) and also pads (forward) or slices (inverse) the row:
// - forward (INVERSE false): x [M, IN_COLS = N]; y [M, OUT_COLS] holds x · Q in its first N
//   columns and zeros after (an axis-1 layer's stored columns);
// - inverse (INVERSE true): x [M, IN_COLS] (an axis-0 layer's stored outputs), of which the first
//   N columns are read; y [M, OUT_COLS = N] = x[:, :N] · Qᵀ.
// The transform of a block is the radix-2 butterfly network with strides 1, 2, …, B/2 in that
// order (hadamard.cuh), a + b and a - b in f32, then the product with the scale 1/√B (its f32 bits are
// SCALE_BITS, as the host computes it): the additions, their order and the one product are those
// of MLX's hadamard_transform on f32, so the result is the same bits as the four-kernel chain.
// Template ints: N (rotated columns, a multiple of B), B (a power of two, at most 256), IN_COLS,
// OUT_COLS, SCALE_BITS. Template bool: INVERSE. Template type: T (activation dtype).
// Grid [ceil(OUT_COLS / B) · THREADS, min(M, 65535), 1] threads, blocks of THREADS = max(B / 2, 1):
// block (c, r) transforms columns [c · B, c · B + B) of rows r, r + 65535, …
  constexpr int THREADS = B / 2 > 0 ? B / 2 : 1;
  __shared__ float buf[B];
  const int M = x_shape[0];
  const int tid = threadIdx.x;
  const int col0 = blockIdx.x * B;
  const float scale = __int_as_float(SCALE_BITS);
  for (int m = blockIdx.y; m < M; m += gridDim.y) {
    T* out = y + (size_t)m * OUT_COLS;
    if (col0 >= N) {  // the forward's zero padding (the whole block is past N: N % B == 0)
      for (int i = tid; i < B && col0 + i < OUT_COLS; i += THREADS) out[col0 + i] = static_cast<T>(0.0f);
      continue;
    }
    const T* in = x + (size_t)m * IN_COLS + col0;
    for (int i = tid; i < B; i += THREADS) {
      const float v = static_cast<float>(in[i]);
      buf[i] = INVERSE ? v : v * signs[col0 + i];
    }
    __syncthreads();
#pragma unroll
    for (int h = 1; h < B; h <<= 1) {
      trellis_cuda::butterfly_stage<B, THREADS>(buf, h, tid);
      __syncthreads();
    }
    for (int i = tid; i < B; i += THREADS) {
      const float v = buf[i] * scale;
      out[col0 + i] = static_cast<T>(INVERSE ? v * signs[col0 + i] : v);
    }
    __syncthreads();
  }

// The SwiGLU between an MLP's projections with the coded axes' rotations around it, in one
// launch (docs/format.md §10): h = silu(g · Qgᵀ) ⊙ (u · Quᵀ), then h · Qd padded with zeros.
// - g [M, SG], u [M, SU]: the gate's and the up projection's stored outputs, of which the first N
//   columns are read (an axis-0 layer's stored outputs; an axis-1 layer's logical ones, SG = N);
// - Qg, Qu: their rotations turned back (an axis-0 layer's output transform), Qd: the down
//   projection's input rotation (an axis-1 layer's input transform); each is
//   diag(signs) · blockdiag(H_B / √B) with B = BG, BU, BD, or none where that B is 0;
// - y [M, SD]: h · Qd in its first N columns and zeros after (the down projection's stored
//   columns; SD = N where it has no padding).
// It replaces up to five launches on a model's one-row path (the two inverse rotations, MLX's
// SiLU and product, the forward rotation), whose fixed costs dominate small layers
// (docs/real-models.md, "Speed"). Every step runs in f32, and y is rounded to T once (the chain of
// launches rounds to T after each); each rotation's butterflies are those of rotate.cu.
// Template ints: N, C (the chunk: a power of two dividing N and 256, a multiple of every B),
// BG, BU, BD, SG, SU, SD, and SCALE_G, SCALE_U, SCALE_D (the f32 bits of 1/√B, as the host
// computes them). Template type: T (activation dtype). The signs are f32 [N]; a missing
// rotation's input may be any array (it is not read).
// Grid [ceil(SD / C) · THREADS, min(M, 65535), 1] threads, blocks of THREADS = max(C / 2, 1):
// block (c, r) writes columns [c · C, c · C + C) of rows r, r + 65535, …
  constexpr int THREADS = C / 2 > 0 ? C / 2 : 1;
  __shared__ float bg[C];
  __shared__ float bu[C];
  const int M = g_shape[0];
  const int tid = threadIdx.x;
  const int col0 = blockIdx.x * C;
  for (int m = blockIdx.y; m < M; m += gridDim.y) {
    T* out = y + (size_t)m * SD;
    if (col0 >= N) {  // the down projection's zero padding (N % C == 0: the whole chunk is past N)
      for (int i = tid; i < C && col0 + i < SD; i += THREADS) out[col0 + i] = static_cast<T>(0.0f);
      continue;
    }
    for (int i = tid; i < C; i += THREADS) {
      bg[i] = static_cast<float>(g[(size_t)m * SG + col0 + i]);
      bu[i] = static_cast<float>(u[(size_t)m * SU + col0 + i]);
    }
    __syncthreads();
    // The butterflies of blocks of B inside the chunk (hadamard.cuh): strides 1, 2, …, B / 2.
#pragma unroll
    for (int h = 1; h < C; h <<= 1) {
      if (h < BG) trellis_cuda::butterfly_stage<C, THREADS>(bg, h, tid);
      if (h < BU) trellis_cuda::butterfly_stage<C, THREADS>(bu, h, tid);
      __syncthreads();
    }
    for (int i = tid; i < C; i += THREADS) {
      float a = bg[i], b = bu[i];
      if (BG > 0) a = a * __int_as_float(SCALE_G) * static_cast<float>(signs_g[col0 + i]);
      if (BU > 0) b = b * __int_as_float(SCALE_U) * static_cast<float>(signs_u[col0 + i]);
      const float hv = a / (1.0f + expf(-a)) * b;
      bg[i] = BD > 0 ? hv * static_cast<float>(signs_d[col0 + i]) : hv;
    }
    __syncthreads();
#pragma unroll
    for (int h = 1; h < BD; h <<= 1) {
      trellis_cuda::butterfly_stage<C, THREADS>(bg, h, tid);
      __syncthreads();
    }
    for (int i = tid; i < C; i += THREADS) {
      const float v = bg[i];
      out[col0 + i] = static_cast<T>(BD > 0 ? v * __int_as_float(SCALE_D) : v);
    }
    __syncthreads();
  }

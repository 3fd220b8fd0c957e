// The block Hadamard transform's butterflies in shared memory, shared by the rotation kernel
// (rotate.cu) and the SwiGLU with rotations (swiglu_rotate.cu): each a + b and a - b in f32, in
// the order of MLX's hadamard_transform, so both kernels give its bits.
namespace trellis_cuda {

// One stage of butterflies at stride h over buf[0, N): every pair (j, j + h) of a block of 2h
// or more once, threads tid, tid + THREADS, … each taking a pair. The caller synchronises the
// block between stages.
template <int N, int THREADS>
__device__ __forceinline__ void butterfly_stage(float* buf, int h, int tid) {
  for (int p = tid; p < N / 2; p += THREADS) {
    const int j = (p / h) * 2 * h + (p % h);
    const float a = buf[j], b = buf[j + h];
    buf[j] = a + b;
    buf[j + h] = a - b;
  }
}

}  // namespace trellis_cuda

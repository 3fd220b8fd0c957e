// The 1MAD code shared by every trellis CUDA kernel (the Metal header's twin).
//
// A state's value is y(state) / 147.800537109375, where y is the sum of the four bytes of the
// LCG step `state * 34038481 + 76625530` minus their mean 510. Kernels accumulate `float(y)` and
// fold 1/147.8... (TRELLIS_RCP) into the activation, so the weights themselves stay integers.
#pragma once

constexpr float TRELLIS_RCP = 1.0f / 147.800537109375f;

namespace trellis_cuda {

// The LCG step of the 1MAD code (its bytes sum to y + 510).
__device__ __forceinline__ unsigned lcg(unsigned state) {
  return state * 34038481u + 76625530u;
}

// The L-bit window at bit `b` of the realigned words `w` (`b` is a compile-time constant once
// the caller's loops are unrolled, so this is one shift or funnel shift and one AND).
template <int L, int NW>
__device__ __forceinline__ unsigned window(const unsigned (&w)[NW], int b) {
  const int i = b >> 5, off = b & 31;
  const unsigned mask = (1u << L) - 1u;
  if (off + L <= 32) return (w[i] >> off) & mask;
  return __funnelshift_r(w[i], w[i + 1], off) & mask;
}

}  // namespace trellis_cuda

// float(y(s)), exactly: dp4a adds the four bytes of the LCG output (at most 1020) to the bits of
// 2^23, whose mantissa then holds the byte sum; subtracting 2^23 + 510 leaves y.
__device__ __forceinline__ float trellis_y_f32(unsigned s) {
  return __uint_as_float(__dp4a(trellis_cuda::lcg(s), 0x01010101u, 0x4B000000u)) - 8389118.0f;
}

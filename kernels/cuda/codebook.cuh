// The 1MAD code shared by every trellis CUDA kernel (the Metal header's twin).
//
// A state's value is y(state) / 147.800537109375, where y is the sum of the four bytes of the
// LCG step `state * 34038481 + 76625530` minus their mean 510. Kernels accumulate `float(y)` and
// fold 1/147.8... (TRELLIS_RCP) into the activation, so the weights themselves stay integers.
#pragma once

constexpr float TRELLIS_RCP = 1.0f / 147.800537109375f;

// float(y(s)), exactly: the byte sum (at most 1020) placed in the mantissa of 2^23 and the
// offset 2^23 + 510 subtracted.
__device__ __forceinline__ float trellis_y_f32(unsigned int s) {
  const unsigned int x = s * 34038481u + 76625530u;
  const unsigned int bs = (x & 0xffu) + ((x >> 8) & 0xffu) + ((x >> 16) & 0xffu) + (x >> 24);
  return __uint_as_float(0x4B000000u | bs) - 8389118.0f;
}

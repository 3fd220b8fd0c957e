// The 1MAD code shared by every trellis Metal kernel.
//
// A state's value is y(state) / 147.800537109375, where y is the sum of the four bytes of the
// LCG step `state * 34038481 + 76625530` minus their mean 510. Kernels accumulate `float(y)` and
// fold 1/147.8... (TRELLIS_RCP) into the activation, so the weights themselves stay integers.
constant constexpr float TRELLIS_RCP = 1.0f / 147.800537109375f;

// float(y(s)), exactly: the byte sum (at most 1020) placed in the mantissa of 2^23 and the
// offset 2^23 + 510 subtracted, one integer-to-float conversion fewer than `float(bs) - 510`.
inline float trellis_y_f32(uint s) {
  const uint x = s * 34038481u + 76625530u;
  const uint bs = (x & 0xffu) + ((x >> 8) & 0xffu) + ((x >> 16) & 0xffu) + (x >> 24);
  return as_type<float>(0x4B000000u | bs) - 8389118.0f;
}

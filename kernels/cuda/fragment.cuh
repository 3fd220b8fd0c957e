// Code values decoded straight into tensor-core fragments, shared by the CUDA kernels that
// multiply trellis weights on the tensor cores (down_mma.cu, gate_up.cu, gate_up_gemm.cu), the
// asynchronous copies of those that stage activations in shared memory, and the decode-once
// GEMMs' row factors. Placed after codebook.cuh, before MLX's `namespace mlx::core::cu`.
#pragma once

namespace trellis_cuda {

// A compile-time int as a type, for generic lambdas (a matrix's bit width, a load path).
template <int V>
struct IntConstant {
  static constexpr int value = V;
};

// D += A * B on the tensor cores: m16n8k16, f16 inputs, f32 accumulators (PTX fragment layout:
// a = {(g, 2q..2q+1), (g+8, 2q..), (g, 2q+8..), (g+8, 2q+8..)}, b = {(2q.., g), (2q+8.., g)},
// d = {(g, 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1)} with g = lane / 4, q = lane % 4).
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Packs two biased f16 code values (low 16 bits each) into an f16x2 of y + 1534 (UNBIAS false)
// or of y (UNBIAS true), both exact.
template <bool UNBIAS>
__device__ __forceinline__ unsigned code_pair(unsigned biased_lo, unsigned biased_hi) {
  const unsigned biased = __byte_perm(biased_lo, biased_hi, 0x5410);
  if (!UNBIAS) return biased;
  const __half2 y = __hsub2(*reinterpret_cast<const __half2*>(&biased), __half2(__half(1534.0f), __half(1534.0f)));
  return *reinterpret_cast<const unsigned*>(&y);
}

// The f16 bit pattern of 1024 + bytesum(state * 34038481 + 76625530), in the low 16 bits: the
// byte sum (at most 1020) lands in the 10-bit mantissa of 1024, and dp4a adds the bytes and the
// exponent bits in one instruction. y(state) is this value minus 1534.
__device__ __forceinline__ unsigned y_biased_f16(unsigned state) {
  return __dp4a(lcg(state), 0x01010101u, 0x6400u);
}

// Two code values as an f16x2 register (state_lo's in the low half), see code_pair.
template <bool UNBIAS>
__device__ __forceinline__ unsigned code_pair_dp4a(unsigned state_lo, unsigned state_hi) {
  return code_pair<UNBIAS>(y_biased_f16(state_lo), y_biased_f16(state_hi));
}

// The same f16x2 as code_pair_dp4a<false> without the PRMT: the high state's byte sum, times
// 65536 by an IMAD, is the accumulator of the low state's dp4a. The PRMT issues on the ALU pipe
// and the IMAD on FMA-heavy; at one row the ALU pipe is the decode's limit, so the kernel packs
// half of its pairs this way. Each half is 0x6400 plus a byte sum of at most 1020: nothing
// carries across halves. `lift` must be 65536 but unknown to the compiler (the caller derives
// it from a run-time value): a known power of two becomes a shift and add, an LEA, which issues
// on the ALU pipe again.
__device__ __forceinline__ unsigned code_pair_dp4a_fma(unsigned state_lo, unsigned state_hi, unsigned lift) {
  const unsigned sum_hi = __dp4a(lcg(state_hi), 0x01010101u, 0u);
  return __dp4a(lcg(state_lo), 0x01010101u, sum_hi * lift + 0x64006400u);
}

// Two activations as an f16x2 B-fragment register (the first in the low half): f16 as they are,
// bf16 and f32 rounded once to f16.
__device__ __forceinline__ __half2 half2_of(__half a, __half b) {
  return __halves2half2(a, b);
}

__device__ __forceinline__ __half2 half2_of(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __float22half2_rn(__bfloat1622float2(__halves2bfloat162(a, b)));
}

__device__ __forceinline__ __half2 half2_of(float a, float b) {
  return __float22half2_rn(make_float2(a, b));
}

// Activations and activation x scale products reach the tensor cores as f16, whose range is
// 6e-8 (2^-24, subnormal below 2^-14) to 65504: real activations run from far below to far
// above it. So each activation row is brought into range first by a power of two, 2^e, chosen
// from the largest |value| the kernel will convert for that row (amax): amax * 2^e lies in
// [2^14, 2^15), so nothing overflows, not even after rounding or in an f32 hi + lo pair, and
// values down to 2^-29 of amax stay normal f16 numbers. The f32 accumulator is multiplied by
// 2^-e before it is written. Both multiplies are exact (powers of two, away from f32's own
// limits), so for activations already in f16's range the results are the bits of no prescale.
// A zero or non-finite amax gets e = 0 (a non-finite input makes its outputs non-finite either
// way); e is clamped to [-100, 100], far past f32 activations of any use (amax from 2^-86).
__device__ __forceinline__ int row_exponent(float amax) {
  if (!(amax > 0.0f) || !(amax <= 3.402823466e38f)) return 0;
  int e;
  frexpf(amax, &e);  // amax = f * 2^e, f in [0.5, 1)
  return max(-100, min(100, 15 - e));
}

// 2^e as an f32, exactly (|e| <= 126).
__device__ __forceinline__ float pow2(int e) {
  return __int_as_float((127 + e) << 23);
}

// The decode-once GEMMs' factors of their pass's `rows` activation rows from `m_base` (of M) into
// shared memory, by the thread block's THREADS threads (0 .. THREADS - 1): each row's
// 2^-e `factor` (e in x_exp, the pre-pass's power of two) and, with BIAS_FOLD, its bias 1534 x_sum
// (the pre-pass's row sum); rows past M get `factor` and 0.
template <bool BIAS_FOLD, int THREADS>
__device__ __forceinline__ void gemm_row_factors(float* unlift, float* row_bias, const __half* x_exp, const float* x_sum,
                                                 int m_base, int m_rows, int rows, float factor = 1.0f) {
  for (int i = threadIdx.x; i < rows; i += THREADS) {
    unlift[i] = m_base + i < m_rows ? pow2(-(int)__half2float(x_exp[m_base + i])) * factor : factor;
    if (BIAS_FOLD) row_bias[i] = m_base + i < m_rows ? 1534.0f * x_sum[m_base + i] : 0.0f;
  }
}

// The largest value of `v` over the 32 lanes of a warp.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sum of `v` over the 32 lanes of a warp.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 16-byte asynchronous copy global -> shared (Ampere and later) with a source size of 16 or 0
// bytes: 0 reads nothing and zero-fills (activation rows past the last); and its group
// bookkeeping.
// `_at` takes a shared-window address (from __cvta_generic_to_shared) the caller keeps.
__device__ __forceinline__ void cp_async16_zfill_at(unsigned smem, const void* gmem, bool read) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(read ? 16 : 0));
}
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool read) {
  cp_async16_zfill_at(static_cast<unsigned>(__cvta_generic_to_shared(smem)), gmem, read);
}

// 8-byte asynchronous copy global -> shared at a shared-window address, zero-filled where
// `read` is false: for rows of code words that are not whole 16-byte words (a 192-weight 3-bit
// block's 18 words).
__device__ __forceinline__ void cp_async8_zfill_at(unsigned smem, const void* gmem, bool read) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem), "l"(gmem), "r"(read ? 8 : 0));
}

// 4-byte asynchronous copy global -> shared: unlike a load into a register, no later barrier or
// fence waits for it (only cp_async_wait does).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// cp_async_wait for a thread that reads its own copies with no barrier after the wait: the
// "memory" clobber keeps the compiler from moving those reads above it.
template <int N>
__device__ __forceinline__ void cp_async_wait_own() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace trellis_cuda

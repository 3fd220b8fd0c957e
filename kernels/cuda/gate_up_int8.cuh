// Helpers of the int8-activation axis-1 kernel (gate_up_int8.cu). Placed after codebook.cuh,
// before MLX's `namespace mlx::core::cu`, so everything here lives in `trellis_cuda`.
#pragma once

namespace trellis_cuda {

// D += A * B on the tensor cores: m16n8k32, A unsigned bytes, B signed bytes, s32 accumulators
// (PTX fragment layout: a = {(g, 4q..4q+3), (g+8, 4q..), (g, 16+4q..), (g+8, 16+4q..)},
// b = {(4q..4q+3, g), (16+4q.., g)}, d = {(g, 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1)} with
// g = lane / 4, q = lane % 4). Each A register is one LCG output (four k-columns of one row:
// the weight's bytes) and each B register one activation in all four bytes, so the MMA adds
// bytesum * q over eight weights of each of 16 rows for 8 activation rows at once.
__device__ __forceinline__ void mma_u8s8(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace trellis_cuda

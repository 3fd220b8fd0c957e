// What the axis-1 kernels (gate_up.cu, gate_up_int8.cu, gate_up_gemm.cu, gate_up_wgmma.cu,
// gate_up_ws.cu) share: the code words a lane reads, their decode into an MMA's A fragment (all but
// the int8 kernel), the GEMMs' outputs and the fused MLP's SwiGLU. Placed after codebook.cuh and
// fragment.cuh, before MLX's `namespace mlx::core::cu`.
#pragma once

namespace trellis_cuda {

// A lane's runs of code words. Lane 4 g + q of a warp decodes positions [64 q, 64 q + 64) of
// output rows row0 + 16 t + g + 8 h (tile t < RT, half h) of each matrix a < NMAT (K bits a
// weight for a = 0, KU for a = 1); those rows past the last read the last row. Its run of a block
// of k-bit codes (8 k words) is 64 k bits plus the L - k bits of its last window: the 2 k words
// from word 2 k (3 - q) (even, so 8-byte aligned, read in pairs), then the word after them,
// which wraps to word 0 where q = 0. A matrix narrower than the widest leaves its last entries
// of a run unused.
template <int NMAT, int RT, int K, int KU>
struct LaneRuns {
  static constexpr int K_MAX = K > KU ? K : KU;
  static constexpr int RUN = 2 * K_MAX + 1;  // words of a run (the widest matrix's)
  using Runs = unsigned[NMAT][RT][2][RUN];

  static constexpr __device__ int k_of(int a) { return a == 0 ? K : KU; }

  // Each row's first word as an offset into its matrix (the host keeps a matrix's words below
  // 2^32): 32-bit offsets and the matrices' pointers, which stay kernel parameters, instead of a
  // 64-bit pointer a row, which ptxas rebuilt at every block for want of registers.
  const unsigned* const* mats;
  unsigned rows[NMAT][RT][2];
  unsigned first[NMAT], last[NMAT];

  // `mats`: each matrix's codes [out, nb * 8 k] words.
  __device__ __forceinline__ LaneRuns(const unsigned* const (&mats)[NMAT], int row0, int out, int nb, int lane)
      : mats(mats) {
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int a = 0; a < NMAT; ++a) {
#pragma unroll
      for (int t = 0; t < RT; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const unsigned o = min(row0 + 16 * t + 8 * h + g, out - 1);
          rows[a][t][h] = o * (unsigned)(nb * 8 * k_of(a));  // words per row
        }
      first[a] = 2 * k_of(a) * (3 - q);
      last[a] = q == 0 ? 0 : first[a] + 2 * k_of(a);
    }
  }

  // Words [from_k * k + from_plus, to_k * k + to_plus] (inclusive) of the lane's runs of block b
  // of every row into `w`, each matrix's range in terms of its own k (word 2 k is the run's last,
  // which wraps to the block's word 0 where q = 0). Even-aligned pairs below word 2 k are read as
  // one 8-byte load, like `load`.
  __device__ __forceinline__ void load_words(int b, Runs& w, int from_k, int from_plus, int to_k, int to_plus) const {
#pragma unroll
    for (int a = 0; a < NMAT; ++a) {
      const int ka = k_of(a), from = from_k * ka + from_plus, to = to_k * ka + to_plus;
#pragma unroll
      for (int t = 0; t < RT; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const unsigned blk_at = rows[a][t][h] + (unsigned)b * (8 * ka);
          const unsigned* const run = mats[a] + (blk_at + first[a]);  // word i at run + i
#pragma unroll
          for (int i = 0; i < RUN; ++i) {
            const bool paired_with_before = (i & 1) == 1 && i - 1 >= from;  // read with word i - 1
            if (i < from || i > to || i > 2 * ka || paired_with_before) continue;
            if (i == 2 * ka) {
              w[a][t][h][i] = mats[a][blk_at + last[a]];
            } else if ((i & 1) == 0 && i + 1 <= to && i + 1 < 2 * ka) {
              const uint2 v = *reinterpret_cast<const uint2*>(run + i);
              w[a][t][h][i] = v.x, w[a][t][h][i + 1] = v.y;
            } else {
              w[a][t][h][i] = run[i];
            }
          }
        }
    }
  }

  // The lane's runs of block b of every row into `w`.
  __device__ __forceinline__ void load(int b, Runs& w) const { load_words(b, w, 0, 0, 2, 0); }
};

// The A fragment of chunk c (0..15) of a lane's block of one matrix of k-bit codes, from its runs
// of rows g (`lo`) and g + 8 (`hi`): k-columns 2q, 2q + 1, 2q + 8, 2q + 9 of the chunk are
// positions 64 q + 4 c + 0..3, whose windows start at run bits (63 - 4 c - j) k. The code values
// are y (UNBIAS) or y + 1534 (fragment.cuh's code_pair); with PACK_FMA (biased only) the pairs of
// `hi` are packed by an IMAD instead of a PRMT (code_pair_dp4a_fma, `lift` 65536).
template <int L, bool UNBIAS, bool PACK_FMA, int RUN>
__device__ __forceinline__ void chunk_fragment(const unsigned (&lo)[RUN], const unsigned (&hi)[RUN], int k, int c,
                                               unsigned lift, unsigned (&f)[4]) {
  static_assert(!(PACK_FMA && UNBIAS), "PACK_FMA packs the biased pairs");
  const int b0 = (63 - 4 * c) * k, b1 = b0 - k, b2 = b0 - 2 * k, b3 = b0 - 3 * k;
  f[0] = code_pair_dp4a<UNBIAS>(window<L>(lo, b0), window<L>(lo, b1));
  f[2] = code_pair_dp4a<UNBIAS>(window<L>(lo, b2), window<L>(lo, b3));
  f[1] = PACK_FMA ? code_pair_dp4a_fma(window<L>(hi, b0), window<L>(hi, b1), lift)
                  : code_pair_dp4a<UNBIAS>(window<L>(hi, b0), window<L>(hi, b1));
  f[3] = PACK_FMA ? code_pair_dp4a_fma(window<L>(hi, b2), window<L>(hi, b3), lift)
                  : code_pair_dp4a<UNBIAS>(window<L>(hi, b2), window<L>(hi, b3));
}

// The decode-once GEMMs' outputs (gate_up_gemm.cu, gate_up_wgmma.cu) from a warp's accumulators
// of its 16-row output tile from `row0` and the pass's 8 MT activation rows from `m_base`: d[e] of
// tile t is output row row0 + g + 8 (e >> 1), activation row m_base + 8 t + 2 q + (e & 1). Each is
// less its row's bias (BIAS_FOLD: `row_bias`, the 1534 x_sum of the pass's rows), times its
// matrix's scale / 147.8 and its row's factor (`unlift`, the pass's 2^-e); `write(m, o, v)` gets
// the NMAT values of each output inside [M, OUT] (the variant's SwiGLU, residual and store).
template <int NMAT, int MT, bool BIAS_FOLD, typename Write>
__device__ __forceinline__ void gemm_outputs(const float (&acc)[NMAT][MT][4], const __half* const (&scales)[NMAT],
                                             int row0, int out, int m_base, int m_rows, const float* unlift,
                                             const float* row_bias, int lane, Write write) {
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int o = row0 + g + 8 * (e >> 1);
    if (o >= out) continue;
    float s[NMAT];
#pragma unroll
    for (int a = 0; a < NMAT; ++a) s[a] = __half2float(scales[a][o]) * TRELLIS_RCP;
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      const int i = 8 * t + 2 * q + (e & 1);
      const int m = m_base + i;
      if (m >= m_rows) continue;
      float v[NMAT];
#pragma unroll
      for (int a = 0; a < NMAT; ++a) v[a] = (acc[a][t][e] - (BIAS_FOLD ? row_bias[i] : 0.0f)) * s[a] * unlift[i];
      write(m, o, v);
    }
  }
}

// gemm_outputs for a warp that runs alone on its scheduler (the warp-specialized GEMM's consumer,
// gate_up_ws.cu): every output's value first, without a branch, in place of its first matrix's
// accumulator (`value(v)`: the variant's SwiGLU), then the stores of those inside [M, OUT]
// (`store(m, o, y)`). Outputs past OUT read row OUT - 1's scale and rows past M the pass's zeros,
// and neither is stored. With a branch around each output, as gemm_outputs has, each output's
// chain of about 14 dependent instructions (two MUFU among them) ran on its own, and the tile's
// writes took half of the consumer's epilogue samples at 128 rows (docs/cuda-mlp.md).
template <int NMAT, int MT, bool BIAS_FOLD, typename Value, typename Store>
__device__ __forceinline__ void gemm_outputs_batched(float (&acc)[NMAT][MT][4], const __half* const (&scales)[NMAT],
                                                     int row0, int out, int m_base, int m_rows, const float* unlift,
                                                     const float* row_bias, int lane, Value value, Store store) {
  const int g = lane >> 2, q = lane & 3;
  float s[2][NMAT];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int a = 0; a < NMAT; ++a) s[h][a] = __half2float(scales[a][min(row0 + g + 8 * h, out - 1)]) * TRELLIS_RCP;
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    const float2 lift = *reinterpret_cast<const float2*>(unlift + 8 * t + 2 * q);
    const float2 bias = BIAS_FOLD ? *reinterpret_cast<const float2*>(row_bias + 8 * t + 2 * q) : make_float2(0.0f, 0.0f);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v[NMAT];
#pragma unroll
      for (int a = 0; a < NMAT; ++a)
        v[a] = (acc[a][t][e] - ((e & 1) ? bias.y : bias.x)) * s[e >> 1][a] * ((e & 1) ? lift.y : lift.x);
      acc[0][t][e] = value(v);
    }
  }
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int o = row0 + g + 8 * (e >> 1), m = m_base + 8 * t + 2 * q + (e & 1);
      if (o < out && m < m_rows) store(m, o, acc[0][t][e]);
    }
}

// One output of the fused MLP, silu(gate) * up in f32. __fdividef is one reciprocal and a
// multiply; `/` is IEEE division, whose range check sent nearly every warp's outputs to its slow
// path (a call): that subroutine alone took 38 % of the warp-specialized GEMM's epilogue samples
// at 128 rows (docs/cuda-mlp.md). Its 2 ulp are far inside the gates. Where the denominator
// passes 2^126 (gate below about -87.3, where |silu| < 1e-36) the quotient is 0; a non-finite
// gate gives what `/` gives.
__device__ __forceinline__ float silu_times(float gate, float up) {
  return __fdividef(gate, 1.0f + __expf(-gate)) * up;
}

}  // namespace trellis_cuda

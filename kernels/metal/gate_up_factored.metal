// Gate/up projections (axis 1) over row-major trellis codes [R, C*K/32] (R output rows, C
// inputs), 1..8 activation rows, with the 1MAD arithmetic: y[m, o] = scale[o] * (1/147.8) *
// sum_i x[m, i] * y(state(o, i)), the scale and 1/147.8 folded in once per output. The reduction
// runs along one stored row, so a SIMD group owns NR output rows and walks their blocks: lane l
// owns bit-order positions 8l..8l+7 of every 256-weight block (bits [8K*l, 8K*l + 8K), two
// adjacent words; all 32 lanes busy for every K), its 8 activations loaded once per block for
// the NR rows. One simd_sum per output folds the lanes and lane r*M + m writes it in the
// activation dtype: no partials, no MLX fold. Rows past R re-read the last row and are not
// written.
//
// Bodies of MLX custom Metal kernels (mx.fast.metal_kernel): MLX writes the signature. Inputs
// x (T [M, C]), codes (uint32 [R, C*K/32]), scales (half [R]); output out (T [M, R]). Header:
// codebook.h + gate_up.h. Template ints R, C, K, L, SG_TG (4), NR, M (ROWS only) and KU (the
// fused variant only); template type T. Grid [32*SG_TG, ceil(ceil(R / NR) / SG_TG), 1] threads, threadgroup [32*SG_TG, 1, 1].
// Needs T 256, K 2..4, L <= 16, NR * M <= 32.
//
// Two kernels, one section each (a `// ---- kernel NAME ----` line starts a body): ROW, one
// activation row; ROWS, M (2..8) rows sharing each decoded weight. Each has two variants, cut
// at registration (`#if SWIGLU`): a gate or up projection alone, and the fused gate·up·SwiGLU
// (inputs x, codes, scales, up_codes, up_scales: codes/scales are the gate's; both code
// tensors read for the same output rows, out = silu(gate) * up). The fused variant takes the
// up projection's bits per weight as its own template int KU (K is the gate's): artifacts that
// allocate bits per tensor give gate and up different widths of the same rows and inputs, and
// the up codes' words per block, the lane's word and offset follow KU.
// ---- kernel ROW ----
  const uint lane = thread_index_in_simdgroup;
  const uint o0 = (threadgroup_position_in_grid.y * (uint)SG_TG + simdgroup_index_in_threadgroup) * (uint)NR;
  // A SIMD group past the last output row leaves as a whole (no collective is split).
  if (o0 >= (uint)R) return;
  const uint wpb = 8u * (uint)K;
  const uint nBlocks = (uint)C / 256u;
  const ulong rowWords = (ulong)nBlocks * wpb;
  const uint bit0 = lane * 8u * (uint)K;
  const uint wi = bit0 >> 5, off = bit0 & 31u;
  const uint next = (wi + 1u == wpb) ? 0u : wi + 1u;
  const device uint32_t* rowCodes[NR];
#if SWIGLU
  // The up codes' block geometry at their own width KU.
  const uint upWpb = 8u * (uint)KU;
  const ulong upRowWords = (ulong)nBlocks * upWpb;
  const uint upBit0 = lane * 8u * (uint)KU;
  const uint upWi = upBit0 >> 5, upOff = upBit0 & 31u;
  const uint upNext = (upWi + 1u == upWpb) ? 0u : upWi + 1u;
  const device uint32_t* upCodes[NR];
  float accUp[NR];
#endif
  float acc[NR];
  #pragma clang loop unroll(full)
  for (uint r = 0; r < (uint)NR; ++r) {
    const uint row = metal::min(o0 + r, (uint)R - 1u);
    rowCodes[r] = codes + (ulong)row * rowWords;
    acc[r] = 0.0f;
#if SWIGLU
    upCodes[r] = up_codes + (ulong)row * upRowWords;
    accUp[r] = 0.0f;
#endif
  }
  // Bit-order position i of the lane is input 256*b + 255 - 8*lane - i.
  const device T* xl = x + 255u - 8u * lane;
  for (uint b = 0; b < nBlocks; ++b, xl += 256) {
    float xv[8];
    #pragma clang loop unroll(full)
    for (uint i = 0; i < 8u; ++i) xv[i] = float(xl[-(int)i]);
    const uint w0 = b * wpb + wi, w1 = b * wpb + next;
#if SWIGLU
    const uint u0 = b * upWpb + upWi, u1 = b * upWpb + upNext;
#endif
    #pragma clang loop unroll(full)
    for (uint r = 0; r < (uint)NR; ++r) {
      float yv[8];
      lane_codes<K, L>(rowCodes[r][w0], rowCodes[r][w1], off, yv);
      #pragma clang loop unroll(full)
      for (uint i = 0; i < 8u; ++i) acc[r] = metal::fma(yv[i], xv[i], acc[r]);
#if SWIGLU
      lane_codes<KU, L>(upCodes[r][u0], upCodes[r][u1], upOff, yv);
      #pragma clang loop unroll(full)
      for (uint i = 0; i < 8u; ++i) accUp[r] = metal::fma(yv[i], xv[i], accUp[r]);
#endif
    }
  }
  #pragma clang loop unroll(full)
  for (uint r = 0; r < (uint)NR; ++r) {
    const float g = metal::simd_sum(acc[r]);
#if SWIGLU
    const float u = metal::simd_sum(accUp[r]);
#endif
    const uint o = o0 + r;
    if (lane == r && o < (uint)R) {
#if SWIGLU
      const float gv = g * (float(scales[o]) * TRELLIS_RCP);
      out[o] = T(trellis_silu(gv) * (u * (float(up_scales[o]) * TRELLIS_RCP)));
#else
      out[o] = T(g * (float(scales[o]) * TRELLIS_RCP));
#endif
    }
  }
// ---- kernel ROWS ----
  const uint lane = thread_index_in_simdgroup;
  const uint o0 = (threadgroup_position_in_grid.y * (uint)SG_TG + simdgroup_index_in_threadgroup) * (uint)NR;
  // A SIMD group past the last output row leaves as a whole (no collective is split).
  if (o0 >= (uint)R) return;
  const uint wpb = 8u * (uint)K;
  const uint nBlocks = (uint)C / 256u;
  const ulong rowWords = (ulong)nBlocks * wpb;
  const uint bit0 = lane * 8u * (uint)K;
  const uint wi = bit0 >> 5, off = bit0 & 31u;
  const uint next = (wi + 1u == wpb) ? 0u : wi + 1u;
  const device uint32_t* rowCodes[NR];
#if SWIGLU
  // The up codes' block geometry at their own width KU.
  const uint upWpb = 8u * (uint)KU;
  const ulong upRowWords = (ulong)nBlocks * upWpb;
  const uint upBit0 = lane * 8u * (uint)KU;
  const uint upWi = upBit0 >> 5, upOff = upBit0 & 31u;
  const uint upNext = (upWi + 1u == upWpb) ? 0u : upWi + 1u;
  const device uint32_t* upCodes[NR];
  float accUp[NR][M];
#endif
  float acc[NR][M];
  #pragma clang loop unroll(full)
  for (uint r = 0; r < (uint)NR; ++r) {
    const uint row = metal::min(o0 + r, (uint)R - 1u);
    rowCodes[r] = codes + (ulong)row * rowWords;
#if SWIGLU
    upCodes[r] = up_codes + (ulong)row * upRowWords;
#endif
    #pragma clang loop unroll(full)
    for (uint m = 0; m < (uint)M; ++m) {
      acc[r][m] = 0.0f;
#if SWIGLU
      accUp[r][m] = 0.0f;
#endif
    }
  }
  // Bit-order position i of the lane is input 256*b + 255 - 8*lane - i.
  const device T* xl = x + 255u - 8u * lane;
  for (uint b = 0; b < nBlocks; ++b, xl += 256) {
    const uint w0 = b * wpb + wi, w1 = b * wpb + next;
#if SWIGLU
    const uint u0 = b * upWpb + upWi, u1 = b * upWpb + upNext;
#endif
    // Every weight decoded once, then multiplied by each activation row's value.
    float yv[NR][8];
    #pragma clang loop unroll(full)
    for (uint r = 0; r < (uint)NR; ++r) lane_codes<K, L>(rowCodes[r][w0], rowCodes[r][w1], off, yv[r]);
#if SWIGLU
    float yu[NR][8];
    #pragma clang loop unroll(full)
    for (uint r = 0; r < (uint)NR; ++r) lane_codes<KU, L>(upCodes[r][u0], upCodes[r][u1], upOff, yu[r]);
#endif
    #pragma clang loop unroll(full)
    for (uint m = 0; m < (uint)M; ++m) {
      const device T* xr = xl + (ulong)m * (ulong)C;
      #pragma clang loop unroll(full)
      for (uint i = 0; i < 8u; ++i) {
        const float xi = float(xr[-(int)i]);
        #pragma clang loop unroll(full)
        for (uint r = 0; r < (uint)NR; ++r) {
          acc[r][m] = metal::fma(yv[r][i], xi, acc[r][m]);
#if SWIGLU
          accUp[r][m] = metal::fma(yu[r][i], xi, accUp[r][m]);
#endif
        }
      }
    }
  }
  #pragma clang loop unroll(full)
  for (uint r = 0; r < (uint)NR; ++r) {
    const uint o = o0 + r;
    const float sg = o < (uint)R ? float(scales[o]) * TRELLIS_RCP : 0.0f;
#if SWIGLU
    const float su = o < (uint)R ? float(up_scales[o]) * TRELLIS_RCP : 0.0f;
#endif
    #pragma clang loop unroll(full)
    for (uint m = 0; m < (uint)M; ++m) {
      const float g = metal::simd_sum(acc[r][m]);
#if SWIGLU
      const float u = metal::simd_sum(accUp[r][m]);
#endif
      if (lane == r * (uint)M + m && o < (uint)R) {
#if SWIGLU
        out[(ulong)m * (ulong)R + o] = T(trellis_silu(g * sg) * (u * su));
#else
        out[(ulong)m * (ulong)R + o] = T(g * sg);
#endif
      }
    }
  }

// Gate/up projections (axis 1) on the simdgroup matrix unit for any number of activation rows,
// over row-major trellis codes [R, C*K/32] (R output rows, C inputs). The product is taken
// transposed, out^T [R, M] = W [R, C] * x^T [C, M], so that a lane's A fragment (weights) is one
// output row: A is 8 output rows x 8 positions, B 8 positions x 8 activation rows, C 8 output
// rows x 8 activation rows. A 256-weight block is walked in 4 chunks of 64 bit-order positions
// and 8 steps; at step s the MMA's reduction entry j is chunk position 8j + s, so lane l (fragment
// row fm, columns fn and fn + 1) holds row fm's chunk positions 8fn + s and 8fn + 8 + s: its 16
// positions of a chunk are contiguous, one realigned bit window per row and chunk (as in
// down_mma_wide, whose block_state reads it). Each code value y comes from a threadgroup half
// table of the 2^L values (exact in half) generated once per threadgroup, as in down_mma_wide.
// A SIMD group owns NT tiles of 8 output rows; each B fragment (activations, read from device
// memory and converted to f32) feeds an MMA per tile and each A fragment one per block of 8
// activation rows (MT of them); grid z walks passes of 8*MT rows. The scale and 1/147.8 are
// folded in once per output and the output written in the activation dtype: no partials, no MLX
// fold. Output rows past R re-read the last row, activation rows past M the last row; neither is
// written. The row count is read at run time (x_shape[0]).
//
// The body of an MLX custom Metal kernel (mx.fast.metal_kernel): MLX writes the signature.
// Inputs x (T [M, C]), codes (uint32 [R, C*K/32]), scales (half [R]); output out (T [M, R]).
// Header: codebook.h + down_mma_wide_state.h + gate_up.h. Template ints R, C, K, L, SG_TG (4),
// NT, MT, NW (= ceil((15*K + L) / 32): the realigned words a lane's 16 positions and the last
// one's window span); template type T. Grid [32*SG_TG, ceil(ceil(R / 8) / (NT*SG_TG)),
// ceil(M / (8*MT))] threads, threadgroup [32*SG_TG, 1, 1]. Needs T 256, K 2..4, L <= 12.
//
// Two variants, cut at registration (`#if SWIGLU`): a gate or up projection alone, and the fused
// gate·up·SwiGLU (inputs x, codes, scales, up_codes, up_scales: codes/scales are the gate's;
// both code tensors read for the same output rows, out = silu(gate) * up). The fused variant
// takes the up projection's bits per weight KU and window words NWU (ceil((15*KU + L) / 32)) as
// template ints of their own: gate and up may have different widths of the same rows and inputs
// (artifacts that allocate bits per tensor); the half table of code values serves both, one L.
  const uint M = (uint)x_shape[0];
  const uint lane = thread_index_in_simdgroup;
  threadgroup half codebook[1 << L];
  for (uint i = simdgroup_index_in_threadgroup * 32u + lane; i < (1u << (uint)L); i += 32u * (uint)SG_TG)
    codebook[i] = half(trellis_y_f32(i));
  threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  const uint tile0 = (threadgroup_position_in_grid.y * (uint)SG_TG + simdgroup_index_in_threadgroup) * (uint)NT;
  // A SIMD group past the last output row leaves as a whole, after the table's one barrier.
  if (tile0 * 8u >= (uint)R) return;
  const uint fm = ((lane / 4u) & 4u) + ((lane / 2u) % 4u);
  const uint fn = ((lane / 4u) & 2u) * 2u + (lane % 2u) * 2u;
  const uint wpb = 8u * (uint)K;
  const uint nBlocks = (uint)C / 256u;
  const ulong rowWords = (ulong)nBlocks * wpb;
  // The lane's window in a chunk starts at bit 8*fn*K: word wLane, offset off0 (the same in
  // every chunk, chunks being 64K bits, whole words).
  const uint bitLane = 8u * fn * (uint)K;
  const uint wLane = bitLane >> 5, off0 = bitLane & 31u;
  const device uint32_t* rowCodes[NT];
#if SWIGLU
  // The up codes' geometry at their own width KU.
  const uint upWpb = 8u * (uint)KU;
  const ulong upRowWords = (ulong)nBlocks * upWpb;
  const uint upBitLane = 8u * fn * (uint)KU;
  const uint upWLane = upBitLane >> 5, upOff0 = upBitLane & 31u;
  const device uint32_t* upCodes[NT];
#endif
  #pragma clang loop unroll(full)
  for (uint t = 0; t < (uint)NT; ++t) {
    const uint row = metal::min(8u * (tile0 + t) + fm, (uint)R - 1u);
    rowCodes[t] = codes + (ulong)row * rowWords;
#if SWIGLU
    upCodes[t] = up_codes + (ulong)row * upRowWords;
#endif
  }
  const uint mBase = threadgroup_position_in_grid.z * 8u * (uint)MT;
  // B fragment columns fn and fn + 1: activation rows mBase + 8*bk + fn (+ 1).
  const device T* xa[MT];
  const device T* xb[MT];
  metal::simdgroup_float8x8 acc[NT][MT];
#if SWIGLU
  metal::simdgroup_float8x8 accUp[NT][MT];
#endif
  #pragma clang loop unroll(full)
  for (uint bk = 0; bk < (uint)MT; ++bk) {
    const uint m = mBase + 8u * bk + fn;
    xa[bk] = x + (ulong)metal::min(m, M - 1u) * (ulong)C;
    xb[bk] = x + (ulong)metal::min(m + 1u, M - 1u) * (ulong)C;
    #pragma clang loop unroll(full)
    for (uint t = 0; t < (uint)NT; ++t) {
      acc[t][bk] = metal::make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
#if SWIGLU
      accUp[t][bk] = metal::make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
#endif
    }
  }
  for (uint b = 0; b < nBlocks; ++b) {
    for (uint c = 0; c < 4u; ++c) {
      // The window's words in the block (past its last word they wrap to its first).
      uint wordAt[NW + 1];
      #pragma clang loop unroll(full)
      for (uint i = 0; i <= (uint)NW; ++i) {
        const uint wi = wLane + 2u * c * (uint)K + i;
        wordAt[i] = b * wpb + (wi >= wpb ? wi - wpb : wi);
      }
      uint w[NT][NW], v[NT][NW];
#if SWIGLU
      uint upWordAt[NWU + 1];
      #pragma clang loop unroll(full)
      for (uint i = 0; i <= (uint)NWU; ++i) {
        const uint wi = upWLane + 2u * c * (uint)KU + i;
        upWordAt[i] = b * upWpb + (wi >= upWpb ? wi - upWpb : wi);
      }
      uint wu[NT][NWU], vu[NT][NWU];
#endif
      #pragma clang loop unroll(full)
      for (uint t = 0; t < (uint)NT; ++t) {
        realign_window<NW>(rowCodes[t], wordAt, off0, w[t], v[t]);
#if SWIGLU
        realign_window<NWU>(upCodes[t], upWordAt, upOff0, wu[t], vu[t]);
#endif
      }
      // B entry fm at step s is chunk position 8*fm + s: input 256*b + 255 - 64*c - 8*fm - s.
      const uint col0 = b * 256u + 255u - 64u * c - 8u * fm;
      #pragma clang loop unroll(full)
      for (uint s = 0; s < 8u; ++s) {
        metal::simdgroup_float8x8 bx[MT];
        #pragma clang loop unroll(full)
        for (uint bk = 0; bk < (uint)MT; ++bk) {
          bx[bk].thread_elements()[0] = float(xa[bk][col0 - s]);
          bx[bk].thread_elements()[1] = float(xb[bk][col0 - s]);
        }
        #pragma clang loop unroll(full)
        for (uint t = 0; t < (uint)NT; ++t) {
          metal::simdgroup_half8x8 a;
          a.thread_elements()[0] = codebook[block_state<K, L>(w[t], v[t], s)];
          a.thread_elements()[1] = codebook[block_state<K, L>(w[t], v[t], s + 8u)];
          #pragma clang loop unroll(full)
          for (uint bk = 0; bk < (uint)MT; ++bk)
            metal::simdgroup_multiply_accumulate(acc[t][bk], a, bx[bk], acc[t][bk]);
#if SWIGLU
          a.thread_elements()[0] = codebook[block_state<KU, L>(wu[t], vu[t], s)];
          a.thread_elements()[1] = codebook[block_state<KU, L>(wu[t], vu[t], s + 8u)];
          #pragma clang loop unroll(full)
          for (uint bk = 0; bk < (uint)MT; ++bk)
            metal::simdgroup_multiply_accumulate(accUp[t][bk], a, bx[bk], accUp[t][bk]);
#endif
        }
      }
    }
  }
  // C fragment (fm, fn), (fm, fn + 1): output row 8*tile + fm of activation rows m, m + 1.
  #pragma clang loop unroll(full)
  for (uint t = 0; t < (uint)NT; ++t) {
    const uint o = 8u * (tile0 + t) + fm;
    if (o >= (uint)R) continue;
    const float sg = float(scales[o]) * TRELLIS_RCP;
#if SWIGLU
    const float su = float(up_scales[o]) * TRELLIS_RCP;
#endif
    #pragma clang loop unroll(full)
    for (uint bk = 0; bk < (uint)MT; ++bk) {
      const uint m = mBase + 8u * bk + fn;
      #pragma clang loop unroll(full)
      for (uint e = 0; e < 2u; ++e) {
        if (m + e >= M) continue;
#if SWIGLU
        const float g = acc[t][bk].thread_elements()[e] * sg;
        out[(ulong)(m + e) * (ulong)R + o] = T(trellis_silu(g) * (accUp[t][bk].thread_elements()[e] * su));
#else
        out[(ulong)(m + e) * (ulong)R + o] = T(acc[t][bk].thread_elements()[e] * sg);
#endif
      }
    }
  }

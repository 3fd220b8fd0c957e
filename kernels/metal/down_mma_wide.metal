// Down projection on the simdgroup matrix unit for any number of activation rows: down_mma's
// splits and accumulation (each output row bit for bit the same), with every decoded B fragment
// feeding an MMA for MT blocks of 8 rows; grid z walks chunks of 8*MT rows. A SIMD group's S
// sub-tiles and MT follow the layout and the rows (the Rust `plan`): neither changes a sum. Each
// code value y is read from a half table of the 2^L values (exact in half) that the threadgroup
// generates once, in place of the 1MAD arithmetic; a window is one bit-field extract (one that
// straddles a word reads a virtual word: the high half of one word and the low half of the next)
// and the B fragments are half. Input rows come in whole steps of 8 (R a multiple of 8, so is
// every split's); activation rows past M repeat the last row and are not written. The row count
// is read at run time (x_shape[0]; one pipeline per geometry and pass). SPLITS f32 partials
// [M, SPLITS, C] fold in one MLX sum. One body, two kernels (template int INTERLEAVE): row-major
// codes [rows, cols*K/32] and the 3-bit block interleave [cols/512, rows, 48].
//
// The body of an MLX custom Metal kernel (mx.fast.metal_kernel): MLX writes the signature.
// Inputs x (T [M, R]), codes (uint32), scales (half [R]); output partial (float [M, SPLITS, C]).
// Header: codebook.h + down_mma_wide_state.h. Template ints R, C, K, L, SPLITS (8), SG_TG (4),
// INTERLEAVE, MT, S, NW (= ceil((2*S*K + L - 1) / 32) + 1), BLOCK_LEN; template type T. Grid
// [32*SG_TG, ceil(nGroups*SPLITS / SG_TG), ceil(M / (8*MT))] threads with
// nGroups = (C/BLOCK_LEN) * (BLOCK_LEN/(8*S)), threadgroup [32*SG_TG, 1, 1]. Needs axis 0,
// C % BLOCK_LEN == 0, 8*S dividing BLOCK_LEN, R % 8 == 0, L <= 12.
// BLOCK_LEN (the coded block's T) is this crate's template int where the seed has 256 (see
// down_mma.metal); at 256 it is the seed's kernel.
  const uint M = (uint)x_shape[0];
  const uint lane = thread_index_in_simdgroup;
  threadgroup half codebook[1 << L];
  for (uint i = simdgroup_index_in_threadgroup * 32u + lane; i < (1u << (uint)L); i += 32u * (uint)SG_TG)
    codebook[i] = half(trellis_y_f32(i));
  threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  const uint id = threadgroup_position_in_grid.y * (uint)SG_TG + simdgroup_index_in_threadgroup;
  const uint groupsPerBlock = (uint)BLOCK_LEN / (8u * (uint)S);
  const uint nGroups = ((uint)C / (uint)BLOCK_LEN) * groupsPerBlock;
  if (id >= nGroups * (uint)SPLITS) return;
  const uint cg = id % nGroups, split = id / nGroups;
  const uint block = cg / groupsPerBlock, pg = (cg % groupsPerBlock) * 8u * (uint)S;
  const uint fm = ((lane / 4u) & 4u) + ((lane / 2u) % 4u);
  const uint fn = ((lane / 4u) & 2u) * 2u + (lane % 2u) * 2u;
  const uint wpb = (uint)BLOCK_LEN * (uint)K / 32u;
  const ulong rowWords = (ulong)(INTERLEAVE ? 2u : (uint)C / (uint)BLOCK_LEN) * wpb;
  const device uint32_t* words = codes + (INTERLEAVE
    ? (ulong)(block / 2u) * (ulong)R * 2u * wpb + (block % 2u) * wpb : (ulong)block * wpb);
  // This lane's 2S positions start at p0; realign its bit window to bit 0.
  const uint p0 = pg + (uint)S * fn;
  const uint bit0 = p0 * (uint)K, w0 = bit0 >> 5, off0 = bit0 & 31u;
  const uint mBase = threadgroup_position_in_grid.z * 8u * (uint)MT;
  const uint rowsPer = (((uint)R + (uint)SPLITS - 1u) / (uint)SPLITS + 7u) & ~7u;
  const uint r0 = split * rowsPer;
  const uint r1 = metal::min((uint)R, r0 + rowsPer);
  const device T* xm[MT];
  metal::simdgroup_float8x8 acc[S][MT];
  #pragma clang loop unroll(full)
  for (uint bk = 0; bk < (uint)MT; ++bk) {
    xm[bk] = x + (ulong)metal::min(mBase + 8u * bk + fm, M - 1u) * (ulong)R;
    #pragma clang loop unroll(full)
    for (uint s = 0; s < (uint)S; ++s) acc[s][bk] = metal::make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  }
  // The window's words in a row's block (the last ones wrap to its first).
  uint wordAt[NW + 1];
  #pragma clang loop unroll(full)
  for (uint i = 0; i <= (uint)NW; ++i) wordAt[i] = (w0 + i) % wpb;
  const device uint32_t* rowCodes = words + (ulong)(r0 + fm) * rowWords;
  for (uint r = r0; r < r1; r += 8u, rowCodes += 8u * rowWords) {
    uint raw[NW + 1];
    #pragma clang loop unroll(full)
    for (uint i = 0; i <= (uint)NW; ++i) raw[i] = rowCodes[wordAt[i]];
    uint w[NW], v[NW];
    #pragma clang loop unroll(full)
    for (uint i = 0; i < (uint)NW; ++i) w[i] = off0 ? (raw[i] >> off0) | (raw[i + 1] << (32u - off0)) : raw[i];
    // Virtual word i: bits [32i - 16, 32i + 16) of the realigned window.
    #pragma clang loop unroll(full)
    for (uint i = 1; i < (uint)NW; ++i) v[i] = (w[i - 1] >> 16) | (w[i] << 16);
    const uint ra = r + fn;
    const float sa = float(scales[ra]) * TRELLIS_RCP, sb = float(scales[ra + 1u]) * TRELLIS_RCP;
    metal::simdgroup_float8x8 a[MT];
    #pragma clang loop unroll(full)
    for (uint bk = 0; bk < (uint)MT; ++bk) {
      a[bk].thread_elements()[0] = float(xm[bk][ra]) * sa;
      a[bk].thread_elements()[1] = float(xm[bk][ra + 1u]) * sb;
    }
    #pragma clang loop unroll(full)
    for (uint s = 0; s < (uint)S; ++s) {
      metal::simdgroup_half8x8 b;
      b.thread_elements()[0] = codebook[block_state<K, L>(w, v, s)];
      b.thread_elements()[1] = codebook[block_state<K, L>(w, v, s + (uint)S)];
      #pragma clang loop unroll(full)
      for (uint bk = 0; bk < (uint)MT; ++bk)
        metal::simdgroup_multiply_accumulate(acc[s][bk], a[bk], b, acc[s][bk]);
    }
  }
  #pragma clang loop unroll(full)
  for (uint bk = 0; bk < (uint)MT; ++bk) {
    const uint m = mBase + 8u * bk + fm;
    if (m >= M) continue;
    device float* out = partial + ((ulong)m * (ulong)SPLITS + split) * (ulong)C + (ulong)block * (uint)BLOCK_LEN + ((uint)BLOCK_LEN - 1u) - p0;
    #pragma clang loop unroll(full)
    for (uint s = 0; s < (uint)S; ++s) {
      out[-(int)s] = acc[s][bk].thread_elements()[0];
      out[-(int)((uint)S + s)] = acc[s][bk].thread_elements()[1];
    }
  }

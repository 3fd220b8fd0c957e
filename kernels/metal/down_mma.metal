// Verify-width down projection on the simdgroup matrix unit, 1..8 activation rows (one block
// of 8). A SIMD group owns 8*S consecutive positions of one BLOCK_LEN-position coded block and a
// split of the input rows. Per 8-row step every lane decodes 2S contiguous positions of one
// input row (its bit window realigned once) into the B fragments of S output sub-tiles; the A
// fragments hold x * scale * (1/147.8) and each feeds S multiplies. Sub-tile s, fragment column
// i is position P_g + S*i + s (output column BLOCK_LEN - 1 - that, per block). SPLITS f32 partials
// [M, SPLITS, C] fold in one MLX sum. One body, two kernels (template int INTERLEAVE): row-major
// codes [rows, cols*K/32] and the 3-bit block interleave [cols/512, rows, 48].
//
// The body of an MLX custom Metal kernel (mx.fast.metal_kernel): MLX writes the signature.
// Inputs x (T [M, R]), codes (uint32), scales (half [R]); output partial (float [M, SPLITS, C]).
// Header: codebook.h + down_mma_state.h. Template ints M, R, C, K, L, SPLITS (8), SG_TG (4),
// INTERLEAVE, MT (1), S (16; 8 where 128 does not divide the block), NW (= ceil((2*S*K + L - 1)
// / 32) + 1), BLOCK_LEN; template type T. Grid [32*SG_TG, ceil(nGroups*SPLITS / SG_TG), 1]
// threads with nGroups = (C/BLOCK_LEN) * (BLOCK_LEN/(8*S)), threadgroup [32*SG_TG, 1, 1].
// Needs axis 0, C % BLOCK_LEN == 0, L <= 12; any R.
// BLOCK_LEN (the coded block's T) is this crate's template int where the seed has 256: shorter
// blocks (a multiple of 64: SmolLM2's 576-wide attention in blocks of 192) run on the same body;
// at 256 it is the seed's kernel.
  const uint lane = thread_index_in_simdgroup;
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
  metal::simdgroup_float8x8 acc[S][MT];
  #pragma clang loop unroll(full)
  for (uint s = 0; s < (uint)S; ++s)
    #pragma clang loop unroll(full)
    for (uint bk = 0; bk < (uint)MT; ++bk) acc[s][bk] = metal::make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  for (uint r = r0; r < r1; r += 8u) {
    const uint rw = r + fm;
    const device uint32_t* rowCodes = words + (ulong)metal::min(rw, (uint)R - 1u) * rowWords;
    uint raw[NW + 1];
    #pragma clang loop unroll(full)
    for (uint i = 0; i <= (uint)NW; ++i) {
      const uint wi = w0 + i;
      raw[i] = rowCodes[wi % wpb];
    }
    uint w[NW];
    #pragma clang loop unroll(full)
    for (uint i = 0; i < (uint)NW; ++i) w[i] = off0 ? (raw[i] >> off0) | (raw[i + 1] << (32u - off0)) : raw[i];
    metal::simdgroup_float8x8 a[MT];
    const uint ra = r + fn;
    const float sa = ra < r1 ? float(scales[ra]) * TRELLIS_RCP : 0.0f;
    const float sb = ra + 1u < r1 ? float(scales[ra + 1u]) * TRELLIS_RCP : 0.0f;
    #pragma clang loop unroll(full)
    for (uint bk = 0; bk < (uint)MT; ++bk) {
      const uint m = mBase + 8u * bk + fm;
      const bool ok = m < (uint)M;
      const device T* xm = x + (ulong)(ok ? m : 0u) * (ulong)R;
      a[bk].thread_elements()[0] = ok && ra < r1 ? float(xm[ra]) * sa : 0.0f;
      a[bk].thread_elements()[1] = ok && ra + 1u < r1 ? float(xm[ra + 1u]) * sb : 0.0f;
    }
    const bool rowOk = rw < r1;
    #pragma clang loop unroll(full)
    for (uint s = 0; s < (uint)S; ++s) {
      metal::simdgroup_float8x8 b;
      b.thread_elements()[0] = rowOk ? trellis_y_f32((block_state<K, L>(w, s))) : 0.0f;
      b.thread_elements()[1] = rowOk ? trellis_y_f32((block_state<K, L>(w, s + (uint)S))) : 0.0f;
      #pragma clang loop unroll(full)
      for (uint bk = 0; bk < (uint)MT; ++bk)
        metal::simdgroup_multiply_accumulate(acc[s][bk], a[bk], b, acc[s][bk]);
    }
  }
  #pragma clang loop unroll(full)
  for (uint bk = 0; bk < (uint)MT; ++bk) {
    const uint m = mBase + 8u * bk + fm;
    if (m >= (uint)M) continue;
    device float* out = partial + ((ulong)m * (ulong)SPLITS + split) * (ulong)C + (ulong)block * (uint)BLOCK_LEN + ((uint)BLOCK_LEN - 1u) - p0;
    #pragma clang loop unroll(full)
    for (uint s = 0; s < (uint)S; ++s) {
      out[-(int)s] = acc[s][bk].thread_elements()[0];
      out[-(int)((uint)S + s)] = acc[s][bk].thread_elements()[1];
    }
  }

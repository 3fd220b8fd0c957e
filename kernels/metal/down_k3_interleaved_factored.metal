// Down projections (axis 0) over 3-bit trellis codes in the block-interleaved layout
// [cols/512, rows, 48] (T 256, L 12): every lane owns 8 consecutive positions (24 bits) of one
// block, so all 32 lanes are busy. The input scale is factored out: each input row's activation
// is pre-multiplied by scale * (1/147.8) and the weights contribute their code value y. Split-K
// over input rows into SPLITS f32 partials [M, SPLITS, C] folded by one MLX sum. Same traversal
// as the scatter baseline, reassociated relative to its f32 code*scale weights.
//
// Bodies of MLX custom Metal kernels (mx.fast.metal_kernel): MLX writes the signature. Inputs
// x (T [M, R]), codes (uint32 [C/512, R, 48]), scales (half [R]); output partial
// (float [M, SPLITS, C]). Template ints: M, R, C, SG_TG, SPLITS; template type T. The layout's
// constants are literals (K 3 -> 3u, BT 256 -> 256u, 255u, L 12 -> 12u, words per block 24 ->
// 24u). Grid [128, ceil(C / 256 / SG_TG), SPLITS] threads, threadgroup [128, 1, 1]: one block per
// SIMD group.
//
// Two kernels, one section each (a `// ---- kernel NAME ----` line starts a body): ROW, one
// activation row; ROWS, M rows sharing each decoded weight.
// ---- kernel ROW ----
  const uint lane = thread_index_in_simdgroup;
  const uint sg = simdgroup_index_in_threadgroup;
  const uint block = thread_position_in_grid.y * (uint)SG_TG + sg;
  const uint nBlocks = (uint)C / 256u;
  const uint split = thread_position_in_grid.z;
  if (block >= nBlocks) return;
  const ulong rowWords = 2ul * 24u;
  const uint pBase = lane * 8u * 3u;
  const uint wi = pBase >> 5u;
  const uint off = pBase & 31u;
  const uint next = (wi + 1u == 24u) ? 0u : wi + 1u;
  const device uint32_t* words = codes + (ulong)(block / 2) * R * 2 * 24u + (block % 2) * 24u;
  const uint rowsPer = ((uint)R + (uint)SPLITS - 1u) / (uint)SPLITS;
  const uint r0 = split * rowsPer;
  const uint r1 = metal::min((uint)R, r0 + rowsPer);
  float acc[8];
  #pragma clang loop unroll(full)
  for (uint i = 0; i < 8u; ++i) acc[i] = 0.0f;
  for (uint r = r0; r < r1; ++r) {
    const uint word = words[(ulong)r * rowWords + wi];
    const uint nxt = words[(ulong)r * rowWords + next];
    const uint lo = off == 0u ? word : (word >> off) | (nxt << (32u - off));
    const uint hi = off == 0u ? nxt : nxt >> off;
    const float xr = float(x[r]);
    const float sr = float(scales[r]);
    #pragma clang loop unroll(full)
    for (uint i = 0; i < 8u; ++i) {
      const uint shift = i * 3u;
      uint win = lo >> shift;
      if (shift + 12u > 32u) win |= hi << (32u - shift);
      win &= (1u << 12u) - 1u;
      acc[i] = metal::fma(trellis_y_f32(win), xr * (sr * TRELLIS_RCP), acc[i]);
    }
  }
  const ulong outBase = (ulong)split * (ulong)C;
  #pragma clang loop unroll(full)
  for (uint i = 0; i < 8u; ++i)
    partial[outBase + block * 256u + 255u - lane * 8u - i] = acc[i];
// ---- kernel ROWS ----
  const uint lane = thread_index_in_simdgroup;
  const uint sg = simdgroup_index_in_threadgroup;
  const uint block = thread_position_in_grid.y * (uint)SG_TG + sg;
  const uint nBlocks = (uint)C / 256u;
  const uint split = thread_position_in_grid.z;
  if (block >= nBlocks) return;
  const ulong rowWords = 2ul * 24u;
  const uint pBase = lane * 8u * 3u;
  const uint wi = pBase >> 5u;
  const uint off = pBase & 31u;
  const uint next = (wi + 1u == 24u) ? 0u : wi + 1u;
  const device uint32_t* words = codes + (ulong)(block / 2) * R * 2 * 24u + (block % 2) * 24u;
  const uint rowsPer = ((uint)R + (uint)SPLITS - 1u) / (uint)SPLITS;
  const uint r0 = split * rowsPer;
  const uint r1 = metal::min((uint)R, r0 + rowsPer);
  float acc[M][8];
  #pragma clang loop unroll(full)
  for (uint m = 0; m < (uint)M; ++m)
    #pragma clang loop unroll(full)
    for (uint i = 0; i < 8u; ++i) acc[m][i] = 0.0f;
  for (uint r = r0; r < r1; ++r) {
    const uint word = words[(ulong)r * rowWords + wi];
    const uint nxt = words[(ulong)r * rowWords + next];
    const uint lo = off == 0u ? word : (word >> off) | (nxt << (32u - off));
    const uint hi = off == 0u ? nxt : nxt >> off;
    float xr[M];
    #pragma clang loop unroll(full)
    for (uint m = 0; m < (uint)M; ++m) xr[m] = float(x[(ulong)m * (ulong)R + r]) * (float(scales[r]) * TRELLIS_RCP);
    #pragma clang loop unroll(full)
    for (uint i = 0; i < 8u; ++i) {
      const uint shift = i * 3u;
      uint win = lo >> shift;
      if (shift + 12u > 32u) win |= hi << (32u - shift);
      win &= (1u << 12u) - 1u;
      const float weight = trellis_y_f32(win);
      #pragma clang loop unroll(full)
      for (uint m = 0; m < (uint)M; ++m) acc[m][i] = metal::fma(weight, xr[m], acc[m][i]);
    }
  }
  #pragma clang loop unroll(full)
  for (uint m = 0; m < (uint)M; ++m) {
    const ulong outBase = ((ulong)m * (ulong)SPLITS + split) * (ulong)C;
    #pragma clang loop unroll(full)
    for (uint i = 0; i < 8u; ++i)
      partial[outBase + block * 256u + 255u - lane * 8u - i] = acc[m][i];
  }

// Down projections (axis 0) over row-major trellis codes [rows, cols*K/32], the input scale
// factored out: each input row's activation is pre-multiplied by scale * (1/147.8) and the
// weights contribute their code value y (trellis_y_f32). Lane per word of a block, running sums
// per position, split-K over input rows into SPLITS f32 partials [M, SPLITS, C] that one MLX sum
// folds. Same traversal as the scatter baseline (trellis_scatter.metal), reassociated relative
// to its f32 code*scale weights.
//
// Bodies of MLX custom Metal kernels (mx.fast.metal_kernel): MLX writes the signature. Inputs
// x (T [M, R]), codes (uint32), scales (half [R]); output partial (float [M, SPLITS, C]).
// Template ints: M, R, C, BT, K, L, SG_TG, SPLITS, NP (= ceil(32 / K)); template type T.
// Grid [128, ceil(groups / SG_TG), SPLITS] threads, threadgroup [128, 1, 1], where groups is
// ceil((C / BT) / (32 / wpb)) SIMD groups of 32 / wpb blocks each.
//
// Two kernels, one section each (a `// ---- kernel NAME ----` line starts a body): ROW, one
// activation row; ROWS, M rows sharing each decoded weight.
// ---- kernel ROW ----
  const uint lane = thread_index_in_simdgroup;
  const uint sg = simdgroup_index_in_threadgroup;
  const uint wpb = (uint)(BT * K / 32);
  const uint nb = 32u / wpb;                       // blocks per SIMD group
  const uint nBlocks = (uint)C / (uint)BT;
  const uint groups = (nBlocks + nb - 1u) / nb;
  const uint group = thread_position_in_grid.y * (uint)SG_TG + sg;
  const uint split = thread_position_in_grid.z;
  const uint bi = lane / wpb;
  const uint wi = lane - bi * wpb;
  const uint blk = group * nb + bi;
  const bool active = (group < groups) && (bi < nb) && (blk < nBlocks);
  // Changed from upstream: a lane past the last block (K = 3: lanes 24..31) shuffles its own
  // word. The upstream formula sends lane 31 to lane 32, an out-of-range simd_shuffle source
  // (undefined in MSL); those lanes discard the value either way.
  const uint nbrLane = active ? (bi * wpb + ((wi + 1u == wpb) ? 0u : wi + 1u)) : lane;
  // This lane's positions: symbol offsets p = multiples of K inside [32wi, 32wi+32).
  const uint pBase = 32u * wi;
  const uint p0 = ((pBase + (uint)K - 1u) / (uint)K) * (uint)K;
  uint offs[NP];
  bool valid[NP];
  bool spill[NP];
  uint cols[NP];
  #pragma clang loop unroll(full)
  for (uint i = 0; i < (uint)NP; ++i) {
    const uint p = p0 + i * (uint)K;
    valid[i] = active && (p < pBase + 32u);
    offs[i] = p - pBase;
    spill[i] = offs[i] + (uint)L > 32u;
    const uint t = (uint)BT - 1u - p / (uint)K;
    cols[i] = blk * (uint)BT + t;
  }
  const ulong rowWords = (ulong)nBlocks * wpb;
  const uint rowsPer = ((uint)R + (uint)SPLITS - 1u) / (uint)SPLITS;
  const uint r0 = split * rowsPer;
  const uint r1 = metal::min((uint)R, r0 + rowsPer);
  const device uint32_t* col0 = codes + (ulong)blk * wpb + wi;
  const uint mask = (1u << (uint)L) - 1u;
  float acc[NP];
  #pragma clang loop unroll(full)
  for (uint i = 0; i < (uint)NP; ++i) acc[i] = 0.0f;
  for (uint r = r0; r < r1; ++r) {
    const uint word = active ? col0[(ulong)r * rowWords] : 0u;
    const uint nxt = metal::simd_shuffle(word, (ushort)nbrLane);
    const float xr = float(x[r]);
    const float sr = float(scales[r]);
    #pragma clang loop unroll(full)
    for (uint i = 0; i < (uint)NP; ++i) {
      uint win = word >> offs[i];
      if (spill[i]) win |= nxt << (32u - offs[i]);
      win &= mask;
      acc[i] = metal::fma(trellis_y_f32(win), xr * (sr * TRELLIS_RCP), acc[i]);
    }
  }
  const ulong outBase = (ulong)split * (ulong)C;
  #pragma clang loop unroll(full)
  for (uint i = 0; i < (uint)NP; ++i)
    if (valid[i]) partial[outBase + cols[i]] = acc[i];
// ---- kernel ROWS ----
  const uint lane = thread_index_in_simdgroup;
  const uint sg = simdgroup_index_in_threadgroup;
  const uint wpb = (uint)(BT * K / 32);
  const uint nb = 32u / wpb;                       // blocks per SIMD group
  const uint nBlocks = (uint)C / (uint)BT;
  const uint groups = (nBlocks + nb - 1u) / nb;
  const uint group = thread_position_in_grid.y * (uint)SG_TG + sg;
  const uint split = thread_position_in_grid.z;
  const uint bi = lane / wpb;
  const uint wi = lane - bi * wpb;
  const uint blk = group * nb + bi;
  const bool active = (group < groups) && (bi < nb) && (blk < nBlocks);
  // Changed from upstream: a lane past the last block (K = 3: lanes 24..31) shuffles its own
  // word. The upstream formula sends lane 31 to lane 32, an out-of-range simd_shuffle source
  // (undefined in MSL); those lanes discard the value either way.
  const uint nbrLane = active ? (bi * wpb + ((wi + 1u == wpb) ? 0u : wi + 1u)) : lane;
  const uint pBase = 32u * wi;
  const uint p0 = ((pBase + (uint)K - 1u) / (uint)K) * (uint)K;
  uint offs[NP];
  bool valid[NP];
  bool spill[NP];
  uint cols[NP];
  #pragma clang loop unroll(full)
  for (uint i = 0; i < (uint)NP; ++i) {
    const uint p = p0 + i * (uint)K;
    valid[i] = active && (p < pBase + 32u);
    offs[i] = p - pBase;
    spill[i] = offs[i] + (uint)L > 32u;
    const uint t = (uint)BT - 1u - p / (uint)K;
    cols[i] = blk * (uint)BT + t;
  }
  const ulong rowWords = (ulong)nBlocks * wpb;
  const uint rowsPer = ((uint)R + (uint)SPLITS - 1u) / (uint)SPLITS;
  const uint r0 = split * rowsPer;
  const uint r1 = metal::min((uint)R, r0 + rowsPer);
  const device uint32_t* col0 = codes + (ulong)blk * wpb + wi;
  const uint mask = (1u << (uint)L) - 1u;
  float acc[M][NP];
  #pragma clang loop unroll(full)
  for (uint m = 0; m < (uint)M; ++m)
    #pragma clang loop unroll(full)
    for (uint i = 0; i < (uint)NP; ++i) acc[m][i] = 0.0f;
  for (uint r = r0; r < r1; ++r) {
    const uint word = active ? col0[(ulong)r * rowWords] : 0u;
    const uint nxt = metal::simd_shuffle(word, (ushort)nbrLane);
    float xr[M];
    #pragma clang loop unroll(full)
    for (uint m = 0; m < (uint)M; ++m) xr[m] = float(x[(ulong)m * (ulong)R + r]) * (float(scales[r]) * TRELLIS_RCP);
    #pragma clang loop unroll(full)
    for (uint i = 0; i < (uint)NP; ++i) {
      uint win = word >> offs[i];
      if (spill[i]) win |= nxt << (32u - offs[i]);
      win &= mask;
      const float weight = trellis_y_f32(win);
      #pragma clang loop unroll(full)
      for (uint m = 0; m < (uint)M; ++m) acc[m][i] = metal::fma(weight, xr[m], acc[m][i]);
    }
  }
  #pragma clang loop unroll(full)
  for (uint m = 0; m < (uint)M; ++m) {
    const ulong outBase = ((ulong)m * (ulong)SPLITS + split) * (ulong)C;
    #pragma clang loop unroll(full)
    for (uint i = 0; i < (uint)NP; ++i)
      if (valid[i]) partial[outBase + cols[i]] = acc[m][i];
  }

// The baseline down projection (axis 0) the factored and MMA kernels are measured against: f32
// weights value(state) * scale, the plain "unfactored" form. value(state) is
// float(y) * TRELLIS_RCP, within one ulp of the reference table entry y / 147.800537109375.
// Traversal as down_factored.metal's ROW kernel: lane per word of a block (32 / wpb blocks per
// SIMD group), the neighbour word by simd_shuffle, NP = ceil(32 / K) positions per lane, split-K
// over input rows into SPLITS f32 partials [M, SPLITS, C] that one MLX sum folds. Each SIMD group
// serves one activation row: grid z walks SPLITS splits of each of the M rows, so any M runs
// without per-row registers. Both code layouts: row-major [rows, cols*K/32] and, with
// INTERLEAVE, the 3-bit block interleave [cols/512, rows, 48] (block b of row r at slot
// (b / 2, r), half b % 2).
//
// The body of an MLX custom Metal kernel (mx.fast.metal_kernel): MLX writes the signature.
// Inputs x (T [M, R]), codes (uint32), scales (half [R]); output partial (float [M, SPLITS, C]).
// Template ints R, C, BT, K, L, SG_TG, SPLITS, NP, INTERLEAVE (0 or 1); template type T.
// Grid [128, ceil(groups / SG_TG), SPLITS * M] threads, threadgroup [128, 1, 1], with groups =
// ceil((C / BT) / (32 / wpb)).
  const uint lane = thread_index_in_simdgroup;
  const uint sg = simdgroup_index_in_threadgroup;
  const uint wpb = (uint)(BT * K / 32);
  const uint nb = 32u / wpb;                       // blocks per SIMD group
  const uint nBlocks = (uint)C / (uint)BT;
  const uint groups = (nBlocks + nb - 1u) / nb;
  const uint group = thread_position_in_grid.y * (uint)SG_TG + sg;
  const uint split = thread_position_in_grid.z % (uint)SPLITS;
  const uint m = thread_position_in_grid.z / (uint)SPLITS;
  const uint bi = lane / wpb;
  const uint wi = lane - bi * wpb;
  const uint blk = group * nb + bi;
  const bool active = (group < groups) && (bi < nb) && (blk < nBlocks);
  // Lanes past the last block read their own word, so no shuffle source leaves 0..31.
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
  const ulong rowWords = INTERLEAVE ? 2ul * wpb : (ulong)nBlocks * wpb;
  const ulong blockBase = INTERLEAVE ? (ulong)(blk / 2u) * (ulong)R * 2ul * wpb + (blk % 2u) * wpb : (ulong)blk * wpb;
  const uint rowsPer = ((uint)R + (uint)SPLITS - 1u) / (uint)SPLITS;
  const uint r0 = split * rowsPer;
  const uint r1 = metal::min((uint)R, r0 + rowsPer);
  const device uint32_t* col0 = codes + blockBase + wi;
  const device T* xm = x + (ulong)m * (ulong)R;
  const uint mask = (1u << (uint)L) - 1u;
  float acc[NP];
  #pragma clang loop unroll(full)
  for (uint i = 0; i < (uint)NP; ++i) acc[i] = 0.0f;
  for (uint r = r0; r < r1; ++r) {
    const uint word = active ? col0[(ulong)r * rowWords] : 0u;
    const uint nxt = metal::simd_shuffle(word, (ushort)nbrLane);
    const float xr = float(xm[r]);
    const float sr = float(scales[r]);
    #pragma clang loop unroll(full)
    for (uint i = 0; i < (uint)NP; ++i) {
      uint win = word >> offs[i];
      if (spill[i]) win |= nxt << (32u - offs[i]);
      win &= mask;
      const float weight = (trellis_y_f32(win) * TRELLIS_RCP) * sr;
      acc[i] = metal::fma(xr, weight, acc[i]);
    }
  }
  const ulong outBase = ((ulong)m * (ulong)SPLITS + split) * (ulong)C;
  #pragma clang loop unroll(full)
  for (uint i = 0; i < (uint)NP; ++i)
    if (valid[i]) partial[outBase + cols[i]] = acc[i];

// Helpers of the axis-1 (gate/up) kernels, gate_up_factored.metal and gate_up_mma.metal (placed
// after codebook.h).

// float(y) of the 8 positions a lane owns in one 256-weight block: bits [8K*lane, 8K*lane + 8K)
// of the block, each window reaching L - K bits further. `word` is the block's word holding bit
// 8K*lane, `nxt` the one after it (the block's first for its last word: the window wraps inside
// the block), `off` = (8K*lane) & 31. Both words suffice: off + 7K + L <= 64 for K <= 4, L <= 16.
// yv[i] is bit-order position i (bits [off + i*K, +L) of the realigned pair).
template <int K, int L_>
inline void lane_codes(uint word, uint nxt, uint off, thread float* yv) {
  const uint lo = off == 0u ? word : (word >> off) | (nxt << (32u - off));
  const uint hi = off == 0u ? nxt : nxt >> off;
  #pragma clang loop unroll(full)
  for (uint i = 0; i < 8u; ++i) {
    const uint shift = i * (uint)K;
    uint win = lo >> shift;
    if (shift + (uint)L_ > 32u) win |= hi << (32u - shift);
    yv[i] = trellis_y_f32(win & ((1u << (uint)L_) - 1u));
  }
}

// silu(v) = v / (1 + e^-v), in f32 once per output. precise:: because Metal's default exp may
// lose low bits and the f32 output is held to the f64 reference; a large negative v gives -0
// (e^-v overflows to inf).
inline float trellis_silu(float v) {
  return v / (1.0f + metal::precise::exp(-v));
}

// A lane's bit window of one row and chunk, realigned to bit 0 (gate_up_mma.metal): words
// row[wordAt[0..NW]] shifted down by off0 into w, and the virtual words v[i] = bits
// [32i - 16, 32i + 16) that block_state (down_mma_wide_state.h) reads for a window straddling a
// word edge. v[0] is never read (no window straddles bit 0); it is zeroed so nothing is left
// undefined.
template <int NW>
inline void realign_window(const device uint32_t* row, thread const uint* wordAt, uint off0, thread uint* w,
                           thread uint* v) {
  uint raw[NW + 1];
  #pragma clang loop unroll(full)
  for (uint i = 0; i <= (uint)NW; ++i) raw[i] = row[wordAt[i]];
  #pragma clang loop unroll(full)
  for (uint i = 0; i < (uint)NW; ++i) w[i] = off0 ? (raw[i] >> off0) | (raw[i + 1] << (32u - off0)) : raw[i];
  v[0] = 0u;
  #pragma clang loop unroll(full)
  for (uint i = 1; i < (uint)NW; ++i) v[i] = (w[i - 1] >> 16) | (w[i] << 16);
}

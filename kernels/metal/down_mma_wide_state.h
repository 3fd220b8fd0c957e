// The bit-window helper of down_mma_wide.metal (placed after codebook.h).
//
// State at position t of a realigned window (bits [t*K, +L) of w), one extract (virtual words v
// past a word edge).
template <int K, int L_>
inline uint block_state(thread const uint* w, thread const uint* v, uint t) {
  const uint b = t * (uint)K;
  const uint off = b & 31u;
  if (off + (uint)L_ <= 32u) return (w[b >> 5] >> off) & ((1u << (uint)L_) - 1u);
  const uint vi = (b + 16u) >> 5;
  return (v[vi] >> (b + 16u - 32u * vi)) & ((1u << (uint)L_) - 1u);
}

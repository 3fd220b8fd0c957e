// The bit-window helper of down_mma.metal (placed after codebook.h).
//
// State at position t of a realigned window (bit t*K of w, LSB first).
template <int K, int L_>
inline uint block_state(thread const uint* w, uint t) {
  const uint b = t * (uint)K;
  const uint wi = b >> 5;
  const uint off = b & 31u;
  uint win = w[wi] >> off;
  if (off + (uint)L_ > 32u) win |= w[wi + 1] << (32u - off);
  return win & ((1u << (uint)L_) - 1u);
}

// Dense weights W[r, c] = value(state(r, c)) * scale[r] in T, for trellis codes of either layout
// (T = BLOCK_LEN positions per coded block, T K / 32 words per block, L <= 16): what MLX's own matmul then
// multiplies when many activation rows share the layer (see src/trellis/cuda/expand.rs).
//
// Thread t writes 16 consecutive weights of one stored row (t = r * C / 16 + chunk): two 16-byte
// stores for 16-bit T, four for f32, so a warp writes 512 contiguous weights and reads the 8 K
// words of each of two 256-position coded blocks (more, shorter ones for a shorter T). (Fewer weights per thread cost more instructions per
// weight, docs/cuda-down.md: the addressing and the realignment are per thread.) The thread
// reads the run of 16 K bits of its positions plus the L - K bits of the last window (wrapping
// inside the block), realigns it to bit 0 once, and takes every window with one shift or funnel
// shift and one mask.
//
// Values equal the reference's f32 weights bit for bit: value(state) is y / 147.800537109375
// rounded once to f32 (y * (1 / 147.8...) and one FMA correction of its residual: checked for
// every y in [-510, 510] on the host, see src/trellis/cuda/expand.rs), times f32(scale[r]), then rounded to T.
//
// Template ints: R, C, K, L, BLOCK_LEN (a multiple of 16 that divides C; 256 for the
// interleave). Template bool: INTERLEAVE (3-bit block interleave). Template type:
// T (the output dtype).
  constexpr int WPB = BLOCK_LEN * K / 32;    // words per coded block
  static_assert(BLOCK_LEN % 16 == 0 && BLOCK_LEN * K % 32 == 0 && C % BLOCK_LEN == 0, "whole threads and words per block");
  static_assert(!INTERLEAVE || BLOCK_LEN == 256, "the 3-bit block interleave pairs 256-weight blocks");
  constexpr int NPOS = 16;                   // positions per thread
  constexpr int SPAN = NPOS * K + L - K;     // bits per thread
  constexpr int NWR = (SPAN + 31) / 32;      // realigned words
  constexpr int NWL = NWR + 1;               // words read (one more where the run is unaligned)
  constexpr int CHUNKS = C / NPOS;           // threads per stored row
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= (long long)R * CHUNKS) return;
  const int r = (int)(t / CHUNKS), chunk = (int)(t % CHUNKS);
  const int blk = chunk / (BLOCK_LEN / NPOS), p0 = (chunk % (BLOCK_LEN / NPOS)) * NPOS;

  // This thread's bits: position p0 + NPOS - 1 at bit 0 after realignment.
  const int bit0 = (BLOCK_LEN - p0 - NPOS) * K;
  const int off = bit0 & 31;
  const uint32_t* block_words = codes + (INTERLEAVE ? ((size_t)(blk >> 1) * R + r) * 48 + (blk & 1) * 24
                                                    : ((size_t)r * (C / BLOCK_LEN) + blk) * WPB);
  unsigned raw[NWL], w[NWR];
#pragma unroll
  for (int j = 0; j < NWL; ++j) raw[j] = block_words[((bit0 >> 5) + j) % WPB];
#pragma unroll
  for (int j = 0; j < NWR; ++j) w[j] = __funnelshift_r(raw[j], raw[j + 1], off);

  const float scale = __half2float(scales[r]);
  constexpr float DIVISOR = 147.800537109375f;
  float v[NPOS];
#pragma unroll
  for (int i = 0; i < NPOS; ++i) {
    const unsigned state = trellis_cuda::window<L>(w, (NPOS - 1 - i) * K);
    const float y = trellis_y_f32(state);
    // y / DIVISOR correctly rounded: the estimate and one Newton step on its exact residual.
    const float q0 = __fmul_rn(y, TRELLIS_RCP);
    const float q = __fmaf_rn(__fmaf_rn(-q0, DIVISOR, y), TRELLIS_RCP, q0);
    v[i] = __fmul_rn(q, scale);
  }
  T* out = weights + (size_t)r * C + (size_t)chunk * NPOS;
  if (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < NPOS / 4; ++i)
      reinterpret_cast<float4*>(out)[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
  } else {
    // 16-bit T: round each value once (T(float) rounds to nearest even), two per word.
    unsigned packed[NPOS / 2];
#pragma unroll
    for (int i = 0; i < NPOS / 2; ++i) {
      const T lo = T(v[2 * i]), hi = T(v[2 * i + 1]);
      packed[i] = (unsigned)*reinterpret_cast<const unsigned short*>(&lo) |
                  ((unsigned)*reinterpret_cast<const unsigned short*>(&hi) << 16);
    }
#pragma unroll
    for (int i = 0; i < NPOS / 8; ++i)
      reinterpret_cast<uint4*>(out)[i] = make_uint4(packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]);
  }

// Tail-biting Viterbi over trellis blocks (the encoder's search, spec section 8), one block of
// T = 256 normalised weights per thread block at a time. It computes exactly what the CPU
// encoder's search computes (src/trellis/encoder.rs), bit for bit:
//
// - path costs are f32 and every cost is formed as `best + (x - value) * (x - value)` with
//   separately rounded operations (__fsub_rn, __fmul_rn, __fadd_rn never contract into an FMA);
// - the cheapest predecessor of a group is taken with a strict `<` in predecessor order, so ties
//   go to the lowest predecessor index j, as the CPU traceback's recomputation picks them;
// - the final state is the cheapest allowed one, the lowest state on ties.
// So the GPU and the CPU encoder produce the same bytes.
//
// Trellis. States s in [0, 2^L); the successor of p under symbol b is ((p << K) | b) mod 2^L,
// so the predecessors of s are (s >> K) | (j << (L - K)), j in [0, 2^K): the 2^K states of
// "group" h = s >> K share them. A step takes every group's minimum over its predecessors
// (phase A: thread per group, the argmin j stored as one byte per group and step in the global
// `scratch` of this thread block), then every state's new cost from its group's minimum
// (phase B: thread per state, the state's value kept in registers). Costs live in shared memory
// and are updated in place, with a barrier between the phases.
//
// Tail-biting as QTIP does it: pass 1 codes the block rotated by T/2 from a free start and
// traces back to rotated index T/2 (original position 0); pass 2 codes the block in its order
// with the first state's top L - K bits and the last state's low L - K bits pinned to that
// state's top L - K bits. Thread 0 walks the stored argmins back and writes the states.
//
// Template ints: K (bits per weight), L (state bits, L <= 15), NT (threads per block, a power of
// two with 2^L / NT states per thread). Inputs: x [nblocks, 256] f32 (already divided by the
// row scale), lut [2^L] f32 (the state values). Outputs: states [nblocks, 256] u16 (the path),
// scratch [gridDim.x, 256, 2^(L-K)] u8 (argmins; contents unspecified). Dynamic shared memory:
// (2^L + 2^(L-K) + 256) floats.
  constexpr int T = 256;
  constexpr int S = 1 << L;                // states
  constexpr int G = 1 << (L - K);          // groups of states with the same predecessors
  constexpr int B = 1 << K;                // predecessors per group
  constexpr int PER = S / NT;              // states per thread (phase B)
  constexpr bool LUT_IN_REGS = PER <= 8;  // larger L reads the values from L1 each step
  // Loops over this thread's states unroll fully only when the values sit in registers, and the
  // predecessor loop unrolls by at most 8: full unrolling at large L or k costs more registers
  // than a 1024-thread block has.
  constexpr int STATE_UNROLL = LUT_IN_REGS ? PER : 4;
  constexpr int PRED_UNROLL = B < 8 ? B : 8;
  constexpr int WARPS = NT / 32;
  constexpr float FORBIDDEN = 1e30f;       // start cost outside the pinned group (finite, as on the CPU)
  static_assert(S % NT == 0 && NT % 32 == 0 && NT <= 1024, "whole states per thread, whole warps");

  extern __shared__ float viterbi_smem[];
  float* cost = viterbi_smem;              // [S]
  float* best = cost + S;                  // [G]
  float* xs = best + G;                    // [T]
  __shared__ float red_cost[WARPS];
  __shared__ int red_state[WARPS];
  __shared__ int pinned_group;

  const int tid = threadIdx.x;
  const int nblocks = x_shape[0];
  unsigned char* arg = scratch + (size_t)blockIdx.x * T * G;

  float value[LUT_IN_REGS ? PER : 1];
  if (LUT_IN_REGS) {
#pragma unroll
    for (int i = 0; i < PER; ++i) value[i] = lut[tid + NT * i];
  }
  auto state_value = [&](int i) { return LUT_IN_REGS ? value[i] : __ldg(&lut[tid + NT * i]); };

  // One pass over the block in xs (rotated by T/2 when `rotated`), start group pinned to `pin`
  // (or free when pin < 0). Leaves the cheapest allowed final state's argmin chain in `arg` and
  // returns that final state (valid in every thread).
  auto forward = [&](bool rotated, int pin) -> int {
    auto x_at = [&](int t) { return xs[rotated ? (t + T / 2) % T : t]; };
    const float x0 = x_at(0);
#pragma unroll STATE_UNROLL
    for (int i = 0; i < PER; ++i) {
      const int s = tid + NT * i;
      const float e = __fsub_rn(x0, state_value(i));
      cost[s] = (pin >= 0 && (s >> K) != pin) ? FORBIDDEN : __fmul_rn(e, e);
    }
    __syncthreads();
    for (int t = 1; t < T; ++t) {
      for (int h = tid; h < G; h += NT) {
        float m = cost[h];
        int a = 0;
#pragma unroll PRED_UNROLL
        for (int j = 1; j < B; ++j) {
          const float c = cost[j * G + h];
          if (c < m) {
            m = c;
            a = j;
          }
        }
        best[h] = m;
        arg[t * G + h] = (unsigned char)a;
      }
      __syncthreads();
      const float xt = x_at(t);
#pragma unroll STATE_UNROLL
      for (int i = 0; i < PER; ++i) {
        const int s = tid + NT * i;
        const float e = __fsub_rn(xt, state_value(i));
        cost[s] = __fadd_rn(best[s >> K], __fmul_rn(e, e));
      }
      __syncthreads();
    }
    // The final state: among the 2^K states p | j G when pinned, among all states otherwise;
    // the lowest state on ties (each thread scans its states in increasing order).
    float m = FORBIDDEN * 4.0f;
    int ms = 0x7fffffff;
    if (pin >= 0) {
      for (int j = tid; j < B; j += NT) {
        const int s = pin | (j * G);
        if (cost[s] < m || (cost[s] == m && s < ms)) {
          m = cost[s];
          ms = s;
        }
      }
    } else {
#pragma unroll STATE_UNROLL
      for (int i = 0; i < PER; ++i) {
        const int s = tid + NT * i;
        if (cost[s] < m) {
          m = cost[s];
          ms = s;
        }
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float om = __shfl_xor_sync(0xffffffffu, m, off);
      const int os = __shfl_xor_sync(0xffffffffu, ms, off);
      if (om < m || (om == m && os < ms)) {
        m = om;
        ms = os;
      }
    }
    if ((tid & 31) == 0) {
      red_cost[tid >> 5] = m;
      red_state[tid >> 5] = ms;
    }
    __syncthreads();
    m = red_cost[0];
    ms = red_state[0];
    for (int w = 1; w < WARPS; ++w) {
      if (red_cost[w] < m || (red_cost[w] == m && red_state[w] < ms)) {
        m = red_cost[w];
        ms = red_state[w];
      }
    }
    return ms;
  };

  for (int blk = blockIdx.x; blk < nblocks; blk += gridDim.x) {
    for (int t = tid; t < T; t += NT) xs[t] = x[(size_t)blk * T + t];
    __syncthreads();

    // Pass 1: rotated, free start; keep the state at rotated index T/2.
    int state = forward(true, -1);
    if (tid == 0) {
      for (int t = T - 1; t > T / 2; --t) {
        const int g = state >> K;
        state = g | ((int)arg[t * G + g] << (L - K));
      }
      pinned_group = state >> K;
    }
    __syncthreads();
    const int pin = pinned_group;

    // Pass 2: original order, both ends pinned.
    state = forward(false, pin);
    if (tid == 0) {
      unsigned short* out = states + (size_t)blk * T;
      out[T - 1] = (unsigned short)state;
      for (int t = T - 1; t > 0; --t) {
        const int g = state >> K;
        state = g | ((int)arg[t * G + g] << (L - K));
        out[t - 1] = (unsigned short)state;
      }
    }
    // The next block overwrites xs, the costs and the argmins thread 0 has just read.
    __syncthreads();
  }

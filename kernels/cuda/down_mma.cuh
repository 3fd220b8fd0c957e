// Helpers of the CUDA down-projection kernel (down_mma.cu). Placed after codebook.cuh and
// fragment.cuh, before MLX's `namespace mlx::core::cu`, so everything here lives in
// `trellis_cuda`.
#pragma once

namespace trellis_cuda {

// A run of NPOS consecutive positions of one row of a coded block of BLOCK_LEN positions
// (BLOCK_LEN K / 32 words): the words that hold its bits (plus L - K bits of the last window,
// wrapping around inside the block), read from a ring row and realigned so that the run's last
// position's window starts at bit 0.
template <int K, int L, int NPOS, int BLOCK_LEN = 256>
struct CodeRun {
  static_assert(BLOCK_LEN * K % 32 == 0, "a coded block is whole words");
  static constexpr int WPB = BLOCK_LEN * K / 32;       // words per coded block
  static constexpr int SPAN = NPOS * K + L - K;        // bits per run
  static constexpr bool ALIGNED = (NPOS * K) % 32 == 0;  // runs start on a word
  static constexpr int NWR = (SPAN + 31) / 32;         // realigned words
  static constexpr int NWL = ALIGNED ? NWR : NWR + 1;  // words read
  int word_at[NWL];  // ring-row word of each word read
  int off;           // bit offset of the run in the first word read

  // The run starting at position `p` of coded block `cb` of a ring row.
  __device__ __forceinline__ CodeRun(int cb, int p) {
    const int bit0 = (BLOCK_LEN - p - NPOS) * K;
    off = bit0 & 31;
#pragma unroll
    for (int j = 0; j < NWL; ++j) word_at[j] = cb * WPB + ((bit0 >> 5) + j) % WPB;
  }

  // The words of the run in `row`, as stored (shared-memory loads only).
  __device__ __forceinline__ void load(const unsigned* row, unsigned (&raw)[NWL]) const {
#pragma unroll
    for (int j = 0; j < NWL; ++j) raw[j] = row[word_at[j]];
  }

  // Loaded words realigned: position p + NPOS - 1 - i's window starts at bit i K.
  __device__ __forceinline__ void realign(const unsigned (&raw)[NWL], unsigned (&w)[NWR]) const {
#pragma unroll
    for (int j = 0; j < NWR; ++j) w[j] = ALIGNED ? raw[j] : __funnelshift_r(raw[j], raw[j + 1], off);
  }

  // The run's bits in `row`, realigned (load, then realign).
  __device__ __forceinline__ void read(const unsigned* row, unsigned (&w)[NWR]) const {
    unsigned raw[NWL];
    load(row, raw);
    realign(raw, w);
  }
};

// Two (x2) or four (x4) 8x8 f16 matrices from shared memory into MMA fragments: lanes 8i..8i+7
// give the row addresses of matrix i; each lane receives row g, columns 2q, 2q+1 of each.
__device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// mbarriers in shared memory (sm_80 and later) for the down kernel's MBARRIERS ring: init
// with the count of arrivals that complete a phase; an arrive by this thread; an arrive that
// fires once this thread's earlier cp.async copies have landed (noinc: it counts against the
// init count); and a wait for the phase of the given parity to complete.
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(s), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared.b64 state, [%0];\n}\n" ::"r"(s) : "memory");
}

__device__ __forceinline__ void mbar_arrive_on_copies(unsigned long long* bar) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(s) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n .reg .pred done;\n"
      "WAIT_%=:\n mbarrier.try_wait.parity.shared.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n}\n" ::"r"(s),
      "r"(parity)
      : "memory");
}

}  // namespace trellis_cuda

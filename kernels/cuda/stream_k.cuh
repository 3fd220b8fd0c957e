// The stream-K work split of the warp-specialized GEMMs (gate_up_ws.cu, down_ws.cu), the fold of
// the tiles it splits, and the activations' side of their rings. Placed after fragment.cuh and
// wgmma.cuh, before MLX's `namespace mlx::core::cu`.
//
// A pass's work is `units` = its tiles of 64 outputs times the input blocks of each, tile-major;
// thread block c of `blocks` takes units [c U / G, (c + 1) U / G), so that every SM gets the same
// number of weights to decode whatever the tile count. A tile whose units one block holds
// entirely is written directly. A tile split between blocks is folded: each part stores its
// accumulators in `partials` (slot 0 of its block: the part at the start of the block's range;
// slot 1: the one at its end), counts itself on the tile's counter, and the last to arrive adds
// the parts in block order (the same f32 sums whichever arrives last) and writes the tile.
#pragma once

namespace trellis_cuda {

// The activations' side of a warp-specialized GEMM's ring: STAGES stages of STAGE_BYTES from
// shared address `stages_addr`, each holding its step's activations at X_OFFSET (X_BYTES, one
// bulk copy of the pre-pass's image of the step, issued by the consumer's thread `tid` 0) and
// landing on the stage's mbarrier (x_full_addr + 8 s). Steps run over the block's units in order:
// step j is quarter j % 4 of input block (u_begin + j / 4) % nb of whichever tile.
template <int STAGES, int STAGE_BYTES, int X_OFFSET, int X_BYTES>
struct ActivationRing {
  const __half* x;  // the pre-pass's image
  unsigned stages_addr, x_full_addr;
  int nb, pass, steps_total, tid;

  // The stages' mbarriers, one arrival each, fenced for the copy engine.
  __device__ __forceinline__ void init() const {
    if (tid == 0) {
      for (int i = 0; i < STAGES; ++i) mbarrier_init(x_full_addr + 8 * i, 1);
      fence_mbarrier_init();
    }
  }

  // Step j's activations (quarter `sub` of input block `block`, wrapped) into stage `into`.
  __device__ __forceinline__ void copy_step(int j, int block, int sub, int into) const {
    if (tid == 0 && j < steps_total) {
      while (block >= nb) block -= nb;
      const __half* const src = x + (((size_t)pass * nb + block) * 4 + sub) * (X_BYTES / 2);
      mbarrier_arrive_expect_bytes(x_full_addr + 8 * into, X_BYTES);
      bulk_copy_to_shared(stages_addr + into * STAGE_BYTES + X_OFFSET, src, X_BYTES, x_full_addr + 8 * into);
    }
  }

  // The first STAGES - 1 steps', the block's range starting at input block b0.
  __device__ __forceinline__ void prologue(int b0) const {
#pragma unroll
    for (int j = 0; j < STAGES - 1; ++j) copy_step(j, b0 + j / 4, j % 4, j);
  }
};

struct StreamK {
  long long units;
  int blocks;

  // The first unit of block c's range (c = blocks: the end of the last).
  __device__ __forceinline__ long long start(int c) const {
    return (long long)c * units / blocks;
  }

  // The block whose range holds unit u.
  __device__ __forceinline__ int block_of(long long u) const {
    int c = (int)(u * blocks / units);
    while (c + 1 < blocks && start(c + 1) <= u) ++c;
    while (c > 0 && start(c) > u) --c;
    return c;
  }
};

// The fold of one part of a split tile by a consumer warpgroup (threads `tid` 0..127, named
// barrier `barrier`): the part's QUADS groups of 4 accumulators (`quad(r)`, float (&)[4]) into
// its slot of `partials` (block `cta` of pass `pass`: [passes, blocks, 2, 128 QUADS 4]), a count
// on the tile's counter (`counters` [passes, tiles]), and where this part is the tile's last,
// the parts' sums in block order, FOLD_LOADS 16-byte loads of every part in flight at once and
// the sums in the accumulators' own registers (a pointer walk over them put them in local memory,
// and each load then waited for the one before: docs/cuda-mlp.md), then `write()`. `nb`: input
// blocks a tile; `at_range_start`: whether this part is at the start of its block's range (slot 0).
template <int QUADS, typename Quad, typename Write>
__device__ __forceinline__ void fold_split_tile(const StreamK& sk, Quad quad, float* partials, const unsigned* counters,
                                                unsigned* last_flag, int pass, int cta, int tile, int tiles, int nb,
                                                bool at_range_start, int tid, int barrier, Write write) {
  float* const mine = partials + (((size_t)pass * sk.blocks + cta) * 2 + (at_range_start ? 0 : 1)) * (QUADS * 4 * 128);
#pragma unroll
  for (int r = 0; r < QUADS; ++r) {
    const float(&part)[4] = quad(r);
    reinterpret_cast<float4*>(mine)[r * 128 + tid] = make_float4(part[0], part[1], part[2], part[3]);
  }
  __threadfence();
  named_sync(barrier, 128);
  unsigned* const counter = const_cast<unsigned*>(counters) + (size_t)pass * tiles + tile;
  if (tid == 0) *last_flag = atomicAdd(counter, 1u);
  named_sync(barrier, 128);
  // The tile's parts: the blocks from the one holding its first unit to the one holding its last,
  // less those with no units (a grid of more blocks than units).
  const long long t0 = (long long)tile * nb;
  const int first = sk.block_of(t0), last = sk.block_of(t0 + nb - 1);
  unsigned parts = 0;
  for (int c = first; c <= last; ++c) parts += sk.start(c + 1) > sk.start(c);
  if (*last_flag == parts - 1) {
    __threadfence();
    constexpr int FOLD_LOADS = QUADS < 8 ? QUADS : 8;
#pragma unroll
    for (int r0 = 0; r0 < QUADS; r0 += FOLD_LOADS) {
#pragma unroll
      for (int r = r0; r < r0 + FOLD_LOADS && r < QUADS; ++r)
#pragma unroll
        for (int e = 0; e < 4; ++e) quad(r)[e] = 0.0f;
      for (int c = first; c <= last; ++c) {
        const long long start = sk.start(c);
        if (sk.start(c + 1) == start) continue;
        const int their_slot = start >= t0 ? 0 : 1;  // their range's first part, or its last
        const float4* part = reinterpret_cast<const float4*>(partials + (((size_t)pass * sk.blocks + c) * 2 + their_slot) * (QUADS * 4 * 128));
        float4 v[FOLD_LOADS];
#pragma unroll
        for (int i = 0; i < FOLD_LOADS; ++i)
          if (r0 + i < QUADS) v[i] = __ldcg(part + (r0 + i) * 128 + tid);
#pragma unroll
        for (int i = 0; i < FOLD_LOADS; ++i)
          if (r0 + i < QUADS) {
            float(&sum)[4] = quad(r0 + i);
            sum[0] += v[i].x, sum[1] += v[i].y, sum[2] += v[i].z, sum[3] += v[i].w;
          }
      }
    }
    write();
  }
  named_sync(barrier, 128);  // the flag is read before the next fold writes it
}

}  // namespace trellis_cuda

#!/usr/bin/env python3
"""Checks the index math of the warp-specialized down GEMM (kernels/cuda/down_ws.cu) without a GPU.

Emulates, in exact integers on a small seeded layer: the producers' code values in a stage (their
runs of 16 positions through CodeRun's words, offset and windows, either code layout), the
pre-pass's image of the activations (prescale.cu's IMAGE_ROWS order), the consumer's wgmmas
reading both through their descriptors' strides (A MN-major, B K-major, no swizzle: CUTLASS's
canonical layouts, ((8,m),(8,k)) core matrices with SBO along M or N and LBO along K) and the
epilogue's output positions, then compares the result with the direct product x W. What it
cannot check is the hardware's reading of those layouts: the GPU tests do (tests/cuda_down.rs).

  scripts/ws_layout_check.py                     # k 3 interleaved, k 3, 2 and 4 row-major
  scripts/ws_layout_check.py --k 4 --l 16 --rows 256 --cols 512 --mt 3
"""
import argparse
import random


def check(R, C, K, L, MT, interleave, seed=1):
    rnd = random.Random(seed)
    WPB, M = 8 * K, 8 * MT
    NB, TILES = R // 256, C // 64
    blocks = [[[rnd.getrandbits(32) for _ in range(WPB)] for _ in range(C // 256)] for _ in range(R)]
    # The stored words: row-major [R, C/256, 8K], or the interleave [C/512, R, 48].
    def block_words(r, cb):
        return ((cb >> 1) * R + r) * 48 + (cb & 1) * 24 if interleave else (r * (C // 256) + cb) * WPB
    flat = [0] * (R * C * K // 32)
    for r in range(R):
        for cb in range(C // 256):
            base = block_words(r, cb)
            flat[base:base + WPB] = blocks[r][cb]

    def y(s):
        v = (s * 34038481 + 76625530) & 0xFFFFFFFF
        return sum((v >> (8 * i)) & 255 for i in range(4)) - 510

    def state(r, c):  # position p's window: bits [(255 - p) K, + L) of the block, wrapping
        bits = sum(w << (32 * i) for i, w in enumerate(blocks[r][c // 256]))
        start = (255 - c % 256) * K
        return sum(((bits >> ((start + i) % (256 * K))) & 1) << i for i in range(L))

    W = [[y(state(r, c)) for c in range(C)] for r in range(R)]
    x = [[rnd.randint(-3, 3) for _ in range(R)] for _ in range(M)]
    want = [[sum(x[m][r] * W[r][c] for r in range(R)) for c in range(C)] for m in range(M)]

    # CodeRun<K, L, 16>: the words of a run of 16 positions from p, realigned.
    span = 16 * K + L - K
    aligned = (16 * K) % 32 == 0
    nwr = (span + 31) // 32
    nwl = nwr if aligned else nwr + 1

    def run_words(base, p):
        bit0 = (256 - p - 16) * K
        off = bit0 & 31
        raw = [flat[base + ((bit0 >> 5) + j) % WPB] for j in range(nwl)]
        return [raw[i] if aligned or off == 0 else ((raw[i] >> off) | (raw[i + 1] << (32 - off))) & 0xFFFFFFFF
                for i in range(nwr)]

    def window(w, b):
        i, off = b >> 5, b & 31
        v = w[i] if off + L <= 32 else w[i] | (w[i + 1] << 32)
        return (v >> off) & ((1 << L) - 1)

    # The pre-pass's image of one pass of M rows (halves).
    def image(row, r0):
        p0 = r0 & 255
        return (((r0 >> 8) * 4 + ((p0 >> 4) & 3)) * (M * 64) + (p0 >> 6) * (M * 16) + (row >> 3) * 128
                + ((p0 >> 3) & 1) * 64 + (row & 7) * 8)
    img = [0] * (M * R)
    for m in range(M):
        for r0 in range(0, R, 8):
            img[image(m, r0):image(m, r0) + 8] = x[m][r0:r0 + 8]

    got = [[0] * C for _ in range(M)]
    sbo, lbo = 256 // 2, 128 // 2  # halves: 256 bytes along M or N, 128 along K
    for tile in range(TILES):
        cb = tile >> 2
        D = [[0] * M for _ in range(64)]
        for b in range(NB):
            for sub in range(4):
                A = [0] * 4096
                for q in range(4):  # producer warp 4 + q: slice q
                    for lane in range(32):
                        j, group = lane & 7, lane >> 3
                        for h in range(2):
                            r = 256 * b + 64 * q + 16 * sub + 8 * h + j
                            w = run_words(block_words(r, cb), 64 * (tile & 3) + 16 * group)
                            for half in range(2):
                                at = (q * 2048 + (2 * group + half) * 256 + h * 128 + j * 16) // 2
                                A[at:at + 8] = [y(window(w, (15 - i) * K)) for i in range(8 * half, 8 * half + 8)]
                B = img[(b * 4 + sub) * M * 64:(b * 4 + sub + 1) * M * 64]
                for qb in range(4):
                    a0, b0 = qb * 1024, qb * MT * 128
                    for mrow in range(64):
                        for k in range(16):
                            a = A[a0 + mrow % 8 + (mrow // 8) * sbo + (k % 8) * 8 + (k // 8) * lbo]
                            for n in range(M):
                                D[mrow][n] += a * B[b0 + k % 8 + (n % 8) * 8 + (k // 8) * lbo + (n // 8) * sbo]
        for mrow in range(64):
            for n in range(M):
                got[n][64 * tile + mrow] = D[mrow][n]
    return max(abs(g - w) for gr, wr in zip(got, want) for g, w in zip(gr, wr))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int)
    ap.add_argument("--l", type=int, default=12)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--cols", type=int, default=512)
    ap.add_argument("--mt", type=int, default=1)
    ap.add_argument("--interleave", action="store_true")
    a = ap.parse_args()
    cases = [(a.rows, a.cols, a.k, a.l, a.mt, a.interleave)] if a.k else [
        (256, 512, 3, 12, 1, True), (256, 256, 3, 12, 2, False), (256, 256, 2, 8, 3, False), (256, 256, 4, 16, 1, False)]
    bad = 0
    for R, C, K, L, MT, inter in cases:
        err = check(R, C, K, L, MT, inter)
        print(f"R {R} C {C} k {K} L {L} mt {MT} {'interleaved' if inter else 'row-major'}: largest difference {err}")
        bad += err != 0
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()

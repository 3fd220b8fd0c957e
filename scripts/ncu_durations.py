#!/usr/bin/env python3
"""Kernel durations from `ncu --metrics gpu__time_duration.sum --print-units base --csv --page raw`.

Durations are in nanoseconds (`--print-units base`). Prints, per file, the shortest duration of
every kernel (one launch at a time, as a chain of dependent layers runs them). Trellis down
kernels are named by their configuration where the kernel name carries the template arguments;
MLX 0.32's CUDA back-end names a custom kernel by a hash of them instead
(`custom_kernel_NAME_HASH`), so there each kernel is labelled by its grid, block and the order of
its first launch (`bench_down --sweep --configs` launches the plan first, then the configurations
in the order given). The row count is not among the template arguments, so a file should hold one
row count's launches (`scripts/gpu.sh profile latency` runs one `--rows` a file).

    python3 scripts/ncu_durations.py out/latency_m1.csv [...]
"""
import collections
import csv
import re
import sys

# The down kernel's name (src/kernel/registry.rs, then MLX's suffix of template arguments in the
# order src/trellis/cuda/down/launch.rs gives them): the dtypes Y and T, the ints R C K L BLOCK_LEN
# NC MT KS WARPS SPLITS STAGES, the bools INTERLEAVE SPLIT_X BIAS_FOLD PACK_FMA PRESCALED MBARRIERS, the int
# UNROLLED_STEPS (0 rolled, 1 rounds of the B tiles' slots, 2 of both rings), then the bools
# BLOCK_EXP and DIRECT_CODES.
CONFIG = re.compile(
    r"mlx_trellis_down_mma_[0-9a-f]+_[a-z0-9_]*?" + r"_(\d+)" * 11 + r"_([tf])" * 6 + r"_(\d)_[tf]_([tf])"
)
UNROLLED = {"0": "", "1": " unrolled over the B tiles", "2": " unrolled over both rings"}


def label(name, grid="", block="", order=0):
    m = CONFIG.search(name)
    if not m:
        short = re.sub(r"\(.*", "", name).replace("void ", "")[:90]
        return f"{short} grid {grid} block {block} (first launched #{order})" if grid else short
    _r, _c, k, _l, t, nc, mt, ks, warps, splits, stages, _il, _sx, bias, pack, prescaled, mbarriers, unrolled, direct = (
        m.groups()
    )
    decode = "dp4a" + (" + bias fold" if bias == "t" else "") + (" + IMAD pack" if pack == "t" else "")
    return (
        f"trellis down k{k} T{t} nc{nc} mt{mt} ks{ks} warps{warps} splits{splits} stages{stages} {decode}"
        + (" prescaled" if prescaled == "t" else "")
        + (" mbarriers" if mbarriers == "t" else "")
        + UNROLLED[unrolled]
        + (" direct codes" if direct == "t" else "")
    )


for path in sys.argv[1:]:
    rows = list(csv.reader(open(path)))
    head = [i for i, r in enumerate(rows) if "Kernel Name" in r]
    print(f"== {path}")
    if not head:
        print("   (no kernels profiled)")
        continue
    hdr = rows[head[0]]
    name_at, time_at = hdr.index("Kernel Name"), hdr.index("gpu__time_duration.sum")
    grid_at = hdr.index("Grid Size") if "Grid Size" in hdr else None
    block_at = hdr.index("Block Size") if "Block Size" in hdr else None
    best = collections.OrderedDict()
    first = {}
    for r in rows[head[0] + 2 :]:
        name = r[name_at]
        first.setdefault(name, len(first) + 1)
        grid = r[grid_at] if grid_at is not None else ""
        block = r[block_at] if block_at is not None else ""
        key = label(name, grid, block, first[name])
        best[key] = min(best.get(key, float("inf")), float(r[time_at].replace(",", "")) / 1000.0)
    for key, us in sorted(best.items(), key=lambda kv: kv[1]):
        print(f"{us:9.1f} us  {key}")

#!/usr/bin/env python3
"""Kernel durations from `ncu --metrics gpu__time_duration.sum --print-units base --csv --page raw`.

Durations are in nanoseconds (`--print-units base`). Prints, per file, the shortest duration of
every kernel (one launch at a time, as a chain of
dependent layers runs them). Trellis down kernels are named by their configuration, decoded
from the template arguments in the kernel name.

    python3 scripts/ncu_durations.py out/latency_m1.csv [...]
"""
import collections
import csv
import re
import sys

# The down kernel's name (src/kernel/registry.rs, then MLX's suffix of template arguments in the
# order src/trellis/cuda/down/mod.rs gives them): the dtypes Y and T, the ints R C K L NC MT KS WARPS
# SPLITS STAGES, the bools INTERLEAVE SPLIT_X BIAS_FOLD PACK_FMA PRESCALED MBARRIERS, then the int
# UNROLLED_STEPS (0 rolled, 1 rounds of the B tiles' slots, 2 of both rings).
CONFIG = re.compile(
    r"mlx_trellis_down_mma_[0-9a-f]+_[a-z0-9_]*?" + r"_(\d+)" * 10 + r"_([tf])" * 6 + r"_(\d)"
)
UNROLLED = {"0": "", "1": " unrolled over the B tiles", "2": " unrolled over both rings"}


def label(name):
    m = CONFIG.search(name)
    if not m:
        return re.sub(r"\(.*", "", name).replace("void ", "")[:90]
    _r, _c, k, _l, nc, mt, ks, warps, splits, stages, _il, _sx, bias, pack, prescaled, mbarriers, unrolled = m.groups()
    decode = "dp4a" + (" + bias fold" if bias == "t" else "") + (" + IMAD pack" if pack == "t" else "")
    return (
        f"trellis down k{k} nc{nc} mt{mt} ks{ks} warps{warps} splits{splits} stages{stages} {decode}"
        + (" prescaled" if prescaled == "t" else "")
        + (" mbarriers" if mbarriers == "t" else "")
        + UNROLLED[unrolled]
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
    best = collections.OrderedDict()
    for r in rows[head[0] + 2 :]:
        key = label(r[name_at])
        best[key] = min(best.get(key, float("inf")), float(r[time_at].replace(",", "")) / 1000.0)
    for key, us in sorted(best.items(), key=lambda kv: kv[1]):
        print(f"{us:9.1f} us  {key}")

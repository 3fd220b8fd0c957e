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

# The activation dtype's name (bfloat16_t, float16_t, float) and then the template ints and bools.
CONFIG = re.compile(
    r"down_mma(?:_staged)?_[0-9a-f]+_[a-z0-9_]*?_(\d+)_(\d+)_(\d+)_(\d+)_(\d+)_(\d+)_(\d+)_(\d+)_(\d+)_(\d+)_([tf])_([tf])_([tf])_([tf])_([tf])(?:_([tf]))?(?:_(\d+))?(?:_(\d+))?(?:_([tf]))?(?:_([tf]))?"
)


def label(name):
    m = CONFIG.search(name)
    if not m:
        return re.sub(r"\(.*", "", name).replace("void ", "")[:90]
    _r, _c, k, _l, nc, mt, ks, warps, splits, stages, _il, _sx, mma, bias, pf, pack, row_warps, producers, prescaled, mbarriers = m.groups()
    decode = ("u8 mma" if mma == "t" else "dp4a") + (" + bias fold" if bias == "t" else "") + (" + IMAD pack" if pack == "t" else "")
    staged = f" staged, {row_warps} row warps" if row_warps and row_warps != "0" else ""
    if producers and producers != "0":
        staged += f", {producers} producer warps"
    return f"trellis k{k} nc{nc} mt{mt} ks{ks} warps{warps} splits{splits} stages{stages} {decode}" + (" prefetch" if pf == "t" else "") + (" prescaled" if prescaled == "t" else "") + (" mbarriers" if mbarriers == "t" else "") + staged


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

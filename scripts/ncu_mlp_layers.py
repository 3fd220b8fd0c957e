#!/usr/bin/env python3
"""Where a coded MLP layer's GPU time goes, from Nsight Compute's kernel durations.

Input: the CSV that `ncu --metrics gpu__time_duration.sum --print-units base --csv --page raw
--log-file FILE` writes while a model runs (for example `bench_model --variant dir:MODEL --rounds 1
--tokens 2 --warmup 1 --rows 1 --chains 1`). A coded MLP layer is the run of kernels from the
first activation pre-pass after an RMSNorm to the next trellis axis-1 kernel (SmolLM2's layout:
gate and up on the axis-0 kernel, down on the axis-1 kernel). Layers are grouped by their exact
kernels (a prompt's layers of several rows run other configurations than one-row decoding); per
group it prints, per kind of kernel, the launches and the median µs per layer, and the total.

    python3 scripts/ncu_mlp_layers.py ncu.csv
"""
import collections
import csv
import re
import statistics
import sys

KINDS = [
    # Before "down_mma", which its name also holds.
    ("down_mma_pair", "axis-0 kernel, gate and up in one launch (trellis down_mma pair)"),
    ("down_mma", "axis-0 kernel (trellis down_mma)"),
    ("gate_up", "axis-1 kernel (trellis gate_up)"),
    ("prescale", "activation pre-passes"),
    ("hadamard", "Hadamard transforms"),
    ("copy_v", "dtype copies"),
    # Before "rotate", which its name also holds.
    ("swiglu_rotate", "SwiGLU with rotations (trellis swiglu_rotate)"),
    ("rotate", "rotation kernel (trellis rotate)"),
]


def kernels(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))
    if not rows:
        sys.exit(f"{path}: no CSV rows (was ncu run with --csv --page raw?)")
    head = rows[0]
    name_at, time_at = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    for r in rows[1:]:
        try:
            ns = float(r[time_at].replace(",", ""))
        except (ValueError, IndexError):
            continue  # the units row
        yield re.sub(r"^void |\(.*", "", r[name_at]), ns


def layers(seq):
    i = 0
    while i < len(seq) - 1:
        if "rms_norm" in seq[i][0] and "prescale" in seq[i + 1][0]:
            j = i + 1
            while j < len(seq) and "gate_up" not in seq[j][0]:
                j += 1
            if j < len(seq):
                yield seq[i + 1 : j + 1]
            i = j
        i += 1


def kind(name):
    return next((label for key, label in KINDS if key in name), "other MLX kernels (signs, SiLU, product)")


def table(found):
    per_kind = collections.defaultdict(list)
    launches = collections.Counter()
    totals = []
    for layer in found:
        sums = collections.defaultdict(float)
        for name, ns in layer:
            sums[kind(name)] += ns / 1000
        for k, us in sums.items():
            per_kind[k].append(us)
        totals.append(sum(ns for _, ns in layer) / 1000)
    for name, _ in found[0]:
        launches[kind(name)] += 1
    print("| kernels | launches | µs per layer (median) |")
    print("|---|---|---|")
    for k, v in per_kind.items():
        print(f"| {k} | {launches[k]} | {statistics.median(v):.1f} |")
    print(f"| total | {len(found[0])} | {statistics.median(totals):.1f} |")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    groups = collections.defaultdict(list)
    for layer in layers(list(kernels(sys.argv[1]))):
        groups[tuple(name for name, _ in layer)].append(layer)
    if not groups:
        sys.exit("no coded MLP layer found")
    for names, found in groups.items():
        trellis = next((n for n in names if "down_mma" in n or "gate_up" in n), names[0])
        print(f"\n{len(found)} coded MLP layers of {len(names)} kernels (first trellis kernel: {trellis[-70:]})")
        table(found)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Every trellis kernel of `bench_mlp`'s chain at each row count, from Nsight Compute's durations.

Input: the CSV that `ncu --metrics gpu__time_duration.sum --print-units base --csv --page raw
--log-file FILE` writes over `bench_mlp --bits K --evals 2 --rounds 1 --no-alone` (one width, the
down projections on axis 0; `scripts/gpu.sh profile chain` runs it). The trellis chain of a row
count is the longest run of consecutive trellis launches between MLX's own kernels (the dense and affine contenders run
between row counts; the short runs are the first layer's checks against the reference). Per row
count, in the order of `--rows`, it prints each trellis kernel (family and grid) with its launches
per layer and its median duration, and the sum per layer: the figure to set beside the chain's
own time per layer.

    python3 scripts/ncu_chain.py ncu.csv [--rows 1,2,4,8,16,32,64,128]
"""
import argparse
import collections
import csv
import re
import statistics


def launches(path):
    """(family, grid, µs) of every launch, in order."""
    with open(path, newline="") as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))
    if not rows:
        raise SystemExit(f"{path}: no CSV rows (was ncu run with --csv --page raw?)")
    head = rows[0]
    name_at, time_at = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    grid_at = head.index("Grid Size") if "Grid Size" in head else None
    for r in rows[1:]:
        try:
            ns = float(r[time_at].replace(",", ""))
        except (ValueError, IndexError):
            continue  # the units row
        # MLX names a custom kernel `custom_kernel_<name>_<source hash>_<template hash>`.
        m = re.search(r"mlx_trellis_([a-z0-9_]+?)_[0-9a-f]{16}_[0-9a-f]{16}", r[name_at])
        grid = r[grid_at] if grid_at is not None else ""
        yield (m.group(1) if m else None), grid, ns / 1000


def chains(seq):
    """The timed chain of each row count: the longest run of consecutive trellis launches up to
    the first of at least 8 (the reference checks before it are a few launches each)."""
    runs, run = [], []
    for family, grid, us in seq:
        if family is None:
            if run:
                runs.append(run)
            run = []
        elif family != "expand":  # the dense twins' decode, before the first row count
            run.append((family, grid, us))
    if run:
        runs.append(run)
    # Between two MLX segments bench_mlp runs the reference checks (a few launches) and then the
    # timed chain; MLX's contenders of the same row count follow it.
    group, best = [], []
    for r in runs:
        group.append(r)
        if len(r) >= 8:
            best.append(max(group, key=len))
            group = []
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv")
    p.add_argument("--rows", default="", help="the run's --rows, to label the chains")
    args = p.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    found = chains(list(launches(args.csv)))
    if not found:
        raise SystemExit("no trellis chain found (at least 8 consecutive trellis launches)")
    print("| M | kernel (grid) | launches a layer | median µs | µs a layer |")
    print("|---|---|---|---|---|")
    for i, run in enumerate(found):
        label = rows[i] if i < len(rows) else f"chain {i + 1}"
        by = collections.defaultdict(list)
        for family, grid, us in run:
            by[(family, grid)].append(us)
        layers = max(sum(1 for f, _, _ in run if f.startswith("gate_up")), 1)
        total = 0.0
        for (family, grid), v in by.items():
            per_layer, median = len(v) / layers, statistics.median(v)
            total += per_layer * median
            print(f"| {label} | {family} {grid} | {per_layer:g} | {median:.1f} | {per_layer * median:.1f} |")
        print(f"| {label} | **sum** | | | **{total:.1f}** |")


if __name__ == "__main__":
    main()

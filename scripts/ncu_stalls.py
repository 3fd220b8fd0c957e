#!/usr/bin/env python3
"""Where a kernel's warps wait, per SASS instruction, from Nsight Compute's source page.

Reads the CSV of `ncu --import REPORT --page source --csv --print-source sass` (a report taken
with `--set full`, whose SourceCounters section samples each warp's program counter and stall
reason) and prints the total of the warp stall samples, the instructions that hold the most of
them (with the share that were not issued), and the samples summed per opcode: the stall
sampling's answer to "which instructions does this kernel wait at". The column names of the
CSV it read are printed too, so that a reason's own column (where the report has them) can be
picked with --column.

    python3 scripts/ncu_stalls.py out/axis1_gemm_m64_sass.csv [--top 40] [--column NAME]
"""
import argparse
import collections
import csv
import io
import sys


def table(path):
    """The header and rows of the CSV's first table of SASS: ncu prints its own lines, and a line
    naming the kernel, before a table's header (the first row with a "Source" column)."""
    text = open(path, errors="replace").read()
    start = text.find('"')
    if start < 0:
        sys.exit(f"{path}: no CSV in it")
    rows = list(csv.reader(io.StringIO(text[start:])))
    at = next((i for i, r in enumerate(rows) if len(r) > 2 and any("Source" in c for c in r)), None)
    if at is None:
        sys.exit(f"{path}: no header with a Source column (first rows: {rows[:2]})")
    header, body = rows[at], []
    for r in rows[at + 1 :]:
        if len(r) != len(header):
            break
        body.append(r)
    return header, body


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", help="the source page as CSV (--page source --csv --print-source sass)")
    parser.add_argument("--top", type=int, default=40, help="instructions to list (default 40)")
    parser.add_argument("--column", help="the samples column (default: Warp Stall Sampling (All Samples))")
    args = parser.parse_args()
    header, body = table(args.csv)
    print("columns: " + " | ".join(header))

    def find(*words):
        return next((i for i, c in enumerate(header) if all(w in c for w in words)), None)

    samples = header.index(args.column) if args.column else find("Sampling", "All")
    not_issued = find("Sampling", "Not")
    source = find("Source")
    if source is None:
        sys.exit("no Source column: was the page exported with --print-source sass?")
    if samples is None:
        sys.exit("no warp stall sampling column: was the report taken with --set full?")
    total = sum(number(r[samples]) for r in body) or 1.0
    print(f"\nwarp stall samples: {total:.0f} over {len(body)} instructions ({header[samples]})")
    print(f"\n{'samples':>8} {'share':>6} {'not issued':>10}  address  instruction")
    for r in sorted(body, key=lambda r: -number(r[samples]))[: args.top]:
        ni = number(r[not_issued]) if not_issued is not None else 0.0
        print(f"{number(r[samples]):8.0f} {100 * number(r[samples]) / total:5.1f}% {ni:10.0f}  {r[0]}  {r[source].strip()[:100]}")
    per_opcode = collections.Counter()
    for r in body:
        words = r[source].split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words:
            per_opcode[words[0].split(".")[0]] += number(r[samples])
    print(f"\n{'samples':>8} {'share':>6}  opcode")
    for op, v in per_opcode.most_common(25):
        print(f"{v:8.0f} {100 * v / total:5.1f}%  {op}")


if __name__ == "__main__":
    main()

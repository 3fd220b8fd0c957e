#!/usr/bin/env python3
"""Where a kernel's warps wait, per SASS instruction, from Nsight Compute's source page.

Reads the CSV of `ncu --import REPORT --page source --csv --print-source sass` (a report taken
with `--set full`, whose SourceCounters section samples each warp's program counter and stall
reason) and prints the total of the warp stall samples, the instructions that hold the most of
them (with the share that were not issued), and the samples summed per opcode: the stall
sampling's answer to "which instructions does this kernel wait at". The column names of the
CSV it read are printed too, so that a reason's own column (where the report has them) can be
picked with --column.

    python3 scripts/ncu_stalls.py out/axis1_gemm_m64_sass.csv [--top 40] [--column NAME] [--roles]
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
    parser.add_argument(
        "--roles",
        action="store_true",
        help="also split the samples of a warp-specialized kernel by role: the producers (the code "
        "from the first IDP, their decode, on), the consumer's per-step code (executed at least "
        "a sixteenth as often as its wgmmas) and its per-tile code (the epilogue and the fold), each with "
        "its main stall reasons",
    )
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
    if args.roles:
        roles(header, body, samples, source, total)


def roles(header, body, samples, source, total):
    """The samples of the warp-specialized GEMMs (gate_up_ws.cu, down_ws.cu) by role. Their code is
    laid out consumer first, producers after: the producers are the instructions from a little before
    the first IDP (the decode's byte sum), and the consumer's instructions split by how often they
    ran: per step at least a sixteenth as often as its wgmmas (HGMMA, one set a step; the copies
    are issued by one warp of four), per tile less (a tile is tens of steps).
    The stall reasons are the report's per-instruction stall_* columns."""
    address = header.index("Address") if "Address" in header else 0
    executed = next((i for i, c in enumerate(header) if c == "Instructions Executed"), None)
    reasons = [(c[len("stall_") :], i) for i, c in enumerate(header) if c.startswith("stall_") and "Not Issued" not in c]
    if executed is None or not reasons:
        print("\n--roles: the report has no Instructions Executed or stall_* columns (--set full)")
        return
    decode = [int(r[address], 16) for r in body if "IDP" in r[source]]
    if not decode:
        print("\n--roles: no IDP in the kernel: not a trellis producer/consumer kernel")
        return
    # The producer loop's head (the code words' addresses, the first windows) precedes its first IDP.
    producers_from = min(decode) - 0x800
    per_step = max((number(r[executed]) for r in body if "HGMMA" in r[source]), default=0.0) / 16
    if per_step == 0:
        print("\n--roles: no wgmma (HGMMA) in the kernel: not a warp-specialized GEMM")
        return
    groups = collections.defaultdict(collections.Counter)
    for r in body:
        if int(r[address], 16) >= producers_from:
            role = "producers"
        elif number(r[executed]) >= per_step:
            role = "consumer, per step"
        else:
            role = "consumer, per tile"
        groups[role]["samples"] += number(r[samples])
        for name, i in reasons:
            groups[role][name] += number(r[i])
    print(f"\n{'samples':>8} {'share':>6}  role: main stall reasons (share of the role's stall samples)")
    for role in ("producers", "consumer, per step", "consumer, per tile"):
        g = groups[role]
        stalls = sum(v for k, v in g.items() if k != "samples") or 1.0
        top = ", ".join(f"{k} {100 * v / stalls:.0f} %" for k, v in g.most_common() if k != "samples" and v > 0)
        print(f"{g['samples']:8.0f} {100 * g['samples'] / total:5.1f}%  {role}: {top[:150]}")


if __name__ == "__main__":
    main()

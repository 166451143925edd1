#!/usr/bin/env python3
"""Where a forward's device time goes, from an Nsight Compute CSV of kernel durations.

  tools/ncu_step_breakdown.py ncu-decode.csv [--json out.json]

The CSV is what `tools/gpu-check.sh profile` writes (`ncu --metrics gpu__time_duration.sum --csv`).
A forward starts at its embedding kernel; the first complete forward in the window is summarised
by kernel: launches, total and mean duration, and the sum over the forward.
"""
import argparse
import collections
import csv
import io
import json
import re
import sys


def forwards(path):
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]
    rows = csv.DictReader(io.StringIO("".join(lines)))
    current, found = None, []
    for row in rows:
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = re.sub(r"\(.*", "", row["Kernel Name"]).replace("void ", "").replace("unnamed>::", "")
        nanoseconds = float(row["Metric Value"].replace(",", ""))
        if "embedding" in name:
            current = []
            found.append(current)
        if current is not None:
            current.append((name, nanoseconds))
    return found[:-1]  # the last one may be cut by the window's end


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--json", help="also write the breakdown here")
    args = parser.parse_args()
    complete = forwards(args.csv)
    if not complete:
        sys.exit(f"{args.csv}: no complete forward in the window")
    forward = complete[0]
    by_kernel = collections.defaultdict(lambda: [0, 0.0])
    for name, nanoseconds in forward:
        by_kernel[name][0] += 1
        by_kernel[name][1] += nanoseconds
    total = sum(nanoseconds for _, nanoseconds in forward)
    print(f"{args.csv}: {len(complete)} complete forwards; the first: {len(forward)} launches, "
          f"{total / 1e6:.3f} ms of kernel time")
    print(f"{'kernel':44} {'launches':>8} {'ms':>8} {'mean us':>8} {'share':>6}")
    table = []
    for name, (count, nanoseconds) in sorted(by_kernel.items(), key=lambda item: -item[1][1]):
        print(f"{name[:44]:44} {count:8d} {nanoseconds / 1e6:8.3f} {nanoseconds / count / 1e3:8.2f} "
              f"{100 * nanoseconds / total:5.1f}%")
        table.append({"kernel": name, "launches": count, "ms": nanoseconds / 1e6})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"launches": len(forward), "kernel_ms": total / 1e6, "kernels": table}, f,
                      indent=2)


if __name__ == "__main__":
    main()

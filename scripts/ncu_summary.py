#!/usr/bin/env python3
"""Per-kernel summary of an ncu --csv --page raw log (scripts/gpu_run.sh profile):
one line per kernel and grid with its count, mean time, DRAM read bandwidth and share."""
import csv
import re
import sys
from collections import defaultdict

lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
rows = list(csv.reader(lines[start:]))
header = {name: i for i, name in enumerate(rows[0])}
data = [r for r in rows[2:] if len(r) == len(rows[0])]


def number(row, key):
    return float(row[header[key]].replace(",", ""))


totals = defaultdict(lambda: [0, 0.0, 0.0])
for r in data:
    name = re.sub(r"\(.*", "", r[header["Kernel Name"]]).replace("void ", "").replace("unnamed>::", "")
    t = totals[(name, r[header["Grid Size"]])]
    t[0] += 1
    t[1] += number(r, "gpu__time_duration.sum")
    t[2] += number(r, "dram__bytes_read.sum")
all_ns = sum(t[1] for t in totals.values())
print(f"{'kernel':44s} {'grid':14s} {'n':>4s} {'mean us':>8s} {'GB/s':>6s} {'share':>6s}")
for (name, grid), (n, ns, b) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
    print(f"{name[:44]:44s} {grid:14s} {n:4d} {ns / n / 1e3:8.2f} {b / ns:6.0f} {ns / all_ns:6.1%}")
print(f"{len(data)} kernels, {all_ns / 1e3:.0f} us")

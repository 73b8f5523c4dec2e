#!/usr/bin/env python3
"""Where a decode step's time goes inside its CUDA graph, from kernel_timeline.so's CSV.

Each graph (a decode step of one batch size and key range) is reported apart. For each
of its launches (one decode step) the kernels are sorted by start; a kernel's
share of the step is how far it moves the step's latest end (end minus the latest end
of the kernels before it, at least 0), so the shares add up to the step. Prints the
shares by kernel, averaged over the last steps, and one step's first kernels in order.

usage: kernel_timeline.py TIMELINE.csv [--steps N] [--show K] [--min-launches L]
"""
import argparse
import collections
import csv
import re


def short(name):
    name = name.replace("mere::cuda::", "").replace("(anonymous namespace)::", "")
    name = re.sub(r"\(.*\)$", "", name)  # parameters
    return name[:90]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=8, help="the last N launches of each graph")
    ap.add_argument("--min-launches", type=int, default=4, help="graphs launched fewer times are left out")
    ap.add_argument("--show", type=int, default=24, help="kernels of one step to list in order")
    a = ap.parse_args()
    launches = collections.defaultdict(list)
    with open(a.csv) as f:
        for r in csv.DictReader(f):
            if r["graph"] == "0":
                continue
            launches[(r["graph"], r["correlation"])].append(
                (int(r["start_ns"]), int(r["end_ns"]), short(r["name"]), r["blocks"], r["threads"], r["dynamic_smem"]))
    if not launches:
        print("no graph launches recorded")
        return
    graphs = collections.defaultdict(list)  # a graph's launches, each a decode step of one batch size
    for (graph, _), kernels in launches.items():
        graphs[graph].append(kernels)
    for graph, steps in sorted(graphs.items(), key=lambda kv: min(k[0] for k in kv[1][0])):
        if len(steps) >= a.min_launches:
            report(graph, steps, a)


def report(graph, steps, a):
    steps = sorted(steps, key=lambda v: min(k[0] for k in v))[-a.steps:]
    share = collections.defaultdict(float)
    duration = collections.defaultdict(float)
    count = collections.Counter()
    spans = []
    for step in steps:
        step.sort()
        t0, latest = step[0][0], step[0][0]
        for start, end, name, *_ in step:
            share[name] += max(0, end - latest) / 1e3
            duration[name] += (end - start) / 1e3
            count[name] += 1
            latest = max(latest, end)
        spans.append((latest - t0) / 1e3)
    n = len(steps)
    span = sum(spans) / n
    print(f"graph {graph}: {n} steps of {len(steps[0])} kernels, {span:.1f} us a step ({min(spans):.1f}-{max(spans):.1f})")
    print(f"{'share us/step':>13} {'%':>5} {'launches':>8} {'us a launch: share':>18} {'duration':>9}  kernel")
    for name, s in sorted(share.items(), key=lambda kv: -kv[1]):
        per = count[name] / n
        print(f"{s / n:13.1f} {100 * s / n / span:5.1f} {per:8.0f} {s / count[name]:18.2f} {duration[name] / count[name]:9.2f}  {name}")
    step = steps[-1]
    t0 = step[0][0]
    print(f"\nthe last step's first {a.show} kernels (us from the step's start):")
    latest = t0
    for start, end, name, blocks, threads, smem in step[: a.show]:
        print(f"  {(start - t0) / 1e3:8.2f} -> {(end - t0) / 1e3:8.2f}  +{max(0, end - latest) / 1e3:5.2f}  "
              f"{blocks:>5}x{threads:<4} {int(smem) // 1024:4d} KB  {name}")
        latest = max(latest, end)
    print()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Where a decode step's time goes inside its CUDA graph, from kernel_timeline.so's CSV.

Each graph (a decode step of one batch size and key range) is reported apart. For each
of its launches (one decode step) the kernels are sorted by start; a kernel's
share of the step is how far it moves the step's latest end (end minus the latest end
of the kernels before it, at least 0), so the shares add up to the step. Prints the
shares by kernel, averaged over the last steps, and one step's first kernels in order.

With --svg, one step's kernels (from --svg-from, --svg-kernels of them) of the graph
--graph (default: the first reported) are drawn as bars from start to end, the part
before the step's latest end so far pale (overlapped, or waiting), the share dark.

usage: kernel_timeline.py TIMELINE.csv [--steps N] [--show K] [--min-launches L]
                          [--svg OUT.svg [--graph G] [--svg-from K] [--svg-kernels N] [--title T]
                           [--labels NAME,NAME,...]] [--roles NAME,NAME,...]

With --roles, the matvec launches of a step (kernels named *matvec*) are named in order by the
roles, repeated (a decode layer's matvecs), the step's last one `lm_head`, and each role's mean
share is printed: what a layer's matrices cost inside the step, against their bytes.
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
    ap.add_argument("--svg", help="draw one step's kernels into this SVG file")
    ap.add_argument("--graph", help="the graph to draw (default: the first reported)")
    ap.add_argument("--svg-from", type=int, default=1, help="the first kernel drawn (0: the step's first)")
    ap.add_argument("--svg-kernels", type=int, default=20, help="kernels drawn")
    ap.add_argument("--title", default="", help="the chart's title")
    ap.add_argument("--labels", default="", help="names for the drawn kernels, comma-separated, repeated")
    ap.add_argument("--show", type=int, default=24, help="kernels of one step to list in order")
    ap.add_argument("--roles", default="", help="names for a layer's matvec launches in order, comma-separated")
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
    drawn = False
    for graph, steps in sorted(graphs.items(), key=lambda kv: min(k[0] for k in kv[1][0])):
        if len(steps) >= a.min_launches:
            last = report(graph, steps, a)
            if a.svg and not drawn and (a.graph is None or a.graph == graph):
                labels = [x.strip() for x in a.labels.split(",")] if a.labels else []
                draw(last[a.svg_from : a.svg_from + a.svg_kernels], a.svg, a.title or f"graph {graph}", labels)
                drawn = True


def draw(kernels, path, title, labels):
    """A Gantt chart of kernels (start, end, name, ...), in us from the first one's start;
    each named by labels (repeated) where given, else by its kernel."""
    t0 = kernels[0][0]
    span = max(k[1] for k in kernels) - t0
    left, width, row, top = 250, 640, 18, 40
    scale = width / span
    colors = {"matvec": "#3b6fb6", "prepare": "#e08a2c", "attention": "#3f9b5a"}

    def kind(name):
        return next((c for key, c in colors.items() if key in name), "#888888")

    def label(name):
        name = name.replace("void ", "")
        return name.split("<")[0][:34]

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 70}" '
           f'height="{top + row * len(kernels) + 40}" font-family="sans-serif" font-size="11">',
           f'<text x="10" y="20" font-size="13">{title}</text>']
    latest = t0
    for i, (start, end, name, blocks, *_) in enumerate(kernels):
        y = top + i * row
        x0, x1 = left + (start - t0) * scale, left + (end - t0) * scale
        xl = left + (max(latest, start) - t0) * scale
        c = kind(name)
        text = labels[i % len(labels)] if labels else label(name)
        out.append(f'<text x="{left - 6}" y="{y + 12}" text-anchor="end">{text} ({blocks} blocks)</text>')
        out.append(f'<rect x="{x0:.1f}" y="{y + 2}" width="{max(xl - x0, 0):.1f}" height="{row - 5}" fill="{c}" '
                   f'opacity="0.25"/>')
        out.append(f'<rect x="{xl:.1f}" y="{y + 2}" width="{max(x1 - xl, 0.5):.1f}" height="{row - 5}" fill="{c}"/>')
        share = max(0, end - latest) / 1e3
        out.append(f'<text x="{x1 + 4:.1f}" y="{y + 12}" fill="#444">+{share:.1f}</text>')
        latest = max(latest, end)
    axis_y = top + row * len(kernels) + 8
    out.append(f'<line x1="{left}" y1="{axis_y}" x2="{left + width}" y2="{axis_y}" stroke="#000"/>')
    step = 10 if span / 1e3 > 40 else 5
    for us in range(0, int(span / 1e3) + 1, step):
        x = left + us * 1e3 * scale
        out.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 4}" stroke="#000"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y + 16}" text-anchor="middle">{us} us</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def roles_report(steps, roles):
    """Each role's mean share a layer (a role named twice adds its launches), the last lm_head's a step."""
    share = collections.defaultdict(float)
    layers = 0
    for step in steps:  # sorted by start (report)
        latest = step[0][0]
        matvecs = []
        for start, end, name, *_ in step:
            if "matvec" in name:
                matvecs.append(max(0, end - latest) / 1e3)
            latest = max(latest, end)
        if (len(matvecs) - 1) % len(roles):
            print(f"roles: {len(matvecs)} matvecs a step are not layers of {len(roles)} and an lm_head")
            return
        layers = (len(matvecs) - 1) // len(roles)
        for i, s in enumerate(matvecs[:-1]):
            share[roles[i % len(roles)]] += s
        share["lm_head"] += matvecs[-1]
    n = len(steps)
    print(f"matvec shares ({layers} layers), us a layer (lm_head: a step):")
    for role in dict.fromkeys(roles):
        print(f"  {role:>10} {share[role] / n / layers:7.2f}")
    print(f"  {'lm_head':>10} {share['lm_head'] / n:7.2f}")
    print(f"  {'a layer':>10} {sum(share[r] for r in dict.fromkeys(roles)) / n / layers:7.2f}")


def report(graph, steps, a):
    """Prints a graph's shares; returns its last step's kernels, sorted by start."""
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
    # Between replays: the GPU idles from a step's last end to the next step's first start
    # (no programmatic launch across graphs; the token copy and the event sit between them).
    gaps = [(after[0][0] - max(k[1] for k in before)) / 1e3 for before, after in zip(steps, steps[1:])]
    if gaps:
        print(f"between consecutive steps: {sum(gaps) / len(gaps):.2f} us idle ({min(gaps):.2f}-{max(gaps):.2f})")
    print(f"{'share us/step':>13} {'%':>5} {'launches':>8} {'us a launch: share':>18} {'duration':>9}  kernel")
    for name, s in sorted(share.items(), key=lambda kv: -kv[1]):
        per = count[name] / n
        print(f"{s / n:13.1f} {100 * s / n / span:5.1f} {per:8.0f} {s / count[name]:18.2f} {duration[name] / count[name]:9.2f}  {name}")
    if a.roles:
        roles_report(steps, [x.strip() for x in a.roles.split(",")])
    step = steps[-1]
    t0 = step[0][0]
    print(f"\nthe last step's first {a.show} kernels (us from the step's start):")
    latest = t0
    for start, end, name, blocks, threads, smem in step[: a.show]:
        print(f"  {(start - t0) / 1e3:8.2f} -> {(end - t0) / 1e3:8.2f}  +{max(0, end - latest) / 1e3:5.2f}  "
              f"{blocks:>5}x{threads:<4} {int(smem) // 1024:4d} KB  {name}")
        latest = max(latest, end)
    print()
    return step


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A stacked horizontal bar chart (SVG, no dependencies) from a CSV: the first
column names a bar, each other column a part of every bar, stacked left to right
in column order. Usage: bar_chart.py data.csv out.svg "title" "x label"."""
import csv
import sys

from line_chart import nice_step

COLOURS = ["#1f77b4", "#d62728", "#ff7f0e", "#9467bd", "#2ca02c", "#8c564b"]
W, LEFT, RIGHT, TOP, BAR, GAP, LEGEND = 820, 230, 30, 40, 26, 14, 24


def main(data, out, title, x_label):
    rows = list(csv.reader(open(data)))
    parts, bars = rows[0][1:], [(r[0], [float(v) for v in r[1:]]) for r in rows[1:] if r]
    total = max(sum(values) for _, values in bars)
    step = nice_step(total, most_ticks=10)
    x1 = (total // step + 1) * step
    px = lambda x: LEFT + x / x1 * (W - LEFT - RIGHT)
    bottom = TOP + len(bars) * (BAR + GAP)
    height = bottom + 40 + LEGEND * ((len(parts) + 2) // 3)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif" '
           f'font-size="12">', f'<rect width="{W}" height="{height}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>']
    x = 0
    while x <= x1:
        svg.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{TOP - 4}" y2="{bottom}" stroke="#ddd"/>')
        svg.append(f'<text x="{px(x):.1f}" y="{bottom + 14}" text-anchor="middle">{x:g}</text>')
        x += step
    svg.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{bottom + 30}" text-anchor="middle">{x_label}</text>')
    for b, (name, values) in enumerate(bars):
        y, start = TOP + b * (BAR + GAP), 0.0
        svg.append(f'<text x="{LEFT - 8}" y="{y + BAR / 2 + 4}" text-anchor="end">{name}</text>')
        for i, v in enumerate(values):
            svg.append(f'<rect x="{px(start):.1f}" y="{y}" width="{px(start + v) - px(start):.1f}" height="{BAR}" '
                       f'fill="{COLOURS[i % len(COLOURS)]}"><title>{parts[i]}: {v:g}</title></rect>')
            start += v
        svg.append(f'<text x="{px(start) + 4:.1f}" y="{y + BAR / 2 + 4}">{start:g}</text>')
    for i, part in enumerate(parts):
        lx, ly = LEFT + (i % 3) * 190, bottom + 48 + LEGEND * (i // 3)
        svg.append(f'<rect x="{lx}" y="{ly - 10}" width="14" height="12" fill="{COLOURS[i % len(COLOURS)]}"/>')
        svg.append(f'<text x="{lx + 20}" y="{ly}">{part}</text>')
    svg.append("</svg>")
    open(out, "w").write("\n".join(svg) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])

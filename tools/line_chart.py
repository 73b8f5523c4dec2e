#!/usr/bin/env python3
"""A line chart (SVG, no dependencies) from a CSV: the first column is x, each
other column a series; a series named "NAME (before)" is drawn dashed in the
colour of "NAME". Usage: line_chart.py data.csv out.svg "title" "x label" "y label"."""
import csv
import sys

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
W, H, LEFT, RIGHT, TOP, BOTTOM = 760, 420, 70, 210, 40, 50


def nice_step(span, most_ticks=8):
    """The smallest round step that cuts span into at most most_ticks ticks."""
    for step in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000):
        if span / step <= most_ticks:
            return step
    return 2000


def main(data, out, title, x_label, y_label):
    rows = list(csv.reader(open(data)))
    names, body = rows[0][1:], [[float(v) for v in r] for r in rows[1:] if r]
    xs = [r[0] for r in body]
    ys = [v for r in body for v in r[1:]]
    x0, x1 = min(xs), max(xs)
    step = nice_step(max(ys) - min(ys))
    y0, y1 = (min(ys) // step) * step, (max(ys) // step + 1) * step
    px = lambda x: LEFT + (x - x0) / (x1 - x0) * (W - LEFT - RIGHT)
    py = lambda y: H - BOTTOM - (y - y0) / (y1 - y0) * (H - TOP - BOTTOM)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>']
    y = y0
    while y <= y1:
        svg.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#ddd"/>')
        svg.append(f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
        y += step
    for x in xs:
        svg.append(f'<text x="{px(x):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{x:g}</text>')
    svg.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 10}" text-anchor="middle">{x_label}</text>')
    svg.append(f'<text transform="translate(16 {(TOP + H - BOTTOM) / 2}) rotate(-90)" text-anchor="middle">{y_label}</text>')
    base = [n for n in names if not n.endswith(" (before)")]
    for i, name in enumerate(names):
        plain = name[:-len(" (before)")] if name.endswith(" (before)") else name
        colour = COLOURS[base.index(plain) % len(COLOURS)] if plain in base else COLOURS[i % len(COLOURS)]
        dash = ' stroke-dasharray="5 4"' if name != plain else ""
        points = " ".join(f"{px(r[0]):.1f},{py(r[i + 1]):.1f}" for r in body)
        svg.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        ly = TOP + 10 + 18 * i
        svg.append(f'<line x1="{W - RIGHT + 12}" x2="{W - RIGHT + 36}" y1="{ly}" y2="{ly}" stroke="{colour}" '
                   f'stroke-width="2"{dash}/>')
        svg.append(f'<text x="{W - RIGHT + 42}" y="{ly + 4}">{name}</text>')
    svg.append("</svg>")
    open(out, "w").write("\n".join(svg) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    main(*sys.argv[1:])

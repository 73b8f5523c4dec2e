#!/usr/bin/env python3
"""Registers, stack frames and spills of every kernel in some CUDA sources, from ptxas.

Compiles each file alone for sm_90a (as the build does, without PTX) with `-Xptxas -v`
and prints the kernels that keep anything in local memory (a stack frame or spills),
then a count of all kernels by registers. A spill inside a decode kernel's loop cost
Qwen3-30B-A3B int8 decode 2.3% (docs/benchmarks.md, twenty-fourth session); a file
takes minutes on two cores.

    tools/ptxas_report.py src/ops/cuda/affine_matvec_mma.cu [--all]
"""
import argparse
import collections
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
NVCC = ["/usr/local/cuda/bin/nvcc", "-DMERE_HAVE_CUDA=1", f"-I{ROOT / 'src'}", "--expt-relaxed-constexpr", "-O3",
        "-DNDEBUG", "-std=c++20", "--generate-code=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-x", "cu", "-c",
        "-o", "/dev/null"]


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return [n.replace("mere::cuda::(anonymous namespace)::", "").split("(")[0] for n in out]


def kernels(source):
    log = subprocess.run(NVCC + [str(source)], capture_output=True, text=True)
    if log.returncode != 0:
        sys.exit(f"{source}: nvcc failed\n{log.stderr[-2000:]}")
    rows, name, frame = [], None, (0, 0, 0)
    for line in log.stderr.splitlines():
        if m := re.search(r"Compiling entry function '(\S+)'", line):
            name = m.group(1)
        elif m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            frame = tuple(int(v) for v in m.groups())
        elif (m := re.search(r"Used (\d+) registers", line)) and name:
            rows.append((name, int(m.group(1)), frame))
            name = None
    return [(d, regs, frame) for d, (_, regs, frame) in zip(demangle([r[0] for r in rows]), rows)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sources", nargs="+")
    parser.add_argument("--all", action="store_true", help="every kernel, not only those with local memory")
    args = parser.parse_args()
    for source in args.sources:
        rows = kernels(source)
        local = [r for r in rows if args.all or r[2] != (0, 0, 0)]
        print(f"{source}: {len(rows)} kernels, {sum(r[2] != (0, 0, 0) for r in rows)} with local memory")
        for name, regs, (stack, stores, loads) in local:
            print(f"  {regs:3d} registers  stack {stack:3d}  spill stores {stores:3d} loads {loads:3d}  {name}")
        by_regs = collections.Counter(regs for _, regs, _ in rows)
        print("  registers: " + ", ".join(f"{r} x{n}" for r, n in sorted(by_regs.items())))


if __name__ == "__main__":
    main()

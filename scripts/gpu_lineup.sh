#!/usr/bin/env bash
# Issue 6's lineup on one GPU in one run: Llama-3-8B and Qwen3-30B-A3B in
# bf16, int8, int4 and fp8 at B = 1 (pp512, tg128), each row's fractions against the ceilings
# measured on this GPU (--calibrate), not the H200 defaults. On the GPU machine (carry .devrun):
#   bash scripts/gpu_lineup.sh [llama3-8b qwen3-30b-a3b]
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
m=/tmp/mere_bin/mere
if [ ! -x $m ]; then
  mkdir -p /tmp/mere_bin /tmp/mere_libs
  tar -C /tmp/mere_bin -xJf .devrun/bin.tar.xz && tar -C /tmp/mere_libs -xJf .devrun/libs.tar.xz
fi
export LD_LIBRARY_PATH=/tmp/mere_libs:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee -a "$out/lineup.log"
for shape in ${@:-llama3-8b qwen3-30b-a3b}; do
  for q in bf16 int8 int4 fp8; do
    timeout 150 $m bench --calibrate --device cuda --shape $shape --quant $q -p 512 -n 128 -r 3 2>&1 | tee -a "$out/lineup.log"
  done
done

#!/usr/bin/env bash
# Device call: lever kernel_token_slots (the step's last kernel writes the tokens
# into the host's pinned slots; no copy between graph replays). Its tests, then
# off/on in one binary (MERERUN_KERNEL_TOKEN_SLOTS), three rounds, and the idle time
# between graph replays from a kernel timeline of each arm. Pack with
# scripts/gpu_package.sh; run with carry .devrun.
cd "$(dirname "$0")/.."
export OUT
t0=$(date +%s)
HANG_S=300 GTEST_FILTER=${GTEST_FILTER:-'CudaOps.AdvancePosition*:*DecodeLoopGpu.*:*BatchDecodeLoopGpu.*'} \
  scripts/gpu_run.sh tests 2>&1 | grep -E "PASSED|FAILED|Failure" | tail -8
echo "tests took $(( $(date +%s) - t0 )) s"
m=/tmp/mere_bin/mere
export LD_LIBRARY_PATH=/tmp/mere_libs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for round in 1 2 3; do
  for run in "llama3-8b --quant int4" "llama3-8b --quant int8" "qwen3-0.6b"; do
    for on in 0 1; do
      echo "== $run kernel_token_slots=$on round $round"
      MERERUN_KERNEL_TOKEN_SLOTS=$on $m bench --device cuda --shape $run -p 0 -n 128 --batch 1,4 -r 3 2>&1 |
        grep -E "tg128" | awk -F'|' '{print $7, $9}'
    done
  done
done 2>&1 | tee $OUT/ab.log
for on in 0 1; do
  for run in "llama3-8b --quant int4" "qwen3-0.6b"; do
    name=$(echo $run | tr -d ' -' )_on$on
    MERERUN_KERNEL_TOKEN_SLOTS=$on CUDA_INJECTION64_PATH=$PWD/.devrun/kernel_timeline.so MERE_TIMELINE=$OUT/$name.csv \
      $m bench --device cuda --shape $run -p 0 -n 32 -r 1 -d 0 --batch 1 > /dev/null 2>&1
    python3 tools/kernel_timeline.py $OUT/$name.csv > $OUT/$name.txt 2>&1
    echo "== timeline $name"; grep -E "^graph|between" $OUT/$name.txt | head -6
  done
done
echo "all took $(( $(date +%s) - t0 )) s"

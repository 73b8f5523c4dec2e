#!/usr/bin/env bash
# Runs the GPU tests and benchmarks on a GPU machine from binaries built elsewhere
# (the device machine of our workplace has no Debian packages): .devrun/ holds
# bin.tar.xz (mere, mere_gpu_tests) and libs.tar.xz (libfmt, libpcre2, ICU). Logs go to $OUT.
# Usage: scripts/gpu_run.sh [tests] [bench] [levers] [decode_ab] [profile] [timeline] [moe] [moe_prefill] [profile_prefill] [lineup] [quant] [quant_moe] [kv] [tc_matvec] [affine_gemm] [hang]; MERE_DEVRUN names the pack
# (default .devrun), GTEST_FILTER picks tests.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pack=$root/${MERE_DEVRUN:-.devrun}
out=${OUT:-/tmp/mere_out}
mkdir -p "$out" /tmp/mere_libs
tar -C /tmp/mere_libs -xJf "$pack/libs.tar.xz"
bin=/tmp/mere_bin
mkdir -p "$bin" && tar -C "$bin" -xJf "$pack/bin.tar.xz"
export LD_LIBRARY_PATH=/tmp/mere_libs:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
# The binaries look for fixtures under the source dir they were built in.
src=$(cat "$pack/source_dir")
if [ -n "$src" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; fi
# Tests that run the CLI find it where it was built (MERE_BINARY).
if [ -f "$pack/build_dir" ]; then
  build=$root/$(cat "$pack/build_dir")
  [ -e "$build/mere" ] || { mkdir -p "$build" && ln -s "$bin/mere" "$build/mere"; }
fi
# Runs CMD... with its output in LOG; if it is still running after LIMIT seconds,
# its host threads' stacks go to LOG.stacks.txt (gdb or cuda-gdb) and it is killed.
watched() {
  local log=$1 limit=$2; shift 2
  "$@" > "$log" 2>&1 &
  local pid=$!
  for _ in $(seq "$limit"); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "still running after $limit s; last test:" | tee "$log.stacks.txt"
    grep '^\[ RUN' "$log" | tail -1 | tee -a "$log.stacks.txt"
    local debugger
    debugger=$(command -v gdb || command -v cuda-gdb || true)
    [ -n "$debugger" ] && "$debugger" -p "$pid" -batch -ex "thread apply all bt" >> "$log.stacks.txt" 2>&1
    kill -9 "$pid"
  fi
  wait "$pid" 2>/dev/null
}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
for what in "${@:-tests bench}"; do
  case $what in
    tests)  # a run still going after HANG_S seconds (default 300) has its host stacks dumped, then is killed
      [ -x "$bin/mere" ] || echo "no mere on this machine (a tests-only pack): the tests that run the CLI fail;" \
        "carry the bench pack (MERE_PACK_SPLIT) first while the machine is warm"
      watched "$out/gpu_tests.log" "${HANG_S:-300}" "$bin/mere_gpu_tests"
      grep -E "^\[ (gpu|  FAILED|  PASSED) |FAILED|PASSED|Failure" "$out/gpu_tests.log" ;;
    bench)
      m="$bin/mere"
      "$m" bench --calibrate --device cuda 2>&1 | tee "$out/bench.log"
      "$m" bench --device cuda --baseline --shape llama3-8b -p 512,4096 -n 128 -d 0,8192 -r 3 2>&1 | tee -a "$out/bench.log"
      "$m" bench --device cuda --baseline --shape qwen3-8b -p 512 -n 128 -r 3 2>&1 | tee -a "$out/bench.log"
      "$m" bench --device cuda --baseline --shape qwen3-0.6b -p 512 -n 128 -r 3 2>&1 | tee -a "$out/bench.log"
      "$m" bench --device cuda --baseline -p 256 -n 128 -r 3 2>&1 | tee -a "$out/bench.log" ;;
    levers)  # each lever flipped alone, the others at their defaults
      m="$bin/mere"
      for shape in llama3-8b qwen3-0.6b; do
        MERERUN_FUSED_ROPE_STORE=0 "$m" bench --device cuda --shape $shape -p 512 -n 128 -r 3 2>&1 | tee -a "$out/levers.log"
        MERERUN_FUSED_PROJECTIONS=0 "$m" bench --device cuda --shape $shape -p 512 -n 128 -r 3 2>&1 | tee -a "$out/levers.log"
        MERERUN_CUDA_GRAPHS=0 "$m" bench --device cuda --shape $shape -p 0 -n 128 -r 3 2>&1 | tee -a "$out/levers.log"
      done ;;
    decode_ab)  # the decode levers added one at a time, tg128, on the shapes that show them
      m="$bin/mere"
      for shape in llama3-8b qwen3-0.6b; do
        for combo in "MERERUN_PIPELINED_DECODE=0" "MERERUN_PIPELINED_DECODE=1" "MERERUN_PROGRAMMATIC_LAUNCH=0" \
            "MERERUN_MATVEC_SPLIT_K=1" "MERERUN_MATVEC_SPLIT_K=1 MERERUN_FUSED_NORM_MATVEC=1"; do
          env $combo "$m" bench --device cuda --shape $shape -p 0 -n 128 -r 3 2>&1 | grep tg | tee -a "$out/decode_ab.log"
        done
      done ;;
    profile)  # per-kernel time and DRAM bytes of one llama3-8b decode step (eager: ncu serialises kernels)
      m="$bin/mere"
      MERERUN_CUDA_GRAPHS=0 ncu --clock-control none --kernel-name-base function --launch-skip 400 --launch-count 400 \
        -k regex:'matvec|attention|norm|silu|embed|store|add|copy|rope|sample|advance' \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size --csv --page raw \
        "$m" bench --device cuda --shape llama3-8b -p 0 -n 4 -r 1 > "$out/ncu_llama3-8b.csv" 2> "$out/ncu.err" ;;
    timeline)  # where a decode step's time goes inside its graph (tools/kernel_timeline.*), B = 1 and 8
      m="$bin/mere"
      for shape in llama3-8b qwen3-30b-a3b; do
        for b in 1 8; do
          CUDA_INJECTION64_PATH="$pack/kernel_timeline.so" MERE_TIMELINE="$out/timeline_${shape}_b$b.csv" \
            "$m" bench --device cuda --shape $shape --quant int4 -p 0 -n 32 -r 1 -d 0 --batch $b > /dev/null 2>&1
          python3 "$root/tools/kernel_timeline.py" "$out/timeline_${shape}_b$b.csv" | tee "$out/timeline_${shape}_b$b.txt"
        done
      done ;;
    moe)  # the Qwen3-30B-A3B shape: bf16, int8 and int4 experts, and the fused gate/up lever
      m="$bin/mere"
      for q in bf16 int8 int4; do
        "$m" bench --device cuda --shape qwen3-30b-a3b --quant $q -p 512,4096 -n 128 -r 3 2>&1 | tee -a "$out/moe.log"
      done
      [ -n "${MERE_MOE_FUSED_AB:-}" ] && for q in bf16 int8; do
        MERERUN_PSI_FUSED_MOE=1 "$m" bench --device cuda --shape qwen3-30b-a3b --quant $q -p 512,4096 -n 128 -r 3 2>&1 |
          tee -a "$out/moe.log"
      done ;;
    moe_prefill)  # the Qwen3-30B-A3B experts' prefill and batched decode, each format's grouped-GEMM
      # lever (tensor_core_affine_moe_gemm, tensor_core_dense_moe_gemm) off and on twice in one binary
      m="$bin/mere"
      for q in int4 int8 bf16 fp8; do
        var=MERERUN_TENSOR_CORE_AFFINE_MOE_GEMM
        case $q in bf16|fp8) var=MERERUN_TENSOR_CORE_DENSE_MOE_GEMM ;; esac
        for v in 0 1 0 1; do
          echo "== $q $var=$v" | tee -a "$out/moe_prefill.log"
          env $var=$v timeout 100 "$m" bench --device cuda --shape qwen3-30b-a3b --quant $q -p 128,512,2048 -n 0 -r 3 \
            2>&1 | tee -a "$out/moe_prefill.log" | grep -E '^\| qwen'
        done
        for v in 0 1; do
          env $var=$v timeout 100 "$m" bench --device cuda --shape qwen3-30b-a3b --quant $q -p 0 -n 32 --batch 1,24,64 \
            -r 2 2>&1 | tee -a "$out/moe_prefill.log" | grep -E '^\| qwen'
        done
      done ;;
    profile_prefill)  # per-kernel time and DRAM bytes of a 2,048-token qwen3-30b-a3b prefill (int4, bf16);
      # the bench's warm-up and timed prefill both count, and its weight fill (fill_random*) is not the prefill's
      m="$bin/mere"
      for q in int4 bf16; do
        ncu --clock-control none --kernel-name-base function \
          --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size --csv --page raw \
          "$m" bench --device cuda --shape qwen3-30b-a3b --quant $q -p 2048 -n 0 -r 1 > "$out/ncu_prefill_$q.csv" \
          2> "$out/ncu_prefill_$q.err"
        python3 "$root/scripts/ncu_summary.py" "$out/ncu_prefill_$q.csv" 2>&1 | head -24 | tee -a "$out/profile_prefill.log"
      done ;;
    profile_moe)  # per-kernel time and DRAM bytes of qwen3-30b-a3b int8 decode steps (eager)
      m="$bin/mere"
      MERERUN_CUDA_GRAPHS=0 ncu --clock-control none --kernel-name-base function --launch-skip 1500 --launch-count 600 \
        -k regex:'matvec|attention|norm|silu|embed|store|add|copy|rope|sample|advance|moe' \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size --csv --page raw \
        "$m" bench --device cuda --shape qwen3-30b-a3b --quant int8 -p 0 -n 8 -r 1 > "$out/ncu_moe.csv" 2> "$out/ncu_moe.err"
      python3 "$root/scripts/ncu_summary.py" "$out/ncu_moe.csv" 2>&1 | head -40 ;;
    detail_moe)  # ncu's speed-of-light, occupancy and stall sections for one of each MoE decode kernel
      m="$bin/mere"
      MERERUN_CUDA_GRAPHS=0 ncu --clock-control none -k regex:'moe_(gate_up|down)_decode' --launch-skip 200 --launch-count 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        "$m" bench --device cuda --shape qwen3-30b-a3b --quant int8 -p 0 -n 8 -r 1 > "$out/ncu_moe_detail.txt" 2>&1
      grep -E "moe_|Duration|Throughput|Registers|Occupancy|Warp Cycles|Stall|Block Limit|Waves|Shared Memory Config|Dynamic Shared|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" "$out/ncu_moe_detail.txt" | head -90 ;;
    kv)  # KV cache modes side by side on the Llama-3-8B shape at three contexts, and the bf16 decode check
      m="$bin/mere"
      "$m" bench --device cuda --shape llama3-8b -p 0 -n 128 -r 3 2>&1 | tee -a "$out/kv.log"
      "$m" bench --device cuda --shape llama3-8b -p 0 -n 128 -d 1024,8192,32768 -r 3 \
        --kv-cache-mode bf16,affine8,affine4 2>&1 | tee -a "$out/kv.log"
      # The affine modes on the CUDA-core kernel (lever tensor_core_kv_attention off), for comparison.
      MERERUN_TENSOR_CORE_KV_ATTENTION=0 "$m" bench --device cuda --shape llama3-8b -p 0 -n 128 -d 1024,8192,32768 \
        -r 3 --kv-cache-mode affine8,affine4 2>&1 | tee -a "$out/kv.log" ;;
    lineup)  # issue 6's lineup in one run: both shapes in every weight format, B = 1, each row against
      # this GPU's measured ceilings (--calibrate), not the H200 defaults; then AffineStep's timing
      m="$bin/mere"
      for shape in llama3-8b qwen3-30b-a3b; do
        for q in bf16 int8 int4 fp8; do
          timeout 150 "$m" bench --calibrate --device cuda --shape $shape --quant $q -p 512 -n 128 -r 3 2>&1 |
            tee -a "$out/lineup.log"
        done
      done
      # and the kernel target on whole layers: a step's matvecs against this GPU's copy bandwidth
      # (a bench-only pack leaves it to a tests pack's call: `GTEST_FILTER='AffineStep.*' ... tests`)
      [ -x "$bin/mere_gpu_tests" ] &&
        timeout 120 "$bin/mere_gpu_tests" --gtest_filter='AffineStep.*' 2>&1 | grep timing | tee -a "$out/lineup.log" ;;
    quant)  # the weight formats side by side on the Llama-3-8B shape
      m="$bin/mere"
      "$m" bench --device cuda --shape llama3-8b -p 512 -n 128 -r 3 2>&1 | tee -a "$out/quant.log"
      for q in int8 int4 fp8; do
        "$m" bench --device cuda --shape llama3-8b --quant $q -p 512 -n 128 -r 3 2>&1 | tee -a "$out/quant.log"
      done
      MERERUN_FP8_ACTIVATION_GEMM=1 "$m" bench --device cuda --shape llama3-8b --quant fp8 -p 512 -n 0 -r 3 2>&1 |
        tee -a "$out/quant.log"
      for q in int8 int4; do  # lever int8_activation_matvec (decode only)
        MERERUN_INT8_ACTIVATION_MATVEC=1 "$m" bench --device cuda --shape llama3-8b --quant $q -p 0 -n 128 -r 3 2>&1 |
          tee -a "$out/quant.log"
      done ;;
    tc_matvec)  # lever tensor_core_affine_matvec off and on: int8/int4 decode at batch 1, 2, 4 and 8
      m="$bin/mere"
      for shape in llama3-8b qwen3-0.6b; do
        for q in int8 int4; do
          for on in 0 1; do
            MERERUN_TENSOR_CORE_AFFINE_MATVEC=$on "$m" bench --device cuda --shape $shape --quant $q -p 0 -n 128 \
              --batch 1,2,4,8 -r 3 2>&1 | tee -a "$out/tc_matvec.log"
          done
        done
      done ;;
    affine_gemm)  # lever tensor_core_affine_gemm off, auto (the default) and on (every size): int8/int4 prefill, bf16 beside
      m="$bin/mere"
      "$m" bench --device cuda --shape llama3-8b -p 64,256,512,4096 -n 0 -r 3 2>&1 | tee -a "$out/affine_gemm.log"
      for shape in llama3-8b qwen3-0.6b; do
        for q in int8 int4; do
          for on in 0 auto 1; do
            MERERUN_TENSOR_CORE_AFFINE_GEMM=$on "$m" bench --device cuda --shape $shape --quant $q \
              -p 64,256,512,4096 -n 0 -r 3 2>&1 | tee -a "$out/affine_gemm.log"
          done
        done
      done
      for q in int8 int4; do  # batched decode past 8 sequences runs the prefill path
        for on in 0 auto; do
          MERERUN_TENSOR_CORE_AFFINE_GEMM=$on "$m" bench --device cuda --shape llama3-8b --quant $q -p 0 -n 64 \
            --batch 8,16,32 -r 3 2>&1 | tee -a "$out/affine_gemm.log"
        done
      done ;;
    quant_moe)  # the Qwen3-30B-A3B shape's int8/int4 decode, lever int8_activation_matvec off and on
      m="$bin/mere"
      for q in int8 int4; do
        for on in 0 1; do
          MERERUN_INT8_ACTIVATION_MATVEC=$on "$m" bench --device cuda --shape qwen3-30b-a3b --quant $q -p 0 -n 128 -r 3 \
            2>&1 | tee -a "$out/quant_moe.log"
        done
      done ;;
    hang)  # the intermittent hang (sessions 6 to 8): the decode-loop tests, repeated, watched as in tests
      GTEST_FILTER=${GTEST_FILTER:-'*KvCacheGpu*:*LlamaGpu*:*DecodeLoopGpu*'} \
        watched "$out/hang.log" "${HANG_S:-240}" "$bin/mere_gpu_tests" --gtest_repeat="${HANG_REPEAT:-5}"
      grep -E "^\[  (PASSED|FAILED) " "$out/hang.log" | tail -3 ;;
  esac
done

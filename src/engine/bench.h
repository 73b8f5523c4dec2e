// `mere bench`: prefill and decode throughput of a model, llama-bench style,
// with each figure set against its roofline (bytes over bandwidth for decode,
// FLOPs over the matmul rate for prefill).
#pragma once

#include <string>
#include <vector>

#include "engine/levers.h"
#include "models/model.h"

namespace mere {

struct Ceilings {
  // H200, a large device copy (read + write), measured; on the CPU (calibrate) its read rate.
  double copy_bytes_per_s = 4.255e12;
  double matmul_flop_per_s = 770e12;   // H200, bf16 8192^3 on random data, measured
  bool calibrated = false;
};

// Measures this device's copy bandwidth and compute ceiling: on the GPU the bf16
// matmul rate, on the CPU the f32 multiply-add peak of its threads.
Ceilings calibrate(Device device);

struct BenchRow {
  std::string test;          // "pp512", "tg128", "tg128 @ d8192"
  std::string levers;        // what ran, e.g. "cuda_graphs=on"
  int64_t tokens = 0, depth = 0;
  bool prefill = false;
  std::vector<double> tok_s; // one per repetition
  double mean_tok_s = 0, sd_tok_s = 0;
  double ttft_ms = 0;        // prefill rows: prefill plus the first sample, median
  double roofline_tok_s = 0; // what the ceiling allows
  double fraction = 0;       // mean over roofline
  double bytes_per_token = 0, flops = 0;
  // Memory the row held at its end, its sequence state alive: on the GPU the
  // allocator's bytes in use (weights, K/V cache, live activations); on the CPU
  // the weights plus the K/V cache.
  double resident_bytes = 0;
  uint64_t kv_bytes = 0;     // resident K/V of the row's sequence at its end (every reserved row)
};

// One prefill of `tokens` after `depth` cached tokens, `reps` times after a warm-up.
// The row's levers say how the model's weights are laid out (fused or not).
BenchRow bench_prefill(const Model& model, int64_t tokens, int64_t depth, int reps, const Ceilings& ceilings,
                       KvCacheMode kv_mode = KvCacheMode::native);
// `tokens` decode steps of the engine's generation loop (greedy, no EOS) after
// `depth` cached tokens, with the engine's levers as given (on the GPU: device
// sampling, graphs and pipelining).
// `context` > 0 gives each sequence a cache of that many tokens (a server's
// context length) instead of just enough: decode attention's split count, and
// with it some kernels' form, follows the cache.
BenchRow bench_decode(const Model& model, int64_t tokens, int64_t depth, int reps, const Ceilings& ceilings,
                      const Levers& levers, KvCacheMode kv_mode = KvCacheMode::native, int64_t context = 0);

// `tokens` steps of same-offset batched decode: `batch` sequences, each after
// `depth` cached tokens, one forward per step for all of them, through the
// engine's batched loop (generate_batch, greedy, no EOS) with the levers as
// given: on the GPU device sampling of the B rows, one graph replay per step
// (cuda_graphs) and pipelining; off, or on the CPU, eager. The row's levers say
// which ran. tok/s counts every sequence's tokens; the roofline is the weights
// read once per step plus each sequence's K/V.
BenchRow bench_batched_decode(const Model& model, int64_t batch, int64_t tokens, int64_t depth, int reps,
                              const Ceilings& ceilings, const Levers& levers,
                              KvCacheMode kv_mode = KvCacheMode::native, int64_t context = 0);

}  // namespace mere

#include "engine/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/thread_pool.h"
#include "engine/generate.h"
#include "engine/generate_batch.h"
#include "ops/ops.h"
#include "sampling/sampler.h"
#include "state/block_pool.h"

namespace mere {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t counter[4] = {uint32_t(i), 0, 0, 0}, out[4];
    philox4x32(counter, seed, out);
    ids[size_t(i)] = int32_t(out[0] % uint32_t(vocab));
  }
  return ids;
}

void finish(BenchRow& row) {
  double n = double(row.tok_s.size());
  row.mean_tok_s = std::accumulate(row.tok_s.begin(), row.tok_s.end(), 0.0) / n;
  double var = 0;
  for (double v : row.tok_s) var += (v - row.mean_tok_s) * (v - row.mean_tok_s);
  row.sd_tok_s = n > 1 ? std::sqrt(var / (n - 1)) : 0;
  row.fraction = row.roofline_tok_s > 0 ? row.mean_tok_s / row.roofline_tok_s : 0;
}

std::string label(const char* kind, int64_t tokens, int64_t depth, int64_t context = 0) {
  return std::string(kind) + std::to_string(tokens) + (depth ? " @ d" + std::to_string(depth) : "") +
         (context ? " c" + std::to_string(context) : "");
}

// A decode row's cache a sequence: room for `depth` cached tokens and `extra`
// more, or `context` in all if that is more.
int64_t row_capacity(int64_t depth, int64_t extra, int64_t context) { return std::max(depth + extra + 1, context); }

// A state holding `depth` cached tokens, with row_capacity's room; on `pool`
// when given (a batch on one pool attends in one launch per layer), else its own.
std::unique_ptr<SeqState> state_at_depth(const Model& model, int64_t depth, int64_t extra, KvCacheMode kv_mode,
                                         std::shared_ptr<BlockPool> pool = nullptr, int64_t context = 0) {
  const int64_t capacity = row_capacity(depth, extra, context);
  auto state = pool ? std::make_unique<SeqState>(pool, capacity) : model.make_state(capacity, kv_mode);
  for (int64_t done = 0; done < depth;) {  // in chunks, so deep contexts do not need one huge activation
    int64_t n = std::min<int64_t>(2048, depth - done);
    model.forward(random_ids(n, model.info().vocab, 7 + uint64_t(done)), *state, false);
    done += n;
  }
  return state;
}

double resident_bytes(const Model& model, const SeqState& state) {
  if (model.info().device == Device::cuda) {
    device_synchronize();
    return double(device_bytes_reserved() - device_bytes_cached());
  }
  return double(model.info().weight_bytes + state.kv_bytes());
}

// The levers a model was loaded and runs with, for a row's label.
std::string layout_levers(const ModelInfo& info) {
  const LoadOptions& o = info.options;
  auto on = [](bool b) { return b ? "on" : "off"; };
  // auto shows what the model decided at load.
  const std::string fold = o.fuse_norm_matvec == LeverMode::automatic
                               ? std::string("auto(") + on(info.folds_step(1)) + ", batches " +
                                     on(info.folds_step(2)) + (info.fold_wide_batches ? ", 9-16 on" : "") +
                                     (info.fold_long_steps_from
                                          ? ", " + std::to_string(info.fold_long_steps_from) + "+ on"
                                          : "") +
                                     ")"
                               : std::string(lever_mode_name(o.fuse_norm_matvec));
  return std::string("fused_projections=") + on(o.fuse_projections) + " fused_rope_store=" + on(o.fuse_rope_store) +
         (o.rope_in_attention ? " rope_in_attention=on" : "") +
         (o.wide_attention_blocks ? " wide_attention_blocks=on" : "") +
         (o.cluster_attention_merge ? " cluster_attention_merge=on" : "") +
         " fused_norm_matvec=" + fold + " programmatic_launch=" + on(o.programmatic_launch) +
         " matvec_split_k=" + on(o.matvec_split_k) + " fp8_activation_gemm=" + on(o.fp8_activation_gemm) +
         (o.int8_activation_matvec ? " int8_activation_matvec=on" : "") +
         (o.tensor_core_kv_attention ? " tensor_core_kv_attention=on" : "") +
         (o.tensor_core_attention ? " tensor_core_attention=on" : "") +
         (o.tensor_core_affine_matvec ? " tensor_core_affine_matvec=on" : "") +
         (o.int16_activation_matvec ? " int16_activation_matvec=on" : "") +
         (o.sixteen_token_matvec ? " sixteen_token_matvec=on" : "") +
         (o.sixteen_token_experts ? " sixteen_token_experts=on" : "") +
         (o.tensor_core_fp8_matvec ? " tensor_core_fp8_matvec=on" : "") +
         (o.tensor_core_moe_matvec ? " tensor_core_moe_matvec=on" : "") +
         (o.routing_in_experts ? " routing_in_experts=on" : "") + (o.deep_moe_ring ? " deep_moe_ring=on" : "") +
         (o.deep_dense_ring ? " deep_dense_ring=on" : "") +
         (o.wide_batch_stages ? " wide_batch_stages=on" : "") +
         (o.uneven_row_cuts ? " uneven_row_cuts=on" : "") +
         (o.int4_byte_codes ? " int4_byte_codes=on" : "") +
         (o.streamed_weights ? " streamed_weights=on" : "") +
         (o.tensor_core_affine_moe_gemm ? " tensor_core_affine_moe_gemm=on" : "") +
         (o.tensor_core_dense_moe_gemm ? " tensor_core_dense_moe_gemm=on" : "") +
         (o.tensor_core_fp8_gemm ? " tensor_core_fp8_gemm=on" : "") +
         (o.grouped_swiglu_epilogue ? " grouped_swiglu_epilogue=on" : "") +
         (o.formed_gemm_input ? " formed_gemm_input=on" : "") +
         (o.split_sum_kernel ? " split_sum_kernel=on" : "") +
         (o.tensor_core_affine_gemm != LeverMode::off
              ? std::string(" tensor_core_affine_gemm=") + lever_mode_name(o.tensor_core_affine_gemm)
              : "") +
         (o.fuse_moe_gate_up ? " fused_moe_gate_up=on" : "") + (o.cpu_direct_matvec ? " cpu_direct_matvec=on" : "") +
         (o.cpu_tiled_matmul ? " cpu_tiled_matmul=on" : "") + (o.cpu_vnni_matvec ? " cpu_vnni_matvec=on" : "") +
         (o.cpu_vector_attention ? " cpu_vector_attention=on" : "") +
         (o.cpu_avx512_matmul ? " cpu_avx512_matmul=on" : "") + (o.cpu_packed_matmul ? " cpu_packed_matmul=on" : "") +
         (o.cpu_avx512_attention ? " cpu_avx512_attention=on" : "");
}

// The decode loop's levers as they ran (the CPU loop is eager and reads each token).
std::string decode_levers(const Model& model, const Levers& levers) {
  const bool cuda = model.info().device == Device::cuda;
  return std::string(cuda && levers.cuda_graphs ? "cuda_graphs=on" : "cuda_graphs=off") +
         (cuda && levers.pipelined_decode ? " pipelined_decode=on" : " pipelined_decode=off") +
         (cuda && levers.kernel_token_slots ? " kernel_token_slots=on" : "");
}

// The median of 5 timed runs of fn after a warm-up, as a rate of `amount` per second.
template <class Fn>
double median_rate(double amount, Fn fn) {
  std::vector<double> rates;
  for (int i = 0; i < 6; ++i) {
    device_synchronize();
    auto t0 = Clock::now();
    fn();
    device_synchronize();
    if (i > 0) rates.push_back(amount / seconds_since(t0));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// The CPU's read bandwidth: every thread streams its share of a 2 GB buffer
// (past any L3) into sums, asking for the lines 2 KB ahead as the decode
// matvecs do. Decode only reads, and on a CPU a copy's read and write streams
// together move more than reading alone does (the development machine: a
// copy 44 GB/s counted twice, reading 29), so a copy is no ceiling for it.
double cpu_read_bytes_per_s() {
  typedef int64_t Words __attribute__((vector_size(32)));
  constexpr int64_t kChunks = 256, kAhead = 2048 / sizeof(Words);
  std::vector<Words> buffer((size_t(2) << 30) / sizeof(Words), Words{} + 1);
  const int64_t n = int64_t(buffer.size());
  std::vector<int64_t> sink(static_cast<size_t>(kChunks));
  return median_rate(double(n) * sizeof(Words), [&] {
    parallel_for(kChunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        Words sum0{}, sum1{};
        for (int64_t i = n * c / kChunks; i < n * (c + 1) / kChunks; i += 2) {
          __builtin_prefetch(buffer.data() + i + kAhead);
          sum0 += buffer[size_t(i)];
          sum1 += buffer[size_t(i + 1)];
        }
        sink[size_t(c)] = (sum0 + sum1)[0];  // kept, so the loop is not dropped
      }
    });
  });
}

// The CPU's f32 multiply-add peak on every thread: 8 independent chains (what
// hides the FMA latency) of the widest vectors it has (AVX-512 where the CPU
// reports it, which lever cpu_avx512_matmul uses; else AVX2), on registers only.
typedef float Lanes8 __attribute__((vector_size(32)));
typedef float Lanes16 __attribute__((vector_size(64)));
constexpr int kChains = 8, kSteps = 1 << 24;

// One thread's chains; their sum keeps the loop from being dropped.
template <typename Lanes>
inline __attribute__((always_inline)) float fma_chains() {
  constexpr int kLanes = sizeof(Lanes) / sizeof(float);
  Lanes v[kChains];
  const Lanes m = Lanes{} + 0.999999f, a = Lanes{} + 1e-7f;
#pragma GCC unroll 8
  for (int c = 0; c < kChains; ++c) v[c] = Lanes{} + float(c) * 1e-3f;
  for (int s = 0; s < kSteps; ++s)
#pragma GCC unroll 8
    for (int c = 0; c < kChains; ++c) v[c] = v[c] * m + a;
  float sum = 0;
  for (const Lanes& x : v)
    for (int l = 0; l < kLanes; ++l) sum += x[l];
  return sum;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) float fma_chains_avx512() { return fma_chains<Lanes16>(); }
bool has_avx512() { return __builtin_cpu_supports("avx512f"); }
#else
float fma_chains_avx512() { return 0; }
bool has_avx512() { return false; }
#endif

double cpu_fma_flop_per_s() {
  const bool wide = has_avx512();
  const int threads = thread_count();
  std::vector<float> sink(static_cast<size_t>(threads));
  return median_rate(2.0 * (wide ? 16 : 8) * kChains * double(kSteps) * threads, [&] {
    parallel_for(threads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) sink[size_t(t)] = wide ? fma_chains_avx512() : fma_chains<Lanes8>();
    });
  });
}

}  // namespace

Ceilings calibrate(Device device) {
  Ceilings c;
  c.calibrated = true;
  if (device == Device::cpu) {  // our CPU matmul is no measure of the machine: its multiply-add peak is
    c.copy_bytes_per_s = cpu_read_bytes_per_s();
    c.matmul_flop_per_s = cpu_fma_flop_per_s();
    return c;
  }
  // Copy bandwidth: a 4 GB device-to-device copy counts 8 GB moved.
  const size_t bytes = size_t(4) << 30;
  Tensor a = Tensor::empty({int64_t(bytes / 2)}, DType::bf16, device), b = Tensor::empty({int64_t(bytes / 2)}, DType::bf16, device);
  ops::fill_random(a, 1, 1.0f);
  c.copy_bytes_per_s = median_rate(2.0 * double(bytes), [&] { copy_bytes(b.raw(), device, a.raw(), device, bytes); });
  // Matmul rate: ops::linear at 8192^3 with bf16 weights (random, never zeros).
  const int64_t n = 8192;
  Tensor x = Tensor::empty({n, n}, DType::f32, device), w = Tensor::empty({n, n}, DType::bf16, device);
  ops::fill_random(x, 2, 1.0f);
  ops::fill_random(w, 3, 1.0f);
  c.matmul_flop_per_s = median_rate(2.0 * double(n) * double(n) * double(n), [&] { Tensor y = ops::linear(x, w); });
  return c;
}

BenchRow bench_prefill(const Model& model, int64_t tokens, int64_t depth, int reps, const Ceilings& ceilings,
                       KvCacheMode kv_mode) {
  BenchRow row;
  row.test = label("pp", tokens, depth);
  row.tokens = tokens;
  row.depth = depth;
  row.prefill = true;
  row.levers = layout_levers(model.info()) + " kv_cache_mode=" + std::string(kv_cache_mode_name(kv_mode));
  row.flops = model.prefill_flops(tokens, depth);
  row.roofline_tok_s = ceilings.matmul_flop_per_s / (row.flops / double(tokens));
  std::vector<int32_t> ids = random_ids(tokens, model.info().vocab, 11);
  std::vector<double> ttft;
  Sampler greedy(SamplingParams{.temperature = 0});
  for (int r = -1; r < reps; ++r) {  // r = -1 warms up
    auto state = state_at_depth(model, depth, tokens, kv_mode);
    device_synchronize();
    auto t0 = Clock::now();
    Tensor logits = model.forward(ids, *state, false);
    device_synchronize();
    double prefill_s = seconds_since(t0);
    row.kv_bytes = state->kv_bytes();
    Tensor host = logits.to_device(Device::cpu);
    greedy.sample(host.data<float>(), model.info().vocab, {});
    if (r < 0) continue;
    row.resident_bytes = resident_bytes(model, *state);
    row.tok_s.push_back(double(tokens) / prefill_s);
    ttft.push_back(seconds_since(t0) * 1e3);
  }
  std::sort(ttft.begin(), ttft.end());
  row.ttft_ms = ttft[ttft.size() / 2];
  finish(row);
  return row;
}

BenchRow bench_decode(const Model& model, int64_t tokens, int64_t depth, int reps, const Ceilings& ceilings,
                      const Levers& levers, KvCacheMode kv_mode, int64_t context) {
  BenchRow row;
  row.test = label("tg", tokens, depth, context);
  row.levers = decode_levers(model, levers) + " " + layout_levers(model.info()) +
               " kv_cache_mode=" + std::string(kv_cache_mode_name(kv_mode));
  row.tokens = tokens;
  row.depth = depth;
  // The mean context over the run decides the K/V bytes.
  row.bytes_per_token = double(model.decode_bytes(depth + tokens / 2, kv_mode));
  row.roofline_tok_s = ceilings.copy_bytes_per_s / row.bytes_per_token;
  // The engine's own loop (device sampling, graphs, pipelining as the levers
  // say), greedy, with no EOS: `tokens` steps after the first, timed from the second token.
  GenerateOptions options;
  options.max_new_tokens = int(tokens) + 2;
  options.sampling.temperature = 0;
  options.levers = levers;
  for (int r = -1; r < reps; ++r) {
    auto state = state_at_depth(model, depth, tokens + 3, kv_mode, nullptr, context);
    GenerateStats stats = generate_from(model, *state, {1}, options, [](int32_t) { return true; });
    row.kv_bytes = state->kv_bytes();
    if (r >= 0) row.tok_s.push_back(stats.decode_tok_s());
    row.resident_bytes = resident_bytes(model, *state);
  }
  finish(row);
  return row;
}

BenchRow bench_batched_decode(const Model& model, int64_t batch, int64_t tokens, int64_t depth, int reps,
                              const Ceilings& ceilings, const Levers& levers, KvCacheMode kv_mode,
                              int64_t context) {
  BenchRow row;
  row.test = label("tg", tokens, depth, context) + " x" + std::to_string(batch);
  row.levers = "same-offset batch " + decode_levers(model, levers) + " " + layout_levers(model.info()) +
               " kv_cache_mode=" + std::string(kv_cache_mode_name(kv_mode));
  row.tokens = tokens;
  row.depth = depth;
  const int64_t mean_keys = depth + tokens / 2;
  const double one = double(model.decode_bytes(mean_keys, kv_mode)), kv = one - double(model.decode_bytes(0, kv_mode));
  row.bytes_per_token = (one + double(batch - 1) * kv) / double(batch);  // a step's bytes over its tokens
  row.roofline_tok_s = ceilings.copy_bytes_per_s / row.bytes_per_token;
  GenerateOptions options;  // as bench_decode: `tokens` steps after the first, timed from the second read
  options.max_new_tokens = int(tokens) + 2;
  options.sampling.temperature = 0;
  options.levers = levers;
  std::vector<std::vector<int32_t>> prompts;  // one token each, a different one per sequence
  for (int64_t b = 0; b < batch; ++b) prompts.push_back({int32_t((b * 7919 + 1) % model.info().vocab)});
  for (int r = -1; r < reps; ++r) {
    std::vector<std::unique_ptr<SeqState>> states;
    std::vector<SeqState*> raw;
    auto pool = std::make_shared<BlockPool>(model.kv_layout(kv_mode),
                                            batch * BlockPool::blocks_for_tokens(row_capacity(depth, tokens + 3, context)));
    for (int64_t b = 0; b < batch; ++b) {
      states.push_back(state_at_depth(model, depth, tokens + 3, kv_mode, pool, context));
      raw.push_back(states.back().get());
    }
    BatchGenerateStats stats = generate_batch(model, raw, prompts, options, [](int64_t, int32_t) { return true; });
    if (r >= 0) row.tok_s.push_back(stats.decode_tok_s());
    row.resident_bytes = resident_bytes(model, *raw.front());
    row.kv_bytes = 0;
    for (SeqState* st : raw) row.kv_bytes += st->kv_bytes();
  }
  finish(row);
  return row;
}

}  // namespace mere

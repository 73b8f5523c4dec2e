#include "engine/prefix_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "core/device.h"
#include "state/prefix_cache.h"

namespace mere {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Prefills the tokens past the state's reused prefix; time to the logits on the host.
double prefill_ms(const Model& model, SeqState& state, const std::vector<int32_t>& tokens) {
  const std::vector<int32_t> rest(tokens.begin() + long(state.length()), tokens.end());
  device_synchronize();
  const auto t0 = Clock::now();
  const Tensor logits = model.forward(rest, state, false).to_device(Device::cpu);
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

std::string PrefixCacheBench::describe() const {
  char line[256];
  std::snprintf(line, sizeof line, "| pp%lld prefix cache | kv %s | miss %.1f ms | hit %.1f ms (%lld reused) |",
                (long long)prompt_tokens, std::string(kv_cache_mode_name(kv_mode)).c_str(), miss_ms, hit_ms,
                (long long)reused_tokens);
  return line;
}

PrefixCacheBench bench_prefix_cache(const Model& model, int64_t prompt_tokens, int64_t new_tokens, int reps,
                                    KvCacheMode kv_mode) {
  MERE_CHECK(prompt_tokens > new_tokens && new_tokens > 0 && reps > 0,
             "prefix-cache bench: {} prompt tokens, {} new, {} reps", prompt_tokens, new_tokens, reps);
  const int64_t capacity = prompt_tokens + 1, vocab = model.info().vocab;
  // The published prompt's blocks and the hit's own, with one to spare.
  auto pool =
      std::make_shared<BlockPool>(model.kv_layout(kv_mode), 2 * BlockPool::blocks_for_tokens(capacity) + 1);
  PrefixCache cache(pool);
  PrefixCacheBench out;
  out.prompt_tokens = prompt_tokens;
  out.kv_mode = kv_mode;
  std::vector<double> miss, hit;
  for (int r = -1; r < reps; ++r) {  // round -1 warms up
    std::vector<int32_t> first;
    for (int64_t i = 0; i < prompt_tokens; ++i)
      first.push_back(int32_t((uint64_t(i) * 7919 + uint64_t(r + 2) * 104729) % uint64_t(vocab)));
    std::vector<int32_t> second = first;
    for (int64_t i = prompt_tokens - new_tokens; i < prompt_tokens; ++i)
      second[size_t(i)] = int32_t((second[size_t(i)] + 1) % vocab);
    {
      auto state = cache.start(first, capacity);
      MERE_CHECK(state->length() == 0, "prefix-cache bench: the cold prompt hit the cache ({} positions)",
                 state->length());
      const double ms = prefill_ms(model, *state, first);
      if (r >= 0) miss.push_back(ms);
      cache.publish(*state, first);
    }
    auto state = cache.start(second, capacity);
    out.reused_tokens = state->length();
    const double ms = prefill_ms(model, *state, second);
    if (r >= 0) hit.push_back(ms);
  }
  out.miss_ms = median(miss);
  out.hit_ms = median(hit);
  return out;
}

}  // namespace mere

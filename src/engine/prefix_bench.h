// `mere bench --prefix-cache`: what a prefix-cache hit saves. A prompt is
// prefilled cold (a miss) on a pool with a PrefixCache and published, then a
// second prompt sharing all but its last few tokens starts from the cache (a
// hit) and prefills only what is left.
#pragma once

#include <string>

#include "models/model.h"

namespace mere {

struct PrefixCacheBench {
  int64_t prompt_tokens = 0;
  int64_t reused_tokens = 0;  // positions the hit took from the cache
  double miss_ms = 0, hit_ms = 0;  // prefill time to the last logits, medians
  KvCacheMode kv_mode = KvCacheMode::native;
  // A table row: "| pp4096 prefix cache | kv default | miss 812.3 ms | hit 6.1 ms (4080 reused) |".
  std::string describe() const;
};

// Medians over `reps` rounds after a warm-up round; each round a fresh prompt
// of `prompt_tokens` random ids, its hit differing in the last `new_tokens`.
PrefixCacheBench bench_prefix_cache(const Model& model, int64_t prompt_tokens, int64_t new_tokens, int reps,
                                    KvCacheMode kv_mode);

}  // namespace mere

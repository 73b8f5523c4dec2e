// Turning logits into the next token: penalties, temperature, top-k, top-p,
// min-p, and a seeded counter-based generator (Philox 4x32-10), so one seed
// gives the same tokens on every run and every machine.
#pragma once

#include <cstdint>
#include <vector>

namespace mere {

struct SamplingParams {
  float temperature = 1.0f;          // <= 0: greedy (argmax)
  int top_k = 0;                     // 0: off
  float top_p = 1.0f;                // 1: off
  float min_p = 0.0f;                // 0: off; drops tokens below min_p * p(best)
  float repetition_penalty = 1.0f;   // transformers' rule: positive logits / p, negative * p
  float presence_penalty = 0.0f;     // OpenAI's rule: minus this once per token present
  uint64_t seed = 0;

  bool is_greedy() const { return temperature <= 0.0f; }
};

// Philox 4x32-10 (Salmon et al., SC'11): 4 random words from a 128-bit counter and a 64-bit key.
void philox4x32(const uint32_t counter[4], uint64_t key, uint32_t out[4]);

class Sampler {
 public:
  explicit Sampler(SamplingParams params) : params_(params) {}

  // Picks the next token from logits [vocab]. `context` holds the tokens the
  // penalties apply to (the prompt and everything generated so far).
  // Each call advances the generator by one draw.
  int32_t sample(const float* logits, int64_t vocab, const std::vector<int32_t>& context);
  const SamplingParams& params() const { return params_; }

 private:
  float next_uniform();  // [0, 1)

  SamplingParams params_;
  uint64_t draws_ = 0;
  std::vector<float> scratch_;
  std::vector<int32_t> order_;
};

}  // namespace mere

// Turning logits into the next token: penalties, temperature, top-k, top-p,
// min-p, and a seeded counter-based generator (Philox 4x32-10), so one seed
// gives the same tokens on every run and every machine. DeviceSampler
// (device_sampler.h) does the same on the GPU and picks the same tokens.
#pragma once

#include <cstdint>
#include <vector>

namespace mere {

struct SamplingParams {
  float temperature = 1.0f;          // <= 0: greedy (argmax)
  int top_k = 0;                     // 0 (or less, as vLLM writes it): off
  float top_p = 1.0f;                // 1: off
  float min_p = 0.0f;                // 0: off; drops tokens below min_p * p(best)
  float repetition_penalty = 1.0f;   // transformers' rule: positive logits / p, negative * p
  float presence_penalty = 0.0f;     // OpenAI's rule: minus this once per token present
  uint64_t seed = 0;

  bool is_greedy() const { return temperature <= 0.0f; }
  bool has_penalties() const { return repetition_penalty != 1.0f || presence_penalty != 0.0f; }
  // An error naming the first field out of range: NaN or infinite values, top_p or min_p
  // outside [0, 1], a repetition penalty of 0 or less. (NaN passes every comparison the
  // samplers make, and their threshold walks would never end.)
  void check() const;
};

// Philox 4x32-10 (Salmon et al., SC'11): 4 random words from a 128-bit counter and a 64-bit key.
void philox4x32(const uint32_t counter[4], uint64_t key, uint32_t out[4]);

// Draw number `draw` of generator `seed`, uniform in [0, 1) with 24 random bits.
float philox_uniform(uint64_t seed, uint64_t draw);

// A logit after the penalties of a token present in the context (computed in
// double and rounded once, so that the GPU gets the same float).
float penalised_logit(float logit, const SamplingParams& params);

// The sampling distribution over (penalised) logits [vocab] when not greedy:
// weights[i] > 0 for the kept tokens, unnormalised, the best token at 1. With
// z = (logit - max) * (1 / temperature) in float (bit-identical on the GPU), the kept set is
//   top-k: the k largest z, ties to the lower id;
//   top-p: z >= tau for the largest tau whose set {z >= tau} (within top-k) holds top_p of the mass;
//   min-p: weight >= min_p (the best token's weight being 1).
// Thresholds rather than a sorted prefix, so that a GPU finds the same set without sorting.
// A NaN logit (or an infinite maximum) is an error naming the token, as torch.multinomial's.
void sampling_weights(const float* logits, int64_t vocab, const SamplingParams& params,
                      std::vector<double>& weights);

class Sampler {
 public:
  explicit Sampler(SamplingParams params) : params_(params) { params_.check(); }

  // Picks the next token from logits [vocab]. `context` holds the tokens the
  // penalties apply to (the prompt and everything generated so far).
  // Each call that is not greedy advances the generator by one draw: with
  // u = the draw, the token is the first in id order whose running weight
  // exceeds u * (total kept weight) (the inverse CDF over ascending ids).
  int32_t sample(const float* logits, int64_t vocab, const std::vector<int32_t>& context);
  const SamplingParams& params() const { return params_; }
  uint64_t draws() const { return draws_; }

 private:
  SamplingParams params_;
  uint64_t draws_ = 0;
  std::vector<float> scratch_;
  std::vector<double> weights_;
};

}  // namespace mere

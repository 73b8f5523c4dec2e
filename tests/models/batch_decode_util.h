// Same-offset batching against decoding alone: the helper the CPU and GPU tests share.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "models/model.h"

namespace mere::test {

inline int32_t argmax_row(const Tensor& logits, int64_t row) {
  const Tensor host = logits.to_device(Device::cpu);
  const int64_t vocab = host.dim(1);
  const float* r = host.data<float>() + row * vocab;
  return int32_t(std::max_element(r, r + vocab) - r);
}

inline std::vector<std::vector<int32_t>> prompts(int n, int length, int64_t vocab) {
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(n));
  for (int b = 0; b < n; ++b)
    for (int i = 0; i < length; ++i) out[size_t(b)].push_back(int32_t((37 * b + 11 * i + 5) % vocab));
  return out;
}

struct BatchComparison {
  std::vector<std::vector<int32_t>> alone, batched;  // greedy tokens per sequence
};

// Greedy tokens of `batch` prompts (12 tokens each) decoded alone, and all of them
// batched at one offset, `steps` tokens each. With one_pool the batch's states
// share one block pool, so each layer's attention is one launch for the batch
// (models/blocks/attention_inputs.cpp); otherwise each has its own.
inline BatchComparison compare_batch_with_alone(const Model& model, int batch, int steps, bool one_pool = false,
                                                KvCacheMode kv_mode = KvCacheMode::native) {
  const auto ps = prompts(batch, 12, model.info().vocab);
  std::vector<std::vector<int32_t>> alone(static_cast<size_t>(batch)), batched(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) {
    auto state = model.make_state(64, kv_mode);
    int32_t next = argmax_row(model.forward(ps[size_t(b)], *state, false), 0);
    for (int s = 0; s < steps; ++s) {
      alone[size_t(b)].push_back(next);
      next = argmax_row(model.forward({next}, *state, false), 0);
    }
  }
  std::vector<std::unique_ptr<SeqState>> states;
  std::vector<SeqState*> raw;
  std::vector<int32_t> next(static_cast<size_t>(batch));
  auto pool = std::make_shared<BlockPool>(model.kv_layout(kv_mode), batch * BlockPool::blocks_for_tokens(64));
  for (int b = 0; b < batch; ++b) {
    states.push_back(one_pool ? std::make_unique<SeqState>(pool, 64) : model.make_state(64, kv_mode));
    raw.push_back(states.back().get());
    next[size_t(b)] = argmax_row(model.forward(ps[size_t(b)], *states.back(), false), 0);
  }
  for (int s = 0; s < steps; ++s) {
    for (int b = 0; b < batch; ++b) batched[size_t(b)].push_back(next[size_t(b)]);
    const Tensor logits = model.forward_batch(next, raw);
    EXPECT_EQ(logits.dim(0), batch);
    for (int b = 0; b < batch; ++b) next[size_t(b)] = argmax_row(logits, b);
  }
  for (SeqState* s : raw) EXPECT_EQ(s->length(), 12 + steps);
  return {alone, batched};
}

}  // namespace mere::test

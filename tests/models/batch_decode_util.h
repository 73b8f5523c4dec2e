// Same-offset batching against decoding alone: the helpers the CPU and GPU tests share.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "engine/generate.h"
#include "engine/generate_batch.h"
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

// generate_batch against generate_from, sequence by sequence: `batch` prompts
// (12 tokens each) generated alone and as one batch with the same options.
// Sequence `stop_seq`'s sink stops it after `stop_after` tokens (both runs).
struct GenerateComparison {
  std::vector<std::vector<int32_t>> alone, batched;  // tokens each sink received
  std::vector<int64_t> alone_length, batched_length;  // the states' lengths afterwards
  std::vector<std::string> alone_reason;
  BatchGenerateStats stats;
};

inline GenerateComparison compare_generate_batch_with_alone(const Model& model, int batch,
                                                           const GenerateOptions& options, int stop_seq = -1,
                                                           int stop_after = 0) {
  const auto ps = prompts(batch, 12, model.info().vocab);
  const int64_t capacity = 12 + options.max_new_tokens + 1;
  GenerateComparison c;
  c.alone.resize(size_t(batch));
  c.batched.resize(size_t(batch));
  for (int b = 0; b < batch; ++b) {
    auto state = model.make_state(capacity);
    std::vector<int32_t>& out = c.alone[size_t(b)];
    GenerateStats s = generate_from(model, *state, ps[size_t(b)], options, [&](int32_t id) {
      out.push_back(id);
      return b != stop_seq || int(out.size()) < stop_after;
    });
    c.alone_length.push_back(state->length());
    c.alone_reason.push_back(s.stop_reason);
  }
  std::vector<std::unique_ptr<SeqState>> states;
  std::vector<SeqState*> raw;
  for (int b = 0; b < batch; ++b) {
    states.push_back(model.make_state(capacity));
    raw.push_back(states.back().get());
  }
  c.stats = generate_batch(model, raw, ps, options, [&](int64_t b, int32_t id) {
    std::vector<int32_t>& out = c.batched[size_t(b)];
    out.push_back(id);
    return b != stop_seq || int(out.size()) < stop_after;
  });
  for (SeqState* s : raw) c.batched_length.push_back(s->length());
  return c;
}

// Each sequence's tokens, final length and stop reason as alone.
inline void expect_batch_as_alone(const GenerateComparison& c, const std::string& label) {
  for (size_t b = 0; b < c.alone.size(); ++b) {
    EXPECT_EQ(c.batched[b], c.alone[b]) << label << ", sequence " << b;
    EXPECT_EQ(c.batched_length[b], c.alone_length[b]) << label << ", sequence " << b;
    EXPECT_EQ(c.stats.stop_reasons[b], c.alone_reason[b]) << label << ", sequence " << b;
  }
}

}  // namespace mere::test

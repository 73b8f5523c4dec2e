// DeviceSampler against Sampler (ctest label gpu): for the same logits, seed and
// context both pick the same token. Greedy must agree always; a sampled draw may
// differ only when f32 weights on the GPU against f64 on the CPU move a token
// boundary across u, so those require 99.5% agreement and print the rate.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <random>
#include <string>

#include "core/device.h"
#include "core/tensor.h"
#include "gpu_test_util.h"
#include "sampling/device_sampler.h"
#include "sampling/sampler.h"

namespace mere {
namespace {

class DeviceSamplerGpu : public test::NeedsGpu<> {};

struct Mode {
  std::string name;
  SamplingParams params;
};

std::vector<Mode> modes() {
  auto with = [](auto set) {
    SamplingParams p;
    p.seed = 1234;
    set(p);
    return p;
  };
  return {
      {"greedy", with([](SamplingParams& p) { p.temperature = 0; })},
      {"greedy+penalties", with([](SamplingParams& p) {
         p.temperature = 0;
         p.repetition_penalty = 1.3f;
         p.presence_penalty = 0.7f;
       })},
      {"temperature 1", with([](SamplingParams&) {})},
      {"temperature 0.6", with([](SamplingParams& p) { p.temperature = 0.6f; })},
      {"top-k 40", with([](SamplingParams& p) { p.top_k = 40; })},
      {"top-k 1", with([](SamplingParams& p) { p.top_k = 1; })},
      {"top-p 0.9", with([](SamplingParams& p) { p.top_p = 0.9f; })},
      {"top-p 0.5 T 0.7", with([](SamplingParams& p) {
         p.top_p = 0.5f;
         p.temperature = 0.7f;
       })},
      {"min-p 0.05", with([](SamplingParams& p) { p.min_p = 0.05f; })},
      {"penalties T 0.8", with([](SamplingParams& p) {
         p.temperature = 0.8f;
         p.repetition_penalty = 1.2f;
         p.presence_penalty = 0.5f;
       })},
      {"all", with([](SamplingParams& p) {
         p.temperature = 0.9f;
         p.top_k = 100;
         p.top_p = 0.95f;
         p.min_p = 0.02f;
         p.repetition_penalty = 1.1f;
         p.presence_penalty = 0.3f;
         p.seed = 99;
       })},
  };
}

// Normal logits times `scale`; scale < 0 gives |scale| * N rounded to quarters,
// so many tokens tie exactly.
std::vector<float> random_logits(int64_t vocab, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (float& v : l) v = scale > 0 ? scale * normal(rng) : std::round(-scale * normal(rng) * 4.0f) / 4.0f;
  return l;
}

std::vector<int32_t> random_prompt(int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> prompt(40);
  for (int32_t& id : prompt) id = int32_t(rng() % uint64_t(vocab));
  return prompt;
}

int32_t read_id(const int32_t* device_id) {
  int32_t id = -1;
  copy_bytes(&id, Device::cpu, device_id, Device::cuda, sizeof(id));
  return id;
}

// The device's tokens for `steps` draws on fixed logits, reading each one back.
std::vector<int32_t> device_tokens(DeviceSampler& sampler, const Tensor& logits, const std::vector<int32_t>& prompt,
                                   int steps) {
  Tensor out = Tensor::empty({1}, DType::i32, Device::cuda);
  sampler.reset(prompt);
  std::vector<int32_t> tokens;
  for (int i = 0; i < steps; ++i) {
    sampler.sample(logits, out.data<int32_t>());
    tokens.push_back(read_id(out.data<int32_t>()));
  }
  return tokens;
}

// How many of the device's tokens the CPU sampler picks too, given the same
// context (the prompt plus the device's earlier tokens, as in the engine).
int cpu_matches(const SamplingParams& params, const std::vector<float>& logits, const std::vector<int32_t>& prompt,
                const std::vector<int32_t>& device) {
  Sampler cpu(params);
  std::vector<int32_t> context = prompt;
  int same = 0;
  for (int32_t id : device) {
    same += cpu.sample(logits.data(), int64_t(logits.size()), context) == id;
    context.push_back(id);
  }
  return same;
}

TEST_F(DeviceSamplerGpu, PicksTheCpuSamplersTokens) {
  constexpr int kSteps = 200;
  struct Case {
    std::string label;
    SamplingParams params;
    std::vector<float> logits;
    std::vector<int32_t> prompt, device;
  };
  std::vector<Case> cases;
  for (int64_t vocab : {int64_t(1000), int64_t(32000), int64_t(151936), int64_t(262208)}) {
    for (float scale : {0.3f, 2.0f, 8.0f, -2.0f}) {
      if (vocab > 200000 && scale != 2.0f) continue;  // the largest vocab (Gemma 3) once, for the memory layout
      std::vector<float> logits = random_logits(vocab, scale, uint64_t(vocab) * 31 + uint64_t(std::fabs(scale) * 10));
      Tensor on_gpu = Tensor::from_floats(logits, {1, vocab}).to_device(Device::cuda);
      std::vector<int32_t> prompt = random_prompt(vocab, uint64_t(vocab));
      for (const Mode& m : modes()) {
        DeviceSampler sampler(m.params, vocab);
        char label[128];
        std::snprintf(label, sizeof(label), "vocab %6lld scale %4.1f%s %s", (long long)vocab, std::fabs(scale),
                      scale < 0 ? " ties" : "     ", m.name.c_str());
        cases.push_back({label, m.params, logits, prompt, device_tokens(sampler, on_gpu, prompt, kSteps)});
      }
    }
  }
  // The CPU side is the slow one (a sort per top-p draw): one thread per case.
  std::vector<std::future<int>> matches;
  for (const Case& c : cases)
    matches.push_back(std::async(std::launch::async, cpu_matches, c.params, c.logits, c.prompt, c.device));
  int total = 0, total_same = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const int same = matches[i].get();
    const double rate = double(same) / kSteps;
    std::printf("[ gpu      ] %-48s %3d/%d identical (%.1f%%)\n", cases[i].label.c_str(), same, kSteps, 100 * rate);
    if (cases[i].params.is_greedy()) {
      EXPECT_EQ(same, kSteps) << cases[i].label;
    } else {
      EXPECT_GE(rate, 0.995) << cases[i].label;
      total += kSteps;
      total_same += same;
    }
  }
  std::printf("[ gpu      ] sampled draws: %d/%d identical (%.3f%%)\n", total_same, total, 100.0 * total_same / total);
}

TEST_F(DeviceSamplerGpu, KeepsTheFirstOfTiedTokens) {
  // All logits equal: top-k 3 keeps ids 0..2, greedy takes id 0.
  const int64_t vocab = 40000;
  Tensor logits = Tensor::from_floats(std::vector<float>(size_t(vocab), 1.5f), {vocab}).to_device(Device::cuda);
  SamplingParams p;
  p.top_k = 3;
  DeviceSampler sampler(p, vocab);
  for (int32_t id : device_tokens(sampler, logits, {}, 100)) EXPECT_LT(id, 3);
  SamplingParams g;
  g.temperature = 0;
  DeviceSampler greedy(g, vocab);
  EXPECT_EQ(device_tokens(greedy, logits, {}, 1)[0], 0);
}

TEST_F(DeviceSamplerGpu, GraphReplayMatchesEagerCalls) {
  const int64_t vocab = 32000;
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.9f;
  p.repetition_penalty = 1.3f;
  p.seed = 5;
  Tensor logits = Tensor::from_floats(random_logits(vocab, 3.0f, 8), {1, vocab}).to_device(Device::cuda);
  std::vector<int32_t> prompt = random_prompt(vocab, 9);
  DeviceSampler sampler(p, vocab);
  std::vector<int32_t> eager = device_tokens(sampler, logits, prompt, 50);

  Tensor out = Tensor::empty({1}, DType::i32, Device::cuda);
  sampler.reset(prompt);
  CudaGraph graph;
  graph.capture([&] { sampler.sample(logits, out.data<int32_t>()); });
  EXPECT_EQ(sampler.draws(), 0);  // capturing runs nothing
  std::vector<int32_t> replayed;
  for (int i = 0; i < 50; ++i) {
    graph.replay();
    replayed.push_back(read_id(out.data<int32_t>()));
  }
  EXPECT_EQ(replayed, eager);
  EXPECT_EQ(sampler.draws(), 50);
}

// A sampler of B rows (one launch) gives each row exactly the tokens of a
// one-row sampler on that row's logits and context, for every mode: the rows'
// presence flags and draw counters are their own.
TEST_F(DeviceSamplerGpu, RowsSampleAsSeparateSamplers) {
  constexpr int64_t kRows = 5, kSteps = 40;
  for (int64_t vocab : {int64_t(1000), int64_t(151936)}) {
    std::vector<float> all;
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t r = 0; r < kRows; ++r) {
      const std::vector<float> l = random_logits(vocab, r % 2 ? 2.0f : -2.0f, uint64_t(vocab + r));
      all.insert(all.end(), l.begin(), l.end());
      prompts.push_back(random_prompt(vocab, uint64_t(r + 17)));
    }
    const Tensor batch = Tensor::from_floats(all, {kRows, vocab}).to_device(Device::cuda);
    for (const Mode& m : modes()) {
      DeviceSampler rows(m.params, vocab, kRows);
      rows.reset(prompts);
      Tensor out = Tensor::empty({kRows}, DType::i32, Device::cuda);
      std::vector<std::vector<int32_t>> got(static_cast<size_t>(kRows));
      for (int i = 0; i < kSteps; ++i) {
        rows.sample(batch, out.data<int32_t>());
        std::vector<int32_t> ids(static_cast<size_t>(kRows));
        copy_bytes(ids.data(), Device::cpu, out.raw(), Device::cuda, ids.size() * sizeof(int32_t));
        for (int64_t r = 0; r < kRows; ++r) got[size_t(r)].push_back(ids[size_t(r)]);
      }
      for (int64_t r = 0; r < kRows; ++r) {
        DeviceSampler one(m.params, vocab);
        const Tensor row = batch.slice_rows(r, r + 1);
        EXPECT_EQ(got[size_t(r)], device_tokens(one, row, prompts[size_t(r)], kSteps))
            << "vocab " << vocab << " " << m.name << " row " << r;
        EXPECT_EQ(rows.draws(r), m.params.is_greedy() ? 0 : kSteps) << m.name << " row " << r;
      }
    }
    std::printf("[ gpu      ] vocab %lld: %lld rows in one launch = %lld one-row samplers, %zu modes\n",
                (long long)vocab, (long long)kRows, (long long)kRows, modes().size());
  }
}

TEST_F(DeviceSamplerGpu, Timing) {
  const int64_t vocab = 151936;
  constexpr int kIters = 1000;
  Tensor out = Tensor::empty({1}, DType::i32, Device::cuda);
  for (float scale : {2.0f, 0.3f}) {
    Tensor logits = Tensor::from_floats(random_logits(vocab, scale, 3), {1, vocab}).to_device(Device::cuda);
    for (const Mode& m : modes()) {
      DeviceSampler sampler(m.params, vocab);
      sampler.reset(random_prompt(vocab, 4));
      for (int i = 0; i < 10; ++i) sampler.sample(logits, out.data<int32_t>());
      device_synchronize();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kIters; ++i) sampler.sample(logits, out.data<int32_t>());
      device_synchronize();
      auto t1 = std::chrono::steady_clock::now();
      CudaGraph graph;
      graph.capture([&] { sampler.sample(logits, out.data<int32_t>()); });
      graph.replay();
      device_synchronize();
      auto t2 = std::chrono::steady_clock::now();
      for (int i = 0; i < kIters; ++i) graph.replay();
      device_synchronize();
      auto t3 = std::chrono::steady_clock::now();
      auto us = [](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count() / kIters; };
      std::printf("[ gpu      ] vocab %lld scale %.1f %-18s %6.1f us/sample eager, %6.1f us graph replay\n",
                  (long long)vocab, scale, m.name.c_str(), us(t0, t1), us(t2, t3));
    }
  }
}

}  // namespace
}  // namespace mere

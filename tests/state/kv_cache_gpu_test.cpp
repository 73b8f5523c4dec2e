// KV cache modes on CUDA (ctest label gpu): the resident bytes of a quantized
// cache on the GPU, and whole models decoding with affine8/affine4 caches on the
// GPU against the same mode on the CPU (a match rate and the first divergence,
// since a code may round the other way when the devices' K differ in the last
// bits), the graph loop against the plain loop, and the fused rope-store into a
// quantized cache against the composition.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "core/device.h"
#include "engine/bench.h"
#include "engine/generate.h"
#include "engine/levers.h"
#include "models/model.h"
#include "models/shapes.h"
#include "ops/cuda/launchers.h"
#include "state/kv_cache.h"
#include "gpu_test_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mere {
namespace {

class KvCacheGpu : public test::NeedsGpu<::testing::TestWithParam<std::string>> {
 protected:
  std::filesystem::path dir() const {
    return test::model_dir(GetParam());
  }
  // Whether lever tensor_core_kv_attention has a kernel for this model's head_dim.
  bool tensor_cores_apply() const {
    const auto config = nlohmann::json::parse(test::read_file(dir() / "config.json"));
    const int64_t head_dim = config.value("head_dim", config["hidden_size"].get<int64_t>() /
                                                          config["num_attention_heads"].get<int64_t>());
    return cuda::attention_affine_mma_supports(int(head_dim), 8);
  }
  std::vector<int32_t> prompt() const {
    if (GetParam() == "demo")
      return Tokenizer::load(dir()).encode("And God said unto Moses, Go in unto Pharaoh", false);
    auto ref = nlohmann::json::parse(test::read_file(dir() / "reference.json"));
    return ref["ids"].get<std::vector<int32_t>>();
  }
};

TEST(KvCacheBytesGpu, QuantizedModesHoldTheStatedFractionOfBf16OnTheGpu) {
  if (!cuda_available()) FAIL() << "gpu tests need a GPU: " << cuda_device_description();
  KvCache bf16(8, 128, 512, Device::cuda, KvCacheMode::bf16), a8(8, 128, 512, Device::cuda, KvCacheMode::affine8),
      a4(8, 128, 512, Device::cuda, KvCacheMode::affine4);
  for (KvCache* c : {&bf16, &a8, &a4}) c->reserve(300);
  EXPECT_EQ(bf16.size_bytes(), size_t(300 * 2 * 8 * 128 * 2));
  EXPECT_EQ(double(a8.size_bytes()) / double(bf16.size_bytes()), 0.53125);
  EXPECT_EQ(double(a4.size_bytes()) / double(bf16.size_bytes()), 0.28125);
}

std::vector<int32_t> greedy(const Model& model, const std::vector<int32_t>& prompt, KvCacheMode mode, int n,
                            const Levers& levers = Levers::from_env()) {
  GenerateOptions options;
  options.max_new_tokens = n;
  options.sampling.temperature = 0;
  options.kv_cache_mode = mode;
  options.levers = levers;
  std::vector<int32_t> out;
  generate(model, prompt, options, [&](int32_t id) { out.push_back(id); return true; });
  return out;
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// The same lossy mode on both devices: prefill logits close, greedy tokens
// agreeing for most of 32 (a near-tie may flip after a code rounds the other way).
TEST_P(KvCacheGpu, QuantizedModesOnTheGpuFollowTheCpu) {
  const Levers levers = Levers::from_env();
  auto gpu_model = load_model(dir(), Device::cuda, levers.load_options(Device::cuda));
  auto cpu_model = load_model(dir(), Device::cpu);
  const std::vector<int32_t> ids = prompt();
  for (KvCacheMode mode : {KvCacheMode::affine8, KvCacheMode::affine4}) {
    auto s1 = cpu_model->make_state(0, mode), s2 = gpu_model->make_state(0, mode);
    Tensor a = cpu_model->forward(ids, *s1, true), b = gpu_model->forward(ids, *s2, true).to_device(Device::cpu);
    const float max_ref = test::max_abs(a);
    const float rel = test::max_abs_diff(a, b).diff / max_ref;
    const auto tc = greedy(*cpu_model, ids, mode, 32), tg = greedy(*gpu_model, ids, mode, 32, levers);
    size_t same = 0;
    for (size_t i = 0; i < tc.size() && i < tg.size(); ++i) same += tc[i] == tg[i];
    const size_t first = common_prefix(tc, tg);
    std::printf("[ gpu      ] %-6s kv %-8s cuda vs cpu: prefill logits rel %.2e, greedy match %zu/32, first divergence %s\n",
                GetParam().c_str(), std::string(kv_cache_mode_name(mode)).c_str(), rel, same,
                first == tc.size() ? "none" : std::to_string(first).c_str());
    EXPECT_LE(rel, mode == KvCacheMode::affine8 ? 5e-2f : 0.3f);
    if (mode == KvCacheMode::affine8) {
      EXPECT_GE(first, 8u) << GetParam();
    }
  }
}

// Lever tensor_core_kv_attention against the CUDA-core kernel, the same mode on
// the same device: next-token logits after the prompt close, and greedy tokens
// agreeing for most of 32 (q and p s rounded to f16 may flip a near-tie). The
// prompt's own attention outputs differ in the last bits, so a later K/V value
// may round to the next code: a whole step, 1/15 of its group's range in
// affine4, hence the looser affine4 bound (observed 2.6e-3 and 1.3-1.5e-2 on the
// demo, the only model here whose head_dim the kernel takes).
TEST_P(KvCacheGpu, TensorCoreAttentionFollowsTheCudaCoreKernel) {
  Levers off = Levers::from_env(), on = off;
  off.tensor_core_kv_attention = false;
  on.tensor_core_kv_attention = true;
  auto model_off = load_model(dir(), Device::cuda, off.load_options(Device::cuda));
  auto model_on = load_model(dir(), Device::cuda, on.load_options(Device::cuda));
  const std::vector<int32_t> ids = prompt();
  for (KvCacheMode mode : {KvCacheMode::affine8, KvCacheMode::affine4}) {
    // The prompt's last token decodes alone, so its logits come from the decode kernel.
    const std::vector<int32_t> head(ids.begin(), ids.end() - 1), last(ids.end() - 1, ids.end());
    Tensor logits[2];
    int i = 0;
    for (const Model* m : {model_off.get(), model_on.get()}) {
      auto state = m->make_state(0, mode);
      m->forward(head, *state, false);
      logits[i++] = m->forward(last, *state, false).to_device(Device::cpu);
    }
    float max_ref = 0;
    for (int64_t j = 0; j < logits[0].numel(); ++j) max_ref = std::max(max_ref, std::fabs(logits[0].at(j)));
    const float rel = test::max_abs_diff(logits[0], logits[1]).diff / max_ref;
    const auto a = greedy(*model_off, ids, mode, 32, off), b = greedy(*model_on, ids, mode, 32, on);
    size_t same = 0;
    for (size_t j = 0; j < a.size() && j < b.size(); ++j) same += a[j] == b[j];
    const size_t first = common_prefix(a, b);
    std::printf("[ gpu      ] %-6s kv %-8s tensor cores vs CUDA cores: decode logits rel %.2e, greedy match %zu/32, "
                "first divergence %s\n", GetParam().c_str(), std::string(kv_cache_mode_name(mode)).c_str(), rel, same,
                first == a.size() ? "none" : std::to_string(first).c_str());
    if (tensor_cores_apply()) {
      EXPECT_LE(rel, mode == KvCacheMode::affine8 ? 1e-2f : 5e-2f) << GetParam() << " " << kv_cache_mode_name(mode);
      EXPECT_GE(first, 8u) << GetParam() << " " << kv_cache_mode_name(mode);
    } else {  // the fixtures' head_dim 16 and 32: the CUDA-core kernel on both sides
      EXPECT_EQ(rel, 0.0f) << GetParam() << " " << kv_cache_mode_name(mode);
      EXPECT_EQ(a, b) << GetParam() << " " << kv_cache_mode_name(mode);
    }
  }
}

// Graph replay reads the quantized cache through the device position: exactly
// the plain loop's tokens, and the counters show that graphs ran.
TEST_P(KvCacheGpu, QuantizedGraphDecodeMatchesThePlainLoop) {
  Levers on = Levers::from_env(), off = on;
  on.cuda_graphs = true;
  off.cuda_graphs = off.pipelined_decode = false;
  auto model = load_model(dir(), Device::cuda, on.load_options(Device::cuda));
  for (KvCacheMode mode : {KvCacheMode::affine8, KvCacheMode::affine4}) {
    const auto a = greedy(*model, prompt(), mode, 32, off), b = greedy(*model, prompt(), mode, 32, on);
    EXPECT_EQ(a, b) << GetParam() << " " << kv_cache_mode_name(mode);
  }
}

// fused_rope_store on a quantized cache (the warp quantizes inside the fused
// kernel) against the composition (rope kernels, then the quantizing store).
TEST_P(KvCacheGpu, QuantizedFusedRopeStoreMatchesTheComposition) {
  LoadOptions fused = Levers::from_env().load_options(Device::cuda), plain = fused;
  fused.fuse_rope_store = true;
  plain.fuse_rope_store = false;
  auto a_model = load_model(dir(), Device::cuda, plain), b_model = load_model(dir(), Device::cuda, fused);
  const std::vector<int32_t> ids = prompt();
  for (KvCacheMode mode : {KvCacheMode::affine8, KvCacheMode::affine4}) {
    auto s1 = a_model->make_state(0, mode), s2 = b_model->make_state(0, mode);
    Tensor a = a_model->forward(ids, *s1, true).to_device(Device::cpu);
    Tensor b = b_model->forward(ids, *s2, true).to_device(Device::cpu);
    const float max_ref = test::max_abs(a);
    const float rel = test::max_abs_diff(a, b).diff / max_ref;
    const size_t first = common_prefix(greedy(*a_model, ids, mode, 32), greedy(*b_model, ids, mode, 32));
    std::printf("[ gpu      ] %-6s kv %-8s fused vs composed rope/store: logits rel %.2e, greedy identical for %zu of 32\n",
                GetParam().c_str(), std::string(kv_cache_mode_name(mode)).c_str(), rel, first);
    EXPECT_LE(rel, mode == KvCacheMode::affine8 ? 2e-2f : 0.2f);
    EXPECT_GE(first, 8u);
  }
}

// A model-sized shape (Qwen3-0.6B: 16 heads over 8 kv heads of 128) at a long
// context: a decode step over ~1,500 cached positions (several splits) with each
// quantized mode against bf16, then mere bench's decode rows for every mode
// (graphs, pipelining), with the resident KV bytes in the stated ratio.
TEST(KvCacheModesGpu, LongContextDecodeAndBenchRowsForEveryMode) {
  if (!cuda_available()) FAIL() << "gpu tests need a GPU: " << cuda_device_description();
  const Levers levers = Levers::from_env();
  auto model = random_model("qwen3-0.6b", Device::cuda, levers.load_options(Device::cuda));
  std::vector<int32_t> ids(1500);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7919 + 13) % 150000);
  auto logits = [&](KvCacheMode mode) {
    auto state = model->make_state(1600, mode);
    model->forward(ids, *state, false);                                  // prefill (bf16 copy for quantized)
    return model->forward({42}, *state, false).to_device(Device::cpu);  // decode reads the codes
  };
  const Tensor want = logits(KvCacheMode::bf16);
  const float max_ref = test::max_abs(want);
  for (KvCacheMode mode : {KvCacheMode::affine8, KvCacheMode::affine4}) {
    const float rel = test::max_abs_diff(logits(mode), want).diff / max_ref;
    std::printf("[ gpu      ] qwen3-0.6b shape, 1500 cached: kv %s decode logits vs bf16 rel %.2e\n",
                std::string(kv_cache_mode_name(mode)).c_str(), rel);
    EXPECT_LE(rel, mode == KvCacheMode::affine8 ? 5e-2f : 0.3f);
  }
  Ceilings ceilings;
  std::vector<BenchRow> rows;
  for (KvCacheMode mode : {KvCacheMode::bf16, KvCacheMode::affine8, KvCacheMode::affine4}) {
    rows.push_back(bench_decode(*model, 32, 1024, 1, ceilings, levers, mode));
    std::printf("[ gpu      ] qwen3-0.6b shape tg32 @ d1024 kv %s: %.1f tok/s, KV %.1f MiB\n",
                std::string(kv_cache_mode_name(mode)).c_str(), rows.back().mean_tok_s,
                double(rows.back().kv_bytes) / (1 << 20));
    EXPECT_GT(rows.back().mean_tok_s, 0.0);
  }
  EXPECT_EQ(double(rows[1].kv_bytes) / double(rows[0].kv_bytes), 0.53125);
  EXPECT_EQ(double(rows[2].kv_bytes) / double(rows[0].kv_bytes), 0.28125);
}

// CUDA states are paged: a fork shares the blocks (copying the last partly
// filled one on write), truncate releases blocks. Both continue exactly as a
// fresh state given the same tokens, in every mode.
TEST_P(KvCacheGpu, PagedForkAndTruncateOnCuda) {
  auto model = load_model(dir(), Device::cuda, Levers::from_env().load_options(Device::cuda));
  const std::vector<int32_t> prompt = this->prompt();
  auto close = [](const Tensor& a, const Tensor& b) {
    const Tensor x = a.to_device(Device::cpu), y = b.to_device(Device::cpu);
    const float max_ref = std::max(1e-30f, test::max_abs(y));
    return test::max_abs_diff(x, y).diff / max_ref;
  };
  for (KvCacheMode mode : {KvCacheMode::bf16, KvCacheMode::affine8, KvCacheMode::affine4}) {
    auto base = model->make_state(200, mode);
    ASSERT_TRUE(base->is_paged());
    model->forward(prompt, *base, false);
    auto fork = base->fork();
    const Tensor a = model->forward({5}, *fork, false), b = model->forward({9}, *base, false);
    auto fresh = [&](int32_t next) {
      auto s = model->make_state(200, mode);
      model->forward(prompt, *s, false);
      return model->forward({next}, *s, false);
    };
    EXPECT_LE(close(a, fresh(5)), 1e-5f) << kv_cache_mode_name(mode);
    EXPECT_LE(close(b, fresh(9)), 1e-5f) << kv_cache_mode_name(mode);
    base->truncate(int64_t(prompt.size()));  // roll back the 9, then take 5 instead
    EXPECT_LE(close(model->forward({5}, *base, false), fresh(5)), 1e-5f) << kv_cache_mode_name(mode);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, KvCacheGpu, ::testing::Values("llama", "qwen2", "qwen3", "demo"));

}  // namespace
}  // namespace mere

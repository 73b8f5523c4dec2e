// The quality gate of MLX affine quantization on the demo model (models/demo):
// `mere quantize` at int8 g64 and int4 g64, then against the bf16 original on the
// CPU: greedy match rate and first divergence over 128 tokens, and held-out
// perplexity. The figures are printed as "[ quality ]" lines for docs/levers.md.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "engine/generate.h"
#include "engine/perplexity.h"
#include "models/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mere {
namespace {

namespace fs = std::filesystem;

constexpr int kNewTokens = 128;

fs::path demo_dir() { return test::source_dir() / "models" / "demo"; }

struct Variant {
  std::string name;
  std::unique_ptr<Model> model;
};

class QuantizedQuality : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    variants_ = new std::vector<Variant>();
    variants_->push_back({"bf16", load_model(demo_dir())});
    const fs::path root = fs::temp_directory_path() / "mere_test_QuantizedQuality";
    fs::remove_all(root);
    for (int bits : {8, 4}) {
      const fs::path out = root / ("int" + std::to_string(bits));
      auto r = test::run_mere("quantize -m " + demo_dir().string() + " -o " + out.string() + " --bits " +
                              std::to_string(bits) + " --group-size 64");
      ASSERT_EQ(r.exit_code, 0) << r.err;
      variants_->push_back({"int" + std::to_string(bits) + " g64", load_model(out)});
    }
  }
  static void TearDownTestSuite() {
    delete variants_;
    variants_ = nullptr;
  }
  static std::vector<Variant>* variants_;
};
std::vector<Variant>* QuantizedQuality::variants_ = nullptr;

std::vector<int32_t> greedy(const Model& model, const std::vector<int32_t>& prompt) {
  GenerateOptions options;
  options.max_new_tokens = kNewTokens;
  options.sampling.temperature = 0;  // no EOS: every run is kNewTokens long
  std::vector<int32_t> out;
  generate(model, prompt, options, [&](int32_t id) {
    out.push_back(id);
    return true;
  });
  return out;
}

// Logits [kNewTokens, vocab]: row t predicts continuation token t, given the prompt
// and continuation[0, t).
Tensor teacher_forced(const Model& model, const std::vector<int32_t>& prompt, const std::vector<int32_t>& continuation) {
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), continuation.begin(), continuation.end() - 1);
  auto state = model.make_state(int64_t(seq.size()));
  Tensor logits = model.forward(seq, *state, /*all_logits=*/true);
  return logits.slice_rows(int64_t(prompt.size()) - 1, int64_t(seq.size()));
}

int argmax(const float* row, int64_t n) { return int(std::max_element(row, row + n) - row); }

int rank_of(const float* row, int64_t n, int token) {
  return int(std::count_if(row, row + n, [&](float v) { return v > row[token]; }));
}

// bf16's greedy continuation of each prompt, then each quantized model's top-1 along it
// (teacher forcing). Until the first disagreement the quantized model sees exactly the
// context it would have produced itself, so the first disagreement is where its own
// greedy run would diverge; the agreement rate is the greedy match rate along bf16's text.
// Packed words count 32 / bits parameters each, and scales and biases none, so
// every variant reports the bf16 model's count (bench's params column).
TEST_F(QuantizedQuality, ParameterCountIsTheLogicalOne) {
  const int64_t bf16 = variants_->front().model->info().n_params;
  EXPECT_GT(bf16, 0);
  for (const Variant& v : *variants_) EXPECT_EQ(v.model->info().n_params, bf16) << v.name;
}

TEST_F(QuantizedQuality, GreedyAgainstBf16) {
  ASSERT_EQ(variants_->size(), 3u);
  const nlohmann::json ref = nlohmann::json::parse(test::read_file(demo_dir() / "reference.json"));
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : ref["models"]["main"]["greedy"]) prompts.push_back(c["prompt_ids"].get<std::vector<int32_t>>());
  prompts = {prompts[1], prompts[3]};  // a verse and a code prompt: each bf16 decode step costs CI time
  const Model& base = *(*variants_)[0].model;
  const int64_t vocab = base.info().vocab;
  std::vector<std::vector<int32_t>> want;
  std::vector<Tensor> base_logits;
  for (const auto& p : prompts) {
    want.push_back(greedy(base, p));
    base_logits.push_back(teacher_forced(base, p, want.back()));
    for (int t = 0; t < kNewTokens; ++t)  // the batched forward agrees with bf16's own decode
      EXPECT_EQ(argmax(base_logits.back().data<float>() + t * vocab, vocab), want.back()[size_t(t)]) << t;
  }
  for (size_t v = 1; v < variants_->size(); ++v) {
    const Variant& q = (*variants_)[v];
    int agreed = 0;
    std::string firsts;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Tensor logits = teacher_forced(*q.model, prompts[i], want[i]);
      int first = -1;
      for (int t = 0; t < kNewTokens; ++t) {
        const float* row = logits.data<float>() + t * vocab;
        const int pick = argmax(row, vocab);
        if (pick == want[i][size_t(t)]) {
          ++agreed;
          continue;
        }
        if (first >= 0) continue;
        first = t;
        // At the first divergence both picks are near the top of the other model's logits.
        const float* b = base_logits[i].data<float>() + t * vocab;
        const int rank_in_base = rank_of(b, vocab, pick), rank_in_q = rank_of(row, vocab, want[i][size_t(t)]);
        firsts += fmt::format("{}{} (bf16 margin {:.3f}, ranks {}/{})", firsts.empty() ? "" : ", ", t,
                              b[want[i][size_t(t)]] - b[pick], rank_in_base, rank_in_q);
        EXPECT_LT(rank_in_base, 5) << q.name << " prompt " << i << " token " << t;
        EXPECT_LT(rank_in_q, 5) << q.name << " prompt " << i << " token " << t;
      }
      if (first < 0) firsts += std::string(firsts.empty() ? "" : ", ") + "none";
    }
    const double agreement = double(agreed) / double(kNewTokens * prompts.size());
    std::printf("[ quality ] demo %s vs bf16, %zu prompts x %d greedy tokens: match %.3f, first divergence [%s]\n",
                q.name.c_str(), prompts.size(), kNewTokens, agreement, firsts.c_str());
    EXPECT_GE(agreement, v == 1 ? 0.95 : 0.85) << q.name;
  }
}

// Perplexity over the first 768 tokens of heldout_test.txt in 3 windows of 256 (the full
// file at stride 128 takes ~20 CPU-seconds a model; its figures are in docs/levers.md).
TEST_F(QuantizedQuality, HeldOutPerplexityAgainstBf16) {
  ASSERT_EQ(variants_->size(), 3u);
  Tokenizer tokenizer = Tokenizer::load(demo_dir());
  std::vector<int32_t> ids = tokenizer.encode(test::read_file(demo_dir() / "heldout_test.txt"), false);
  ASSERT_EQ(ids.size(), 2967u);
  ids.resize(768);
  const double base = perplexity(*(*variants_)[0].model, ids, 256, 256).ppl();
  std::printf("[ quality ] demo bf16: ppl %.4f (heldout_test.txt, first 768 tokens, ctx 256, stride 256)\n", base);
  for (size_t v = 1; v < variants_->size(); ++v) {
    const double ppl = perplexity(*(*variants_)[v].model, ids, 256, 256).ppl();
    const double delta = (ppl - base) / base;
    std::printf("[ quality ] demo %s: ppl %.4f, %+.2f%% vs bf16\n", (*variants_)[v].name.c_str(), ppl, 100 * delta);
    EXPECT_LE(std::fabs(delta), v == 1 ? 0.01 : 0.10) << (*variants_)[v].name;
  }
}

}  // namespace
}  // namespace mere

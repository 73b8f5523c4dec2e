// Lever int16_activation_matvec on the demo model quantized by `mere quantize`
// (ctest label gpu). int8 g64: every matrix takes the tensor-core matvec from 2
// tokens; int4 g64: down_proj only (the other matrices' 384 columns are not a
// whole number of its 256-value stages). The held-out text is teacher-forced in
// forwards of 4 tokens, the decode matvec at T = 4 (where the lever puts the
// four tokens in one mma instead of two), against the same model with x in
// three digits. Prints the figures for docs/levers.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "audit/verdict.h"
#include "models/model.h"
#include "ops/ops.h"
#include "gpu_test_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mere {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kTokens = 512, kChunk = 4;

fs::path demo_dir() { return test::source_dir() / "models" / "demo"; }

// Natural-log softmax of a row, in double.
std::vector<double> log_softmax(const float* row, int64_t n) {
  const double top = *std::max_element(row, row + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(row[i]) - top);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = double(row[i]) - top - std::log(sum);
  return out;
}

// Logits [kTokens - 1, vocab]: row t predicts ids[t + 1], forwards of kChunk tokens.
Tensor chunked_logits(const Model& model, const std::vector<int32_t>& ids) {
  auto state = model.make_state(kTokens);
  std::vector<Tensor> rows;
  for (int64_t b = 0; b + 1 < int64_t(ids.size()); b += kChunk) {
    const int64_t e = std::min<int64_t>(b + kChunk, int64_t(ids.size()) - 1);
    const std::vector<int32_t> chunk(ids.begin() + b, ids.begin() + e);
    rows.push_back(model.forward(chunk, *state, /*all_logits=*/true).to_device(Device::cpu));
  }
  return ops::concat_rows(rows);
}

class Int16ActivationDemo : public test::NeedsGpu<::testing::TestWithParam<int>> {};

TEST_P(Int16ActivationDemo, ChunkedDecodeStaysWithThreeDigits) {
  const int bits = GetParam();
  const fs::path out = fs::temp_directory_path() / ("mere_test_Int16ActivationDemo_int" + std::to_string(bits));
  fs::remove_all(out);
  auto r = test::run_mere("quantize -m " + demo_dir().string() + " -o " + out.string() + " --bits " +
                          std::to_string(bits) + " --group-size 64");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  LoadOptions exact_options{.fuse_projections = true, .fuse_rope_store = true, .programmatic_launch = true,
                            .matvec_split_k = true, .tensor_core_affine_matvec = true};
  LoadOptions lever_options = exact_options;
  lever_options.int16_activation_matvec = true;
  auto exact = load_model(out, Device::cuda, exact_options);
  auto lever = load_model(out, Device::cuda, lever_options);

  const std::string text = test::read_file(demo_dir() / "heldout_test.txt");
  std::vector<int32_t> ids = Tokenizer::load(demo_dir()).encode(text, false);
  ASSERT_GE(int64_t(ids.size()), kTokens);
  ids.resize(size_t(kTokens));
  const Tensor a = chunked_logits(*exact, ids), b = chunked_logits(*lever, ids);
  // Each forward's all_logits rows predict its tokens' successors.
  const int64_t n = a.dim(0), vocab = a.dim(1);
  ASSERT_EQ(n, kTokens - 1);
  double nll_a = 0, nll_b = 0;
  std::vector<double> kls;
  float worst = 0;
  int same_argmax = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* ra = a.data<float>() + t * vocab;
    const float* rb = b.data<float>() + t * vocab;
    const std::vector<double> la = log_softmax(ra, vocab), lb = log_softmax(rb, vocab);
    double kl = 0;
    for (int64_t i = 0; i < vocab; ++i) kl += std::exp(la[size_t(i)]) * (la[size_t(i)] - lb[size_t(i)]);
    kls.push_back(kl);
    const int32_t next = ids[size_t(t + 1)];
    nll_a -= la[size_t(next)];
    nll_b -= lb[size_t(next)];
    float top = 1e-30f, diff = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      top = std::max(top, std::fabs(ra[i]));
      diff = std::max(diff, std::fabs(ra[i] - rb[i]));
    }
    worst = std::max(worst, diff / top);
    same_argmax += std::max_element(ra, ra + vocab) - ra == std::max_element(rb, rb + vocab) - rb;
  }
  const double ppl_a = std::exp(nll_a / double(n)), ppl_b = std::exp(nll_b / double(n));
  double kl_mean = 0;
  for (double kl : kls) kl_mean += kl / double(n);
  std::sort(kls.begin(), kls.end());
  const double kl_p99 = kls[size_t(double(n - 1) * 0.99)];
  std::printf(
      "[ quality ] demo int%d g64, forwards of %lld tokens over %lld held-out tokens, int16 x vs three digits: logits "
      "rel diff %.3g, argmax %d/%lld, KL mean %.3g p99 %.3g nats, ppl %.4f vs %.4f (%+.4f%%)\n",
      bits, static_cast<long long>(kChunk), static_cast<long long>(kTokens), worst, same_argmax,
      static_cast<long long>(n), kl_mean, kl_p99, ppl_b, ppl_a, 100 * (ppl_b - ppl_a) / ppl_a);
  EXPECT_GT(worst, 0.0f) << "the lever changed no logit: did the two-digit matvec run?";
  // Rounding x to 15 bits a group moves each product by about 2^-14 of the group's largest term.
  EXPECT_LE(worst, 2e-3f);
  EXPECT_GE(same_argmax * 100, n * 98) << "argmax agreement below 98%";
  // The audit's parity bounds (src/audit/verdict.h), but for argmax agreement.
  EXPECT_LE(kl_mean, kParityKlMean);
  EXPECT_LE(kl_p99, kParityKlP99);
  EXPECT_LE(std::fabs(ppl_b - ppl_a) / ppl_a, kParityPplRel);
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Demo, Int16ActivationDemo, ::testing::Values(8, 4));

}  // namespace
}  // namespace mere

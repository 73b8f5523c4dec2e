// Lever int16_activation_matvec on the demo model quantized by `mere quantize`
// (ctest label gpu). int8 g64: every matrix takes the tensor-core matvec from 2
// tokens; int4 g64: down_proj only (the other matrices' 384 columns are not a
// whole number of its 256-value stages). The held-out text is teacher-forced in
// forwards of 4 tokens, the decode matvec at T = 4 (where the lever puts the
// four tokens in one mma instead of two), against the same model with x in
// three digits. Prints the figures for docs/levers.md.
// Lever sixteen_token_matvec likewise, in forwards of 16 tokens: the same
// two-digit matvec at T = 16 against the prefill path it replaces (x and the
// weights rounded to bf16), both against the CPU's f32 product.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "audit/verdict.h"
#include "engine/levers.h"
#include "models/model.h"
#include "ops/ops.h"
#include "gpu_test_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mere {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kTokens = 512;

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

// Logits [kTokens - 1, vocab]: row t predicts ids[t + 1], forwards of `chunk` tokens.
Tensor chunked_logits(const Model& model, const std::vector<int32_t>& ids, int64_t chunk) {
  auto state = model.make_state(kTokens);
  std::vector<Tensor> rows;
  for (int64_t b = 0; b + 1 < int64_t(ids.size()); b += chunk) {
    const int64_t e = std::min<int64_t>(b + chunk, int64_t(ids.size()) - 1);
    const std::vector<int32_t> chunk(ids.begin() + b, ids.begin() + e);
    rows.push_back(model.forward(chunk, *state, /*all_logits=*/true).to_device(Device::cpu));
  }
  return ops::concat_rows(rows);
}

// How logits b differ from logits a over the held-out ids: the largest
// difference relative to a row's largest |logit|, argmax agreement, KL(a || b)
// and both perplexities.
struct Comparison {
  float worst = 0;
  int same_argmax = 0;
  int64_t n = 0;
  double kl_mean = 0, kl_p99 = 0, ppl_a = 0, ppl_b = 0;
  double ppl_rel() const { return (ppl_b - ppl_a) / ppl_a; }
};

Comparison compare(const Tensor& a, const Tensor& b, const std::vector<int32_t>& ids) {
  Comparison c;
  c.n = a.dim(0);
  const int64_t vocab = a.dim(1);
  double nll_a = 0, nll_b = 0;
  std::vector<double> kls;
  for (int64_t t = 0; t < c.n; ++t) {
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
    c.worst = std::max(c.worst, diff / top);
    c.same_argmax += std::max_element(ra, ra + vocab) - ra == std::max_element(rb, rb + vocab) - rb;
  }
  c.ppl_a = std::exp(nll_a / double(c.n));
  c.ppl_b = std::exp(nll_b / double(c.n));
  for (double kl : kls) c.kl_mean += kl / double(c.n);
  std::sort(kls.begin(), kls.end());
  c.kl_p99 = kls[size_t(double(c.n - 1) * 0.99)];
  return c;
}

// The audit's parity bounds (src/audit/verdict.h), and argmax agreement of 98%.
void expect_parity(const Comparison& c) {
  EXPECT_GE(c.same_argmax * 100, c.n * 98) << "argmax agreement below 98%";
  EXPECT_LE(c.kl_mean, kParityKlMean);
  EXPECT_LE(c.kl_p99, kParityKlP99);
  EXPECT_LE(std::fabs(c.ppl_rel()), kParityPplRel);
}

// The demo quantized by `mere quantize` (g64) into a fresh directory, and its held-out ids.
fs::path quantized_demo(int bits, const std::string& test) {
  const fs::path out = fs::temp_directory_path() / ("mere_test_" + test + "_int" + std::to_string(bits));
  fs::remove_all(out);
  auto r = test::run_mere("quantize -m " + demo_dir().string() + " -o " + out.string() + " --bits " +
                          std::to_string(bits) + " --group-size 64");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return out;
}

std::vector<int32_t> heldout_ids() {
  const std::string text = test::read_file(demo_dir() / "heldout_test.txt");
  std::vector<int32_t> ids = Tokenizer::load(demo_dir()).encode(text, false);
  EXPECT_GE(int64_t(ids.size()), kTokens);
  ids.resize(size_t(kTokens));
  return ids;
}

class Int16ActivationDemo : public test::NeedsGpu<::testing::TestWithParam<int>> {};

TEST_P(Int16ActivationDemo, ChunkedDecodeStaysWithThreeDigits) {
  const int bits = GetParam();
  const fs::path out = quantized_demo(bits, "Int16ActivationDemo");
  LoadOptions exact_options{.fuse_projections = true, .fuse_rope_store = true, .programmatic_launch = true,
                            .matvec_split_k = true, .tensor_core_affine_matvec = true};
  LoadOptions lever_options = exact_options;
  lever_options.int16_activation_matvec = true;
  auto exact = load_model(out, Device::cuda, exact_options);
  auto lever = load_model(out, Device::cuda, lever_options);
  const std::vector<int32_t> ids = heldout_ids();
  constexpr int64_t kChunk = 4;
  const Tensor a = chunked_logits(*exact, ids, kChunk), b = chunked_logits(*lever, ids, kChunk);
  ASSERT_EQ(a.dim(0), kTokens - 1);  // each forward's all_logits rows predict its tokens' successors
  const Comparison c = compare(a, b, ids);
  std::printf(
      "[ quality ] demo int%d g64, forwards of %lld tokens over %lld held-out tokens, int16 x vs three digits: logits "
      "rel diff %.3g, argmax %d/%lld, KL mean %.3g p99 %.3g nats, ppl %.4f vs %.4f (%+.4f%%)\n",
      bits, static_cast<long long>(kChunk), static_cast<long long>(kTokens), c.worst, c.same_argmax,
      static_cast<long long>(c.n), c.kl_mean, c.kl_p99, c.ppl_b, c.ppl_a, 100 * c.ppl_rel());
  EXPECT_GT(c.worst, 0.0f) << "the lever changed no logit: did the two-digit matvec run?";
  // Rounding x to 15 bits a group moves each product by about 2^-14 of the group's largest term.
  EXPECT_LE(c.worst, 2e-3f);
  expect_parity(c);
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Demo, Int16ActivationDemo, ::testing::Values(8, 4));

// Lever sixteen_token_matvec: forwards of 16 tokens on the two-digit matvec
// (int8: every matrix; int4: down_proj) against the lever off (the
// prefill path: x and the weights rounded to bf16), each against the CPU's f32
// product on the same codes. The lever's logits must be the closer ones (int8:
// KL 5.3e-6 against the lever off's 2.0e-5, H100), with the same argmax and
// perplexity within the audit's bounds. KL between the two arms is the lever
// off's own distance mostly (2.1e-5 at int8, outside the parity bound), so the
// parity bounds apply to the lever against the CPU where every matrix takes it.
class SixteenTokenMatvecDemo : public test::NeedsGpu<::testing::TestWithParam<int>> {};

TEST_P(SixteenTokenMatvecDemo, ForwardsOfSixteenStayCloserToTheCpu) {
  const int bits = GetParam();
  const fs::path out = quantized_demo(bits, "SixteenTokenMatvecDemo");
  LoadOptions on = Levers{}.load_options(Device::cuda), off = on;
  on.sixteen_token_matvec = true;
  off.sixteen_token_matvec = false;
  auto with_lever = load_model(out, Device::cuda, on);
  auto without = load_model(out, Device::cuda, off);
  auto cpu = load_model(out, Device::cpu, Levers{}.load_options(Device::cpu));
  const std::vector<int32_t> ids = heldout_ids();
  constexpr int64_t kChunk = 16;
  const Tensor a = chunked_logits(*without, ids, kChunk), b = chunked_logits(*with_lever, ids, kChunk);
  const Tensor truth = chunked_logits(*cpu, ids, kChunk);
  const Comparison c = compare(a, b, ids), off_vs_cpu = compare(truth, a, ids), on_vs_cpu = compare(truth, b, ids);
  std::printf(
      "[ quality ] demo int%d g64, forwards of %lld tokens over %lld held-out tokens, sixteen_token_matvec on vs off: "
      "logits rel diff %.3g, argmax %d/%lld, KL mean %.3g p99 %.3g nats, ppl %.4f vs %.4f (%+.4f%%); against the "
      "CPU: on %.3g (KL %.3g), off %.3g (KL %.3g)\n",
      bits, static_cast<long long>(kChunk), static_cast<long long>(kTokens), c.worst, c.same_argmax,
      static_cast<long long>(c.n), c.kl_mean, c.kl_p99, c.ppl_b, c.ppl_a, 100 * c.ppl_rel(), on_vs_cpu.worst,
      on_vs_cpu.kl_mean, off_vs_cpu.worst, off_vs_cpu.kl_mean);
  EXPECT_GT(c.worst, 0.0f) << "the lever changed no logit: did the matvec take the 16 tokens?";
  EXPECT_LT(on_vs_cpu.kl_mean, off_vs_cpu.kl_mean) << "the lever's logits are not closer to the CPU's";
  EXPECT_LT(on_vs_cpu.worst, off_vs_cpu.worst) << "the lever's logits are not closer to the CPU's";
  EXPECT_GE(c.same_argmax * 100, c.n * 98) << "argmax agreement below 98%";
  EXPECT_LE(std::fabs(c.ppl_rel()), kParityPplRel);
  if (bits == 8) expect_parity(on_vs_cpu);  // int4: the other matrices' bf16 path dominates both arms
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Demo, SixteenTokenMatvecDemo, ::testing::Values(8, 4));


}  // namespace
}  // namespace mere

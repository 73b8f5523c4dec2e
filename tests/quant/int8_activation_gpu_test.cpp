// Lever int8_activation_matvec on the MLX-quantized fixtures (ctest label gpu):
// decode steps with the activations rounded to int8 against the same model with
// f32 activations and against transformers' logits. The lever is lossy, so this
// bounds and prints what it costs; the quality gate is `mere audit`
// (docs/levers.md).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "io/npy.h"
#include "models/model.h"
#include "gpu_test_util.h"
#include "test_util.h"

namespace mere {
namespace {

class Int8ActivationFixture : public test::NeedsGpu<::testing::TestWithParam<const char*>> {};

int64_t argmax(const Tensor& row) {
  int64_t best = 0;
  for (int64_t i = 1; i < row.numel(); ++i)
    if (row.at(i) > row.at(best)) best = i;
  return best;
}

// Teacher-forced decode: the first half of the reference ids as one prefill
// (dequantized GEMM, the lever does not apply), then one id per step (the
// quantized matvec, where it does).
TEST_P(Int8ActivationFixture, DecodeLogitsStayCloseToF32Activations) {
  const auto dir = test::fixtures_dir() / GetParam();
  const auto ref = nlohmann::json::parse(test::read_file(dir / "reference.json"));
  const std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
  const Tensor want = read_npy(dir / "logits.npy");  // transformers on the dequantized weights, [T, vocab]
  auto plain = load_model(dir, Device::cuda, {.fuse_projections = true, .fuse_rope_store = true});
  auto lever = load_model(dir, Device::cuda,
                          {.fuse_projections = true, .fuse_rope_store = true, .int8_activation_matvec = true});
  auto s1 = plain->make_state(), s2 = lever->make_state();
  const size_t half = ids.size() / 2;
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + int64_t(half));
  plain->forward(prompt, *s1, false);
  lever->forward(prompt, *s2, false);
  float worst_vs_plain = 0, worst_plain_vs_ref = 0, worst_lever_vs_ref = 0;
  int same_argmax = 0, steps = 0, changed = 0;
  for (size_t i = half; i < ids.size(); ++i, ++steps) {
    const Tensor a = plain->forward({ids[i]}, *s1, false).to_device(Device::cpu);
    const Tensor b = lever->forward({ids[i]}, *s2, false).to_device(Device::cpu);
    const Tensor r = want.slice_rows(int64_t(i), int64_t(i) + 1);
    float max_ref = 1e-30f;
    for (int64_t j = 0; j < r.numel(); ++j) max_ref = std::max(max_ref, std::fabs(r.at(j)));
    const float d = test::max_abs_diff(a, b).diff;
    changed += d > 0;
    worst_vs_plain = std::max(worst_vs_plain, d / max_ref);
    worst_plain_vs_ref = std::max(worst_plain_vs_ref, test::max_abs_diff(a, r).diff / max_ref);
    worst_lever_vs_ref = std::max(worst_lever_vs_ref, test::max_abs_diff(b, r).diff / max_ref);
    same_argmax += argmax(a) == argmax(b);
  }
  std::printf(
      "[ gpu      ] %s: int8 activations vs f32, %d decode steps: logits rel diff %.3g, argmax same %d/%d; against "
      "transformers %.3g (f32 activations %.3g)\n",
      GetParam(), steps, worst_vs_plain, same_argmax, steps, worst_lever_vs_ref, worst_plain_vs_ref);
  EXPECT_GT(changed, 0) << "the lever changed no decode step: did the int8 path run?";
  // Rounding x to int8 per 32 values moves a dot product by about 0.3% of its
  // terms' scale; the tiny random fixtures' logits are within a few percent.
  EXPECT_LE(worst_vs_plain, 5e-2f);
  EXPECT_LE(worst_lever_vs_ref, worst_plain_vs_ref + 5e-2f);
  EXPECT_GE(same_argmax * 4, steps * 3) << "argmax agreement below 75%";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Int8ActivationFixture,
                         ::testing::Values("qwen3-mlx4", "llama-mlx8", "qwen3_moe-mlx4", "qwen2-mlx4"));

}  // namespace
}  // namespace mere

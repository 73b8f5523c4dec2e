// The CUDA mixture-of-experts ops against the CPU reference on random inputs:
// routing (ids exact, weights to f32 rounding), the experts' decode matvecs
// (f32 arithmetic) and prefill grouped GEMMs (bf16 operands), for dense, FP8
// (128x128 block scales) and MLX affine experts, fused and separate gate/up,
// and skewed routing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "core/device.h"
#include "gpu_test_util.h"
#include "ops/cuda/moe_launchers.h"
#include "ops/ops.h"
#include "ops/quantized_ops.h"
#include "quant/fp8_test_util.h"

namespace mere {
namespace {

using test::gpu;
using test::random;
using test::relative_error;

class MoeOpsGpu : public test::NeedsGpu<> {};

void expect_same_choice(const ops::MoeChoice& got, const ops::MoeChoice& want, const char* label) {
  const Tensor ids = got.ids.to_device(Device::cpu);
  for (int64_t i = 0; i < want.ids.numel(); ++i)
    ASSERT_EQ(ids.data<int32_t>()[i], want.ids.data<int32_t>()[i]) << label << " at " << i;
  EXPECT_LE(relative_error(got.weights, want.weights, label), 1e-5f);
}

TEST_F(MoeOpsGpu, RouteMatchesCpu) {
  const Tensor logits = random({37, 128}, DType::f32, 1, 3.0f);
  const ops::MoeRouting qwen{.top_k = 8, .renormalize = true};
  expect_same_choice(ops::moe_route(gpu(logits), qwen), ops::moe_route(logits, qwen), "route softmax top-8 renorm");
  const ops::MoeRouting deepseek{.score = ops::MoeRouting::Score::sigmoid, .top_k = 8, .renormalize = true,
                                 .scale = 2.5f, .n_groups = 8, .top_groups = 4};
  const Tensor correction = random({128}, DType::f32, 2, 0.5f);
  expect_same_choice(ops::moe_route(gpu(logits), deepseek, gpu(correction)), ops::moe_route(logits, deepseek, correction),
                     "route sigmoid groups 8/4 + correction");
  // Exact ties (logits on a grid: ties go to the lower index), expert counts
  // that leave lanes partly empty or hold many experts a lane, and k up to 32.
  auto on_grid = [](Tensor t, float steps_per_unit) {
    for (int64_t i = 0; i < t.numel(); ++i)
      t.data<float>()[i] = std::round(t.data<float>()[i] * steps_per_unit) / steps_per_unit;
    return t;
  };
  const Tensor tied = on_grid(random({19, 128}, DType::f32, 3, 2.0f), 2);
  expect_same_choice(ops::moe_route(gpu(tied), qwen), ops::moe_route(tied, qwen), "route softmax ties");
  const ops::MoeRouting top32{.top_k = 32};
  expect_same_choice(ops::moe_route(gpu(tied), top32), ops::moe_route(tied, top32), "route softmax top-32 ties");
  const Tensor sixty = random({11, 60}, DType::f32, 4, 3.0f);
  const ops::MoeRouting four{.top_k = 4};
  expect_same_choice(ops::moe_route(gpu(sixty), four), ops::moe_route(sixty, four), "route 60 experts top-4");
  const Tensor wide = on_grid(random({7, 1024}, DType::f32, 5, 3.0f), 4);
  expect_same_choice(ops::moe_route(gpu(wide), qwen), ops::moe_route(wide, qwen), "route 1024 experts ties");
  const Tensor logits256 = random({5, 256}, DType::f32, 6, 3.0f), correction256 = random({256}, DType::f32, 7, 0.5f);
  expect_same_choice(ops::moe_route(gpu(logits256), deepseek, gpu(correction256)),
                     ops::moe_route(logits256, deepseek, correction256), "route 256 experts sigmoid groups 8/4 + correction");
}

// A NaN logit (a model gone wrong upstream) makes every softmax score of its
// token NaN: the ids must still name experts (a NaN is chosen last, ties to
// the lower index), so the experts' kernels read real rows and the NaN reaches
// the output instead of an illegal address. Other tokens route as on the CPU.
TEST_F(MoeOpsGpu, NanLogitsStillNameExperts) {
  const int64_t E = 16;
  Tensor logits = random({2, E}, DType::f32, 170, 2.0f);
  logits.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();  // token 0's expert 3
  for (const ops::MoeRouting& routing :
       {ops::MoeRouting{.top_k = 4, .renormalize = true},
        ops::MoeRouting{.score = ops::MoeRouting::Score::sigmoid, .top_k = 4}}) {
    const ops::MoeChoice got = ops::moe_route(gpu(logits), routing);
    const Tensor ids = got.ids.to_device(Device::cpu);
    for (int64_t i = 0; i < ids.numel(); ++i) {
      EXPECT_GE(ids.data<int32_t>()[i], 0);
      EXPECT_LT(ids.data<int32_t>()[i], E);
    }
    // Sigmoid scores are per expert: only expert 3 is NaN, and it is not chosen.
    if (routing.score == ops::MoeRouting::Score::sigmoid) {
      for (int64_t j = 0; j < 4; ++j) EXPECT_NE(ids.data<int32_t>()[j], 3);
    }
    const ops::MoeChoice want = ops::moe_route(logits.slice_rows(1, 2), routing);
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(ids.data<int32_t>()[4 + j], want.ids.data<int32_t>()[j]);
  }
}

Weight random_affine(int64_t rows, int64_t cols, int bits, int group, uint64_t seed) {
  Tensor packed = Tensor::empty({rows, cols * bits / 32}, DType::u32);
  ops::fill_random_bytes(packed, seed, 0xff);
  AffineWeight a{packed, random({rows, cols / group}, DType::bf16, seed + 1, 0.01f, 0.02f),
                 random({rows, cols / group}, DType::bf16, seed + 2, 0.05f, -0.1f), bits, group};
  return Weight(std::move(a), cols);
}

// E experts [f, d] / [d, f] in `format` ("bf16", "f16", "fp8", "int4", "int8"), gate and up fused or not;
// affine groups of `group` (default: 64 for int4, 32 for int8).
ops::ExpertWeights random_experts(int64_t E, int64_t f, int64_t d, const std::string& format, bool fused,
                                  int group = 0) {
  auto matrix = [&](int64_t rows, int64_t cols, uint64_t seed) {
    if (format == "bf16" || format == "f16")
      return Weight(random({rows, cols}, format == "bf16" ? DType::bf16 : DType::f16, seed, 0.05f));
    if (format == "fp8") return Weight(test::random_fp8(rows, cols, 128, seed));
    const int bits = format == "int4" ? 4 : 8;
    return random_affine(rows, cols, bits, group > 0 ? group : bits == 4 ? 64 : 32, seed);
  };
  ops::ExpertWeights w;
  w.n_experts = E;
  w.d_ff = f;
  w.d_model = d;
  if (fused) w.gate_up = matrix(E * 2 * f, d, 10);
  else {
    w.gate = matrix(E * f, d, 10);
    w.up = matrix(E * f, d, 20);
  }
  w.down = matrix(E * d, f, 30);
  return w;
}

ops::ExpertWeights on_gpu(const ops::ExpertWeights& w) {
  ops::ExpertWeights g = w;
  for (Weight* m : {&g.gate, &g.up, &g.gate_up, &g.down})
    if (m->defined()) *m = m->to_device(Device::cuda);
  return g;
}

ops::MoeChoice on_gpu(const ops::MoeChoice& c) { return {gpu(c.ids), gpu(c.weights)}; }

TEST_F(MoeOpsGpu, ExpertsMatchCpuForDecodeAndPrefill) {
  const int64_t E = 16, f = 128, d = 256, k = 4;
  for (const std::string format : {"bf16", "fp8", "int4", "int8"})
    for (bool fused : {false, true}) {
      const ops::ExpertWeights w = random_experts(E, f, d, format, fused), wg = on_gpu(w);
      for (int64_t T : {1, 3, 8, 9, 150}) {
        const Tensor x = random({T, d}, DType::f32, 40 + uint64_t(T));
        const ops::MoeChoice c = ops::moe_route(random({T, E}, DType::f32, 50, 2.0f), {.top_k = int(k), .renormalize = true});
        const std::string label = format + (fused ? " fused" : "") + " T=" + std::to_string(T);
        // Decode runs f32 arithmetic; prefill rounds x, the activations and dense weights to bf16.
        EXPECT_LE(relative_error(ops::moe_experts(gpu(x), wg, on_gpu(c)), ops::moe_experts(x, w, c), label),
                  T <= 8 ? 1e-4f : 2e-2f);
      }
    }
}

// Decode at shapes whose rows are not a whole round of a warp's 32 chunks (the
// down kernel's slots then start mid-round, where it finds them by an f32
// quotient), every group size (found by shifts), 8 slots. The early fetch of the
// down rows under programmatic launch: LlamaGpu.ProgrammaticLaunchIsBitIdentical.
TEST_F(MoeOpsGpu, DecodeMatchesCpuAtUnevenShapesAndEveryGroupSize) {
  struct Case {
    std::string format;
    int group;
    int64_t f, d;
  };
  const int64_t E = 12, k = 8;
  for (const Case& s : {Case{"int4", 32, 96, 160}, Case{"int4", 64, 192, 320}, Case{"int4", 128, 384, 128},
                        Case{"int8", 32, 160, 96}, Case{"int8", 64, 192, 2048}, Case{"int8", 128, 768, 256},
                        Case{"int4", 64, 768, 2048}, Case{"bf16", 0, 96, 64}, Case{"fp8", 0, 256, 384}})
    for (bool fused : {false, true}) {
      const ops::ExpertWeights w = random_experts(E, s.f, s.d, s.format, fused, s.group), wg = on_gpu(w);
      for (int64_t T : {1, 2, 5}) {
        const Tensor x = random({T, s.d}, DType::f32, 70 + uint64_t(T));
        const ops::MoeChoice c = ops::moe_route(random({T, E}, DType::f32, 80, 2.0f), {.top_k = int(k)});
        const std::string label = s.format + " g" + std::to_string(s.group) + " f=" + std::to_string(s.f) +
                                  " d=" + std::to_string(s.d) + (fused ? " fused" : "") + " T=" + std::to_string(T);
        EXPECT_LE(relative_error(ops::moe_experts(gpu(x), wg, on_gpu(c)), ops::moe_experts(x, w, c), label), 1e-4f);
      }
    }
}

// Lever tensor_core_moe_matvec: the affine experts' decode on the integer tensor
// cores (x and the activations in three s8 digits, 23 bits per group), and the
// FP8 experts' on f16 mmas (x in hi and lo f16, 22 bits a block), against the
// CPU's f32 arithmetic, for every bits / group / scale dtype, fused and
// separate gate/up, k of 1, 2, 4 and 8 slots and 1 to 8 tokens, with tokens
// sharing experts (E = 12 at k = 8). It runs two prepare and two mma kernels;
// k = 3 (not a divisor of the 8 warps) and int4 gate with int8 down fall back
// or mix as they should.
class MoeTensorCoreGpu : public test::NeedsGpuDefaultLaunch {};

TEST_F(MoeTensorCoreGpu, DecodeMatchesCpuForEveryFormatSlotCountAndBatch) {
  struct Case {
    std::string format;
    int group;
    int64_t k, f, d;
    DType scales;
  };
  const int64_t E = 12;
  for (const Case& s : {Case{"int4", 64, 8, 256, 512, DType::bf16}, Case{"int4", 32, 2, 512, 256, DType::f16},
                        Case{"int4", 128, 1, 256, 768, DType::f32}, Case{"int8", 32, 8, 128, 256, DType::bf16},
                        Case{"int8", 64, 4, 384, 512, DType::bf16}, Case{"int8", 128, 8, 256, 1024, DType::f16},
                        Case{"fp8", 128, 8, 256, 512, DType::f32}, Case{"fp8", 128, 2, 384, 256, DType::f32}})
    for (bool fused : {false, true}) {
      ops::ExpertWeights w = random_experts(E, s.f, s.d, s.format, fused, s.group);
      for (Weight* m : {&w.gate, &w.up, &w.gate_up, &w.down}) {
        if (!m->defined() || s.format == "fp8") continue;
        AffineWeight a = m->affine();
        a.scales = a.scales.to(s.scales);
        a.biases = a.biases.to(s.scales);
        *m = Weight(std::move(a), m->cols());
      }
      const ops::ExpertWeights wg = on_gpu(w);
      for (int64_t T : {1, 2, 5, 8}) {
        const Tensor x = random({T, s.d}, DType::f32, 90 + uint64_t(T));
        const ops::MoeChoice c =
            ops::moe_route(random({T, E}, DType::f32, 91, 2.0f), {.top_k = int(s.k), .renormalize = true});
        const std::string label = s.format + " g" + std::to_string(s.group) + " k=" + std::to_string(s.k) +
                                  " f=" + std::to_string(s.f) + " d=" + std::to_string(s.d) + (fused ? " fused" : "") +
                                  " T=" + std::to_string(T);
        ops::set_launch_settings({.tensor_core_moe_matvec = true});
        const Tensor xg = gpu(x);
        const ops::MoeChoice cg = on_gpu(c);
        const auto kernels = test::kernel_launches_by([&] { ops::moe_experts(xg, wg, cg); });
        const Tensor got = ops::moe_experts(xg, wg, cg);
        ops::set_launch_settings({});
        size_t mma = 0;
        for (const auto& k : kernels) mma += k.name.find("matvec_mma_kernel") != std::string::npos;
        EXPECT_EQ(kernels.size(), 4u) << label;
        EXPECT_EQ(mma, 2u) << label;
        EXPECT_LE(relative_error(got, ops::moe_experts(x, w, c), label), 1e-5f);
      }
    }
}

// Lever sixteen_token_experts: steps of 9-16 tokens take the tensor-core affine
// experts (two prepare and two mma kernels, one image a token as at 1-8) within
// the same bound of the CPU's f32 arithmetic; without the lever, and for FP8
// experts, the grouped GEMMs take them. With routing in the experts the choice
// is the routing kernel's bit for bit, and h += the experts adds inside down.
TEST_F(MoeTensorCoreGpu, SixteenTokenExpertsMatchTheCpu) {
  struct Case {
    std::string format;
    int group;
    int64_t k, f, d;
  };
  const int64_t E = 24;
  for (const Case& s : {Case{"int4", 64, 8, 256, 512}, Case{"int8", 32, 2, 384, 256}, Case{"int4", 128, 4, 256, 768},
                        Case{"int8", 64, 8, 128, 512}, Case{"fp8", 128, 8, 256, 512}})
    for (int64_t T : {9, 12, 16}) {
      const ops::ExpertWeights w = random_experts(E, s.f, s.d, s.format, T == 12, s.group), wg = on_gpu(w);
      const Tensor x = random({T, s.d}, DType::f32, 210 + uint64_t(T));
      const Tensor logits = random({T, E}, DType::f32, 211, 2.0f);
      const ops::MoeRouting routing{.top_k = int(s.k), .renormalize = true};
      const Tensor xg = gpu(x), lg = gpu(logits);
      // The routing kernel's choice, which routing inside gate/up reproduces bit for bit.
      const ops::MoeChoice c = ops::moe_route(logits, routing), cg = ops::moe_route(lg, routing);
      const std::string label = s.format + " g" + std::to_string(s.group) + " k=" + std::to_string(s.k) +
                                (T == 12 ? " fused" : "") + " T=" + std::to_string(T);
      auto mma_kernels = [&](const ops::LaunchSettings& settings) {
        ops::set_launch_settings(settings);
        size_t mma = 0;
        for (const auto& kernel : test::kernel_launches_by([&] { ops::moe_experts(xg, wg, cg); }))
          mma += kernel.name.find("matvec_mma_kernel") != std::string::npos;
        ops::set_launch_settings({});
        return mma;
      };
      const bool affine = s.format != "fp8";
      EXPECT_EQ(mma_kernels({.tensor_core_moe_matvec = true}), 0u) << label << ": the lever is off";
      EXPECT_EQ(mma_kernels({.sixteen_token_experts = true, .tensor_core_moe_matvec = true}), affine ? 2u : 0u)
          << label;
      ops::set_launch_settings({.sixteen_token_experts = true, .tensor_core_moe_matvec = true});
      const Tensor got = ops::moe_experts(xg, wg, cg);
      ops::set_launch_settings({});
      EXPECT_LE(relative_error(got, ops::moe_experts(x, w, c), label), affine ? 1e-5f : 2e-2f);
      if (!affine) continue;
      // Routing inside gate/up, and down adding into h.
      const Tensor h0 = random({T, s.d}, DType::f32, 212, 3.0f);
      Tensor want = gpu(h0), added = gpu(h0);
      ops::set_launch_settings({.sixteen_token_experts = true, .tensor_core_moe_matvec = true});
      ops::add_inplace(want, ops::moe_experts(xg, wg, cg));
      ops::set_launch_settings({.sixteen_token_experts = true, .tensor_core_moe_matvec = true,
                                .routing_in_experts = true});
      const Tensor routed = ops::moe_routed_experts(xg, wg, lg, routing).to_device(Device::cpu);
      ops::moe_routed_experts_add(added, xg, wg, lg, routing);
      ops::set_launch_settings({});
      EXPECT_EQ(test::max_abs_diff(routed, got.to_device(Device::cpu)).diff, 0.0f) << label << ": routed";
      EXPECT_EQ(test::max_abs_diff(added.to_device(Device::cpu), want.to_device(Device::cpu)).diff, 0.0f)
          << label << ": added";
    }
}

// Lever streamed_weights on the experts' modes of the same kernel: the same
// bits with the lever on and off (int4 and int8, one token and eight).
TEST_F(MoeTensorCoreGpu, StreamedWeightsGiveTheSameBits) {
  const int64_t E = 12, f = 256, d = 512, k = 8;
  for (const std::string format : {"int4", "int8"})
    for (int64_t T : {1, 8}) {
      const ops::ExpertWeights wg = on_gpu(random_experts(E, f, d, format, false));
      const Tensor xg = gpu(random({T, d}, DType::f32, 97 + uint64_t(T)));
      const ops::MoeChoice cg = on_gpu(ops::moe_route(random({T, E}, DType::f32, 98, 2.0f), {.top_k = int(k)}));
      ops::set_launch_settings({.tensor_core_moe_matvec = true});
      const Tensor normal = ops::moe_experts(xg, wg, cg).to_device(Device::cpu);
      ops::set_launch_settings({.tensor_core_moe_matvec = true, .streamed_weights = true});
      const Tensor streamed = ops::moe_experts(xg, wg, cg).to_device(Device::cpu);
      ops::set_launch_settings({});
      EXPECT_EQ(std::memcmp(streamed.raw(), normal.raw(), normal.size_bytes()), 0) << format << " T=" << T;
    }
}

TEST_F(MoeTensorCoreGpu, FallsBackWhereItCannotRunAndMixesFormats) {
  const int64_t E = 12, f = 256, d = 512, T = 3;
  const Tensor x = random({T, d}, DType::f32, 95);
  // k = 3 slots: not a divisor of the block's 8 warps, so the CUDA-core kernels run.
  {
    const ops::ExpertWeights w = random_experts(E, f, d, "int4", false), wg = on_gpu(w);
    const ops::MoeChoice c = ops::moe_route(random({T, E}, DType::f32, 96, 2.0f), {.top_k = 3}), cg = on_gpu(c);
    const Tensor xg = gpu(x);
    ops::set_launch_settings({.tensor_core_moe_matvec = true});
    const auto kernels = test::kernel_launches_by([&] { ops::moe_experts(xg, wg, cg); });
    const Tensor got = ops::moe_experts(xg, wg, cg);
    ops::set_launch_settings({});
    for (const auto& k : kernels) EXPECT_EQ(k.name.find("mma"), std::string::npos) << k.name;
    EXPECT_LE(relative_error(got, ops::moe_experts(x, w, c), "k=3 falls back"), 1e-4f);
  }
  // int4 gate/up with int8 down (MLX per-layer overrides): each half in its own format.
  {
    ops::ExpertWeights w = random_experts(E, f, d, "int4", false);
    w.down = random_experts(E, f, d, "int8", false).down;
    const ops::ExpertWeights wg = on_gpu(w);
    const ops::MoeChoice c = ops::moe_route(random({T, E}, DType::f32, 97, 2.0f), {.top_k = 8});
    ops::set_launch_settings({.tensor_core_moe_matvec = true});
    const Tensor got = ops::moe_experts(gpu(x), wg, on_gpu(c));
    ops::set_launch_settings({});
    EXPECT_LE(relative_error(got, ops::moe_experts(x, w, c), "int4 gate/up, int8 down"), 1e-5f);
  }
}

// Lever routing_in_experts: the tensor-core experts' (affine and FP8) gate/up blocks route
// each token themselves with the routing kernel's code, so the output is the
// lever off's bit for bit, with the routing kernel gone. Softmax with and
// without renormalising, sigmoid scores with a correction and a scale, in
// groups (DeepSeek-V3's form) or not, E of 12 to 256, k of 1 to 8, 1 to 8
// tokens. The logits are multiples of 1/4, so that exact ties (to the lower
// index) occur and the CPU's and GPU's expf cannot order a near-tie
// differently. Without groups and with E a multiple of 32 up to 128 each warp
// routes alone, ranking only the experts at or above a bound: all of them
// where a token's logits all tie (token 0 of the `flat` cases).
TEST_F(MoeTensorCoreGpu, RoutingInExpertsGivesTheRoutingKernelsChoiceBitForBit) {
  struct Case {
    std::string format;
    int group;
    int64_t E, f, d;
    ops::MoeRouting routing;
    bool correction;
    bool flat = false;
  };
  const ops::MoeRouting deepseek{.score = ops::MoeRouting::Score::sigmoid, .top_k = 4, .renormalize = true,
                                 .scale = 2.5f, .n_groups = 8, .top_groups = 4};
  for (const Case& s : {Case{"int4", 64, 128, 256, 512, {.top_k = 8, .renormalize = true}, false},
                        Case{"int8", 32, 12, 128, 256, {.top_k = 2}, false},
                        Case{"int4", 32, 256, 256, 256, deepseek, true},
                        Case{"int8", 128, 128, 256, 512, {.top_k = 1}, false},
                        Case{"int4", 64, 128, 256, 512, {.top_k = 8, .renormalize = true}, false, true},
                        Case{"int8", 64, 64, 256, 512,
                             {.score = ops::MoeRouting::Score::sigmoid, .top_k = 4, .scale = 1.5f}, true, true},
                        Case{"int4", 32, 32, 256, 512, {.top_k = 4, .renormalize = true}, false},
                        Case{"fp8", 128, 128, 256, 512, {.top_k = 8, .renormalize = true}, false},
                        Case{"fp8", 128, 256, 256, 256, deepseek, true},
                        Case{"fp8", 128, 64, 384, 256, {.top_k = 2}, false, true}})
    for (bool fused : {false, true}) {
      const ops::ExpertWeights w = random_experts(s.E, s.f, s.d, s.format, fused, s.group), wg = on_gpu(w);
      const Tensor correction = s.correction ? random({s.E}, DType::f32, 140, 0.5f) : Tensor();
      const Tensor correction_gpu = s.correction ? gpu(correction) : Tensor();
      for (int64_t T : {1, 3, 8}) {
        const Tensor x = random({T, s.d}, DType::f32, 141 + uint64_t(T));
        Tensor logits = random({T, s.E}, DType::f32, 150 + uint64_t(T), 2.0f);
        for (int64_t i = 0; i < logits.numel(); ++i) logits.data<float>()[i] = std::round(logits.at(i) * 4) / 4;
        if (s.flat)
          for (int64_t e = 0; e < s.E; ++e) logits.data<float>()[e] = 0.5f;
        const std::string label = s.format + " E=" + std::to_string(s.E) + " k=" + std::to_string(s.routing.top_k) +
                                  (s.correction ? " sigmoid, correction" : "") +
                                  (s.routing.n_groups > 1 ? " groups" : "") + (s.flat ? " flat" : "") +
                                  (fused ? " fused" : "") +
                                  " T=" + std::to_string(T);
        const Tensor xg = gpu(x), lg = gpu(logits);
        auto run = [&] { return ops::moe_routed_experts(xg, wg, lg, s.routing, correction_gpu); };
        auto routing_kernels = [](const std::vector<test::KernelLaunch>& launches) {
          size_t n = 0;
          for (const auto& k : launches) n += k.name.find("moe_route") != std::string::npos;
          return n;
        };
        ops::set_launch_settings({.tensor_core_moe_matvec = true});
        const auto kernels_off = test::kernel_launches_by(run);
        const Tensor off = run().to_device(Device::cpu);
        ops::set_launch_settings({.tensor_core_moe_matvec = true, .routing_in_experts = true});
        const auto kernels_on = test::kernel_launches_by(run);
        const Tensor on = run().to_device(Device::cpu);
        ops::set_launch_settings({});
        EXPECT_EQ(test::max_abs_diff(on, off).diff, 0.0f) << label;
        EXPECT_EQ(kernels_off.size(), 5u) << label;  // routing, then the tensor-core experts' four
        EXPECT_EQ(routing_kernels(kernels_off), 1u) << label;
        EXPECT_EQ(routing_kernels(kernels_on), 0u) << label;
        EXPECT_EQ(kernels_on.size() + 1, kernels_off.size()) << label;
        // The kernel of warps that route alone, where the routing allows it.
        const cuda::MoeRouteArgs route{.E = int(s.E), .k = s.routing.top_k, .n_groups = s.routing.n_groups};
        EXPECT_EQ(cuda::routes_in_a_warp(route), s.routing.n_groups == 1 && s.E % 32 == 0 && s.E <= 128) << label;
        const Tensor want = ops::moe_routed_experts(x, w, logits, s.routing, correction);
        EXPECT_LE(relative_error(on, want, label), 1e-5f);
      }
    }
}

// Lever deep_moe_ring: one token of int8 experts runs gate/up and down with
// five ring stages a warp instead of three (their own kernels). The arithmetic
// is the same, but the deeper ring leaves gate/up one block an SM, where
// split-K gives a tile more warps (4 instead of 2 at these shapes, g32 and
// g64), whose partial sums then meet in another grouping: the output moves by
// f32 rounding only, and stays as close to the CPU's. Qwen3-30B-A3B's expert
// rows (d 2048, d_ff 768, k 8; fewer experts) at every int8 group size,
// routing in the experts or not; 2 tokens and int4 keep three stages and the
// same bits, as does the lever off.
TEST_F(MoeTensorCoreGpu, DeepRingAtOneTokenOfInt8ExpertsMovesOnlyTheRounding) {
  const int64_t E = 16, f = 768, d = 2048, k = 8;
  for (const std::string format : {"int8", "int4"})
    for (int group : {32, 64, 128}) {
      const ops::ExpertWeights w = random_experts(E, f, d, format, false, group), wg = on_gpu(w);
      for (int64_t T : {1, 2})
        for (bool in_experts : {false, true}) {
          const std::string label = format + " g" + std::to_string(group) + " T=" + std::to_string(T) +
                                    (in_experts ? " routing in the experts" : "");
          const Tensor x = random({T, d}, DType::f32, 190 + uint64_t(T));
          const Tensor logits = random({T, E}, DType::f32, 191 + uint64_t(T), 2.0f);
          const Tensor xg = gpu(x), lg = gpu(logits);
          const ops::MoeRouting routing{.top_k = int(k), .renormalize = true};
          auto run = [&] { return ops::moe_routed_experts(xg, wg, lg, routing); };
          // The stages each matvec takes, as the launcher decides them.
          cuda::MoeExpertsArgs args;
          for (cuda::ExpertMatrix* m : {&args.gate, &args.up, &args.down})
            *m = {.dtype = DType::bf16, .bits = format == "int8" ? 8 : 4, .group_size = group};
          args.T = T, args.k = k, args.n_experts = E, args.d_model = d, args.d_ff = f;
          auto launches = [&](bool deep) {
            ops::set_launch_settings(
                {.tensor_core_moe_matvec = true, .routing_in_experts = in_experts, .deep_moe_ring = deep});
            std::vector<std::string> names;
            for (const auto& launch : test::kernel_launches_by(run)) names.push_back(launch.name);
            return names;
          };
          const auto names_off = launches(false);
          const cuda::MoeRingStages stages_off = cuda::moe_experts_mma_ring_stages(args);
          const Tensor off = run().to_device(Device::cpu);
          const auto names_on = launches(true);
          const cuda::MoeRingStages stages_on = cuda::moe_experts_mma_ring_stages(args);
          const Tensor on = run().to_device(Device::cpu);
          ops::set_launch_settings({});
          const int want = format == "int8" && T == 1 ? 5 : 3;
          EXPECT_EQ(stages_off.gate_up, 3) << label;
          EXPECT_EQ(stages_off.down, 3) << label;
          EXPECT_EQ(stages_on.gate_up, want) << label;
          EXPECT_EQ(stages_on.down, want) << label;
          // The deeper ring is its own kernel: gate/up's and down's names change, the prepares' do not.
          ASSERT_EQ(names_on.size(), names_off.size()) << label;
          size_t changed = 0;
          for (size_t i = 0; i < names_on.size(); ++i) changed += names_on[i] != names_off[i];
          EXPECT_EQ(changed, want == 5 ? 2u : 0u) << label;
          if (want == 3) {
            EXPECT_EQ(test::max_abs_diff(on, off).diff, 0.0f) << label;
          }
          EXPECT_LE(relative_error(on, off, label + ", deep ring against three stages"), 1e-5f);
          const Tensor cpu = ops::moe_routed_experts(x, w, logits, routing);
          EXPECT_LE(relative_error(off, cpu, label + ", three stages against the CPU"), 1e-4f);
          EXPECT_LE(relative_error(on, cpu, label + ", deep ring against the CPU"), 1e-4f);
        }
    }
}

// Lever int4_byte_codes on the experts: int4 g64 and g128 stacks take the stored
// bytes at every batch (one image a token), their two prepares and two matvecs
// their own kernels; g32 keeps the unpacked codes, the same kernels and bits.
// Within 1e-5 of the lever off, routing in the experts or not, adding into the
// residual, or normalizing it first, and within 1e-4 of the CPU; x's token 0
// beyond f16's range, token 1 each group at its own scale down to 1e-7.
TEST_F(MoeTensorCoreGpu, Int4ByteCodesMoveOnlyTheRounding) {
  const int64_t E = 16, f = 768, d = 2048, k = 8;
  const Weight router = random_affine(E, d, 4, 64, 289).to_device(Device::cuda);
  const Tensor norm_w = gpu(random({d}, DType::bf16, 288, 0.5f, 1.0f));
  for (int group : {32, 64, 128}) {
    const ops::ExpertWeights w = random_experts(E, f, d, "int4", group != 64, group), wg = on_gpu(w);
    for (int64_t T : {1, 2, 5})
      for (bool in_experts : {false, true}) {
        const std::string label = "int4 g" + std::to_string(group) + " T=" + std::to_string(T) +
                                  (in_experts ? " routing in the experts" : "");
        Tensor x = random({T, d}, DType::f32, 290 + uint64_t(T), 3.0f);
        if (T > 1)
          for (int64_t i = 0; i < d; ++i) {
            x.data<float>()[i] *= 1e5f;
            x.data<float>()[d + i] *= float(1 << ((i / group) % 24)) * 1e-7f;
          }
        const Tensor logits = random({T, E}, DType::f32, 291 + uint64_t(T), 2.0f);
        const Tensor h = random({T, d}, DType::f32, 292 + uint64_t(T));
        const Tensor xg = gpu(x), lg = gpu(logits);
        const ops::MoeRouting routing{.top_k = int(k), .renormalize = true};
        auto run = [&] { return ops::moe_routed_experts(xg, wg, lg, routing); };
        struct Run {
          std::vector<std::string> names;
          Tensor y, added, normed;
        };
        auto run_with = [&](bool bytes) {
          ops::set_launch_settings(
              {.tensor_core_moe_matvec = true, .routing_in_experts = in_experts, .int4_byte_codes = bytes});
          Run r;
          for (const auto& launch : test::kernel_launches_by(run)) r.names.push_back(launch.name);
          r.y = run().to_device(Device::cpu);
          Tensor added = gpu(h), normed = gpu(h);
          ops::moe_routed_experts_add(added, xg, wg, lg, routing);
          r.added = added.to_device(Device::cpu);
          ops::moe_normed_experts_add(normed, norm_w, 1e-6f, router, wg, routing);
          r.normed = normed.to_device(Device::cpu);
          ops::set_launch_settings({});
          return r;
        };
        const Run off = run_with(false), on = run_with(true);
        ASSERT_EQ(on.names.size(), off.names.size()) << label;
        size_t changed = 0;
        for (size_t i = 0; i < on.names.size(); ++i) changed += on.names[i] != off.names[i];
        EXPECT_EQ(changed, group >= 64 ? 4u : 0u) << label << ": two prepares and two matvecs";
        if (group < 64) {
          EXPECT_EQ(test::max_abs_diff(on.y, off.y).diff, 0.0f) << label;
        }
        EXPECT_LE(relative_error(on.y, off.y, label + ", bytes against digits"), 1e-5f);
        EXPECT_LE(relative_error(on.added, off.added, label + ", added, bytes against digits"), 1e-5f);
        EXPECT_LE(relative_error(on.normed, off.normed, label + ", normed, bytes against digits"), 1e-5f);
        for (int64_t t = 0; t < T; ++t)
          EXPECT_LE(relative_error(on.y.slice_rows(t, t + 1), off.y.slice_rows(t, t + 1),
                                   label + ", token " + std::to_string(t)),
                    1e-5f);
        EXPECT_LE(relative_error(on.y, ops::moe_routed_experts(x, w, logits, routing), label + ", bytes against the CPU"),
                  1e-4f);
      }
  }
}

// Where the experts cannot route (k = 3, affine or FP8, on the CUDA-core
// kernels), the lever leaves the routing kernel in place, with the same results.
TEST_F(MoeTensorCoreGpu, RoutingInExpertsFallsBackToTheRoutingKernel) {
  const int64_t E = 16, f = 256, d = 512, T = 2;
  const Tensor x = random({T, d}, DType::f32, 160), logits = random({T, E}, DType::f32, 161, 2.0f);
  for (const auto& [format, k] : {std::pair<std::string, int>{"fp8", 3}, {"int4", 3}}) {
    const ops::ExpertWeights w = random_experts(E, f, d, format, false), wg = on_gpu(w);
    const Tensor xg = gpu(x), lg = gpu(logits);
    const ops::MoeRouting routing{.top_k = k, .renormalize = true};
    auto run = [&] { return ops::moe_routed_experts(xg, wg, lg, routing); };
    ops::set_launch_settings({.tensor_core_moe_matvec = true});
    const Tensor off = run().to_device(Device::cpu);
    ops::set_launch_settings({.tensor_core_moe_matvec = true, .routing_in_experts = true});
    const auto kernels = test::kernel_launches_by(run);
    const Tensor on = run().to_device(Device::cpu);
    ops::set_launch_settings({});
    size_t routing_kernels = 0;
    for (const auto& kernel : kernels) routing_kernels += kernel.name.find("moe_route") != std::string::npos;
    EXPECT_EQ(routing_kernels, 1u) << format;
    EXPECT_EQ(test::max_abs_diff(on, off).diff, 0.0f) << format;
    EXPECT_LE(relative_error(on, ops::moe_routed_experts(x, w, logits, routing), format), 1e-4f);
  }
}

// h += the experts: the tensor-core affine experts' down adds into h itself, the
// same bits as the output added by a kernel after it, one launch fewer; where
// they do not run (FP8 experts, k = 3) the add kernel follows, as before.
TEST_F(MoeTensorCoreGpu, ExpertsAddIntoTheResidualWithTheSameBits) {
  const int64_t E = 16, f = 256, d = 512;
  for (const auto& [format, k] : {std::pair<std::string, int>{"int4", 8}, {"int8", 2}, {"fp8", 4}, {"int4", 3}})
    for (int64_t T : {1, 5}) {
      const ops::ExpertWeights wg = on_gpu(random_experts(E, f, d, format, false));
      const Tensor x = gpu(random({T, d}, DType::f32, 180 + uint64_t(T)));
      const Tensor logits = gpu(random({T, E}, DType::f32, 181, 2.0f));
      const Tensor h0 = random({T, d}, DType::f32, 182, 3.0f);
      const ops::MoeRouting routing{.top_k = k, .renormalize = true};
      const std::string label = format + " k=" + std::to_string(k) + " T=" + std::to_string(T);
      ops::set_launch_settings({.tensor_core_moe_matvec = true, .routing_in_experts = true});
      Tensor want = gpu(h0), got = gpu(h0), captured = gpu(h0);  // (no copies inside a capture)
      const auto add_after = test::kernel_launches_by(
          [&] { ops::add_inplace(captured, ops::moe_routed_experts(x, wg, logits, routing)); });
      const auto add_inside =
          test::kernel_launches_by([&] { ops::moe_routed_experts_add(captured, x, wg, logits, routing); });
      ops::add_inplace(want, ops::moe_routed_experts(x, wg, logits, routing));
      ops::moe_routed_experts_add(got, x, wg, logits, routing);
      ops::set_launch_settings({});
      EXPECT_EQ(test::max_abs_diff(got.to_device(Device::cpu), want.to_device(Device::cpu)).diff, 0.0f) << label;
      const bool tensor_cores = format != "fp8" && k != 3;
      EXPECT_EQ(add_inside.size() + (tensor_cores ? 1 : 0), add_after.size()) << label;
    }
}

// The experts from h itself (lever fused_norm_matvec's form): the router's
// matvec and the experts' first kernel each normalize h, one launch fewer than
// rms_norm, the router and the experts, with the composition's values (the
// sums in another order): the router's CUDA-core matvec at one token, its
// tensor-core prepare kernel at 2-4. A dense router, FP8 experts, k = 3 and
// 5 tokens on the tensor cores compose the steps; so does the CPU.
TEST_F(MoeTensorCoreGpu, ExpertsNormalizeTheResidualThemselves) {
  const int64_t E = 16, f = 256, d = 512;
  const float eps = 1e-6f;
  for (const auto& [format, k] : {std::pair<std::string, int>{"int4", 8}, {"int8", 2}, {"fp8", 4}, {"int4", 3}})
    for (const std::string router_format : {"int4", "int8", "bf16"})
      for (int64_t T : {1, 4, 5}) {
        const ops::ExpertWeights w = random_experts(E, f, d, format, false), wg = on_gpu(w);
        const Weight router = router_format == "bf16" ? Weight(random({E, d}, DType::bf16, 190, 0.05f))
                                                      : random_affine(E, d, router_format == "int4" ? 4 : 8, 64, 191);
        const Weight router_g = router.to_device(Device::cuda);
        const Tensor h0 = random({T, d}, DType::f32, 192 + uint64_t(T), 3.0f);
        const Tensor norm_w = random({d}, DType::bf16, 193, 0.5f, 1.0f);
        const ops::MoeRouting routing{.top_k = k, .renormalize = true};
        for (bool in_experts : {true, false}) {
          const std::string label = format + " k=" + std::to_string(k) + " router " + router_format +
                                    " T=" + std::to_string(T) + (in_experts ? " routing in experts" : "");
          // 4 and 5 tokens of the router take the tensor cores where that lever is on.
          ops::set_launch_settings({.tensor_core_affine_matvec = T > 1, .tensor_core_moe_matvec = true,
                                    .routing_in_experts = in_experts});
          const bool router_on_tensor_cores =
              router_format != "bf16" && ops::cuda::affine_linear_on_tensor_cores(router_g.affine(), d, T);
          const Tensor norm_g = gpu(norm_w);
          Tensor want = gpu(h0), got = gpu(h0), captured = gpu(h0);  // (no copies inside a capture)
          const auto composed = test::kernel_launches_by([&] {
            const Tensor x = ops::rms_norm(captured, norm_g, eps);
            ops::moe_routed_experts_add(captured, x, wg, ops::linear(x, router_g), routing);
          });
          const auto fused = test::kernel_launches_by(
              [&] { ops::moe_normed_experts_add(captured, norm_g, eps, router_g, wg, routing); });
          const Tensor x = ops::rms_norm(want, norm_g, eps);
          ops::moe_routed_experts_add(want, x, wg, ops::linear(x, router_g), routing);
          ops::moe_normed_experts_add(got, norm_g, eps, router_g, wg, routing);
          ops::set_launch_settings({});
          EXPECT_LE(relative_error(got.to_device(Device::cpu), want.to_device(Device::cpu), label), 1e-5f);
          EXPECT_EQ(router_on_tensor_cores, T > 1 && router_format != "bf16") << label;
          const bool folds = format != "fp8" && k != 3 && router_format != "bf16" && T <= 4;
          EXPECT_EQ(fused.size() + (folds ? 1 : 0), composed.size()) << label;
          if (T == 1 && in_experts) {  // the CPU composes the same steps
            Tensor on_cpu = h0.clone();
            ops::moe_normed_experts_add(on_cpu, norm_w, eps, router, w, routing);
            EXPECT_LE(relative_error(got.to_device(Device::cpu), on_cpu, label + " vs CPU"), 1e-4f);
          }
        }
      }
}

// FP8 experts whose rows are not whole 128-row scale blocks (d_ff 96): a clear
// error naming the experts and the rule, not wrong rows, separate or fused.
TEST_F(MoeOpsGpu, Fp8ExpertsOffTheScaleBlocksAreRefused) {
  const int64_t E = 4, f = 96, d = 256;
  const Tensor x = gpu(random({1, d}, DType::f32, 130));
  const ops::MoeChoice c = on_gpu(ops::moe_route(random({1, E}, DType::f32, 131, 2.0f), {.top_k = 2}));
  for (bool fused : {false, true}) {
    const ops::ExpertWeights w = on_gpu(random_experts(E, f, d, "fp8", fused));
    try {
      ops::moe_experts(x, w, c);
      ADD_FAILURE() << "fp8 experts of 96 rows ran" << (fused ? " (fused)" : "");
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("gate experts"), std::string::npos) << what;
      EXPECT_NE(what.find("96 rows an expert"), std::string::npos) << what;
      EXPECT_NE(what.find("whole blocks"), std::string::npos) << what;
    }
  }
}

TEST_F(MoeOpsGpu, SkewedRoutingAllTokensToOneExpertLeavesOthersEmpty) {
  const int64_t E = 8, f = 64, d = 64, T = 200;  // 200 rows: four row tiles of one expert, seven empty experts
  const ops::ExpertWeights w = random_experts(E, f, d, "bf16", false);
  ops::MoeChoice c{Tensor::empty({T, 2}, DType::i32), Tensor::empty({T, 2}, DType::f32)};
  for (int64_t t = 0; t < T; ++t) {
    c.ids.data<int32_t>()[2 * t] = 5;
    c.ids.data<int32_t>()[2 * t + 1] = t % 3 == 0 ? 7 : 5 - 1;  // a second slot so pairs interleave
    c.weights.data<float>()[2 * t] = 0.75f;
    c.weights.data<float>()[2 * t + 1] = 0.25f;
  }
  const Tensor x = random({T, d}, DType::f32, 60);
  EXPECT_LE(relative_error(ops::moe_experts(gpu(x), on_gpu(w), on_gpu(c)), ops::moe_experts(x, w, c),
                           "skewed: 200 tokens to expert 5"), 2e-2f);
}

// The grouped affine GEMM (levers tensor_core_affine_moe_gemm and
// tensor_core_dense_moe_gemm) against the WMMA grouped GEMM it replaces. Both
// round x, the weights and the activations to bf16 and sum in f32, so only the
// order of the sums moves: within 1e-3 of the lever off, and of the CPU as the
// prefill test above. Token tiles of 32, 64 and 128 pairs come from 17, 150 and
// 600 tokens (k = 4 of 16 experts; at 600 an expert has several tiles).
class MoeAffineGemmGpu : public test::NeedsGpuDefaultLaunch {};

struct GroupedCase {
  std::string format;
  int group;
  int64_t E, f, d, k;
  bool fused, skewed;
  std::vector<int64_t> tokens;
};

// Runs case c with `lever` of the launch settings off and on: the lever's
// kernels in place of the WMMA GEMM's, within 1e-3 of it and 2e-2 of the CPU;
// and with grouped_swiglu_epilogue too: one launch fewer, the same bits.
void expect_grouped_gemm_matches_the_wmma_gemm(const GroupedCase& c, bool ops::LaunchSettings::*lever) {
  const ops::ExpertWeights w = random_experts(c.E, c.f, c.d, c.format, c.fused, c.group), wg = on_gpu(w);
  for (int64_t T : c.tokens) {
    const std::string label = c.format + " g" + std::to_string(c.group) + (c.fused ? " fused" : "") +
                              (c.skewed ? " skewed" : "") + " E=" + std::to_string(c.E) + " k=" +
                              std::to_string(c.k) + " T=" + std::to_string(T);
    const Tensor x = random({T, c.d}, DType::f32, 700 + uint64_t(T));
    ops::MoeChoice choice;
    if (c.skewed) {  // every token on expert 5 and on 4 or 7: the five others empty
      choice = {Tensor::empty({T, c.k}, DType::i32), Tensor::empty({T, c.k}, DType::f32)};
      for (int64_t t = 0; t < T; ++t) {
        choice.ids.data<int32_t>()[c.k * t] = 5, choice.ids.data<int32_t>()[c.k * t + 1] = t % 3 == 0 ? 7 : 4;
        choice.weights.data<float>()[c.k * t] = 0.75f, choice.weights.data<float>()[c.k * t + 1] = 0.25f;
      }
    } else {
      choice = ops::moe_route(random({T, c.E}, DType::f32, 701 + uint64_t(T), 2.0f),
                              {.top_k = int(c.k), .renormalize = true});
    }
    const Tensor xg = gpu(x);
    const ops::MoeChoice cg = on_gpu(choice);
    auto run_with = [&](bool grouped, bool swiglu_epilogue = false) {
      ops::LaunchSettings settings;
      settings.*lever = grouped;
      settings.grouped_swiglu_epilogue = swiglu_epilogue;
      ops::set_launch_settings(settings);
      std::vector<std::string> names;
      for (const auto& launch : test::kernel_launches_by([&] { ops::moe_experts(xg, wg, cg); }))
        names.push_back(launch.name);
      const Tensor y = ops::moe_experts(xg, wg, cg).to_device(Device::cpu);
      ops::set_launch_settings({});
      return std::pair{names, y};
    };
    auto launched = [](const std::vector<std::string>& names, const char* kernel) {
      int n = 0;
      for (const std::string& name : names) n += name.find(kernel) != std::string::npos;
      return n;
    };
    const auto [off_names, off] = run_with(false);
    const auto [on_names, on] = run_with(true);
    EXPECT_EQ(launched(off_names, "moe_grouped_gemm"), 2) << label;
    EXPECT_EQ(launched(on_names, "moe_grouped_gemm"), 0) << label;
    EXPECT_EQ(launched(on_names, "affine_gemm_kernel"), 3) << label << ": gate, up, down";
    EXPECT_EQ(launched(on_names, "affine_grouped_input_kernel"), 1) << label;
    EXPECT_EQ(launched(on_names, "affine_grouped_swiglu_kernel"), 1) << label;
    EXPECT_LE(relative_error(on, off, label + ", grouped affine against WMMA"), 1e-3f);
    // Lever grouped_swiglu_epilogue: gate and up in one launch, the same sums, so the same bits.
    const auto [fused_names, fused] = run_with(true, true);
    EXPECT_EQ(launched(fused_names, "affine_gemm_kernel"), 2) << label << ": gate/up with SwiGLU, down";
    EXPECT_EQ(launched(fused_names, "affine_grouped_swiglu_kernel"), 0) << label;
    EXPECT_EQ(test::max_abs_diff(fused, on).diff, 0.0f) << label << ", SwiGLU in the gate/up epilogue";
    EXPECT_LE(relative_error(on, ops::moe_experts(x, w, choice), label + ", grouped affine against the CPU"), 2e-2f);
  }
}

// Experts in `format` that the grouped affine GEMM does not take keep the WMMA
// GEMM under `settings`, with the same bits as without them (150 tokens, k = 4
// of 16 experts of 128 x 256, random inputs from `seed`).
void expect_the_wmma_gemm_kept(const std::string& format, const ops::LaunchSettings& settings, uint64_t seed) {
  const ops::ExpertWeights w = random_experts(16, 128, 256, format, false), wg = on_gpu(w);
  const Tensor x = gpu(random({150, 256}, DType::f32, seed));
  const ops::MoeChoice choice = on_gpu(ops::moe_route(random({150, 16}, DType::f32, seed + 1, 2.0f), {.top_k = 4}));
  const Tensor off = ops::moe_experts(x, wg, choice).to_device(Device::cpu);
  ops::set_launch_settings(settings);
  EXPECT_EQ(test::launch_named([&] { ops::moe_experts(x, wg, choice); }, {"moe_grouped_gemm"}).name.empty(), false);
  const Tensor on = ops::moe_experts(x, wg, choice).to_device(Device::cpu);
  ops::set_launch_settings({});
  EXPECT_EQ(test::max_abs_diff(on, off).diff, 0.0f) << format << " experts";
}

// Lever tensor_core_affine_moe_gemm: MLX affine experts, the weights formed in
// registers from their codes. int4 and int8 in groups of 32, 64 and 128, fused
// and separate gate/up, every token on two experts (five of eight experts
// empty, one with 4 tiles), and a wider shape (32 experts of 256 x 512, k = 8).
// bf16 experts keep the WMMA GEMM, bit for bit.
TEST_F(MoeAffineGemmGpu, GroupedAffineGemmMatchesTheWmmaGemm) {
  const std::vector<GroupedCase> cases = {
      {"int4", 64, 16, 128, 256, 4, false, false, {17, 150, 600}},
      {"int4", 32, 16, 128, 256, 4, true, false, {150}},
      {"int4", 128, 16, 128, 256, 4, false, false, {150}},
      {"int8", 32, 16, 128, 256, 4, false, false, {17, 150, 600}},
      {"int8", 64, 16, 128, 256, 4, true, false, {150}},
      {"int8", 128, 16, 128, 256, 4, false, false, {150}},
      {"int4", 64, 8, 64, 128, 2, false, true, {200}},
      {"int4", 64, 32, 256, 512, 8, false, false, {40, 300}},
  };
  for (const GroupedCase& c : cases)
    expect_grouped_gemm_matches_the_wmma_gemm(c, &ops::LaunchSettings::tensor_core_affine_moe_gemm);
  expect_the_wmma_gemm_kept("bf16", {.tensor_core_affine_moe_gemm = true}, 720);
}

// Lever tensor_core_dense_moe_gemm: bf16 experts (rows by ldmatrix from the
// 128-byte swizzle) and FP8 ones (each value times its 128 x 128 block's scale,
// rounded once to bf16, as the WMMA GEMM stages it), fused and separate gate/up,
// every token on two experts, and 32 experts of 256 x 512 (k = 8): H100,
// bit-identical to the WMMA GEMM (x is not permuted, so the sums run in its
// order), 2.2e-3 to 5.1e-3 of the CPU. f16 experts keep the WMMA GEMM, bit for bit.
TEST_F(MoeAffineGemmGpu, GroupedGemmTakesBf16AndFp8Experts) {
  const std::vector<GroupedCase> cases = {
      {"bf16", 0, 16, 128, 256, 4, false, false, {17, 150, 600}},
      {"bf16", 0, 16, 128, 256, 4, true, false, {150}},
      {"fp8", 0, 16, 128, 256, 4, false, false, {17, 150, 600}},
      {"fp8", 0, 16, 128, 256, 4, true, false, {150}},
      {"bf16", 0, 8, 64, 128, 2, false, true, {200}},
      {"fp8", 0, 32, 256, 512, 8, false, false, {40, 300}},
  };
  for (const GroupedCase& c : cases)
    expect_grouped_gemm_matches_the_wmma_gemm(c, &ops::LaunchSettings::tensor_core_dense_moe_gemm);
  expect_the_wmma_gemm_kept("f16", {.tensor_core_affine_moe_gemm = true, .tensor_core_dense_moe_gemm = true}, 730);
}

TEST_F(MoeOpsGpu, AddGatedMatchesCpu) {
  Tensor out = random({5, 64}, DType::f32, 70), y = random({5, 64}, DType::f32, 71), g = random({5, 1}, DType::f32, 72, 3.0f);
  Tensor out_gpu = gpu(out);
  ops::add_gated(out_gpu, gpu(y), gpu(g));
  ops::add_gated(out, y, g);
  EXPECT_LE(relative_error(out_gpu, out, "add_gated"), 1e-6f);
}

}  // namespace
}  // namespace mere

// The CPU mixture-of-experts ops (the reference the CUDA kernels are checked
// against): routing rules on hand-made logits, and the experts against a
// direct per-token computation, including skewed routing.
#include <gtest/gtest.h>

#include <cmath>

#include "models/blocks/moe.h"
#include "ops/ops.h"
#include "test_util.h"

namespace mere {
namespace {

Tensor random_tensor(Shape shape, uint64_t seed, float scale, DType dtype = DType::f32) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  ops::fill_random(t, seed, scale);
  return t;
}

std::vector<int32_t> ids_of(const ops::MoeChoice& c) {
  return {c.ids.data<int32_t>(), c.ids.data<int32_t>() + c.ids.numel()};
}
std::vector<float> weights_of(const ops::MoeChoice& c) { return c.weights.to_floats(); }

TEST(MoeRoute, SoftmaxTopKRenormalisedAndTiesToLowerIndex) {
  // Token 0: experts 1 and 3 tie for first; token 1: 0, 2 tie for second.
  Tensor logits = Tensor::from_floats({0.0f, 2.0f, 1.0f, 2.0f, /**/ 3.0f, 1.0f, 1.0f, -1.0f}, {2, 4});
  const ops::MoeChoice c = ops::moe_route(logits, {.top_k = 2, .renormalize = false});
  EXPECT_EQ(ids_of(c), (std::vector<int32_t>{1, 3, 0, 1}));
  const float z0 = 1 + 2 * std::exp(2.0f) + std::exp(1.0f);
  EXPECT_NEAR(weights_of(c)[0], std::exp(2.0f) / z0, 1e-6);
  const ops::MoeChoice r = ops::moe_route(logits, {.top_k = 2, .renormalize = true, .scale = 2.5f});
  EXPECT_NEAR(weights_of(r)[0], 1.25f, 1e-6);  // two equal weights renormalised to 0.5, times 2.5
  EXPECT_NEAR(weights_of(r)[2] + weights_of(r)[3], 2.5f, 1e-6);
}

TEST(MoeRoute, SigmoidGroupsAndCorrectionChooseButDoNotWeigh) {
  // 8 experts in 4 groups of 2, the best 2 groups compete. The correction
  // lifts expert 7 into the choice; its weight stays sigmoid(logit).
  Tensor logits = Tensor::from_floats({2.0f, 1.9f, 0.0f, 0.1f, 1.95f, -2.0f, -1.0f, -1.0f}, {1, 8});
  Tensor correction = Tensor::from_floats({0, 0, 0, 0, 0, 0, 0, 3.0f}, {8});
  const ops::MoeRouting routing{.score = ops::MoeRouting::Score::sigmoid, .top_k = 3, .n_groups = 4, .top_groups = 2};
  const ops::MoeChoice c = ops::moe_route(logits, routing, correction);
  // Group scores (the sum of the two best corrected scores): g3 = 2 s(-1) + 3 = 3.54, g0 = s(2) + s(1.9) = 1.75,
  // g1 = 1.02, g2 = s(1.95) + s(-2) = 0.99. Groups 3 and 0 compete, so expert 4 (s(1.95) = 0.876) is out
  // although it beats expert 1 (s(1.9) = 0.870).
  EXPECT_EQ(ids_of(c), (std::vector<int32_t>{7, 0, 1}));
  auto sigmoid = [](float x) { return 1.0f / (1.0f + std::exp(-x)); };
  EXPECT_NEAR(weights_of(c)[0], sigmoid(-1.0f), 1e-6);
  EXPECT_NEAR(weights_of(c)[1], sigmoid(2.0f), 1e-6);
}

// out[t] = sum_j w[t,j] * down_e(silu(gate_e x) * up_e x), computed per token from dequantized experts.
Tensor direct(const Tensor& x, const ops::ExpertWeights& w, const ops::MoeChoice& c) {
  const int64_t T = x.dim(0), k = c.ids.dim(1), d = w.d_model;
  Tensor out = Tensor::zeros({T, d}, DType::f32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = c.ids.data<int32_t>()[t * k + j];
      Tensor xt = x.slice_rows(t, t + 1).clone();
      Tensor g = ops::linear(xt, w.gate_of(e).dequantize()), u = ops::linear(xt, w.up_of(e).dequantize());
      Tensor y = ops::linear(ops::silu_mul(g, u), w.down_of(e).dequantize());
      for (int64_t i = 0; i < d; ++i) out.data<float>()[t * d + i] += c.weights.data<float>()[t * k + j] * y.at(i);
    }
  return out;
}

ops::ExpertWeights random_experts(int64_t E, int64_t f, int64_t d, bool fused, uint64_t seed) {
  ops::ExpertWeights w;
  w.n_experts = E;
  w.d_ff = f;
  w.d_model = d;
  if (fused) {
    w.gate_up = random_tensor({E * 2 * f, d}, seed, 0.3f, DType::bf16);
  } else {
    w.gate = random_tensor({E * f, d}, seed, 0.3f, DType::bf16);
    w.up = random_tensor({E * f, d}, seed + 1, 0.3f, DType::bf16);
  }
  w.down = random_tensor({E * d, f}, seed + 2, 0.3f, DType::bf16);
  return w;
}

TEST(MoeExperts, MatchDirectComputation) {
  const int64_t T = 7, E = 6, f = 24, d = 32, k = 2;
  Tensor x = random_tensor({T, d}, 1, 1.0f);
  const ops::MoeChoice c = ops::moe_route(random_tensor({T, E}, 2, 2.0f), {.top_k = int(k), .renormalize = true});
  for (bool fused : {false, true}) {
    const ops::ExpertWeights w = random_experts(E, f, d, fused, 10);
    EXPECT_LE(test::max_abs_diff(ops::moe_experts(x, w, c), direct(x, w, c)).diff, 1e-5f) << "fused " << fused;
  }
}

TEST(MoeExperts, SkewedRoutingAllTokensToOneExpertAndEmptyExperts) {
  const int64_t T = 5, E = 4, f = 16, d = 32;
  Tensor x = random_tensor({T, d}, 3, 1.0f);
  ops::MoeChoice c{Tensor::empty({T, 1}, DType::i32), Tensor::empty({T, 1}, DType::f32)};
  for (int64_t t = 0; t < T; ++t) {
    c.ids.data<int32_t>()[t] = 2;  // every token to expert 2; experts 0, 1, 3 get nothing
    c.weights.data<float>()[t] = 0.5f + 0.1f * float(t);
  }
  const ops::ExpertWeights w = random_experts(E, f, d, false, 20);
  EXPECT_LE(test::max_abs_diff(ops::moe_experts(x, w, c), direct(x, w, c)).diff, 1e-5f);
  c.ids.data<int32_t>()[3] = 4;  // out of range: an error, not a wild read
  EXPECT_THROW(ops::moe_experts(x, w, c), Error);
}

TEST(AddGated, SigmoidOfTheGateScalesEachRow) {
  Tensor out = Tensor::from_floats({1, 1, 2, 2}, {2, 2}), y = Tensor::from_floats({1, 2, 3, 4}, {2, 2});
  ops::add_gated(out, y, Tensor::from_floats({0.0f, 100.0f}, {2, 1}));
  EXPECT_EQ(out.to_floats(), (std::vector<float>{1.5f, 2.0f, 5.0f, 6.0f}));
  ops::add_gated(out, y, Tensor());
  EXPECT_EQ(out.to_floats(), (std::vector<float>{2.5f, 4.0f, 8.0f, 10.0f}));
}

}  // namespace
}  // namespace mere

namespace mere {
namespace {

// The shared block: routed experts plus a shared expert, gated by sigmoid(x . g)
// or not, equals its composition from the ops.
TEST(MoeBlock, SharedExpertWithAndWithoutGateAddsToTheRoutedOutput) {
  const int64_t T = 3, E = 4, f = 16, d = 32;
  MoeBlock block;
  block.router = Weight(random_tensor({E, d}, 80, 0.5f));
  block.routing = {.score = ops::MoeRouting::Score::sigmoid, .top_k = 2, .renormalize = true, .scale = 1.5f};
  block.experts = random_experts(E, f, d, true, 81);
  block.shared.gate = Weight(random_tensor({f, d}, 82, 0.3f));
  block.shared.up = Weight(random_tensor({f, d}, 83, 0.3f));
  block.shared.down = Weight(random_tensor({d, f}, 84, 0.3f));
  const Tensor x = random_tensor({T, d}, 85, 1.0f);
  const ops::MoeChoice c = ops::moe_route(ops::linear(x, block.router), block.routing);
  const Tensor routed = direct(x, block.experts, c), shared = block.shared.apply(x);
  Tensor want = routed.clone();
  ops::add_inplace(want, shared);
  EXPECT_LE(test::max_abs_diff(block.apply(x), want).diff, 1e-5f);
  block.shared_gate = Weight(random_tensor({1, d}, 86, 0.5f));
  const Tensor g = ops::linear(x, block.shared_gate);
  want = routed.clone();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < d; ++i)
      want.data<float>()[t * d + i] += shared.at(t * d + i) / (1.0f + std::exp(-g.at(t)));
  EXPECT_LE(test::max_abs_diff(block.apply(x), want).diff, 1e-5f);
  EXPECT_EQ(block.decode_bytes(), block.router.size_bytes() + 2 * block.experts.size_bytes() / 4 +
                                      block.shared.size_bytes() + block.shared_gate.size_bytes());
}

// add_normed (the fused forms' entry) adds the block applied to RMSNorm(h)
// norm_w into h, with and without a shared expert; a router or norm weight of
// the wrong shape is a clear error naming it, with h untouched.
TEST(MoeBlock, AddNormedAddsTheBlockOfTheNormedRowAndRefusesMisshapenWeights) {
  const int64_t T = 2, E = 4, f = 16, d = 32;
  const float eps = 1e-6f;
  MoeBlock block;
  block.router = Weight(random_tensor({E, d}, 90, 0.5f));
  block.routing = {.top_k = 2, .renormalize = true};
  block.experts = random_experts(E, f, d, false, 91);
  const Tensor h0 = random_tensor({T, d}, 92, 2.0f), norm_w = random_tensor({d}, 93, 0.5f);
  for (bool with_shared : {false, true}) {
    if (with_shared) {
      block.shared.gate = Weight(random_tensor({f, d}, 94, 0.3f));
      block.shared.up = Weight(random_tensor({f, d}, 95, 0.3f));
      block.shared.down = Weight(random_tensor({d, f}, 96, 0.3f));
    }
    Tensor want = h0.clone(), got = h0.clone();
    ops::add_inplace(want, block.apply(ops::rms_norm(h0, norm_w, eps)));
    block.add_normed(got, norm_w, eps);
    EXPECT_LE(test::max_abs_diff(got, want).diff, 1e-5f) << (with_shared ? "with" : "without") << " a shared expert";
  }
  block.shared = GatedMlp{};
  auto expect_error = [&](const MoeBlock& b, const Tensor& w, const char* names) {
    Tensor h = h0.clone();
    try {
      b.add_normed(h, w, eps);
      ADD_FAILURE() << "no error for a misshapen " << names;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
    }
    EXPECT_EQ(test::max_abs_diff(h, h0).diff, 0.0f) << names;
  };
  MoeBlock narrow = block;
  narrow.router = Weight(random_tensor({E, d / 2}, 97, 0.5f));
  expect_error(narrow, norm_w, "router");
  expect_error(block, random_tensor({d + 1}, 98, 0.5f), "norm weight");
}

}  // namespace
}  // namespace mere

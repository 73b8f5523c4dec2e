// FP8 E4M3 block-scaled weights on CUDA (ctest label gpu): the decode matvec
// (plain, and in the fused forms of lever fused_norm_matvec), the prefill GEMM
// and the embedding against Weight::dequantize and the CPU dense reference, on
// random weights of awkward shapes; then speed on Llama-3-8B-shaped
// matrices, printed and not asserted. The matvec accumulates the same f32
// products as the reference (1e-5); the prefill GEMM rounds the activations to
// E4M3 (one scale per token and 128 columns), so it is checked twice: loosely
// against the exact reference, tightly against the reference on activations
// rounded the same way.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "engine/generate.h"
#include "engine/levers.h"
#include "io/npy.h"
#include "models/model.h"
#include "models/shapes.h"
#include "ops/cuda/fp8_launchers.h"
#include "ops/cuda/launchers.h"
#include "ops/ops.h"
#include "ops/quantized_ops.h"
#include "ops/weight.h"
#include "gpu_test_util.h"
#include "quant/fp8_test_util.h"
#include "test_util.h"

namespace mere {
namespace {

using test::random_fp8;

using test::gpu;
using test::random;
using test::relative_error;

constexpr float kMatvecTolerance = 1e-5f;
constexpr float kGemmTolerance = 5e-2f;          // E4M3 activations against the exact reference
constexpr float kGemmRoundedTolerance = 2e-3f;  // against the reference on the same rounded activations
constexpr double kCopyBandwidth = 4.2e12;       // H200 device-to-device copy, bytes/s

cudaStream_t stream() { return static_cast<cudaStream_t>(cuda_stream()); }

// Activations whose magnitude changes by up to 1000x between tokens and between
// blocks of 128 columns, so a mixed-up activation scale shows.
Tensor random_activations(int64_t T, int64_t in, uint64_t seed) {
  Tensor x = Tensor::empty({T, in}, DType::f32);
  ops::fill_random(x, seed, 1.0f);
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> exponent(-2.0f, 1.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < (in + 127) / 128; ++b) {
      const float m = std::pow(10.0f, exponent(rng));
      for (int64_t i = b * 128; i < std::min(in, b * 128 + 128); ++i) x.data<float>()[t * in + i] *= m;
    }
  return x;
}

// x as the FP8 GEMM sees it: each token's 128 columns scaled to amax 448, rounded
// to the nearest E4M3 value, scaled back.
Tensor round_activations_to_e4m3(const Tensor& x) {
  std::vector<float> codes;
  for (int b = 0; b < 256; ++b)
    if ((b & 0x7f) != 0x7f) codes.push_back(f8_e4m3_to_f32(uint8_t(b)));
  std::sort(codes.begin(), codes.end());
  const int64_t T = x.dim(0), in = x.dim(1);
  Tensor r = x.clone();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < (in + 127) / 128; ++b) {
      const int64_t end = std::min(in, b * 128 + 128);
      float amax = 0;
      for (int64_t i = b * 128; i < end; ++i) amax = std::max(amax, std::fabs(x.at(t * in + i)));
      if (amax == 0) continue;
      for (int64_t i = b * 128; i < end; ++i) {
        const float v = std::clamp(x.at(t * in + i) * (448.0f / amax), -448.0f, 448.0f);
        auto it = std::lower_bound(codes.begin(), codes.end(), v);
        float q = it == codes.end() ? codes.back() : *it;
        if (it != codes.begin() && std::fabs(*(it - 1) - v) <= std::fabs(q - v)) q = *(it - 1);
        r.data<float>()[t * in + i] = q * (amax / 448.0f);
      }
    }
  return r;
}

class Fp8Gpu : public test::NeedsGpuDefaultLaunch {};

TEST_F(Fp8Gpu, LinearMatchesTheDequantizedReference) {
  ops::set_launch_settings({.fp8_activation_gemm = true});  // the FP8 GEMM where a shape allows it
  struct Case { int64_t out, in; int block; };
  // FP8 GEMMs need rows of 16-byte multiples (in, out % 16); 384 and 1168 columns
  // make scale rows of 3 and 10 blocks, which cuBLASLt reads padded to 4 and 12.
  for (Case c : {Case{1, 16, 128}, Case{7, 200, 128}, Case{130, 300, 128}, Case{256, 384, 128}, Case{1024, 512, 128},
                 Case{33, 129, 128}, Case{77, 1040, 128}, Case{96, 1040, 128}, Case{304, 4096, 128},
                 Case{384, 1168, 128}, Case{40, 100, 64}, Case{96, 256, 32}})
    for (int64_t T : {1, 2, 5, 8, 17, 200})
      for (bool with_bias : {false, true}) {
        Weight w(random_fp8(c.out, c.in, c.block, uint64_t(c.out * 1000 + c.in)));
        Weight wd = w.to_device(Device::cuda);
        Tensor x = random_activations(T, c.in, uint64_t(T * 7 + c.in));
        Tensor b;
        if (with_bias) {
          b = Tensor::empty({c.out}, DType::f32);
          ops::fill_random(b, uint64_t(c.out), 0.5f);
        }
        Tensor dense = w.dequantize(DType::f32);
        Tensor want = ops::linear(x, dense, b);
        Tensor got = ops::linear(gpu(x), wd, with_bias ? gpu(b) : Tensor());
        const std::string path = cuda::fp8_gemm_path(T, c.in, c.out, c.block);
        const std::string label = fmt::format("T={} {}x{} b{}{} {}", T, c.out, c.in, c.block, with_bias ? " bias" : "",
                                              path);
        if (T <= cuda::kMaxFp8MatvecTokens) {
          EXPECT_LE(relative_error(got, want, label), kMatvecTolerance);
          continue;
        }
        EXPECT_LE(relative_error(got, want, label), kGemmTolerance);
        if (path.starts_with("fp8 tensor cores")) {
          Tensor rounded = ops::linear(round_activations_to_e4m3(x), dense, b);
          EXPECT_LE(relative_error(got, rounded, label + " vs rounded x"), kGemmRoundedTolerance);
        }
      }
  ops::set_launch_settings({});
}

// The copy a prefill without fp8_activation_gemm multiplies by (bf16), and its
// f32 form: bit for bit the CPU's Weight::dequantize, in 16-byte chunks (rows of
// 16-byte multiples) and one value at a time (129 or 200 columns).
TEST_F(Fp8Gpu, DequantizedCopyEqualsTheCpu) {
  struct Case { int64_t out, in; };
  for (Case c : {Case{304, 4096}, Case{130, 1040}, Case{7, 200}, Case{33, 129}})
    for (DType dt : {DType::bf16, DType::f32}) {
      const Weight w(random_fp8(c.out, c.in, 128, uint64_t(c.out * 31 + c.in)));
      const Weight wg = w.to_device(Device::cuda);
      const cuda::Fp8WeightView view{wg.fp8().values.data<uint8_t>(), wg.fp8().scale_inv.data<float>(), c.out, c.in,
                                     wg.fp8().scale_inv.dim(1), 128};
      Tensor got = Tensor::empty({c.out, c.in}, dt, Device::cuda);
      ASSERT_EQ(cuda::launch_fp8_dequantize(view, got.raw(), dt, stream()), cudaSuccess);
      const Tensor host = got.to_device(Device::cpu), want = w.dequantize(dt);
      EXPECT_EQ(std::memcmp(host.raw(), want.raw(), want.size_bytes()), 0)
          << c.out << "x" << c.in << " " << dtype_name(dt);
    }
}

// Lever tensor_core_fp8_gemm: prefill of 9-256 tokens on the GEMM that forms
// the bf16 weights in registers (each value times its block's scale, rounded
// once, the bf16 copy's values) against that copy and the dense GEMM: the same
// operands, so only the order of the f32 sums moves (1e-3), and within the
// copy's distance of the f32 reference. Rows off the 128-row tiles (130, 304),
// a last scale block of 64 columns (1088), split k-tiles (few row tiles),
// every token tile (9 to 256 tokens), a bias; with the lever on no copy is made.
// Past 256 tokens, or in not a multiple of 64, the copy stays.
TEST_F(Fp8Gpu, TensorCoreGemmMatchesTheBf16Copy) {
  struct Case { int64_t out, in; };
  for (Case c : {Case{130, 1088}, Case{256, 512}, Case{304, 4096}, Case{1024, 2048}})
    for (int64_t T : {9, 16, 33, 100, 256})
      for (bool with_bias : {false, true}) {
        const Weight w(random_fp8(c.out, c.in, 128, uint64_t(c.out * 1000 + c.in)));
        const Weight wd = w.to_device(Device::cuda);
        const Tensor x = gpu(random_activations(T, c.in, uint64_t(T * 7 + c.in)));
        Tensor b;
        if (with_bias) {
          b = Tensor::empty({c.out}, DType::f32);
          ops::fill_random(b, uint64_t(c.out), 0.5f);
          b = gpu(b);
        }
        const std::string label = fmt::format("T={} {}x{}{}", T, c.out, c.in, with_bias ? " bias" : "");
        const Tensor copy = ops::linear(x, wd, b);
        ops::set_launch_settings({.tensor_core_fp8_gemm = true});
        const auto launches = test::kernel_launches_by([&] { ops::linear(x, wd, b); });
        const Tensor got = ops::linear(x, wd, b);
        ops::set_launch_settings({});
        auto launched = [&](const char* name) {
          return std::any_of(launches.begin(), launches.end(),
                             [&](const auto& l) { return l.name.find(name) != std::string::npos; });
        };
        EXPECT_TRUE(launched("affine_gemm_kernel")) << label;
        EXPECT_FALSE(launched("fp8_dequantize")) << label;
        EXPECT_LE(relative_error(got, copy.to_device(Device::cpu), label + ", against the bf16 copy"), 1e-3f);
        const Tensor want = ops::linear(random_activations(T, c.in, uint64_t(T * 7 + c.in)),
                                        w.dequantize(DType::f32), with_bias ? b.to_device(Device::cpu) : Tensor());
        EXPECT_LE(relative_error(got, want, label + ", against the f32 reference"),
                  std::max(2e-2f, 2 * relative_error(copy, want, label + ", the copy against it")));
      }
  // Past the token limit, and where in is not a multiple of 64, the copy stays.
  for (auto [T, out, in] : {std::tuple<int64_t, int64_t, int64_t>{257, 256, 512}, {100, 130, 1000}}) {
    const Weight wd = Weight(random_fp8(out, in, 128, 9)).to_device(Device::cuda);
    const Tensor x = gpu(random_activations(T, in, 10));
    ops::set_launch_settings({.tensor_core_fp8_gemm = true});
    EXPECT_FALSE(test::launch_named([&] { ops::linear(x, wd, Tensor()); }, {"fp8_dequantize"}).name.empty())
        << T << " tokens, " << in << " columns";
    ops::set_launch_settings({});
  }
}

// Lever tensor_core_fp8_matvec: the tensor-core matvec (x as two f16 per token
// and block, f32 sums) against the f32 reference, T 1-8 (one or two mmas), rows
// off the 16-row tiles, more tiles than blocks (9000 rows), split-K (40 rows),
// long rows cut into launches (14336 columns at 4-8 tokens), activations 1000x
// apart between blocks; ops::linear takes it under the lever from 2 tokens and
// at one token of a matrix of 2^24 weights (4096 x 4096; bit for bit the direct
// launch), and the CUDA-core kernel without it, at one token of the smaller
// matrices, or where it does not apply (a row not a multiple of 128).
TEST_F(Fp8Gpu, TensorCoreMatvecMatchesTheDequantizedReference) {
  struct Case { int64_t out, in; };
  int n = 0;
  for (Case c : {Case{304, 4096}, Case{9000, 256}, Case{40, 4096}, Case{77, 14336}, Case{130, 1040}, Case{4096, 4096}})
    for (int64_t T : {1, 2, 3, 4, 5, 8}) {
      const std::string label = fmt::format("tensor-core fp8 T={} {}x{}", T, c.out, c.in);
      Weight w(random_fp8(c.out, c.in, 128, uint64_t(c.out + c.in + n++)));
      const Weight wg = w.to_device(Device::cuda);
      const Tensor x = random_activations(T, c.in, uint64_t(n)), b = random({c.out}, DType::f32, 10, 0.5f);
      const Tensor want = ops::linear(x, w.dequantize(DType::f32), b);
      const Tensor xd = gpu(x), bd = gpu(b);
      const cuda::Fp8WeightView view{wg.fp8().values.data<uint8_t>(), wg.fp8().scale_inv.data<float>(), c.out, c.in,
                                     wg.fp8().scale_inv.dim(1), 128};
      const bool supported = cuda::fp8_matvec_mma_supports(view, T);
      EXPECT_EQ(supported, c.in % 128 == 0) << label;
      Tensor direct;
      if (supported) {
        direct = Tensor::empty({T, c.out}, DType::f32, Device::cuda);
        Tensor scratch = Tensor::empty({cuda::fp8_matvec_mma_scratch_bytes(view, T)}, DType::u8, Device::cuda);
        ASSERT_EQ(cuda::launch_fp8_matvec_mma(xd.data<float>(), view, bd.data<float>(), direct.data<float>(), T,
                                              scratch.raw(), stream()),
                  cudaSuccess)
            << label;
        EXPECT_LE(relative_error(direct, want, label), kMatvecTolerance) << label;
        direct = direct.to_device(Device::cpu);
      }
      ops::set_launch_settings({});
      const Tensor cuda_cores = ops::linear(xd, wg, bd).to_device(Device::cpu);
      ops::set_launch_settings({.tensor_core_fp8_matvec = true});
      const Tensor lever = ops::linear(xd, wg, bd).to_device(Device::cpu);
      ops::set_launch_settings({});
      // One token of a matrix below 2^24 weights keeps the CUDA-core kernel.
      const bool applies = supported && (T >= 2 || c.out * c.in >= cuda::kMinTensorCoreWeightsAtOneToken);
      const Tensor& expected = applies ? direct : cuda_cores;
      EXPECT_EQ(std::memcmp(lever.raw(), expected.raw(), lever.size_bytes()), 0) << label;
      if (applies) {
        EXPECT_NE(std::memcmp(lever.raw(), cuda_cores.raw(), lever.size_bytes()), 0) << label;
      }
    }
}

// x far outside f16's range in both directions (each token's block is scaled
// by its own power of two before the split into f16), and a NaN, which makes
// its token's outputs NaN and leaves the others alone.
TEST_F(Fp8Gpu, TensorCoreMatvecKeepsHugeAndTinyInputs) {
  test::expect_huge_tiny_and_nan_inputs(Weight(random_fp8(96, 1024, 128, 77)), {.tensor_core_fp8_matvec = true}, 128,
                                        "tensor-core fp8");
}

// Every compiled tile shape and split of the matvec (T = 1 and 8; the default
// tile at 3 and 5), on rows that end mid-block (1040 columns) and rows split
// unevenly (14336 columns = 112 steps).
TEST_F(Fp8Gpu, EveryMatvecTileMatches) {
  struct Case { int64_t out, in; };
  for (Case c : {Case{304, 4096}, Case{1000, 1040}, Case{77, 14336}})
    for (int64_t T : {1, 3, 5, 8}) {
      Weight w(random_fp8(c.out, c.in, 128, uint64_t(c.out + c.in)));
      Tensor values = gpu(w.fp8().values), scales = gpu(w.fp8().scale_inv);
      Tensor x = random_activations(T, c.in, 9), b = Tensor::empty({c.out}, DType::f32);
      ops::fill_random(b, 10, 0.5f);
      Tensor want = ops::linear(x, w.dequantize(DType::f32), b);
      Tensor xd = gpu(x), bd = gpu(b), y = Tensor::empty({T, c.out}, DType::f32, Device::cuda);
      const cuda::Fp8WeightView view{values.data<uint8_t>(), scales.data<float>(), c.out, c.in, scales.dim(1), 128};
      for (int variant = -1; variant < cuda::fp8_matvec_variants(); ++variant) {
        ASSERT_EQ(cuda::launch_fp8_matvec(xd.data<float>(), view, bd.data<float>(), y.data<float>(), T, stream(),
                                          variant),
                  cudaSuccess);
        EXPECT_LE(relative_error(y, want, fmt::format("matvec tile {} T={} {}x{}", variant, T, c.out, c.in)),
                  kMatvecTolerance);
      }
    }
}

// Lever matvec_split_k on the FP8 matvec: matrices whose row groups do not fill
// a wave of resident warps share each row among 2 or 4 warps (Qwen3-30B-A3B's
// o_proj and router; its q/k/v at 2), each keeping a batch of 8 steps; a
// matrix of many rows, or of short rows, keeps one. The default launch gives
// the bits of the compiled variant of the same split, within the tolerance of
// the CPU, at 1 and 8 tokens; with the lever off, split 1.
TEST_F(Fp8Gpu, FewRowsShareTheirColumnsAmongWarps) {
  struct Case { int64_t out, in; int split; };
  // An H100's or H200's 132 SMs hold 8,448 resident warps.
  for (Case c : {Case{2048, 4096, 4}, Case{128, 2048, 2}, Case{5120, 2048, 2}, Case{28672, 4096, 1},
                 Case{64, 1024, 1}})
    for (int64_t T : {1, 8}) {
      const std::string label = fmt::format("{}x{} T={}", c.out, c.in, T);
      Weight w(random_fp8(c.out, c.in, 128, uint64_t(c.out + 3 * c.in)));
      Tensor values = gpu(w.fp8().values), scales = gpu(w.fp8().scale_inv);
      const cuda::Fp8WeightView view{values.data<uint8_t>(), scales.data<float>(), c.out, c.in, scales.dim(1), 128};
      Tensor x = random_activations(T, c.in, 19);
      const Tensor want = ops::linear(x, w.dequantize(DType::f32), Tensor());
      Tensor xd = gpu(x);
      auto run = [&](int variant) {
        Tensor y = Tensor::empty({T, c.out}, DType::f32, Device::cuda);
        EXPECT_EQ(cuda::launch_fp8_matvec(xd.data<float>(), view, nullptr, y.data<float>(), T, stream(), variant),
                  cudaSuccess);
        return y.to_device(Device::cpu);
      };
      // The variant of the default tile (T = 1: 2 x 8; T = 8: 2 x 8 pipelined) with a given split.
      auto variant_of = [&](int split) {
        for (int v = 0; v < cuda::fp8_matvec_variants(); ++v) {
          const cuda::Fp8MatvecTile t = cuda::fp8_matvec_tile(v);
          if (t.rows_per_warp == 2 && t.steps_in_flight == 8 && t.pipelined == (T > 2) && t.split == split) return v;
        }
        return -1;
      };
      ops::set_launch_settings({.matvec_split_k = true});
      EXPECT_EQ(cuda::fp8_matvec_split(view), c.split) << label;
      const Tensor split = run(-1);
      ops::set_launch_settings({});
      EXPECT_EQ(cuda::fp8_matvec_split(view), 1) << label;
      const Tensor one = run(-1);
      EXPECT_TRUE(test::same_bytes(split, run(variant_of(c.split)))) << label;
      EXPECT_TRUE(test::same_bytes(one, run(variant_of(1)))) << label;
      EXPECT_LE(relative_error(split, want, label + " split"), kMatvecTolerance);
    }
}

TEST_F(Fp8Gpu, ProgrammaticLaunchAndFusedRowsChangeNothing) {
  Weight q(random_fp8(256, 1024, 128, 1)), k(random_fp8(128, 1024, 128, 2)), v(random_fp8(128, 1024, 128, 3));
  Tensor x = gpu(random_activations(3, 1024, 4));
  Weight qd = q.to_device(Device::cuda);
  Tensor plain = ops::linear(x, qd).to_device(Device::cpu);
  ops::set_launch_settings({.programmatic = true});
  Tensor early = ops::linear(x, qd).to_device(Device::cpu);
  ops::set_launch_settings({});
  EXPECT_EQ(test::max_abs_diff(early, plain).diff, 0.0f);
  // q, k and v stacked (whole blocks each) give the same rows as apart.
  Weight qkv = Weight::concat_rows({qd, k.to_device(Device::cuda), v.to_device(Device::cuda)});
  ASSERT_TRUE(qkv.defined());
  std::vector<Tensor> parts = ops::split_columns(ops::linear(x, qkv), {256, 128, 128});
  EXPECT_EQ(test::max_abs_diff(parts[0].to_device(Device::cpu), plain).diff, 0.0f);
  EXPECT_LE(relative_error(parts[2], ops::linear(x.to_device(Device::cpu), v.dequantize()), "fused qkv: v rows"),
            kMatvecTolerance);
}

TEST_F(Fp8Gpu, EmbedMatchesTheCpu) {
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{300, 200}, {1000, 4096}, {129, 77}}) {
    Weight w(random_fp8(rows, cols, 128, uint64_t(rows + cols)));
    Tensor ids = Tensor::empty({6}, DType::i32);
    const int32_t picks[6] = {0, int32_t(rows - 1), 128, 127, 5, 0};
    std::copy(picks, picks + 6, ids.data<int32_t>());
    Tensor want = ops::embed(w, ids);
    Tensor got = ops::embed(w.to_device(Device::cuda), gpu(ids));
    EXPECT_EQ(relative_error(got, want, fmt::format("embed {}x{}", rows, cols)), 0.0f);
  }
}

// The FP8 fixture (tests/fixtures/qwen3-fp8) on the GPU with the default levers:
// the prefill (weights dequantized to bf16 for the GEMM) and one token at a time
// (the matvec) against transformers within the bf16 error; the prefill through
// the FP8 GEMM (lever fp8_activation_gemm) loosely; graph replay giving the
// plain loop's tokens.
TEST_F(Fp8Gpu, FixtureMatchesTransformers) {
  const auto dir = test::fixtures_dir() / "qwen3-fp8";
  const std::vector<int32_t> ids =
      nlohmann::json::parse(test::read_file(dir / "reference.json"))["ids"].get<std::vector<int32_t>>();
  Tensor want = read_npy(dir / "logits.npy");
  auto model = load_model(dir, Device::cuda, Levers{}.load_options(Device::cuda));
  auto state = model->make_state();
  Tensor prefill = model->forward(ids, *state, /*all_logits=*/true);
  EXPECT_LE(relative_error(prefill, want, "qwen3-fp8 prefill (bf16 dequantized GEMM) vs transformers"), 3e-2f);
  // Lever fp8_activation_gemm: E4M3 activations cost accuracy on this tiny random
  // model; reported, and bounded loosely.
  Levers with_fp8_gemm;
  with_fp8_gemm.fp8_activation_gemm = true;
  auto fast = load_model(dir, Device::cuda, with_fp8_gemm.load_options(Device::cuda));
  auto fast_state = fast->make_state();
  EXPECT_LE(relative_error(fast->forward(ids, *fast_state, true), want, "qwen3-fp8 prefill (fp8 GEMM) vs transformers"),
            0.3f);
  auto step_state = model->make_state();
  std::vector<float> rows;
  for (int32_t id : ids) {
    std::vector<float> row = model->forward({id}, *step_state, false).to_device(Device::cpu).to_floats();
    rows.insert(rows.end(), row.begin(), row.end());
  }
  EXPECT_LE(relative_error(Tensor::from_floats(rows, want.shape()), want, "qwen3-fp8 one token a step vs transformers"),
            3e-2f);
  GenerateOptions plain, graphed;
  plain.max_new_tokens = graphed.max_new_tokens = 24;
  plain.sampling.temperature = graphed.sampling.temperature = 0;
  plain.levers.cuda_graphs = false;
  graphed.levers.cuda_graphs = true;
  std::vector<int32_t> a, b;
  generate(*model, ids, plain, [&](int32_t id) { a.push_back(id); return true; });
  GenerateStats stats = generate(*model, ids, graphed, [&](int32_t id) { b.push_back(id); return true; });
  EXPECT_EQ(a, b);
  EXPECT_GT(stats.graph_replays, 0);
}

// The fused decode forms (lever fused_norm_matvec) on the tensor-core FP8
// matvec: RMSNorm(h) w and silu(gate) up formed as x is converted, and the
// product added into the residual, against the CPU composition on the
// dequantized weights; each direct call must take the kernel (it says so).
TEST_F(Fp8Gpu, TensorCoreMatvecFormsItsInputAndAddsIntoTheResidual) {
  struct Case { int64_t T, out, in; DType norm_dt; };
  // 8 tokens of 14,336 columns: x too long for shared memory, the row cut into launches.
  // 16,896 columns: the RMSNorm prepare's threads hold 8 K values and loop over the rest.
  // One token of 4096 x 4096: at the one-token floor, as Llama-3-8B's o_proj.
  for (const Case& c : {Case{2, 96, 1024, DType::bf16}, Case{5, 130, 512, DType::f32}, Case{8, 64, 2048, DType::f16},
                        Case{1, 4096, 4096, DType::bf16}, Case{4, 300, 4096, DType::bf16},
                        Case{3, 97, 4096, DType::f16}, Case{8, 80, 14336, DType::bf16},
                        Case{2, 48, 16896, DType::bf16}}) {
    const std::string label = fmt::format("fp8 T={} {}x{} {} norm", c.T, c.out, c.in, dtype_name(c.norm_dt));
    Weight w(random_fp8(c.out, c.in, 128, uint64_t(c.T * 7 + c.out)));
    const Tensor dense = w.dequantize(DType::f32);
    const Weight wg = w.to_device(Device::cuda);
    const Tensor h = random_activations(c.T, c.in, 11), norm_w = random({c.in}, c.norm_dt, 12, 0.5f, 1.0f);
    const Tensor x = random_activations(c.T, c.in, 13), gate_up = random({c.T, 2 * c.in}, DType::f32, 14, 3.0f);
    const Tensor residual = random({c.T, c.out}, DType::f32, 15), bias = random({c.out}, DType::f32, 16, 0.1f);
    ops::set_launch_settings({.tensor_core_fp8_matvec = true});

    const Tensor normed_want = ops::linear(ops::rms_norm(h, norm_w, 1e-5f), dense, bias);
    Tensor normed = Tensor::empty({c.T, c.out}, DType::f32, Device::cuda);
    EXPECT_TRUE(ops::cuda::fp8_rms_norm_linear(gpu(h), gpu(norm_w), 1e-5f, wg.fp8(), gpu(bias), normed)) << label;
    EXPECT_LE(relative_error(normed.to_device(Device::cpu), normed_want, label + " rms_norm_linear"),
              kMatvecTolerance);
    const Tensor via_ops = ops::rms_norm_linear(gpu(h), gpu(norm_w), 1e-5f, wg, gpu(bias)).to_device(Device::cpu);
    EXPECT_EQ(std::memcmp(via_ops.raw(), normed.to_device(Device::cpu).raw(), via_ops.size_bytes()), 0) << label;

    Tensor added_want = residual.clone();
    ops::add_inplace(added_want, ops::linear(x, dense, bias));
    Tensor added = gpu(residual);
    EXPECT_TRUE(ops::cuda::fp8_linear_add(added, gpu(x), wg.fp8(), gpu(bias))) << label;
    EXPECT_LE(relative_error(added.to_device(Device::cpu), added_want, label + " linear_add"), kMatvecTolerance);

    Tensor gated_want = residual.clone();
    ops::add_inplace(gated_want, ops::linear(ops::silu_mul_halves(gate_up), dense, bias));
    Tensor gated = gpu(residual);
    EXPECT_TRUE(ops::cuda::fp8_swiglu_linear_add(gated, gpu(gate_up), wg.fp8(), gpu(bias))) << label;
    EXPECT_LE(relative_error(gated.to_device(Device::cpu), gated_want, label + " swiglu_linear_add"),
              kMatvecTolerance);
    // The fused add equals the composition on the GPU bit for bit (the same
    // input, product and add) where one launch takes the whole row.
    if (c.in * c.T <= 4096 * 8) {
      Tensor composed = gpu(residual);
      ops::add_inplace(composed, ops::linear(ops::silu_mul_halves(gpu(gate_up)), wg, gpu(bias)));
      EXPECT_EQ(std::memcmp(composed.to_device(Device::cpu).raw(), gated.to_device(Device::cpu).raw(),
                            gated.size_bytes()),
                0)
          << label;
    }
    ops::set_launch_settings({});
    // Without the lever the fused forms decline and the ops compose the steps.
    Tensor declined = gpu(residual);
    EXPECT_FALSE(ops::cuda::fp8_linear_add(declined, gpu(x), wg.fp8(), gpu(bias))) << label;
    ops::linear_add(declined, gpu(x), wg, gpu(bias));
    EXPECT_LE(relative_error(declined.to_device(Device::cpu), added_want, label + " composed"), kMatvecTolerance);
  }
}

// o_proj's fused input: split-K attention's partials merged by the FP8
// matvec's prepare kernel, against the merge done on the CPU in double, then
// the dequantized product. Every third split after a row's first is empty (max
// -inf, outputs never written), as the last splits of a short context are; and
// where attention wrote only its first splits (AttentionSplits::live), garbage
// past them is never read.
TEST_F(Fp8Gpu, TensorCoreMatvecMergesAttentionSplitsIntoItsInput) {
  struct Case { int64_t T, heads, splits, head_dim, out; };
  for (const Case& c : {Case{1, 32, 33, 128, 4096}, Case{3, 8, 5, 64, 200}, Case{8, 4, 1, 128, 96},
                        Case{2, 16, 64, 64, 130}, Case{4, 32, 17, 128, 256}, Case{2, 8, 40, 32, 256}}) {
    const int64_t in = c.heads * c.head_dim;
    const std::string label =
        fmt::format("fp8 T={} {} heads x {} splits x {}", c.T, c.heads, c.splits, c.head_dim);
    Weight w(random_fp8(c.out, in, 128, uint64_t(c.T * 5 + c.splits)));
    const Weight wg = w.to_device(Device::cuda);
    const ops::AttentionSplits cpu = test::random_attention_splits(c.T, c.heads, c.splits, c.head_dim);
    const Tensor merged = test::merged_on_cpu(cpu);
    const ops::AttentionSplits splits{.max = gpu(cpu.max), .sum = gpu(cpu.sum), .out = gpu(cpu.out)};
    const Tensor residual = random({c.T, c.out}, DType::f32, 24), bias = random({c.out}, DType::f32, 25, 0.1f);
    Tensor want = residual.clone();
    ops::add_inplace(want, ops::linear(merged, w.dequantize(DType::f32), bias));

    ops::set_launch_settings({.tensor_core_fp8_matvec = true});
    Tensor fused = gpu(residual);
    EXPECT_TRUE(ops::cuda::fp8_attention_linear_add(fused, splits, wg.fp8(), gpu(bias))) << label;
    EXPECT_LE(relative_error(fused.to_device(Device::cpu), want, label + " fused"), kMatvecTolerance);
    Tensor via_ops = gpu(residual);
    ops::attention_linear_add(via_ops, splits, wg, gpu(bias));
    EXPECT_EQ(std::memcmp(via_ops.to_device(Device::cpu).raw(), fused.to_device(Device::cpu).raw(), fused.size_bytes()),
              0)
        << label;
    if (c.splits > 2) {
      const test::LiveSplits live = test::live_splits_on_gpu(cpu, (c.splits + 1) / 2);
      Tensor want_live = gpu(residual), got_live = gpu(residual);
      EXPECT_TRUE(ops::cuda::fp8_attention_linear_add(want_live, live.marked, wg.fp8(), gpu(bias))) << label;
      EXPECT_TRUE(ops::cuda::fp8_attention_linear_add(got_live, live.garbage, wg.fp8(), gpu(bias))) << label;
      // The warps share out the splits read by their count, so the sums regroup.
      EXPECT_LE(relative_error(got_live.to_device(Device::cpu), want_live.to_device(Device::cpu),
                               label + " live splits", false),
                1e-6f);
    }
    ops::set_launch_settings({});
    // Without the lever the fused form declines; the op merges, then multiplies.
    Tensor declined = gpu(residual);
    EXPECT_FALSE(ops::cuda::fp8_attention_linear_add(declined, splits, wg.fp8(), gpu(bias))) << label;
    ops::attention_linear_add(declined, splits, wg, gpu(bias));
    EXPECT_LE(relative_error(declined.to_device(Device::cpu), want, label + " merged, then multiplied"),
              kMatvecTolerance);
  }
}

// More splits than the fused merge takes (a warp per 8, at most
// kMaxAttentionSplits): the fused form declines, and the op merges with the
// merge kernel, then multiplies.
TEST_F(Fp8Gpu, FusedMergeDeclinesMoreSplitsThanItTakes) {
  const int64_t T = 2, heads = 4, splits = cuda::kMaxAttentionSplits + 1, head_dim = 128, out = 256;
  const Weight w(random_fp8(out, heads * head_dim, 128, 97));
  const Weight wg = w.to_device(Device::cuda);
  const ops::AttentionSplits cpu = test::random_attention_splits(T, heads, splits, head_dim);
  const ops::AttentionSplits gpu_splits{.max = gpu(cpu.max), .sum = gpu(cpu.sum), .out = gpu(cpu.out)};
  const Tensor residual = random({T, out}, DType::f32, 24);
  Tensor want = residual.clone();
  ops::add_inplace(want, ops::linear(test::merged_on_cpu(cpu), w.dequantize(DType::f32)));
  ops::set_launch_settings({.tensor_core_fp8_matvec = true});
  Tensor h = gpu(residual);
  EXPECT_FALSE(ops::cuda::fp8_attention_linear_add(h, gpu_splits, wg.fp8(), Tensor()));
  ops::attention_linear_add(h, gpu_splits, wg);
  ops::set_launch_settings({});
  EXPECT_LE(relative_error(h.to_device(Device::cpu), want, "65 splits merged, then multiplied"), kMatvecTolerance);
}

// The query behind lever fused_norm_matvec's auto mode: an FP8 weight on the
// GPU at or above the one-token floor (2^24 weights) takes the tensor cores at
// one row; a smaller one only from two rows; the same weight on the CPU never.
TEST_F(Fp8Gpu, TensorCoreQueryFollowsTheFloorAtOneRow) {
  const Weight large = Weight(random_fp8(4096, 4096, 128, 93)).to_device(Device::cuda);
  const Weight small = Weight(random_fp8(4096 - 128, 4096, 128, 94)).to_device(Device::cuda);
  EXPECT_TRUE(ops::matvec_on_tensor_cores(large, 1));
  EXPECT_FALSE(ops::matvec_on_tensor_cores(small, 1));
  EXPECT_FALSE(ops::matvec_on_tensor_cores(large.to_device(Device::cpu), 1));
  for (int64_t T = 2; T <= ops::kMaxFusedRows; ++T) {
    EXPECT_TRUE(ops::matvec_on_tensor_cores(small, T)) << T;
    EXPECT_FALSE(ops::matvec_on_tensor_cores(large.to_device(Device::cpu), T)) << T;
  }
  // Unlike the affine matvec's, the floor stays 2^24 in a fused form: Qwen3-30B-A3B's
  // attention (2^23-2^23.3 weights) folded decoded 0.8% slower in FP8 (docs/levers.md).
  const Weight o_proj = Weight(random_fp8(2048, 4096, 128, 95)).to_device(Device::cuda);
  EXPECT_FALSE(ops::matvec_on_tensor_cores(o_proj, 1, true));
  EXPECT_TRUE(ops::matvec_on_tensor_cores(o_proj, 2, true));
  // Auto folds such a weight's steps where the lever takes them.
  LoadOptions o{.tensor_core_fp8_matvec = true};
  EXPECT_TRUE(folding_pays(large, o, 1));
  EXPECT_FALSE(folding_pays(small, o, 1));
  EXPECT_TRUE(folding_pays(small, o, 8));
  o.tensor_core_fp8_matvec = false;
  EXPECT_FALSE(folding_pays(large, o, 1));
  EXPECT_FALSE(folding_pays(large, o, 2));
}

// Lever fused_norm_matvec on an FP8 model whose matrices take the tensor-core
// matvec (Qwen3-0.6B's shape, random weights; the FP8 fixture's 64 columns are
// below the kernel's 128-column blocks): steps of 2-8 tokens folded against the
// composition, logits within 1e-4 of the largest (the RMSNorm's sum in another
// order) and at least three kernels fewer a layer (the residual adds with their
// RMSNorms, SwiGLU); a prefill of more than 8 tokens runs unfolded either way,
// bit for bit. One token of this model's matrices (below 2^24 weights) keeps the
// CUDA-core kernel, so auto folds only its batches' steps.
TEST_F(Fp8Gpu, FoldedModelMatchesTheComposition) {
  Levers on, off;
  on.fused_norm_matvec = LeverMode::on;
  off.fused_norm_matvec = LeverMode::off;
  const RandomQuant fp8 = RandomQuant::parse("fp8");
  auto folded = random_model("qwen3-0.6b", Device::cuda, on.load_options(Device::cuda), 1, fp8);
  auto composed = random_model("qwen3-0.6b", Device::cuda, off.load_options(Device::cuda), 1, fp8);
  ASSERT_TRUE(folded->info().folds_step(1) && folded->info().folds_step(8));
  ASSERT_FALSE(composed->info().folds_step(1) || composed->info().folds_step(8));
  const auto automatic = random_model("qwen3-0.6b", Device::cuda, Levers{}.load_options(Device::cuda), 1, fp8);
  EXPECT_FALSE(automatic->info().folds_step(1));
  for (int64_t T = 2; T <= ops::kMaxFusedRows; ++T) EXPECT_TRUE(automatic->info().folds_step(T)) << T;
  EXPECT_FALSE(automatic->info().folds_step(ops::kMaxFusedRows + 1));
  auto a = folded->make_state(64), b = composed->make_state(64);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(int32_t((97 * i + 5) % folded->info().vocab));
  const std::vector<int32_t> prefill(prompt.begin(), prompt.begin() + 16);
  const Tensor p1 = folded->forward(prefill, *a, true).to_device(Device::cpu);
  const Tensor p2 = composed->forward(prefill, *b, true).to_device(Device::cpu);
  EXPECT_EQ(std::memcmp(p1.raw(), p2.raw(), p1.size_bytes()), 0) << "a 16-token prefill runs unfolded";
  size_t at = 16;
  for (size_t n : {2, 4, 8}) {
    const std::vector<int32_t> step(prompt.begin() + int64_t(at), prompt.begin() + int64_t(at + n));
    at += n;
    const Tensor got = folded->forward(step, *a, true).to_device(Device::cpu);
    const Tensor want = composed->forward(step, *b, true).to_device(Device::cpu);
    const float top = test::max_abs(want);
    const float rel = test::max_abs_diff(got, want).diff / top;
    std::printf("[ gpu      ] qwen3-0.6b fp8, a step of %zu tokens folded vs composed: logits rel diff %.3g\n", n, rel);
    EXPECT_LE(rel, 1e-4f) << n << " tokens";
  }
  // One more step of 4 tokens, its kernels counted in a capture after a warm-up run.
  auto kernels_of_a_step = [&](const Model& model, SeqState& state) {
    Tensor chunk = Tensor::empty({4}, DType::i32), pos = Tensor::empty({1}, DType::i32);
    for (int i = 0; i < 4; ++i) chunk.data<int32_t>()[i] = prompt[size_t(i)];
    state.reserve(state.length() + 4);
    pos.data<int32_t>()[0] = int32_t(state.length());
    const Tensor ids_dev = gpu(chunk), pos_dev = gpu(pos);
    SeqState* states[] = {&state};
    model.run(ids_dev, pos_dev, states, false);
    device_synchronize();
    return test::kernels_launched_by([&] { model.run(ids_dev, pos_dev, states, false); });
  };
  const size_t folded_kernels = kernels_of_a_step(*folded, *a), composed_kernels = kernels_of_a_step(*composed, *b);
  const int64_t layers = folded->kv_layout().n_layers;
  std::printf("[ gpu      ] qwen3-0.6b fp8, a step of 4 tokens: %zu kernels folded, %zu composed (%lld layers)\n",
              folded_kernels, composed_kernels, (long long)layers);
  // At least the two residual adds with their RMSNorms and SwiGLU a layer (attention's
  // merge may move into o_proj's prepare too).
  EXPECT_GE(composed_kernels, folded_kernels + size_t(3 * layers));
}

// Lever tensor_core_fp8_gemm on a model: a Qwen3-0.6B-shaped FP8 model's prefill
// of 9-256 tokens takes the dequantizing GEMM (the same bf16 operands as the
// copy, summed in another order: the op test above checks the launches), within
// 1e-2 of the largest logit of the copy's.
TEST_F(Fp8Gpu, TensorCoreGemmPrefillFollowsTheCopyOnAModel) {
  const RandomQuant fp8 = RandomQuant::parse("fp8");
  Levers on, off;  // the model applies its own launch settings each forward
  on.tensor_core_fp8_gemm = true;
  off.tensor_core_fp8_gemm = false;
  auto gemm_model = random_model("qwen3-0.6b", Device::cuda, on.load_options(Device::cuda), 1, fp8);
  auto copy_model = random_model("qwen3-0.6b", Device::cuda, off.load_options(Device::cuda), 1, fp8);
  for (int64_t T : {9, 100, 256}) {
    std::vector<int32_t> prompt;
    for (int64_t i = 0; i < T; ++i) prompt.push_back(int32_t((97 * i + 5) % gemm_model->info().vocab));
    auto prefill = [&](const Model& model) {
      auto state = model.make_state(T + 1);
      return model.forward(prompt, *state, true).to_device(Device::cpu);
    };
    const Tensor copy = prefill(*copy_model), gemm = prefill(*gemm_model);
    const float rel = test::max_abs_diff(gemm, copy).diff / test::max_abs(copy);
    std::printf("[ gpu      ] qwen3-0.6b fp8, a %lld-token prefill on the dequantizing GEMM vs the bf16 copy: logits "
                "rel diff %.3g\n", (long long)T, rel);
    EXPECT_GT(rel, 0.0f) << T << " tokens: the lever took no matmul (the sums' order would move)";
    EXPECT_LE(rel, 1e-2f) << T << " tokens";
  }
}

// ---- speed ---------------------------------------------------------------------

// Mean milliseconds per call over `reps` calls (call(i) launches, returns the
// launch's status) after two warm-ups.
template <typename Call>
float time_ms(Call&& call, int reps) {
  EXPECT_EQ(call(0), cudaSuccess);
  EXPECT_EQ(call(1), cudaSuccess);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, stream());
  for (int i = 0; i < reps; ++i) EXPECT_EQ(call(i), cudaSuccess);
  cudaEventRecord(stop, stream());
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return ms / float(reps);
}

// The same through a CUDA graph of `reps` calls with programmatic launch on, as
// the decode loop runs them: launch gaps shrink, the next matvec's first weight
// loads overlap the previous one's tail.
template <typename Call>
float time_graph_ms(Call&& call, int reps) {
  ops::set_launch_settings({.programmatic = true});
  CudaGraph graph;
  graph.capture([&] {
    for (int i = 0; i < reps; ++i) EXPECT_EQ(call(i), cudaSuccess);
  });
  graph.replay();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, stream());
  for (int r = 0; r < 3; ++r) graph.replay();
  cudaEventRecord(stop, stream());
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  ops::set_launch_settings({});
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return ms / float(3 * reps);
}

// `copies` [out, in] FP8 matrices of random bytes (no NaN patterns) back to back
// on the GPU, so timed calls can rotate through more bytes than L2 holds.
Tensor random_fp8_copies(int64_t copies, int64_t out, int64_t in) {
  Tensor all = Tensor::empty({copies * out, in}, DType::f8_e4m3, Device::cuda);
  const size_t pattern_bytes = size_t(64) << 20;
  std::vector<uint8_t> pattern(pattern_bytes);
  std::mt19937_64 rng(11);
  for (size_t i = 0; i < pattern_bytes; i += 8) {
    uint64_t r = rng();
    for (int j = 0; j < 8; ++j) {
      uint8_t b = uint8_t(r >> (8 * j));
      pattern[i + size_t(j)] = (b & 0x7f) == 0x7f ? 0x3f : b;
    }
  }
  for (size_t offset = 0; offset < all.size_bytes(); offset += pattern_bytes)
    copy_bytes(static_cast<char*>(all.raw()) + offset, Device::cuda, pattern.data(), Device::cpu,
               std::min(pattern_bytes, all.size_bytes() - offset));
  return all;
}

struct Shape8b {
  const char* name;
  int64_t out, in;
};
constexpr Shape8b kLlama3Shapes[] = {{"qkv 4096->6144", 6144, 4096},
                                     {"o 4096->4096", 4096, 4096},
                                     {"gate_up 4096->28672", 28672, 4096},
                                     {"down 14336->4096", 4096, 14336},
                                     {"lm_head 4096->128256", 128256, 4096}};

// Enough copies that every timed call reads its matrix from HBM (L2 is 60 MB).
int64_t copies_for(uint64_t bytes) { return std::max<int64_t>(2, int64_t((uint64_t(768) << 20) / bytes) + 1); }

TEST_F(Fp8Gpu, DecodeSpeedOnLlama3Shapes) {
  for (const Shape8b& s : kLlama3Shapes) {
    const int64_t copies = copies_for(uint64_t(s.out * s.in));
    Tensor values = random_fp8_copies(copies, s.out, s.in);
    Tensor scales = Tensor::empty({(s.out + 127) / 128, (s.in + 127) / 128}, DType::f32, Device::cuda);
    ops::fill_random(scales, 3, 0.5f, 0.5f);
    for (int64_t T : {1, 8}) {
      Tensor x = Tensor::empty({T, s.in}, DType::f32, Device::cuda), y = Tensor::empty({T, s.out}, DType::f32,
                                                                                          Device::cuda);
      ops::fill_random(x, 5, 1.0f);
      const double bytes = double(s.out) * s.in + double(scales.size_bytes()) + 4.0 * T * (s.in + s.out);
      auto report = [&](const std::string& how, float ms) {
        std::printf("[ gpu      ] fp8 matvec  T=%lld %-22s %-20s %8.1f us %7.1f GB/s %5.1f%% of 4.2 TB/s\n",
                    (long long)T, s.name, how.c_str(), ms * 1e3, bytes / (ms * 1e-3) / 1e9,
                    100.0 * bytes / (ms * 1e-3) / kCopyBandwidth);
      };
      for (int variant = -1; variant < cuda::fp8_matvec_variants(); ++variant) {
        auto launch = [&](int i) {
          cuda::Fp8WeightView w{values.data<uint8_t>() + (i % copies) * s.out * s.in, scales.data<float>(), s.out,
                                s.in, scales.dim(1), 128};
          return cuda::launch_fp8_matvec(x.data<float>(), w, nullptr, y.data<float>(), T, stream(), variant);
        };
        std::string tile = "default";
        if (variant >= 0) {
          const cuda::Fp8MatvecTile t = cuda::fp8_matvec_tile(variant);
          tile = fmt::format("{}r x {}{} split {}", t.rows_per_warp, t.steps_in_flight, t.pipelined ? " pipe" : "",
                             t.split);
        }
        report(tile, time_ms(launch, 50));
        if (variant < 0) report("default, graph+PDL", time_graph_ms(launch, 50));
      }
      // Lever tensor_core_fp8_matvec.
      const cuda::Fp8WeightView first{values.data<uint8_t>(), scales.data<float>(), s.out, s.in, scales.dim(1), 128};
      if (cuda::fp8_matvec_mma_supports(first, T)) {
        Tensor scratch = Tensor::empty({cuda::fp8_matvec_mma_scratch_bytes(first, T)}, DType::u8, Device::cuda);
        auto launch = [&](int i) {
          cuda::Fp8WeightView w = first;
          w.values += (i % copies) * s.out * s.in;
          return cuda::launch_fp8_matvec_mma(x.data<float>(), w, nullptr, y.data<float>(), T, scratch.raw(), stream());
        };
        report("tensor cores", time_ms(launch, 50));
        report("tensor cores, graph+PDL", time_graph_ms(launch, 50));
      }
    }
  }
  // The dense bf16 matvec on the same shapes, same run: the baseline.
  for (const Shape8b& s : kLlama3Shapes) {
    const int64_t copies = copies_for(uint64_t(s.out * s.in * 2));
    Tensor w = Tensor::empty({copies * s.out, s.in}, DType::bf16, Device::cuda);
    ops::fill_random(w, 7, 0.05f);
    Tensor x = Tensor::empty({1, s.in}, DType::f32, Device::cuda), y = Tensor::empty({1, s.out}, DType::f32,
                                                                                      Device::cuda);
    ops::fill_random(x, 5, 1.0f);
    const double bytes = 2.0 * s.out * s.in + 4.0 * (s.in + s.out);
    auto launch = [&](int i) {
      cuda::MatvecArgs a;
      a.x = x.data<float>();
      a.w = w.data<uint16_t>() + (i % copies) * s.out * s.in;
      a.w_dtype = DType::bf16;
      a.y = y.data<float>();
      a.T = 1;
      a.in = s.in;
      a.out = s.out;
      return cuda::launch_matvec(a, stream());
    };
    for (bool graph : {false, true}) {
      const float ms = graph ? time_graph_ms(launch, 50) : time_ms(launch, 50);
      std::printf("[ gpu      ] bf16 matvec T=1 %-22s %-20s %8.1f us %7.1f GB/s %5.1f%% of 4.2 TB/s\n", s.name,
                  graph ? "graph+PDL" : "plain", ms * 1e3, bytes / (ms * 1e-3) / 1e9,
                  100.0 * bytes / (ms * 1e-3) / kCopyBandwidth);
    }
  }
}

// Prefill through ops::linear, as the model calls it (activation conversion or
// quantization included): FP8 weights against the same shapes in bf16.
TEST_F(Fp8Gpu, PrefillSpeedOnLlama3Shapes) {
  ops::set_launch_settings({.fp8_activation_gemm = true});
  for (const Shape8b& s : kLlama3Shapes) {
    Tensor scales = Tensor::empty({(s.out + 127) / 128, (s.in + 127) / 128}, DType::f32, Device::cuda);
    ops::fill_random(scales, 3, 0.5f, 0.5f);
    Weight fp8(Fp8Weight{random_fp8_copies(1, s.out, s.in), scales, 128});
    Tensor bf16 = Tensor::empty({s.out, s.in}, DType::bf16, Device::cuda);
    ops::fill_random(bf16, 7, 0.05f);
    for (int64_t T : {512, 4096}) {
      Tensor x = Tensor::empty({T, s.in}, DType::f32, Device::cuda);
      ops::fill_random(x, 5, 1.0f);
      const double flops = 2.0 * double(T) * s.in * s.out;
      const int reps = T * s.out > 100'000'000 ? 5 : 20;
      const float fp8_ms = time_ms([&](int) { ops::linear(x, fp8); return cudaSuccess; }, reps);
      const float bf16_ms = time_ms([&](int) { ops::linear(x, bf16); return cudaSuccess; }, reps);
      std::printf("[ gpu      ] prefill T=%-4lld %-22s fp8 %7.3f ms %6.1f TFLOP/s | bf16 %7.3f ms %6.1f TFLOP/s (%s)\n",
                  (long long)T, s.name, fp8_ms, flops / (fp8_ms * 1e-3) / 1e12, bf16_ms,
                  flops / (bf16_ms * 1e-3) / 1e12, cuda::fp8_gemm_path(T, s.in, s.out, 128));
    }
  }
  ops::set_launch_settings({});
}

}  // namespace
}  // namespace mere

// The MLX affine-quantized CUDA kernels (ops/cuda/affine_matvec.cu) against the
// reference, Weight::dequantize then the CPU dense matmul, on random packed
// words (ctest label gpu). Decode row counts run the quantized matvec (f32
// arithmetic); prefill ones a bf16 dequantized copy through the tensor cores.
// A timing case prints the matvec's bandwidth on Llama-3-8B's matrices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "core/device.h"
#include "ops/cuda/affine_launchers.h"
#include "ops/cuda/launchers.h"
#include "ops/ops.h"
#include "ops/quantized_ops.h"
#include "gpu_test_util.h"
#include "quant/fp8_test_util.h"
#include "test_util.h"

namespace mere {
namespace {

using test::gpu;
using test::int16_rounded;
using test::random;
using test::relative_error;
using test::random_affine;
using test::seconds_per_launch;

mere::cuda::AffineArgs args_of(const Weight& w) { return test::affine_args(w.affine(), w.cols()); }

// The matvec launched directly with a plan's hints (x staged or not, a forced split).
Tensor launch_matvec(const Weight& w, const Tensor& x, const Tensor& bias, mere::cuda::AffineMatvecPlan hint) {
  Tensor y = Tensor::empty({x.dim(0), w.rows()}, DType::f32, Device::cuda);
  EXPECT_EQ(mere::cuda::launch_affine_matvec(args_of(w), x.data<float>(), bias.defined() ? bias.data<float>() : nullptr,
                                             y.data<float>(), x.dim(0), static_cast<cudaStream_t>(cuda_stream()), hint),
            cudaSuccess);
  return y;
}

class Affine : public test::NeedsGpuDefaultLaunch {};

TEST_F(Affine, MatvecAndPrefillMatchTheDequantizedReference) {
  struct Shape2 { int64_t in, out; };
  const Shape2 shapes[] = {{512, 77}, {1024, 131}, {384, 33}};
  int n = 0;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (DType dt : {DType::bf16, DType::f16})
        for (int64_t T : {1, 2, 5, 8, 17, 64})
          for (bool with_bias : {false, true}) {
            const Shape2 s = shapes[n++ % 3];
            if (s.in % group) continue;
            const uint64_t seed = uint64_t(n) * 7919;
            Weight w(random_affine(s.out, s.in, bits, group, dt, seed), s.in);
            Tensor x = random({T, s.in}, DType::f32, seed + 3);
            Tensor b = with_bias ? random({s.out}, DType::f32, seed + 4, 0.1f) : Tensor();
            Tensor want = ops::linear(x, w.dequantize(DType::f32), b);
            Tensor got = ops::linear(gpu(x), w.to_device(Device::cuda), with_bias ? gpu(b) : Tensor());
            const bool matvec = T <= 8;
            const std::string label = fmt::format("int{} g{} {} T={} {}x{}{} {}", bits, group, dtype_name(dt), T, s.out,
                                                  s.in, with_bias ? " +bias" : "", matvec ? "matvec" : "gemm");
            // The matvec sums f32 products; the GEMM rounds x and w to bf16 first.
            EXPECT_LE(relative_error(got, want, label), matvec ? 1e-5f : 4e-3f) << label;
            if (matvec) {  // x read through L1 instead of staged
              EXPECT_LE(relative_error(launch_matvec(w.to_device(Device::cuda), gpu(x), with_bias ? gpu(b) : Tensor(),
                                              {.stage = 0}),
                                       want, label + " L1", false),
                        1e-5f)
                  << label << " L1";
            }
          }
}

// Lever tensor_core_affine_matvec: the tensor-core matvec (x rounded to 23 bits
// per group as three s8 digits, exact s32 sums) against the f32 reference: T 1-8, int4/int8,
// groups 32/64/128, scale dtypes, with and without bias, rows off the 16-row
// tiles, more tiles than blocks (9000 rows) and split-K (4096 wide). ops::linear
// runs it, under the lever, from 2 tokens where it applies (bit for bit the
// direct launch); elsewhere (one token of these small matrices, T > 8, a row
// not a whole number of stages) the other kernels, bit for bit.
TEST_F(Affine, TensorCoreMatvecMatchesTheDequantizedReference) {
  struct Shape2 { int64_t in, out; };
  const Shape2 shapes[] = {{512, 77}, {1024, 131}, {4096, 40}, {256, 9000}, {384, 33}};
  cudaStream_t stream = static_cast<cudaStream_t>(cuda_stream());
  int n = 0;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (DType dt : {DType::bf16, DType::f16, DType::f32})
        for (int64_t T : {1, 2, 3, 5, 8, 17})
          for (bool with_bias : {false, true}) {
            const Shape2 s = shapes[n++ % 5];
            if (s.in % group) continue;
            const uint64_t seed = uint64_t(n) * 104729;
            Weight w(random_affine(s.out, s.in, bits, group, dt, seed), s.in);
            Tensor x = random({T, s.in}, DType::f32, seed + 3);
            Tensor b = with_bias ? random({s.out}, DType::f32, seed + 4, 0.1f) : Tensor();
            Tensor want = ops::linear(x, w.dequantize(DType::f32), b);
            const Weight wg = w.to_device(Device::cuda);
            const Tensor xg = gpu(x), bg = with_bias ? gpu(b) : Tensor();
            const std::string label = fmt::format("tensor-core int{} g{} {} T={} {}x{}{}", bits, group, dtype_name(dt),
                                                  T, s.out, s.in, with_bias ? " +bias" : "");
            const mere::cuda::AffineArgs a = args_of(wg);
            const bool supported = mere::cuda::affine_matvec_mma_supports(a, T);
            // A stage: 128 bytes of a row and two groups at least.
            const int64_t stage_values = std::max<int64_t>(2 * group, 1024 / bits);
            const bool whole_stages = s.in % stage_values == 0;
            if (T <= 4 && whole_stages) {
              EXPECT_TRUE(supported) << label;
            }
            if (T > 8 || !whole_stages) {
              EXPECT_FALSE(supported) << label;
            }
            Tensor direct;
            if (supported) {
              direct = Tensor::empty({T, s.out}, DType::f32, Device::cuda);
              Tensor scratch =
                  Tensor::empty({mere::cuda::affine_matvec_mma_scratch_bytes(a, T)}, DType::u8, Device::cuda);
              const float* bias = with_bias ? bg.data<float>() : nullptr;
              ASSERT_EQ(mere::cuda::launch_affine_matvec_mma(a, xg.data<float>(), bias, direct.data<float>(), T,
                                                             scratch.raw(), stream),
                        cudaSuccess);
              EXPECT_LE(relative_error(direct, want, label), 1e-5f) << label;
              direct = direct.to_device(Device::cpu);
            }
            ops::set_launch_settings({});
            const Tensor cuda_cores = ops::linear(xg, wg, bg).to_device(Device::cpu);
            ops::set_launch_settings({.tensor_core_affine_matvec = true});
            const Tensor got = ops::linear(xg, wg, bg).to_device(Device::cpu);
            ops::set_launch_settings({});
            const bool applies = supported && T >= 2;
            const Tensor& expected = applies ? direct : cuda_cores;
            EXPECT_EQ(std::memcmp(got.raw(), expected.raw(), got.size_bytes()), 0) << label;
            if (applies) {
              EXPECT_NE(std::memcmp(got.raw(), cuda_cores.raw(), got.size_bytes()), 0) << label;
            }
          }
}

// Every tensor-core matvec kernel keeps its values in registers: without a
// blocks-an-SM bound, ptxas fitted the int8 MoE gate/up kernel in 80 registers
// with a spill in its loop, which cost Qwen3-30B-A3B int8 decode 2.3%.
TEST_F(Affine, TensorCoreMatvecKernelsDoNotSpill) {
  const mere::cuda::MmaKernelLocal most = mere::cuda::affine_matvec_mma_most_local();
  EXPECT_EQ(most.bytes, 0) << "local bytes a thread in the " << most.bits << "-bit g" << most.group << " "
                           << dtype_name(most.scale_dtype) << " kernel of " << most.mmas << " mmas and "
                           << most.digits << " digits, " << most.mode;
}

// Rows too long for x in one block's shared memory at this T (down_proj's
// 14336 columns from 4 tokens, 65536 from 1) run as launches of whole stages,
// each adding its columns' product into y: against the f32 reference, with
// the bias added once.
TEST_F(Affine, TensorCoreMatvecSplitsLongRowsIntoLaunches) {
  struct Case { int64_t T, out, in; int bits, group; };
  for (const Case& c : {Case{4, 100, 14336, 4, 64}, Case{8, 100, 14336, 8, 64}, Case{8, 40, 14336, 4, 32},
                        Case{3, 48, 65536, 4, 128}, Case{2, 16, 114688, 8, 64}}) {
    const std::string label = fmt::format("int{} g{} T={} {}x{}", c.bits, c.group, c.T, c.out, c.in);
    Weight w(random_affine(c.out, c.in, c.bits, c.group, DType::bf16, uint64_t(c.in + c.T)), c.in);
    const Tensor x = random({c.T, c.in}, DType::f32, 21), bias = random({c.out}, DType::f32, 22, 0.1f);
    const Tensor want = ops::linear(x, w.dequantize(DType::f32), bias);
    const Weight wg = w.to_device(Device::cuda);
    const mere::cuda::AffineArgs a = args_of(wg);
    ASSERT_TRUE(mere::cuda::affine_matvec_mma_supports(a, c.T)) << label;
    Tensor y = Tensor::empty({c.T, c.out}, DType::f32, Device::cuda);
    Tensor scratch = Tensor::empty({mere::cuda::affine_matvec_mma_scratch_bytes(a, c.T)}, DType::u8, Device::cuda);
    const Tensor xg = gpu(x), bg = gpu(bias);
    ASSERT_EQ(mere::cuda::launch_affine_matvec_mma(a, xg.data<float>(), bg.data<float>(), y.data<float>(), c.T,
                                                   scratch.raw(), static_cast<cudaStream_t>(cuda_stream())),
              cudaSuccess)
        << label;
    EXPECT_LE(relative_error(y.to_device(Device::cpu), want, "tensor-core " + label), 1e-5f);
  }
}

// A large matrix at one token: its 4,096 tiles fill the slots as well at split 1
// as at any (two waves of units), but two blocks an SM leave L1 too small for
// the factor lines of 16 tiles at once, so split-K takes more warps a tile
// (matvec_split.h); the product is still the reference's.
TEST_F(Affine, LargeMatrixSplitsForItsFactorLinesAndMatchesTheReference) {
  const int64_t in = 4096, out = 65536;
  for (int bits : {4, 8}) {
    const std::string label = fmt::format("int{} g64 T=1 {}x{}", bits, out, in);
    Weight w(random_affine(out, in, bits, 64, DType::bf16, uint64_t(31 + bits)), in);
    const Tensor x = random({1, in}, DType::f32, 32);
    const Tensor want = ops::linear(x, w.dequantize(DType::f32), Tensor());
    const Weight wg = w.to_device(Device::cuda);
    const mere::cuda::AffineArgs a = args_of(wg);
    EXPECT_GE(mere::cuda::affine_matvec_mma_split(a, 1), 2) << label;
    Tensor y = Tensor::empty({1, out}, DType::f32, Device::cuda);
    Tensor scratch = Tensor::empty({mere::cuda::affine_matvec_mma_scratch_bytes(a, 1)}, DType::u8, Device::cuda);
    const Tensor xg = gpu(x);
    ASSERT_EQ(mere::cuda::launch_affine_matvec_mma(a, xg.data<float>(), nullptr, y.data<float>(), 1,
                                                   scratch.raw(), static_cast<cudaStream_t>(cuda_stream())),
              cudaSuccess)
        << label;
    EXPECT_LE(relative_error(y.to_device(Device::cpu), want, "tensor-core " + label), 1e-5f);
  }
}

// One token of a matrix of 2^24 weights or more goes to the tensor cores under
// the lever (one of fewer stays on the CUDA cores: the test above), unless
// int8_activation_matvec is on.
TEST_F(Affine, TensorCoreMatvecTakesOneTokenOfALargeMatrix) {
  const int64_t in = 4096, out = 4096;
  Weight w(random_affine(out, in, 4, 64, DType::bf16, 91), in);
  const Tensor x = random({1, in}, DType::f32, 92);
  const Tensor want = ops::linear(x, w.dequantize(DType::f32), Tensor());
  const Weight wg = w.to_device(Device::cuda);
  const Tensor cuda_cores = ops::linear(gpu(x), wg, Tensor()).to_device(Device::cpu);
  ops::set_launch_settings({.tensor_core_affine_matvec = true});
  const Tensor got = ops::linear(gpu(x), wg, Tensor()).to_device(Device::cpu);
  ops::set_launch_settings({});
  EXPECT_LE(relative_error(got, want, "tensor-core int4 g64 T=1 4096x4096"), 1e-5f);
  EXPECT_NE(std::memcmp(got.raw(), cuda_cores.raw(), got.size_bytes()), 0);
  // int8_activation_matvec, the user's explicit accuracy trade, takes precedence.
  ops::set_launch_settings({.int8_activation_matvec = true});
  const Tensor int8_x = ops::linear(gpu(x), wg, Tensor()).to_device(Device::cpu);
  ops::set_launch_settings({.int8_activation_matvec = true, .tensor_core_affine_matvec = true});
  const Tensor both = ops::linear(gpu(x), wg, Tensor()).to_device(Device::cpu);
  ops::set_launch_settings({});
  EXPECT_EQ(std::memcmp(both.raw(), int8_x.raw(), both.size_bytes()), 0);
}

// Lever streamed_weights: the tensor-core matvec's weight copies take an L2
// evict-first policy, a cache hint only: ops::linear gives the same bits with
// the lever on and off, at one token (three digits) and 2, 5 and 8 (two
// digits), for int4 and int8, groups of 32, 64 and 128, and a row cut into
// launches (14336 columns at 8 tokens); the launch settings switch the flag.
TEST_F(Affine, StreamedWeightsGiveTheSameBits) {
  struct Case {
    int64_t T, out, in;
    int bits, group;
  };
  int n = 0;
  for (const Case& c : {Case{1, 4096, 4096, 4, 64}, Case{2, 1024, 4096, 8, 64}, Case{8, 512, 2048, 4, 32},
                        Case{8, 256, 14336, 4, 64}, Case{5, 384, 1024, 8, 128}}) {
    const std::string label = fmt::format("int{} g{} T={} {}x{}", c.bits, c.group, c.T, c.out, c.in);
    const Weight wg = Weight(random_affine(c.out, c.in, c.bits, c.group, DType::bf16, uint64_t(3000 + n++)), c.in)
                          .to_device(Device::cuda);
    const Tensor xg = gpu(random({c.T, c.in}, DType::f32, uint64_t(n))), bg = gpu(random({c.out}, DType::f32, 7, 0.1f));
    ops::set_launch_settings({.tensor_core_affine_matvec = true, .int16_activation_matvec = true});
    EXPECT_FALSE(mere::cuda::streamed_weights_enabled());
    const Tensor normal = ops::linear(xg, wg, bg).to_device(Device::cpu);
    ops::set_launch_settings({.tensor_core_affine_matvec = true, .int16_activation_matvec = true,
                              .streamed_weights = true});
    EXPECT_TRUE(mere::cuda::streamed_weights_enabled());
    const auto kernels = test::kernel_launches_by([&] { ops::linear(xg, wg, bg); });
    const Tensor streamed = ops::linear(xg, wg, bg).to_device(Device::cpu);
    ops::set_launch_settings({});
    EXPECT_TRUE(std::any_of(kernels.begin(), kernels.end(),
                            [](const auto& k) { return k.name.find("affine_matvec_mma_kernel") != std::string::npos; }))
        << label << ": the tensor-core matvec ran";
    EXPECT_EQ(std::memcmp(streamed.raw(), normal.raw(), normal.size_bytes()), 0) << label;
  }
}

// The lever's other decode matvecs: bf16 weights (matvec.cu), an affine matrix
// below the tensor cores' one-token floor (the CUDA-core kernel) and FP8 on
// the tensor cores give the same bits with the lever on and off.
TEST_F(Affine, StreamedWeightsGiveTheSameBitsOnEveryDecodeMatvec) {
  const Weight bf16(random({768, 1024}, DType::bf16, 41, 0.05f));
  const Weight small(random_affine(256, 1024, 4, 64, DType::bf16, 42), 1024);
  const Weight fp8(test::random_fp8(512, 1024, 128, 43));
  int n = 0;
  for (const Weight* w : {&bf16, &small, &fp8})
    for (int64_t T : {1, 3, 8}) {
      const std::string label = fmt::format("weight {} T={}", n++, T);
      const Weight wg = w->to_device(Device::cuda);
      const Tensor xg = gpu(random({T, 1024}, DType::f32, uint64_t(50 + n)));
      ops::set_launch_settings({.tensor_core_fp8_matvec = true});
      const Tensor normal = ops::linear(xg, wg, Tensor()).to_device(Device::cpu);
      ops::set_launch_settings({.tensor_core_fp8_matvec = true, .streamed_weights = true});
      const Tensor streamed = ops::linear(xg, wg, Tensor()).to_device(Device::cpu);
      ops::set_launch_settings({});
      EXPECT_EQ(std::memcmp(streamed.raw(), normal.raw(), normal.size_bytes()), 0) << label;
    }
}

// The query behind lever fused_norm_matvec's auto mode: an affine weight on the
// GPU at or above the one-token floor (2^24 weights) takes the tensor cores at
// one row; a smaller one only from two rows; the same weight on the CPU, or a
// dense one, never.
TEST_F(Affine, TensorCoreQueryFollowsTheFloorAtOneRow) {
  const Weight host_large(random_affine(4096, 4096, 4, 64, DType::bf16, 93), 4096);
  const Weight large = host_large.to_device(Device::cuda);
  const Weight small =
      Weight(random_affine(4095 - 4095 % 16, 4096, 8, 64, DType::bf16, 94), 4096).to_device(Device::cuda);
  const Weight dense = host_large.dequantize(DType::bf16).to_device(Device::cuda);
  EXPECT_TRUE(ops::matvec_on_tensor_cores(large, 1));
  EXPECT_FALSE(ops::matvec_on_tensor_cores(small, 1));
  for (int64_t T = 1; T <= ops::kMaxFusedRows; ++T) {
    if (T >= 2) {
      EXPECT_TRUE(ops::matvec_on_tensor_cores(small, T)) << T;
    }
    EXPECT_FALSE(ops::matvec_on_tensor_cores(host_large, T)) << T;
    EXPECT_FALSE(ops::matvec_on_tensor_cores(dense, T)) << T;
  }
  // In a fused form (its input formed by the prepare kernel) the floor is 2^23:
  // Qwen3-30B-A3B's o_proj (2048 x 4096) passes, half of it does not.
  const Weight o_proj = Weight(random_affine(2048, 4096, 4, 64, DType::bf16, 95), 4096).to_device(Device::cuda);
  const Weight half = Weight(random_affine(1024, 4096, 4, 64, DType::bf16, 96), 4096).to_device(Device::cuda);
  EXPECT_FALSE(ops::matvec_on_tensor_cores(o_proj, 1));
  EXPECT_TRUE(ops::matvec_on_tensor_cores(o_proj, 1, true));
  EXPECT_FALSE(ops::matvec_on_tensor_cores(half, 1, true));
  EXPECT_TRUE(ops::matvec_on_tensor_cores(half, 2, true));
  // Auto folds a step where the lever takes its matrices, and not under int8_activation_matvec.
  LoadOptions o{.tensor_core_affine_matvec = true};
  EXPECT_TRUE(folding_pays(o_proj, o, 1));
  EXPECT_FALSE(folding_pays(half, o, 1));
  EXPECT_TRUE(folding_pays(half, o, 8));
  o.int8_activation_matvec = true;
  EXPECT_FALSE(folding_pays(o_proj, o, 1));
  EXPECT_FALSE(folding_pays(half, o, 2));
}

// The fused decode forms (lever fused_norm_matvec) on the tensor-core matvec:
// RMSNorm(h) w formed as x is converted, silu(gate) up likewise, and the
// product added into the residual, against the CPU composition on the
// dequantized weights; the kernel must take each (the direct calls say so).
TEST_F(Affine, TensorCoreMatvecFormsItsInputAndAddsIntoTheResidual) {
  struct Case { int64_t T, out, in; int bits, group; DType norm_dt; };
  // The last two rows are too long for x in shared memory at 8 tokens: each launch takes part of them.
  // 3-4 tokens of 4096 columns: one block an SM (x's copy is large), as Llama-3-8B's qkv and gate_up at B = 4.
  // 16,896 columns: the RMSNorm prepare's threads hold 8 runs each and loop over the rest.
  for (const Case& c : {Case{2, 96, 1024, 4, 64, DType::bf16}, Case{5, 130, 512, 8, 32, DType::f32},
                        Case{8, 64, 2048, 4, 128, DType::f16}, Case{1, 4096, 4096, 8, 64, DType::bf16},
                        Case{4, 300, 4096, 4, 64, DType::bf16}, Case{3, 97, 4096, 8, 128, DType::f16},
                        Case{8, 80, 14336, 4, 64, DType::bf16}, Case{7, 33, 14336, 8, 32, DType::f32},
                        Case{2, 48, 16896, 4, 64, DType::bf16}}) {
    Weight w(random_affine(c.out, c.in, c.bits, c.group, DType::bf16, uint64_t(c.T * 7 + c.bits)), c.in);
    const Tensor dense = w.dequantize(DType::f32);
    const Weight wg = w.to_device(Device::cuda);
    const Tensor h = random({c.T, c.in}, DType::f32, 11, 2.0f), norm_w = random({c.in}, c.norm_dt, 12, 0.5f, 1.0f);
    const Tensor x = random({c.T, c.in}, DType::f32, 13), gate_up = random({c.T, 2 * c.in}, DType::f32, 14, 3.0f);
    const Tensor residual = random({c.T, c.out}, DType::f32, 15), bias = random({c.out}, DType::f32, 16, 0.1f);
    for (bool int16 : {false, true}) {  // x in three digits, or two (lever int16_activation_matvec)
      ops::set_launch_settings({.tensor_core_affine_matvec = true, .int16_activation_matvec = int16});
      // Three digits: the f32 product; two: x rounded to 15 bits a group, a bounded change.
      const float tol = int16 ? 2e-4f : 1e-5f;
      const std::string label = fmt::format("int{} g{} T={} {}x{}{}", c.bits, c.group, c.T, c.out, c.in,
                                            int16 ? " int16 x" : "");

      const Tensor normed_want = ops::linear(ops::rms_norm(h, norm_w, 1e-5f), dense, bias);
      Tensor normed = Tensor::empty({c.T, c.out}, DType::f32, Device::cuda);
      EXPECT_TRUE(ops::cuda::affine_rms_norm_linear(gpu(h), gpu(norm_w), 1e-5f, wg.affine(), gpu(bias), normed))
          << label;
      EXPECT_LE(relative_error(normed.to_device(Device::cpu), normed_want, label + " rms_norm_linear"), tol);
      const Tensor via_ops = ops::rms_norm_linear(gpu(h), gpu(norm_w), 1e-5f, wg, gpu(bias)).to_device(Device::cpu);
      EXPECT_EQ(std::memcmp(via_ops.raw(), normed.to_device(Device::cpu).raw(), via_ops.size_bytes()), 0) << label;

      Tensor added_want = residual.clone();
      ops::add_inplace(added_want, ops::linear(x, dense, bias));
      Tensor added = gpu(residual);
      EXPECT_TRUE(ops::cuda::affine_linear_add(added, gpu(x), wg.affine(), gpu(bias))) << label;
      EXPECT_LE(relative_error(added.to_device(Device::cpu), added_want, label + " linear_add"), tol);

      Tensor gated_want = residual.clone();
      ops::add_inplace(gated_want, ops::linear(ops::silu_mul_halves(gate_up), dense, bias));
      Tensor gated = gpu(residual);
      EXPECT_TRUE(ops::cuda::affine_swiglu_linear_add(gated, gpu(gate_up), wg.affine(), gpu(bias))) << label;
      EXPECT_LE(relative_error(gated.to_device(Device::cpu), gated_want, label + " swiglu_linear_add"), tol);
      // The fused add equals the composition on the GPU bit for bit (the same
      // product, then the same add) where one launch takes the whole row.
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
      EXPECT_FALSE(ops::cuda::affine_linear_add(declined, gpu(x), wg.affine(), gpu(bias))) << label;
    }
  }
}

// o_proj's fused input (lever fused_norm_matvec): split-K attention's partials,
// merged by the matvec's prepare kernel, against the merge done on the CPU in
// double, then the dequantized product. Some splits are empty (max -inf, the
// outputs never written), as the last splits of a short context are.
TEST_F(Affine, TensorCoreMatvecMergesAttentionSplitsIntoItsInput) {
  struct Case { int64_t T, heads, splits, head_dim, out; int bits, group; };
  for (const Case& c : {Case{1, 32, 33, 128, 4096, 4, 64}, Case{3, 8, 5, 64, 200, 8, 32},
                        Case{8, 4, 1, 128, 96, 4, 128}, Case{2, 16, 64, 64, 130, 8, 64},
                        Case{4, 32, 17, 128, 256, 4, 64}}) {
    const int64_t in = c.heads * c.head_dim;
    const std::string label = fmt::format("int{} g{} T={} {} heads x {} splits x {}", c.bits, c.group, c.T, c.heads,
                                          c.splits, c.head_dim);
    Weight w(random_affine(c.out, in, c.bits, c.group, DType::bf16, uint64_t(c.T * 5 + c.splits)), in);
    const Weight wg = w.to_device(Device::cuda);
    const ops::AttentionSplits cpu = test::random_attention_splits(c.T, c.heads, c.splits, c.head_dim);
    const Tensor merged = test::merged_on_cpu(cpu);
    const ops::AttentionSplits splits{.max = gpu(cpu.max), .sum = gpu(cpu.sum), .out = gpu(cpu.out)};
    const Tensor residual = random({c.T, c.out}, DType::f32, 24), bias = random({c.out}, DType::f32, 25, 0.1f);
    Tensor want = residual.clone();
    ops::add_inplace(want, ops::linear(merged, w.dequantize(DType::f32), bias));

    EXPECT_LE(relative_error(ops::merge_attention(splits).to_device(Device::cpu).reshape({c.T, in}), merged,
                             label + " merge_attention"),
              1e-6f);
    ops::set_launch_settings({.tensor_core_affine_matvec = true});
    Tensor fused = gpu(residual);
    EXPECT_TRUE(ops::cuda::affine_attention_linear_add(fused, splits, wg.affine(), gpu(bias))) << label;
    EXPECT_LE(relative_error(fused.to_device(Device::cpu), want, label + " fused"), 1e-5f);
    Tensor via_ops = gpu(residual);
    ops::attention_linear_add(via_ops, splits, wg, gpu(bias));
    EXPECT_EQ(std::memcmp(via_ops.to_device(Device::cpu).raw(), fused.to_device(Device::cpu).raw(), fused.size_bytes()),
              0)
        << label;
    // Under lever int16_activation_matvec the merged input of 2 tokens or more is rounded to 15 bits a group.
    ops::set_launch_settings({.tensor_core_affine_matvec = true, .int16_activation_matvec = true});
    Tensor int16_x = gpu(residual);
    EXPECT_TRUE(ops::cuda::affine_attention_linear_add(int16_x, splits, wg.affine(), gpu(bias))) << label;
    EXPECT_LE(relative_error(int16_x.to_device(Device::cpu), want, label + " fused, int16 x"), 2e-4f);
    // One token keeps three digits.
    const bool same = std::memcmp(int16_x.to_device(Device::cpu).raw(), fused.to_device(Device::cpu).raw(),
                                  fused.size_bytes()) == 0;
    EXPECT_EQ(same, c.T == 1) << label;
    ops::set_launch_settings({});
    // Without the lever the fused form declines; the op merges, then multiplies.
    Tensor declined = gpu(residual);
    EXPECT_FALSE(ops::cuda::affine_attention_linear_add(declined, splits, wg.affine(), gpu(bias))) << label;
    ops::attention_linear_add(declined, splits, wg, gpu(bias));
    EXPECT_LE(relative_error(declined.to_device(Device::cpu), want, label + " merged, then multiplied"), 1e-5f);

    // A wide attention grid writes only its first splits (AttentionSplits::live)
    // and marks the rest empty; the prepare reads only those. Garbage past them
    // (a huge max, NaN outputs) would poison the merge if it were read.
    if (c.splits > 2) {
      const test::LiveSplits live = test::live_splits_on_gpu(cpu, (c.splits + 1) / 2);
      ops::set_launch_settings({.tensor_core_affine_matvec = true});
      Tensor want_live = gpu(residual), got_live = gpu(residual);
      EXPECT_TRUE(ops::cuda::affine_attention_linear_add(want_live, live.marked, wg.affine(), gpu(bias))) << label;
      EXPECT_TRUE(ops::cuda::affine_attention_linear_add(got_live, live.garbage, wg.affine(), gpu(bias))) << label;
      ops::set_launch_settings({});
      EXPECT_LE(relative_error(got_live.to_device(Device::cpu), want_live.to_device(Device::cpu),
                               label + " live splits", false),
                1e-6f);
    }
  }
}

// x far outside f16's range, in both directions and in one row: each group of
// each token is scaled by its own power of two before it is rounded to digits,
// so huge values do not overflow and tiny ones keep their digits; a NaN gives
// NaN outputs.
TEST_F(Affine, TensorCoreMatvecKeepsHugeAndTinyInputs) {
  for (int bits : {4, 8})
    test::expect_huge_tiny_and_nan_inputs(Weight(random_affine(96, 1024, bits, 64, DType::bf16, 77 + bits), 1024),
                                          {.tensor_core_affine_matvec = true}, 64, fmt::format("int{}", bits));
}

// The two-digit tensor-core matvec (x rounded to 15 bits a group) launched
// directly, whatever the levers say; y on the CPU.
Tensor direct_two_digit_matvec(const Weight& wg, const Tensor& xg, const Tensor& bg, const std::string& label) {
  const mere::cuda::AffineArgs a = args_of(wg);
  const int64_t T = xg.dim(0);
  Tensor y = Tensor::empty({T, wg.rows()}, DType::f32, Device::cuda);
  Tensor scratch = Tensor::empty({mere::cuda::affine_matvec_mma_scratch_bytes(a, T, 2)}, DType::u8, Device::cuda);
  EXPECT_EQ(mere::cuda::launch_affine_matvec_mma(a, xg.data<float>(), bg.data<float>(), y.data<float>(), T,
                                                 scratch.raw(), static_cast<cudaStream_t>(cuda_stream()), 2),
            cudaSuccess)
      << label;
  return y.to_device(Device::cpu);
}

// Lever int16_activation_matvec: the tensor-core matvec on x in two digits (15
// bits a group, four tokens an mma) equals the f32 product on x rounded that
// way: T 1-16 (one to four mmas; 9-16 under lever sixteen_token_matvec, where
// three digits stop), int4/int8, groups 32/64/128, scale dtypes, rows off the
// tiles, more tiles than blocks, split-K and rows cut into launches (down_proj's
// 14,336 columns; Qwen3-4B's 9,728 at 16 tokens of int4 into three, the last
// shorter, under lever uneven_row_cuts). ops::linear runs it under the levers
// from 2 tokens (bit for bit the direct launch; one token keeps three digits),
// and against the exact three-digit form it moves the product by the rounding
// alone.
TEST_F(Affine, Int16ActivationsMatchTheRoundedReference) {
  struct Case { int64_t T, out, in; int bits, group; DType dt; };
  int n = 0;
  for (const Case& c : {Case{1, 77, 512, 4, 64, DType::bf16}, Case{2, 131, 1024, 8, 32, DType::f16},
                        Case{3, 40, 4096, 4, 64, DType::bf16}, Case{4, 9000, 256, 8, 128, DType::f32},
                        Case{5, 33, 512, 4, 128, DType::bf16}, Case{6, 300, 2048, 8, 64, DType::bf16},
                        Case{7, 64, 4096, 4, 32, DType::f16}, Case{8, 48, 1024, 8, 64, DType::bf16},
                        Case{8, 100, 14336, 4, 64, DType::bf16}, Case{1, 4096, 4096, 4, 64, DType::bf16},
                        // 9-16 tokens (three or four mmas, lever sixteen_token_matvec)
                        Case{9, 77, 512, 4, 64, DType::bf16}, Case{10, 131, 1024, 8, 32, DType::f16},
                        Case{12, 40, 4096, 4, 128, DType::bf16}, Case{13, 9000, 256, 8, 128, DType::f32},
                        Case{16, 300, 4096, 4, 64, DType::bf16}, Case{16, 64, 4096, 8, 64, DType::bf16},
                        Case{15, 48, 2048, 4, 32, DType::f16}, Case{16, 100, 14336, 4, 64, DType::bf16},
                        Case{11, 64, 14336, 8, 128, DType::bf16},
                        // Qwen3-4B's down_proj row: int4 (38 stages) has no equal cut that fits, so three
                        // launches, the last shorter; int8 (76 stages) four equal ones
                        Case{16, 100, 9728, 4, 64, DType::bf16}, Case{16, 72, 9728, 8, 64, DType::f16}}) {
    const std::string label =
        fmt::format("int16 x, int{} g{} {} T={} {}x{}", c.bits, c.group, dtype_name(c.dt), c.T, c.out, c.in);
    Weight w(random_affine(c.out, c.in, c.bits, c.group, c.dt, uint64_t(2000 + n++)), c.in);
    Tensor x = random({c.T, c.in}, DType::f32, uint64_t(n));
    x.data<float>()[37] = 40.0f;  // an outlier: the rest of its group keeps fewer bits
    const Tensor b = random({c.out}, DType::f32, 6, 0.1f);
    const Tensor dense = w.dequantize(DType::f32);
    const Tensor want = ops::linear(int16_rounded(x, c.group), dense, b);
    const Tensor exact = ops::linear(x, dense, b);
    const Weight wg = w.to_device(Device::cuda);
    const Tensor xg = gpu(x), bg = gpu(b);
    const mere::cuda::AffineArgs a = args_of(wg);
    ops::set_launch_settings({.uneven_row_cuts = true});
    ASSERT_TRUE(mere::cuda::affine_matvec_mma_supports(a, c.T, 2)) << label;
    const Tensor got = direct_two_digit_matvec(wg, xg, bg, label);
    EXPECT_LE(relative_error(got, want, label), 1e-5f) << label;
    // What the rounding costs against f32 x (about 2^-14 of a group's largest value a term).
    EXPECT_LE(relative_error(got, exact, label + ": against f32 x"), 1e-3f);
    EXPECT_GT(test::max_abs_diff(got, exact).diff, 0.0f) << label << ": the rounding changed nothing";

    ops::set_launch_settings({.tensor_core_affine_matvec = true, .int16_activation_matvec = true,
                              .sixteen_token_matvec = true, .uneven_row_cuts = true});
    const Tensor lever = ops::linear(xg, wg, bg).to_device(Device::cpu);
    ops::set_launch_settings({.tensor_core_affine_matvec = true, .uneven_row_cuts = true});
    const Tensor three_digits = ops::linear(xg, wg, bg).to_device(Device::cpu);
    ops::set_launch_settings({});
    if (c.T >= 2) {
      EXPECT_EQ(std::memcmp(lever.raw(), got.raw(), got.size_bytes()), 0) << label << ": ops::linear under the lever";
    } else {  // one token keeps three digits (or the CUDA-core kernel below the tensor cores' floor)
      EXPECT_EQ(std::memcmp(lever.raw(), three_digits.raw(), got.size_bytes()), 0) << label;
    }
    if (c.T > 8) {
      EXPECT_FALSE(mere::cuda::affine_matvec_mma_supports(a, c.T, 3)) << label << ": three digits stop at 8";
    }
    if (c.in == 9728 && c.bits == 4) {  // lever uneven_row_cuts: 13 + 13 + 12 stages; no equal cut fits
      ops::set_launch_settings({.tensor_core_affine_matvec = true, .int16_activation_matvec = true,
                                .sixteen_token_matvec = true, .uneven_row_cuts = true});
      size_t launches = 0;
      for (const auto& k : test::kernel_launches_by([&] { ops::linear(xg, wg, bg); }))
        launches += k.name.find("matvec_mma_kernel") != std::string::npos;
      ops::set_launch_settings({});
      EXPECT_EQ(launches, 3u) << label;
      EXPECT_FALSE(mere::cuda::affine_matvec_mma_supports(a, c.T, 2)) << label << ": without uneven_row_cuts";
    }
  }
}

// Lever sixteen_token_matvec (its products: the test above): ops::linear takes
// 9-16 tokens on the two-digit matvec only under the lever, the prefill GEMM
// (x and the weights rounded to bf16) without it; 17 tokens stay unsupported.
// The fused forms (RMSNorm'd input, SwiGLU, attention's splits merged, the
// residual add) take 12 and 16 tokens too.
TEST_F(Affine, SixteenTokenMatvecTakesNineToSixteenTokens) {
  struct Case { int64_t T, out, in; int bits, group; DType dt; };
  {
    const Weight w(random_affine(300, 4096, 4, 64, DType::bf16, 3001), 4096);
    const Tensor x = random({16, 4096}, DType::f32, 41), b = random({300}, DType::f32, 6, 0.1f);
    const Tensor exact = ops::linear(x, w.dequantize(DType::f32), b);
    const Weight wg = w.to_device(Device::cuda);
    const Tensor xg = gpu(x), bg = gpu(b);
    const Tensor got = direct_two_digit_matvec(wg, xg, bg, "16 tokens");
    ops::set_launch_settings(
        {.tensor_core_affine_matvec = true, .int16_activation_matvec = true, .sixteen_token_matvec = true});
    const Tensor lever = ops::linear(xg, wg, bg).to_device(Device::cpu);
    ops::set_launch_settings({.tensor_core_affine_matvec = true, .int16_activation_matvec = true,
                              .tensor_core_affine_gemm = true, .affine_gemm_at_every_size = true});
    const Tensor gemm = ops::linear(xg, wg, bg).to_device(Device::cpu);
    ops::set_launch_settings({});
    EXPECT_EQ(std::memcmp(lever.raw(), got.raw(), got.size_bytes()), 0) << "ops::linear under the lever";
    EXPECT_NE(std::memcmp(gemm.raw(), got.raw(), got.size_bytes()), 0) << "the GEMM without the lever";
    EXPECT_LE(relative_error(gemm, exact, "the GEMM"), 2e-2f);
    EXPECT_FALSE(mere::cuda::affine_matvec_mma_supports(args_of(wg), 17, 2)) << "17 tokens";
  }

  // The fused forms at 12 and 16 tokens, against the CPU composition on x rounded as the prepare rounds it.
  for (const Case& c : {Case{16, 96, 4096, 4, 64, DType::bf16}, Case{12, 130, 14336, 8, 32, DType::bf16}}) {
    const std::string label = fmt::format("fused, int{} g{} T={} {}x{}", c.bits, c.group, c.T, c.out, c.in);
    Weight w(random_affine(c.out, c.in, c.bits, c.group, c.dt, uint64_t(c.T * 3 + c.bits)), c.in);
    const Tensor dense = w.dequantize(DType::f32);
    const Weight wg = w.to_device(Device::cuda);
    const Tensor h = random({c.T, c.in}, DType::f32, 11, 2.0f), norm_w = random({c.in}, DType::bf16, 12, 0.5f, 1.0f);
    const Tensor gate_up = random({c.T, 2 * c.in}, DType::f32, 14, 3.0f);
    const Tensor residual = random({c.T, c.out}, DType::f32, 15), bias = random({c.out}, DType::f32, 16, 0.1f);
    ops::set_launch_settings({.tensor_core_affine_matvec = true, .int16_activation_matvec = true,
                              .sixteen_token_matvec = true});
    Tensor normed = Tensor::empty({c.T, c.out}, DType::f32, Device::cuda);
    EXPECT_TRUE(ops::cuda::affine_rms_norm_linear(gpu(h), gpu(norm_w), 1e-5f, wg.affine(), gpu(bias), normed))
        << label;
    const Tensor normed_want =
        ops::linear(int16_rounded(ops::rms_norm(h, norm_w, 1e-5f), c.group), dense, bias);
    // The prepare's f32 RMSNorm and silu may round a value across a 15-bit boundary of x the CPU's did not.
    EXPECT_LE(relative_error(normed.to_device(Device::cpu), normed_want, label + " rms_norm_linear"), 1e-4f);
    Tensor gated = gpu(residual);
    EXPECT_TRUE(ops::cuda::affine_swiglu_linear_add(gated, gpu(gate_up), wg.affine(), gpu(bias))) << label;
    Tensor gated_want = residual.clone();
    ops::add_inplace(gated_want, ops::linear(int16_rounded(ops::silu_mul_halves(gate_up), c.group), dense, bias));
    EXPECT_LE(relative_error(gated.to_device(Device::cpu), gated_want, label + " swiglu_linear_add"), 1e-4f);
    if (c.in == 4096) {  // o_proj's input: 32 heads of 128, 9 splits
      const ops::AttentionSplits cpu = test::random_attention_splits(c.T, 32, 9, 128);
      const ops::AttentionSplits splits{.max = gpu(cpu.max), .sum = gpu(cpu.sum), .out = gpu(cpu.out)};
      Tensor fused = gpu(residual);
      EXPECT_TRUE(ops::cuda::affine_attention_linear_add(fused, splits, wg.affine(), gpu(bias))) << label;
      Tensor want = residual.clone();
      ops::add_inplace(want, ops::linear(int16_rounded(test::merged_on_cpu(cpu), c.group), dense, bias));
      EXPECT_LE(relative_error(fused.to_device(Device::cpu), want, label + " attention_linear_add"), 1e-4f);
    }
    ops::set_launch_settings({.tensor_core_affine_matvec = true, .int16_activation_matvec = true});
    Tensor declined = gpu(residual);
    EXPECT_FALSE(ops::cuda::affine_linear_add(declined, gpu(h), wg.affine(), gpu(bias))) << label << ": lever off";
    ops::set_launch_settings({});
  }
}

// int8 down_proj at four tokens (x in two digits, as a decode step of four
// sequences runs it): one block an SM of about 198 KB leaves 28 KB of L1, where
// no split's factor lines fit; the rule then takes the most warps a tile its
// guard allows (8; the fill alone gives 4 on 132 SMs), and the split sums
// still equal the f32 product on x rounded to two digits.
TEST_F(Affine, DownProjWithNoSplitFittingL1TakesTheMostWarpsAndMatchesTheReference) {
  const int64_t in = 14336, out = 4096, T = 4;
  Weight w(random_affine(out, in, 8, 64, DType::bf16, 4101), in);
  const Tensor x = random({T, in}, DType::f32, 4102);
  const Tensor want = ops::linear(int16_rounded(x, 64), w.dequantize(DType::f32), Tensor());
  const Weight wg = w.to_device(Device::cuda);
  const mere::cuda::AffineArgs a = args_of(wg);
  ASSERT_TRUE(mere::cuda::affine_matvec_mma_supports(a, T, 2));
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  if (sms == 132) {
    EXPECT_EQ(mere::cuda::affine_matvec_mma_split(a, T, 2), 8);
  }
  Tensor y = Tensor::empty({T, out}, DType::f32, Device::cuda);
  Tensor scratch = Tensor::empty({mere::cuda::affine_matvec_mma_scratch_bytes(a, T, 2)}, DType::u8, Device::cuda);
  const Tensor xg = gpu(x);
  ASSERT_EQ(mere::cuda::launch_affine_matvec_mma(a, xg.data<float>(), nullptr, y.data<float>(), T, scratch.raw(),
                                                 static_cast<cudaStream_t>(cuda_stream()), 2),
            cudaSuccess);
  EXPECT_LE(relative_error(y.to_device(Device::cpu), want, "int8 g64 T=4 4096x14336, int16 x"), 1e-5f);
}

// ops::linear of x [T, in] on the tensor-core matvec under `settings` (reset
// after): the kernels it launches, its output on the CPU, and the split the
// matvec takes with x in `digits` digits.
struct LinearRun {
  Tensor y;
  std::vector<std::string> names;
  int split;
};
LinearRun run_linear_with(const ops::LaunchSettings& settings, const Tensor& xg, const Weight& wg, int digits) {
  ops::set_launch_settings(settings);
  LinearRun r;
  for (const auto& launch : test::kernel_launches_by([&] { (void)ops::linear(xg, wg, Tensor()); }))
    r.names.push_back(launch.name);
  r.y = ops::linear(xg, wg, Tensor()).to_device(Device::cpu);
  r.split = mere::cuda::affine_matvec_mma_split(args_of(wg), xg.dim(0), digits);
  ops::set_launch_settings({});
  return r;
}

// Lever wide_batch_stages: at 5-8 tokens (two digits of x) of int8 weights the
// tensor-core matvec reads 256 bytes of each row a stage (its own kernel: the
// matvec's name changes, the prepare's does not) where its blocks an SM stay:
// 4,096 columns, whose image leaves one block an SM at 128-byte stages too.
// Not: int4, f32 scales, four tokens (one mma), a short row (two blocks an SM
// at 128 bytes, one at 256), down_proj's row at 8 tokens (two launches whose
// image and wider rings would not fit), g128 (its stages already take 256
// bytes). The same group sums; where the split stays the same bits, else the
// f32 sums regroup: within 1e-5 of the lever off, and both within 1e-3 of the
// f32 product on x itself.
TEST_F(Affine, WideBatchStagesMoveOnlyTheRounding) {
  struct Case {
    int64_t T, out, in;
    int bits, group;
    DType dt;
    bool wide;
  };
  int n = 0;
  for (const Case& c : {Case{8, 6144, 4096, 8, 64, DType::bf16, true}, Case{5, 4096, 4096, 8, 64, DType::f16, true},
                        Case{7, 2056, 4096, 8, 32, DType::bf16, true}, Case{8, 28672, 4096, 8, 64, DType::bf16, true},
                        Case{6, 4096, 4096, 4, 64, DType::bf16, false}, Case{8, 4096, 4096, 8, 64, DType::f32, false},
                        Case{4, 4096, 4096, 8, 64, DType::bf16, false}, Case{8, 1024, 1024, 8, 64, DType::bf16, false},
                        Case{8, 4096, 14336, 8, 64, DType::bf16, false},
                        Case{8, 4096, 4096, 8, 128, DType::bf16, false}}) {
    const std::string label = fmt::format("int{} g{} {} T={} {}x{}", c.bits, c.group, dtype_name(c.dt), c.T, c.out, c.in);
    Weight w(random_affine(c.out, c.in, c.bits, c.group, c.dt, uint64_t(5300 + n++)), c.in);
    const Tensor x = random({c.T, c.in}, DType::f32, uint64_t(5400 + n));
    const Tensor want = ops::linear(x, w.dequantize(DType::f32), Tensor());
    const Weight wg = w.to_device(Device::cuda);
    const Tensor xg = gpu(x);
    auto run_with = [&](bool wide) {
      return run_linear_with(
          {.tensor_core_affine_matvec = true, .int16_activation_matvec = true, .wide_batch_stages = wide}, xg, wg, 2);
    };
    const LinearRun off = run_with(false), on = run_with(true);
    ASSERT_GE(off.names.size(), 2u) << label << ": the prepare and the matvec";
    ASSERT_EQ(on.names.size(), off.names.size()) << label;
    EXPECT_EQ(on.names[0], off.names[0]) << label << ": the prepare kernel";
    if (c.wide) {
      EXPECT_NE(on.names[1], off.names[1]) << label << ": the wide stages are their own kernel";
    } else {
      EXPECT_EQ(on.names, off.names) << label;
      EXPECT_EQ(std::memcmp(on.y.raw(), off.y.raw(), on.y.size_bytes()), 0) << label;
    }
    if (on.split == off.split) {
      EXPECT_EQ(std::memcmp(on.y.raw(), off.y.raw(), on.y.size_bytes()), 0) << label << ": the same split";
    }
    EXPECT_LE(relative_error(on.y, off.y, label + ", wide against 128-byte stages"), 1e-5f);
    EXPECT_LE(relative_error(on.y, want, label + ", wide stages"), 1e-3f);
    EXPECT_LE(relative_error(off.y, want, label + ", 128-byte stages"), 1e-3f);
  }
}

// Lever deep_dense_ring: one token of int8 weights on the tensor cores keeps
// five ring stages a warp (its own kernel: the matvec's name changes, the
// prepare's does not); int4, two tokens and rows cut into launches keep three
// (the same kernels and bits), as do launches whose blocks an SM five stages
// would lower. Where the split stays, the bits are the same;
// the smaller L1 beside the deeper ring may raise the split (the f32 sums
// regroup): within 1e-5 of the f32 reference either way.
TEST_F(Affine, DeepDenseRingAtOneTokenOfInt8MovesOnlyTheRounding) {
  struct Case {
    int64_t T, out, in;
    int bits, group;
    DType dt;
    bool deep;
  };
  int n = 0;
  // down_proj's long row (x's image leaves one block an SM at three stages as
  // at five) and g128 take it; 4,096 columns at g32/g64 hold two blocks an SM
  // at three stages and one at five, so they keep three.
  for (const Case& c : {Case{1, 4096, 14336, 8, 64, DType::bf16, true}, Case{1, 32768, 4096, 8, 128, DType::f32, true},
                        Case{1, 4096, 4096, 8, 64, DType::bf16, false}, Case{1, 6144, 4096, 8, 32, DType::f16, false},
                        Case{1, 4096, 4096, 4, 64, DType::bf16, false}, Case{2, 4096, 14336, 8, 64, DType::bf16, false}}) {
    const std::string label = fmt::format("int{} g{} {} T={} {}x{}", c.bits, c.group, dtype_name(c.dt), c.T, c.out, c.in);
    Weight w(random_affine(c.out, c.in, c.bits, c.group, c.dt, uint64_t(5100 + n++)), c.in);
    const Tensor x = random({c.T, c.in}, DType::f32, uint64_t(5200 + n));
    const Tensor want = ops::linear(x, w.dequantize(DType::f32), Tensor());
    const Weight wg = w.to_device(Device::cuda);
    const Tensor xg = gpu(x);
    auto run_with = [&](bool deep) {
      return run_linear_with({.tensor_core_affine_matvec = true, .deep_dense_ring = deep}, xg, wg, c.T == 1 ? 3 : 2);
    };
    const LinearRun off = run_with(false), on = run_with(true);
    ASSERT_EQ(off.names.size(), 2u) << label << ": the prepare and the matvec";
    ASSERT_EQ(on.names.size(), 2u) << label;
    EXPECT_EQ(on.names[0], off.names[0]) << label << ": the prepare kernel";
    if (c.deep) {
      EXPECT_NE(on.names[1], off.names[1]) << label << ": the deep ring is its own kernel";
    } else {
      EXPECT_EQ(on.names[1], off.names[1]) << label;
      EXPECT_EQ(std::memcmp(on.y.raw(), off.y.raw(), on.y.size_bytes()), 0) << label;
    }
    if (on.split == off.split) {
      EXPECT_EQ(std::memcmp(on.y.raw(), off.y.raw(), on.y.size_bytes()), 0) << label << ": the same split";
    }
    EXPECT_GE(on.split, off.split) << label;
    EXPECT_LE(relative_error(off.y, want, label + ", three stages"), 1e-5f);
    EXPECT_LE(relative_error(on.y, want, label + ", deep ring"), 1e-5f);
  }
}

// More rows than one wave of blocks: staged blocks loop over row blocks, also
// with a forced split (the partial sums' buffers alternate).
// One token of a matrix of at most one row an SM (a MoE router's 128 rows) takes
// two rows a warp, so its blocks spread over twice the SMs; the sums are the
// four-row plan's, bit for bit. More rows, or more tokens, keep four.
TEST_F(Affine, OneTokenOfFewRowsTakesTwoRowsAWarp) {
  const int64_t in = 2048;
  for (int bits : {4, 8}) {
    const Weight w = Weight(random_affine(128, in, bits, 64, DType::bf16, uint64_t(300 + bits)), in).to_device(Device::cuda);
    const Tensor x = gpu(random({1, in}, DType::f32, 301));
    EXPECT_EQ(mere::cuda::affine_matvec_plan(args_of(w), 1).rows, 2) << bits;
    EXPECT_EQ(mere::cuda::affine_matvec_plan(args_of(w), 2).rows, 4) << bits;
    const Tensor two = launch_matvec(w, x, Tensor(), {}).to_device(Device::cpu);
    const Tensor four = launch_matvec(w, x, Tensor(), {.rows = 4, .batch = 2}).to_device(Device::cpu);
    EXPECT_EQ(test::max_abs_diff(two, four).diff, 0.0f) << bits;
  }
  const Weight many(random_affine(4096, in, 4, 64, DType::bf16, 302), in);
  EXPECT_EQ(mere::cuda::affine_matvec_plan(args_of(many.to_device(Device::cuda)), 1).rows, 4);
}

// The CUDA-core matvec that normalizes its input (fused_norm_matvec's form for
// matrices the tensor cores leave at one token, a MoE router's): RMSNorm(h) w
// times the weight against the CPU composition on the dequantized weight, in
// one launch; the next kernel's early start changes no bit; rows too long for
// the norm weights a thread holds are declined.
TEST_F(Affine, CudaCoreMatvecNormalizesItsInput) {
  struct Case { int64_t T, out, in; int bits, group; DType norm_dt; };
  for (const Case& c : {Case{1, 128, 2048, 4, 64, DType::bf16}, Case{1, 128, 2048, 8, 64, DType::bf16},
                        Case{3, 300, 1024, 8, 32, DType::f32}, Case{8, 64, 2048, 4, 128, DType::f16},
                        Case{2, 5000, 512, 4, 64, DType::bf16}, Case{5, 37, 4096, 8, 64, DType::bf16},
                        Case{1, 7, 96, 4, 32, DType::f32}}) {
    const std::string label = fmt::format("int{} g{} T={} {}x{} norm {}", c.bits, c.group, c.T, c.out, c.in,
                                          dtype_name(c.norm_dt));
    const Weight w(random_affine(c.out, c.in, c.bits, c.group, DType::bf16, uint64_t(c.in + c.out + c.bits)), c.in);
    const Weight wg = w.to_device(Device::cuda);
    const Tensor h = random({c.T, c.in}, DType::f32, 21, 3.0f), norm_w = random({c.in}, c.norm_dt, 22, 0.5f, 1.0f);
    const Tensor bias = random({c.out}, DType::f32, 23, 0.1f);
    const Tensor want = ops::linear(ops::rms_norm(h, norm_w, 1e-6f), w.dequantize(DType::f32), bias);
    const Tensor hg = gpu(h), ng = gpu(norm_w), bg = gpu(bias);
    Tensor got = Tensor::empty({c.T, c.out}, DType::f32, Device::cuda);
    Tensor early = Tensor::empty({c.T, c.out}, DType::f32, Device::cuda);
    const auto launches = test::kernel_launches_by(
        [&] { EXPECT_TRUE(ops::cuda::affine_cuda_core_rms_norm_linear(hg, ng, 1e-6f, wg.affine(), bg, got, false)); });
    EXPECT_EQ(launches.size(), 1u) << label;
    EXPECT_TRUE(ops::cuda::affine_cuda_core_rms_norm_linear(hg, ng, 1e-6f, wg.affine(), bg, got, false)) << label;
    EXPECT_TRUE(ops::cuda::affine_cuda_core_rms_norm_linear(hg, ng, 1e-6f, wg.affine(), bg, early, true)) << label;
    const Tensor got_cpu = got.to_device(Device::cpu);
    EXPECT_LE(relative_error(got_cpu, want, label), 1e-5f);
    EXPECT_EQ(test::max_abs_diff(early.to_device(Device::cpu), got_cpu).diff, 0.0f) << label;
  }
  // Declined: a row longer than the norm weights a thread holds; 8 tokens of
  // 4,096 columns, whose staged copy does not fit; norm weights not a float.
  struct Declined { int64_t T, in; DType norm_dt; };
  for (const Declined& c : {Declined{1, 8192, DType::bf16}, Declined{8, 4096, DType::bf16},
                            Declined{1, 2048, DType::i32}}) {
    const Weight w = Weight(random_affine(16, c.in, 4, 64, DType::bf16, 24), c.in).to_device(Device::cuda);
    Tensor out = Tensor::empty({c.T, 16}, DType::f32, Device::cuda);
    const Tensor norm_w = c.norm_dt == DType::i32 ? Tensor::zeros({c.in}, DType::i32) : random({c.in}, c.norm_dt, 26);
    EXPECT_FALSE(ops::cuda::affine_cuda_core_rms_norm_linear(gpu(random({c.T, c.in}, DType::f32, 25)), gpu(norm_w),
                                                            1e-6f, w.affine(), Tensor(), out, false))
        << c.T << " x " << c.in << " norm " << dtype_name(c.norm_dt);
  }
}

// rms_norm_linear of a matrix below the tensor cores' floor at one token takes
// the CUDA-core form: one launch where the composition takes two.
TEST_F(Affine, SmallNormedMatvecTakesOneLaunch) {
  const int64_t in = 2048;
  const Weight w = Weight(random_affine(128, in, 4, 64, DType::bf16, 27), in).to_device(Device::cuda);
  const Tensor h = gpu(random({1, in}, DType::f32, 28, 2.0f)), norm_w = gpu(random({in}, DType::bf16, 29, 0.5f, 1.0f));
  EXPECT_EQ(test::kernels_launched_by([&] { ops::rms_norm_linear(h, norm_w, 1e-6f, w); }), 1u);
  const Tensor fused = ops::rms_norm_linear(h, norm_w, 1e-6f, w).to_device(Device::cpu);
  const Tensor composed = ops::linear(ops::rms_norm(h, norm_w, 1e-6f), w).to_device(Device::cpu);
  EXPECT_LE(relative_error(fused, composed, "128x2048 int4"), 1e-5f);
}

TEST_F(Affine, PersistentBlocksLoopOverRows) {
  for (int64_t T : {1, 3})
    for (int split : {0, 2, 8}) {
      const int64_t in = 256, out = 20001;
      Weight w(random_affine(out, in, 4, 32, DType::bf16, uint64_t(T * 10 + split)), in);
      Tensor x = random({T, in}, DType::f32, 7), b = random({out}, DType::f32, 8, 0.1f);
      Tensor want = ops::linear(x, w.dequantize(DType::f32), b);
      Tensor got = launch_matvec(w.to_device(Device::cuda), gpu(x), gpu(b), {.split = split});
      EXPECT_LE(relative_error(got, want, fmt::format("int4 g32 T={} {}x{} split {}", T, out, in, split)), 1e-5f);
    }
}

// Programmatic launch changes nothing; split-K (few rows, long rows) only the
// summation order. f32 scales take the same path.
TEST_F(Affine, ProgrammaticLaunchAndSplitK) {
  struct Case { int64_t T, in, out; int bits, group; DType dt; };
  for (Case c : {Case{1, 4096, 37, 4, 64, DType::bf16}, Case{3, 4096, 19, 8, 32, DType::f16},
                 Case{8, 8192, 5, 4, 128, DType::bf16}, Case{1, 2048, 300, 8, 64, DType::f32},
                 Case{2, 14336, 9, 4, 32, DType::f32}}) {
    const std::string label = fmt::format("int{} g{} {} T={} {}x{}", c.bits, c.group, dtype_name(c.dt), c.T, c.out, c.in);
    Weight w(random_affine(c.out, c.in, c.bits, c.group, c.dt, uint64_t(c.in + c.out)), c.in);
    Tensor x = random({c.T, c.in}, DType::f32, 5), b = random({c.out}, DType::f32, 6, 0.1f);
    Tensor want = ops::linear(x, w.dequantize(DType::f32), b);
    Weight wg = w.to_device(Device::cuda);
    Tensor xg = gpu(x), bg = gpu(b);
    ops::set_launch_settings({});
    Tensor plain = ops::linear(xg, wg, bg).to_device(Device::cpu);
    ops::set_launch_settings({.programmatic = true});
    Tensor early = ops::linear(xg, wg, bg).to_device(Device::cpu);
    ops::set_launch_settings({.programmatic = true, .matvec_split_k = true});
    Tensor split = ops::linear(xg, wg, bg);
    ops::set_launch_settings({});
    EXPECT_LE(relative_error(plain, want, "matvec " + label), 1e-5f);
    EXPECT_EQ(test::max_abs_diff(early, plain).diff, 0.0f) << "programmatic launch changed " << label;
    mere::cuda::AffineArgs a{};
    a.bits = c.bits;
    a.group_size = c.group;
    a.in = c.in;
    a.out = c.out;
    a.packed = wg.affine().packed.data<uint32_t>();
    a.scale_dtype = c.dt;
    cuda::set_matvec_split_k(true);
    const int warps_per_row = mere::cuda::affine_matvec_plan(a, c.T).split;
    cuda::set_matvec_split_k(false);
    EXPECT_LE(relative_error(split, want, fmt::format("split-K x{} {}", warps_per_row, label)), 1e-5f);
  }
}

// x as lever int8_activation_matvec rounds it: per token and 32 values,
// d = max|x| / 127 and x' = d * round(x / d).
Tensor int8_rounded(const Tensor& x) {
  Tensor r = Tensor::empty(x.shape(), DType::f32);
  const float* src = x.data<float>();
  float* dst = r.data<float>();
  for (int64_t b = 0; b < x.numel(); b += 32) {
    float amax = 0;
    for (int64_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(src[i]));
    const float d = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (int64_t i = b; i < b + 32; ++i) dst[i] = d * std::nearbyint(src[i] * inv);
  }
  return r;
}

// Lever int8_activation_matvec: the int8-x matvec equals the f32 reference on
// the rounded x (so the only change is the rounding), is chosen by ops::linear
// only under the lever, and falls back to f32 x where the int8 copy of x does
// not fit in shared memory.
TEST_F(Affine, Int8ActivationsMatchTheRoundedReference) {
  struct Case { int64_t T, in, out; int bits, group; DType dt; };
  int n = 0;
  for (Case c : {Case{1, 4096, 300, 4, 64, DType::bf16}, Case{1, 4096, 257, 8, 64, DType::bf16},
                 Case{2, 1024, 77, 4, 32, DType::f16}, Case{3, 2048, 131, 8, 128, DType::f32},
                 Case{5, 512, 33, 4, 128, DType::bf16}, Case{8, 4096, 64, 8, 32, DType::bf16},
                 Case{8, 384, 1000, 4, 32, DType::bf16}, Case{4, 14336, 40, 4, 64, DType::bf16}}) {
    const std::string label =
        fmt::format("int8 x, int{} g{} {} T={} {}x{}", c.bits, c.group, dtype_name(c.dt), c.T, c.out, c.in);
    Weight w(random_affine(c.out, c.in, c.bits, c.group, c.dt, uint64_t(1000 + n++)), c.in);
    Tensor x = random({c.T, c.in}, DType::f32, uint64_t(n));
    // One block of x with an outlier, as real activations have: the rest of that block loses precision.
    x.data<float>()[37] = 40.0f;
    Tensor b = random({c.out}, DType::f32, 6, 0.1f);
    const Tensor dense = w.dequantize(DType::f32);
    const Tensor want = ops::linear(int8_rounded(x), dense, b);
    const Tensor exact = ops::linear(x, dense, b);
    Weight wg = w.to_device(Device::cuda);
    Tensor xg = gpu(x), bg = gpu(b);
    for (int split : {0, 2}) {
      const Tensor got = launch_matvec(wg, xg, bg, {.split = split, .stage = 2});
      EXPECT_LE(relative_error(got, want, fmt::format("{} split {}", label, split)), 1e-5f) << label;
    }
    ops::set_launch_settings({.int8_activation_matvec = true});
    const Tensor lever = ops::linear(xg, wg, bg).to_device(Device::cpu);
    ops::set_launch_settings({});
    const Tensor plain = ops::linear(xg, wg, bg).to_device(Device::cpu);
    EXPECT_LE(relative_error(plain, exact, label + ": lever off", false), 1e-5f);
    EXPECT_LE(relative_error(lever, want, label + ": lever on"), 1e-5f);
    // What the rounding costs against f32 x, for the record (bounded loosely).
    EXPECT_LE(relative_error(lever, exact, label + ": int8 x against f32 x"), 2e-2f);
    EXPECT_GT(test::max_abs_diff(lever, plain).diff, 0.0f) << label << ": the lever changed nothing";
  }
  // T = 8 of a 14336-wide x does not fit the int8 staging: f32 x, unchanged.
  Weight w(random_affine(16, 14336, 4, 64, DType::bf16, 99), 14336);
  Tensor x = random({8, 14336}, DType::f32, 98);
  ops::set_launch_settings({.int8_activation_matvec = true});
  const Tensor fallback = ops::linear(gpu(x), w.to_device(Device::cuda), Tensor());
  ops::set_launch_settings({});
  EXPECT_LE(relative_error(fallback, ops::linear(x, w.dequantize(DType::f32), Tensor()), "int8 x fallback"), 1e-5f);
}

TEST_F(Affine, DequantizeAndEmbedMatchTheReference) {
  for (int bits : {4, 8})
    for (int group : {32, 128})
      for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
        const int64_t vocab = 1001, d = 256;
        Weight w(random_affine(vocab, d, bits, group, dt, uint64_t(bits * group)), d);
        Weight wg = w.to_device(Device::cuda);
        const std::string label = fmt::format("int{} g{} {}", bits, group, dtype_name(dt));
        const AffineWeight& a = wg.affine();
        mere::cuda::AffineArgs args{a.packed.data<uint32_t>(), a.scales.raw(), a.biases.raw(), dt, bits, group, d, vocab};
        Tensor dense = Tensor::empty({vocab, d}, DType::f32, Device::cuda);
        ASSERT_EQ(mere::cuda::launch_affine_dequantize(args, dense.raw(), DType::f32,
                                                       static_cast<cudaStream_t>(cuda_stream())),
                  cudaSuccess);
        EXPECT_LE(relative_error(dense, w.dequantize(DType::f32), "dequantize " + label), 1e-6f);
        Tensor ids = Tensor::empty({5}, DType::i32);
        const int32_t picks[5] = {0, 1000, 17, 17, 512};
        std::copy(picks, picks + 5, ids.data<int32_t>());
        EXPECT_LE(relative_error(ops::embed(wg, gpu(ids)), ops::embed(w, ids), "embed " + label), 1e-6f);
      }
}

// GB/s of the decode matvec on Llama-3-8B's matrices (and, named by
// MERE_AFFINE_TIMING only, Qwen3-30B-A3B's attention and router; bytes: packed words,
// scales and biases; bf16 weights for the dense kernel), and the fraction of
// the H200's 4.2 TB/s copy bandwidth. Programmatic launch and split-K on, as
// a decode step runs. Nothing is asserted.
TEST_F(Affine, TimingOnLlama3Matrices) {
  struct Matrix { const char* name; int64_t in, out; };
  const Matrix matrices[] = {{"qkv", 4096, 6144},        {"o", 4096, 4096},           {"gate_up", 4096, 28672},
                             {"down", 14336, 4096},      {"lm_head", 4096, 128256},
                             // Qwen3-30B-A3B's attention and router (CUDA cores at one token), by MERE_AFFINE_TIMING only
                             {"qwen_qkv", 2048, 5120}, {"qwen_o", 4096, 2048},     {"qwen_router", 2048, 128}};
  constexpr double kCopyBytesPerS = 4.2e12;
  cudaStream_t stream = static_cast<cudaStream_t>(cuda_stream());
  // The decode defaults these kernels run under (streamed_weights: the L2 evict-first hint).
  const ops::LaunchSettings timed{.programmatic = true, .matvec_split_k = true, .streamed_weights = true};
  ops::set_launch_settings(timed);
  auto report = [&](const std::string& label, double bytes, double s) {
    std::printf("[ timing   ] %-58s %8.1f us %7.0f GB/s %5.3f of 4.2 TB/s\n", label.c_str(), s * 1e6, bytes / s / 1e9,
                bytes / s / kCopyBytesPerS);
  };
  // MERE_AFFINE_TIMING=NAME:BITS:GROUP (e.g. gate_up:4:64) times that case alone, for a profiler.
  const char* only_env = std::getenv("MERE_AFFINE_TIMING");
  const std::string only = only_env ? only_env : "";
  auto wanted = [&](const Matrix& m, int bits, int group) {
    return only.empty() || only == fmt::format("{}:{}:{}", m.name, bits, group);
  };
  for (const Matrix& m : matrices) {
    if (!only.empty() && only.rfind(std::string(m.name) + ":", 0) != 0) continue;
    if (only.empty() && std::string(m.name).rfind("qwen_", 0) == 0) continue;
    Tensor x = Tensor::empty({8, m.in}, DType::f32, Device::cuda), y = Tensor::empty({8, m.out}, DType::f32, Device::cuda);
    ops::fill_random(x, 1, 1.0f);
    {
      Tensor w = Tensor::empty({m.out, m.in}, DType::bf16, Device::cuda);
      ops::fill_random(w, 2, 0.02f);
      mere::cuda::MatvecArgs a;
      a.x = x.data<float>();
      a.w = w.raw();
      a.y = y.data<float>();
      a.in = m.in;
      a.out = m.out;
      for (int64_t T : {1, 8}) {
        a.T = T;
        report(fmt::format("{:8s} {}x{} bf16 dense T={}", m.name, m.out, m.in, T), double(w.size_bytes()),
               seconds_per_launch([&] { mere::cuda::launch_matvec(a, stream); }));
      }
    }
    for (int bits : {4, 8}) {
      Tensor packed = Tensor::empty({m.out, m.in * bits / 32}, DType::u32, Device::cuda);
      ASSERT_EQ(mere::cuda::launch_fill_random_bytes(packed.raw(), int64_t(packed.size_bytes()), 3, 0xff, stream),
                cudaSuccess);
      for (int group : {32, 64, 128}) {
        if (!wanted(m, bits, group)) continue;
        Tensor scales = Tensor::empty({m.out, m.in / group}, DType::bf16, Device::cuda);
        Tensor biases = Tensor::empty({m.out, m.in / group}, DType::bf16, Device::cuda);
        ops::fill_random(scales, 4, 0.005f, 0.01f);
        ops::fill_random(biases, 5, 0.01f, -0.01f * float(1 << (bits - 1)));
        mere::cuda::AffineArgs a{packed.data<uint32_t>(), scales.raw(), biases.raw(), DType::bf16, bits, group, m.in,
                                 m.out};
        const double bytes = double(packed.size_bytes() + scales.size_bytes() + biases.size_bytes());
        Tensor scratch = Tensor::empty({mere::cuda::affine_matvec_mma_scratch_bytes(a, 8)}, DType::u8, Device::cuda);
        auto run = [&](int64_t T, mere::cuda::AffineMatvecPlan hint) {
          const mere::cuda::AffineMatvecPlan plan = mere::cuda::affine_matvec_plan(a, T, hint);
          report(fmt::format("{:8s} {}x{} int{} g{} T={} R{} B{} split{} {}", m.name, m.out, m.in, bits, group, T,
                             plan.rows, plan.batch, plan.split,
                             plan.stage == 2 ? "int8x" : plan.stage ? "staged" : "L1"),
                 bytes, seconds_per_launch([&] {
                   mere::cuda::launch_affine_matvec(a, x.data<float>(), nullptr, y.data<float>(), T, stream, hint);
                 }));
        };
        run(1, {});
        run(1, {.stage = 2});
        for (int64_t T : {1, 2, 4, 8})  // lever tensor_core_affine_matvec, where x fits in shared memory
          for (int digits : {3, 2})          // 2: lever int16_activation_matvec
            if ((T == 1 || group == 64) && mere::cuda::affine_matvec_mma_supports(a, T, digits))
              report(fmt::format("{:8s} {}x{} int{} g{} T={} tensor cores{} split{}", m.name, m.out, m.in, bits,
                                 group, T, digits == 2 ? ", int16 x" : "",
                                 mere::cuda::affine_matvec_mma_split(a, T, digits)),
                     bytes, seconds_per_launch([&] {
                       mere::cuda::launch_affine_matvec_mma(a, x.data<float>(), nullptr, y.data<float>(), T,
                                                            scratch.raw(), stream, digits);
                     }));
        if (group != 64) continue;
        for (int64_t T : {2, 4, 8}) run(T, {});
        for (int64_t T : {2, 4, 8}) run(T, {.stage = 2});
        // The alternatives to the default plan, for tuning.
        for (mere::cuda::AffineMatvecPlan hint :
             {mere::cuda::AffineMatvecPlan{0, 0, 0, 0}, {4, 1, 0, -1}, {2, 2, 0, -1}, {2, 4, 0, -1}, {8, 1, 0, -1},
              {0, 0, 1, -1}, {0, 0, 2, -1}, {0, 0, 4, -1}, {2, 2, 2, -1}, {2, 2, 4, -1}, {2, 4, 2, -1}})
          run(1, hint);
        for (mere::cuda::AffineMatvecPlan hint : {mere::cuda::AffineMatvecPlan{4, 1, 0, 2}, {2, 2, 0, 2}, {2, 4, 0, 2},
                                                   {8, 1, 0, 2}, {0, 0, 1, 2}, {0, 0, 2, 2}})
          run(1, hint);
        ops::LaunchSettings serial = timed;
        serial.programmatic = false;
        ops::set_launch_settings(serial);
        std::printf("[ timing   ] programmatic launch off:\n");
        run(1, {});
        ops::set_launch_settings(timed);
      }
    }
    // The prefill path's dequantization (bf16 out), for its share of a prefill.
    {
      Tensor packed = Tensor::empty({m.out, m.in / 8}, DType::u32, Device::cuda);
      Tensor scales = Tensor::empty({m.out, m.in / 64}, DType::bf16, Device::cuda);
      Tensor dense = Tensor::empty({m.out, m.in}, DType::bf16, Device::cuda);
      ops::fill_random(scales, 4, 0.005f, 0.01f);
      mere::cuda::AffineArgs a{packed.data<uint32_t>(), scales.raw(), scales.raw(), DType::bf16, 4, 64, m.in, m.out};
      const double bytes = double(packed.size_bytes() + 2 * scales.size_bytes() + dense.size_bytes());
      report(fmt::format("{:8s} {}x{} int4 g64 dequantize to bf16", m.name, m.out, m.in), bytes,
             seconds_per_launch([&] { mere::cuda::launch_affine_dequantize(a, dense.raw(), DType::bf16, stream); }, 10));
    }
  }
  ops::set_launch_settings({});
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a timed launch failed";
}

}  // namespace
}  // namespace mere

// The MLX affine prefill GEMM that dequantizes its tiles in registers
// (ops/cuda/affine_gemm.cu, lever tensor_core_affine_gemm) against the product
// of the same bf16 weights on the CPU: Weight::dequantize to bf16 (scale * q +
// bias in f32, rounded once, as the kernel forms them) times x rounded to bf16,
// summed in f32 (ctest label gpu). A timing case prints its TFLOP/s on
// Llama-3-8B's matrices beside the bf16-weight GEMM and the dequantize + GEMM
// path it replaces.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>

#include "core/device.h"
#include "ops/cuda/affine_launchers.h"
#include "ops/cuda/launchers.h"
#include "ops/ops.h"
#include "ops/quantized_ops.h"
#include "gpu_test_util.h"
#include "test_util.h"

namespace mere {
namespace {

using test::gpu;
using test::random;
using test::relative_error;
using test::random_affine;
using test::seconds_per_launch;

cudaStream_t stream() { return static_cast<cudaStream_t>(cuda_stream()); }

Tensor as_dtype(const Tensor& t, DType dt) {
  Tensor out = Tensor::empty(t.shape(), dt, t.device());
  ops::convert_into(t, out);
  return out;
}

class AffineGemm : public test::NeedsGpuDefaultLaunch {};

// Every bits / group / scale dtype, every token tile (32 to 256), one to
// eight splits of the k-tiles, token counts off the tiles and row counts off
// the 128-row blocks, with and without bias; the sums differ from the CPU's
// only in their order.
TEST_F(AffineGemm, MatchesTheProductOfTheDequantizedBf16Weights) {
  struct Case { int64_t T, out, in; };
  const Case cases[] = {{9, 128, 1024}, {100, 200, 768}, {300, 384, 1024}, {513, 136, 3072}, {257, 72, 1536}};
  int n = 0;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
        const Case c = cases[n % 5];
        const bool with_bias = n % 2;
        const uint64_t seed = 1000 + uint64_t(n) * 31;
        ++n;
        const AffineWeight a = random_affine(c.out, c.in, bits, group, dt, seed);
        const Weight w(a, c.in);
        Tensor x = as_dtype(as_dtype(random({c.T, c.in}, DType::f32, seed + 3), DType::bf16), DType::f32);
        Tensor b = with_bias ? random({c.out}, DType::f32, seed + 4, 0.1f) : Tensor();
        Tensor want = ops::linear(x, as_dtype(w.dequantize(DType::bf16), DType::f32), b);
        const Weight wd = w.to_device(Device::cuda);
        const AffineWeight& ad = wd.affine();
        const mere::cuda::AffineArgs args = test::affine_args(ad, c.in);
        ASSERT_TRUE(mere::cuda::affine_gemm_supports(args, c.T));
        Tensor xd = gpu(x), bd = with_bias ? gpu(b) : Tensor();
        for (int tokens : {32, 64, 128, 256})
          for (int splits : {1, 2, 3, 8}) {
            Tensor scratch = Tensor::empty({mere::cuda::affine_gemm_scratch_bytes(args, c.T, {tokens, splits})},
                                           DType::u8, Device::cuda);
            Tensor y = Tensor::empty({c.T, c.out}, DType::f32, Device::cuda);
            ops::fill_random(y, 9, 1.0f);  // a split launch must clear what was there
            ASSERT_EQ(mere::cuda::launch_affine_gemm(args, xd.data<float>(), scratch.raw(),
                                                     with_bias ? bd.data<float>() : nullptr, y.data<float>(), c.T,
                                                     stream(), {tokens, splits}),
                      cudaSuccess);
            const std::string label = fmt::format("int{} g{} {} T={} {}x{}{} N={} split {}", bits, group,
                                                  dtype_name(dt), c.T, c.out, c.in, with_bias ? " +bias" : "",
                                                  tokens, splits);
            EXPECT_LE(relative_error(y, want, label), 2e-5f) << label;
          }
      }
}

// Lever split_sum_kernel: launches of three splits or more add their slices in
// a kernel of their own (one launch more, the tiles' counters unused) and give
// y bit for bit as the last split's tail does: rows off the float4s (136, 200),
// with and without bias, int4 and int8; one and two splits launch as before.
TEST_F(AffineGemm, SplitSumKernelAddsTheSlicesWithTheSameBits) {
  struct Case { int64_t T, out, in; int tokens, splits; bool with_bias; };
  const Case cases[] = {{100, 200, 768, 64, 3, true}, {300, 384, 1024, 128, 8, false},
                        {257, 136, 1536, 256, 4, true}, {16, 4096, 4096, 32, 0, false},
                        {256, 4096, 4096, 256, 0, true}, {64, 512, 1024, 64, 2, true}};
  for (int bits : {4, 8})
    for (const Case& c : cases) {
      const uint64_t seed = 77 + uint64_t(c.T * 3 + c.splits + bits);
      const Weight w = Weight(random_affine(c.out, c.in, bits, 64, DType::bf16, seed), c.in).to_device(Device::cuda);
      const mere::cuda::AffineArgs args = test::affine_args(w.affine(), c.in);
      Tensor x = gpu(random({c.T, c.in}, DType::f32, seed + 1));
      Tensor b = c.with_bias ? gpu(random({c.out}, DType::f32, seed + 2, 0.1f)) : Tensor();
      const mere::cuda::AffineGemmPlan plan{c.tokens, c.splits};
      Tensor scratch = Tensor::empty({mere::cuda::affine_gemm_scratch_bytes(args, c.T, plan)}, DType::u8, Device::cuda);
      auto run = [&](bool apart, Tensor& y) {
        ops::LaunchSettings settings;
        settings.split_sum_kernel = apart;
        ops::set_launch_settings(settings);
        ops::fill_random(y, 9, 1.0f);
        return mere::cuda::launch_affine_gemm(args, x.data<float>(), scratch.raw(),
                                              c.with_bias ? b.data<float>() : nullptr, y.data<float>(), c.T, stream(),
                                              plan);
      };
      Tensor tail = Tensor::empty({c.T, c.out}, DType::f32, Device::cuda), apart = tail.clone();
      const std::string label = fmt::format("int{} T={} {}x{} N={} split {}{}", bits, c.T, c.out, c.in, c.tokens,
                                            c.splits, c.with_bias ? " +bias" : "");
      ASSERT_EQ(run(false, tail), cudaSuccess) << label;
      ASSERT_EQ(run(true, apart), cudaSuccess) << label;
      EXPECT_TRUE(test::same_bytes(apart, tail)) << label;
      size_t off = 0, on = 0, sums = 0;
      {
        Tensor y = tail.clone();
        off = test::kernels_launched_by([&] { run(false, y); });
        for (const test::KernelLaunch& k : test::kernel_launches_by([&] { run(true, y); })) {
          ++on;
          sums += k.name.find("affine_gemm_sum_splits_kernel") != std::string::npos;
        }
      }
      // o_proj's shape at 16 and 256 tokens splits by itself (plan 0: 8 and 4 ranges).
      const bool sliced = c.splits > 2 || c.splits == 0;
      EXPECT_EQ(sums, sliced ? 1u : 0u) << label;
      EXPECT_EQ(on, off + sums) << label;
    }
  ops::set_launch_settings({});
}

// A grid that leaves SMs idle splits its k-tiles into more than two ranges,
// whose sums take room in the scratch: Llama-3-8B's o_proj at 16 tokens is 32
// blocks; gate_up (224 blocks) and a 4,096-token prompt fill the SMs unsplit.
TEST_F(AffineGemm, SmallGridsSplitTheirTilesToFillTheSms) {
  mere::cuda::AffineArgs o;
  o.in = 4096, o.out = 4096;
  mere::cuda::AffineArgs gate_up = o;
  gate_up.out = 28672;
  const int64_t x_bytes = 16 * 4096 * 2;  // x's bf16 copy, all an unsplit launch needs
  EXPECT_GT(mere::cuda::affine_gemm_scratch_bytes(o, 16), x_bytes + 2 * 16 * 4096 * 4) << "o_proj at 16 tokens";
  EXPECT_EQ(mere::cuda::affine_gemm_scratch_bytes(gate_up, 16), x_bytes) << "gate_up at 16 tokens";
  EXPECT_EQ(mere::cuda::affine_gemm_scratch_bytes(o, 4096), int64_t(4096) * 4096 * 2) << "o_proj at 4,096 tokens";
}

// Shapes the kernel cannot take are refused, not run: a row not a whole
// number of 64-value tiles, more row tiles than a grid holds.
TEST_F(AffineGemm, RefusesShapesItCannotTake) {
  const Weight b = Weight(random_affine(128, 96, 4, 32, DType::bf16, 8), 96).to_device(Device::cuda);
  EXPECT_FALSE(mere::cuda::affine_gemm_supports(test::affine_args(b.affine(), 96), 64));  // not a whole number of tiles
  Tensor x = Tensor::empty({64, 96}, DType::f32, Device::cuda), y = Tensor::empty({64, 128}, DType::f32, Device::cuda);
  Tensor scratch = Tensor::empty({64 * 96 * 2}, DType::u8, Device::cuda);
  EXPECT_EQ(mere::cuda::launch_affine_gemm(test::affine_args(b.affine(), 96), x.data<float>(), scratch.raw(), nullptr,
                                           y.data<float>(), 64, stream()),
            cudaErrorInvalidValue);
  // More rows than the grid's 65535 row tiles (the query reads no weights).
  const Weight c = Weight(random_affine(128, 1024, 4, 64, DType::bf16, 9), 1024).to_device(Device::cuda);
  mere::cuda::AffineArgs huge = test::affine_args(c.affine(), 1024);
  EXPECT_TRUE(mere::cuda::affine_gemm_supports(huge, 64));
  huge.out = int64_t(65535) * 128 + 1;
  EXPECT_FALSE(mere::cuda::affine_gemm_supports(huge, 64));
}

// The lever through ops::linear: prefills of 9 to 384 tokens of a matrix of
// 2^24 weights run the fused GEMM (bit for bit its direct launch); decode,
// longer prefills and smaller matrices keep their paths (bit for bit the
// lever off).
TEST_F(AffineGemm, LeverTakesShortPrefillsOfLargeMatricesOnly) {
  struct Case { int64_t out, in, T; bool fused, every_size; };
  const Case cases[] = {{4096, 4096, 8, false, false},   {4096, 4096, 9, true, false},
                        {4096, 4096, 384, true, false},  {4096, 4096, 385, false, false},
                        {4000, 4096, 64, false, false},  {320, 1024, 64, false, false},
                        {320, 1024, 64, true, true},     {320, 1024, 600, true, true}};  // `on`: every size
  for (const Case& c : cases) {
    const int64_t in = c.in, out = c.out, T = c.T;
    const Weight w = Weight(random_affine(out, in, 4, 64, DType::bf16, 11), in).to_device(Device::cuda);
    const mere::cuda::AffineArgs args = test::affine_args(w.affine(), in);
    Tensor x = gpu(random({T, in}, DType::f32, 12 + uint64_t(T)));
    ops::set_launch_settings({});
    Tensor off = ops::linear(x, w).to_device(Device::cpu);
    ops::set_launch_settings({.tensor_core_affine_gemm = true, .affine_gemm_at_every_size = c.every_size});
    Tensor on = ops::linear(x, w).to_device(Device::cpu);
    Tensor direct = Tensor::empty({T, out}, DType::f32, Device::cuda);
    Tensor scratch = Tensor::empty({mere::cuda::affine_gemm_scratch_bytes(args, T)}, DType::u8, Device::cuda);
    ASSERT_EQ(mere::cuda::launch_affine_gemm(args, x.data<float>(), scratch.raw(), nullptr, direct.data<float>(), T,
                                             stream()),
              cudaSuccess);
    const std::string label = fmt::format("lever {} vs off, {}x{} T={}", c.every_size ? "on" : "auto", out, in, T);
    const Tensor& same_as = c.fused ? direct.to_device(Device::cpu) : off;
    EXPECT_EQ(test::max_abs_diff(on, same_as).diff, 0.0f) << label;
    EXPECT_LE(relative_error(on, off, label), 2e-5f) << label;
  }
}

// TFLOP/s on Llama-3-8B's matrices at 512 and 4096 tokens: bf16 weights (x
// converted, cuBLAS), the path this replaces (dequantize to bf16, then the
// same) and the fused GEMM (x converted, then the kernel). Nothing is asserted.
TEST_F(AffineGemm, TimingOnLlama3Matrices) {
  struct Matrix { const char* name; int64_t in, out; };
  const Matrix matrices[] = {{"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096}};
  // MERE_GEMM_TIMING=NAME:T (e.g. gate_up:4096) times that case alone, for a profiler.
  const char* only_env = std::getenv("MERE_GEMM_TIMING");
  const std::string only = only_env ? only_env : "";
  for (int64_t T : {16, 64, 512, 4096})
    for (const Matrix& m : matrices) {
      if (!only.empty() && only != fmt::format("{}:{}", m.name, T)) continue;
      Tensor x = Tensor::empty({T, m.in}, DType::f32, Device::cuda);
      Tensor y = Tensor::empty({T, m.out}, DType::f32, Device::cuda);
      Tensor dense = Tensor::empty({m.out, m.in}, DType::bf16, Device::cuda);
      ops::fill_random(x, 1, 1.0f);
      const double flops = 2.0 * double(T) * double(m.in) * double(m.out);
      auto report = [&](const std::string& what, double s, double base_s) {
        std::printf("[ timing   ] %-8s %5dx%-5d T=%-4d %-34s %8.1f us %6.1f TFLOP/s %5.2f of bf16\n", m.name,
                    int(m.out), int(m.in), int(T), what.c_str(), s * 1e6, flops / s / 1e12, base_s / s);
      };
      ops::fill_random(dense, 2, 0.02f);
      const double bf16_s = seconds_per_launch([&] { y = ops::linear(x, dense); }, 5);
      report("bf16 weights (cuBLAS)", bf16_s, bf16_s);
      for (int bits : {4, 8}) {
        Tensor packed = Tensor::empty({m.out, m.in * bits / 32}, DType::u32, Device::cuda);
        ops::fill_random_bytes(packed, 3, 0xff);
        Tensor scales = Tensor::empty({m.out, m.in / 64}, DType::bf16, Device::cuda);
        Tensor biases = Tensor::empty({m.out, m.in / 64}, DType::bf16, Device::cuda);
        ops::fill_random(scales, 4, 0.005f, 0.01f);
        ops::fill_random(biases, 5, 0.01f, -0.01f * float(1 << (bits - 1)));
        const mere::cuda::AffineArgs a{packed.data<uint32_t>(), scales.raw(), biases.raw(), DType::bf16, bits, 64,
                                       m.in, m.out};
        report(fmt::format("int{} g64 dequantize + cuBLAS", bits), seconds_per_launch([&] {
                 mere::cuda::launch_affine_dequantize(a, dense.raw(), DType::bf16, stream());
                 y = ops::linear(x, dense);
               }, 5), bf16_s);
        for (mere::cuda::AffineGemmPlan plan :
             {mere::cuda::AffineGemmPlan{0, 0}, {0, 1}, {64, 1}, {128, 1}, {256, 1}, {256, 2}}) {
          Tensor scratch =
              Tensor::empty({mere::cuda::affine_gemm_scratch_bytes(a, T, plan)}, DType::u8, Device::cuda);
          report(plan.tokens   ? fmt::format("int{} g64 fused N={} split {}", bits, plan.tokens, plan.splits)
                 : plan.splits ? fmt::format("int{} g64 fused, one split", bits)
                               : fmt::format("int{} g64 fused", bits),
                 seconds_per_launch([&] {
                   mere::cuda::launch_affine_gemm(a, x.data<float>(), scratch.raw(), nullptr, y.data<float>(), T,
                                                  stream(), plan);
                 }, 5), bf16_s);
        }
      }
    }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a timed launch failed";
}

}  // namespace
}  // namespace mere

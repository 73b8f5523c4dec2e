// Every CUDA op against the CPU reference on seeded random inputs of awkward
// shapes (ctest label gpu). Errors are measured relative to the largest
// reference magnitude, with tolerances from the dtype of the arithmetic.
#include <gtest/gtest.h>

#include <cmath>

#include "core/device.h"
#include "ops/ops.h"
#include "gpu_test_util.h"
#include "test_util.h"

namespace mere {
namespace {

using test::gpu;
using test::random;
using test::relative_error;


class CudaOps : public test::NeedsGpu<> {};

TEST_F(CudaOps, RandomFillMatchesCpuBitForBit) {
  Tensor cpu = random({1000, 37}, DType::bf16, 5);
  Tensor dev = Tensor::empty({1000, 37}, DType::bf16, Device::cuda);
  ops::fill_random(dev, 5, 1.0f);
  EXPECT_EQ(test::max_abs_diff(dev.to_device(Device::cpu), cpu).diff, 0.0f);
}

// The kernel form in a graph: each replay moves the device position on and
// writes the step's tokens into the pinned ring's row of the new position, which
// the host reads once the stream has passed it, with no copy queued.
TEST_F(CudaOps, AdvancePositionWritesTheTokensToThePinnedRowOfTheirPosition) {
  constexpr int64_t kB = 3, kSlots = 4;
  Tensor pos = Tensor::zeros({1}, DType::i32, Device::cuda), tokens = Tensor::zeros({kB}, DType::i32, Device::cuda);
  const int32_t start = 6;
  copy_bytes(pos.raw(), Device::cuda, &start, Device::cpu, sizeof(start));
  std::shared_ptr<void> pinned = pinned_alloc(kSlots * kB * sizeof(int32_t));
  auto* host = static_cast<int32_t*>(pinned.get());
  std::fill_n(host, kSlots * kB, -1);
  auto* ring = static_cast<int32_t*>(pinned_device_address(pinned.get()));
  CudaGraph graph;
  graph.capture([&] { ops::advance_position(pos, 1, tokens, ring, kSlots); });
  for (int32_t step = 0; step < 6; ++step) {
    std::vector<int32_t> values(kB);
    for (int32_t b = 0; b < kB; ++b) values[size_t(b)] = 100 * step + b;
    copy_bytes(tokens.raw(), Device::cuda, values.data(), Device::cpu, kB * sizeof(int32_t));
    graph.replay();
    CudaEvent done;
    done.record();
    done.synchronize();
    const int32_t p = start + 1 + step;
    for (int32_t b = 0; b < kB; ++b) EXPECT_EQ(host[(p % kSlots) * kB + b], 100 * step + b) << step;
    if (step == 0) {
      EXPECT_EQ(host[0], -1);  // row 0 is not position 7's
    }
  }
  int32_t end = 0;
  copy_bytes(&end, Device::cpu, pos.raw(), Device::cuda, sizeof(end));
  EXPECT_EQ(end, start + 6);
}

TEST_F(CudaOps, RmsNorm) {
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 64}, {7, 4096}, {33, 5120}, {2, 129}})
    for (DType dt : {DType::f32, DType::bf16}) {
      Tensor x = random({rows, cols}, DType::f32, uint64_t(rows * cols)), w = random({cols}, dt, 9, 0.2f, 1.0f);
      Tensor want = ops::rms_norm(x, w, 1e-6f);
      EXPECT_LE(relative_error(ops::rms_norm(gpu(x), gpu(w), 1e-6f), want,
                               fmt::format("rms_norm {}x{} {}", rows, cols, dtype_name(dt))), 1e-5f);
    }
}

TEST_F(CudaOps, LinearMatvecAndGemm) {
  struct Case { int64_t T, in, out; };
  for (Case c : {Case{1, 4096, 4096}, Case{3, 512, 1000}, Case{8, 1024, 96}, Case{9, 256, 320}, Case{64, 384, 1024},
                 Case{1, 129, 77}, Case{24, 64, 512}})
    for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
      Tensor x = random({c.T, c.in}, DType::f32, 3), w = random({c.out, c.in}, dt, 4, 1.0f / std::sqrt(float(c.in)));
      Tensor b = random({c.out}, DType::f32, 6, 0.1f);
      Tensor want = ops::linear(x, w, b);
      // The matvec accumulates the same f32 products; the tensor-core GEMM rounds
      // activations to the weight dtype first (bf16: 8 bits of mantissa).
      bool gemm = c.T > 8 || (c.in * int64_t(dtype_size(dt))) % 16 != 0;
      float tol = !gemm || dt == DType::f32 ? 1e-4f : dt == DType::f16 ? 3e-3f : 2e-2f;
      EXPECT_LE(relative_error(ops::linear(gpu(x), gpu(w), gpu(b)), want,
                               fmt::format("linear T={} {}x{} {}{}", c.T, c.out, c.in, dtype_name(dt),
                                           gemm ? " gemm" : " matvec")), tol);
    }
}

TEST_F(CudaOps, ElementwiseEmbedAndConvert) {
  Tensor g = random({5, 333}, DType::f32, 1, 4.0f), u = random({5, 333}, DType::f32, 2);
  EXPECT_LE(relative_error(ops::silu_mul(gpu(g), gpu(u)), ops::silu_mul(g, u), "silu_mul"), 1e-6f);
  Tensor h = random({5, 333}, DType::f32, 3), hd = gpu(h);
  ops::add_inplace(hd, gpu(u));
  ops::add_inplace(h, u);
  EXPECT_LE(relative_error(hd, h, "add_inplace"), 1e-7f);
  Tensor table = random({100, 96}, DType::bf16, 4);
  std::vector<int32_t> ids = {5, 99, 0, 5};
  EXPECT_EQ(relative_error(ops::embed(gpu(table), ids), ops::embed(table, ids), "embed bf16"), 0.0f);
  // Eight values a thread where the count allows (6 x 400), one a thread where not (5 x 333); both ways.
  for (const Tensor& src : {g, random({6, 400}, DType::f32, 5, 4.0f)})
    for (DType dt : {DType::bf16, DType::f16}) {
      const std::string label = fmt::format("convert {} values f32 <-> {}", src.numel(), dtype_name(dt));
      Tensor dst = Tensor::empty(src.shape(), dt, Device::cuda), dst_cpu = Tensor::empty(src.shape(), dt);
      ops::convert_into(gpu(src), dst);
      ops::convert_into(src, dst_cpu);
      EXPECT_EQ(relative_error(dst, dst_cpu, label), 0.0f);
      Tensor back = Tensor::empty(src.shape(), DType::f32, Device::cuda);
      Tensor back_cpu = Tensor::empty(src.shape(), DType::f32);
      ops::convert_into(dst, back);
      ops::convert_into(dst_cpu, back_cpu);
      EXPECT_EQ(relative_error(back, back_cpu, label + " and back"), 0.0f);
    }
}

TEST_F(CudaOps, FusedHelpersMatchTheCpu) {
  Tensor gu = random({5, 2 * 300}, DType::f32, 11, 3.0f);
  EXPECT_LE(relative_error(ops::silu_mul_halves(gpu(gu)), ops::silu_mul_halves(gu), "silu_mul_halves"), 1e-6f);
  const Tensor odd = random({3, 2 * 301}, DType::f32, 15, 3.0f);  // halves of 301: one column a thread
  EXPECT_LE(relative_error(ops::silu_mul_halves(gpu(odd)), ops::silu_mul_halves(odd), "silu_mul_halves f=301"), 1e-6f);
  // A fused qkv's three parts (or up to four) in one launch, exact copies.
  const Tensor gu_gpu = gpu(gu);
  for (const std::vector<int64_t>& widths : {std::vector<int64_t>{128, 64, 408}, {600}, {1, 3, 500, 96}}) {
    // (A captured launch does not run: the count and the values come from two calls.)
    EXPECT_EQ(test::kernels_launched_by([&] { ops::split_columns(gu_gpu, widths); }), 1u);
    const auto cpu_parts = ops::split_columns(gu, widths), gpu_parts = ops::split_columns(gu_gpu, widths);
    for (size_t i = 0; i < widths.size(); ++i)
      EXPECT_EQ(relative_error(gpu_parts[i], cpu_parts[i], "split_columns"), 0.0f);
  }
  EXPECT_THROW(ops::split_columns(gu_gpu, {100, 100, 100, 100, 200}), Error);
  // add_rms_norm on the GPU is bit-identical to add_inplace then rms_norm on the GPU.
  Tensor h = random({3, 4096}, DType::f32, 12), x = random({3, 4096}, DType::f32, 13);
  Tensor w = random({4096}, DType::bf16, 14, 0.2f, 1.0f);
  Tensor h1 = gpu(h), h2 = gpu(h);
  Tensor fused = ops::add_rms_norm(h1, gpu(x), gpu(w), 1e-6f);
  ops::add_inplace(h2, gpu(x));
  Tensor composed = ops::rms_norm(h2, gpu(w), 1e-6f);
  EXPECT_EQ(relative_error(h1, h2.to_device(Device::cpu), "add_rms_norm residual"), 0.0f);
  EXPECT_EQ(relative_error(fused, composed.to_device(Device::cpu), "add_rms_norm vs composition"), 0.0f);
}

// The fused decode forms against the CPU composition, for every weight dtype,
// row counts up to the matvec's 8 and a prefill-sized one (which composes), with
// and without bias; programmatic launch must not change a bit; split-K stays
// within the same tolerance.
TEST_F(CudaOps, FusedNormMatvecMatchesTheComposition) {
  struct Case { int64_t T, in, out; bool bias; };
  for (Case c : {Case{1, 4096, 300, false}, Case{3, 512, 1000, true}, Case{8, 2048, 64, false}, Case{20, 256, 96, true},
                 Case{1, 1032, 17, true}, Case{2, 8192, 64, true}})
    for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
      const std::string label = fmt::format("T={} in={} out={} {}", c.T, c.in, c.out, dtype_name(dt));
      // Past 8 rows the tensor-core GEMM runs, on activations rounded to the weight dtype.
      const float tol = c.T <= 8 || dt == DType::f32 ? 1e-5f : dt == DType::bf16 ? 4e-3f : 5e-4f;
      Tensor h = random({c.T, c.in}, DType::f32, 21, 2.0f), norm = random({c.in}, dt, 22, 0.2f, 1.0f);
      Tensor w = random({c.out, c.in}, dt, 23, 0.05f), b = c.bias ? random({c.out}, DType::f32, 24) : Tensor();
      Tensor want = ops::linear(ops::rms_norm(h, norm, 1e-6f), w, b);
      ops::set_launch_settings({});
      Tensor got = ops::rms_norm_linear(gpu(h), gpu(norm), 1e-6f, gpu(w), c.bias ? gpu(b) : Tensor());
      EXPECT_LE(relative_error(got, want, "rms_norm_linear " + label), tol);
      ops::set_launch_settings({.programmatic = true});
      Tensor early = ops::rms_norm_linear(gpu(h), gpu(norm), 1e-6f, gpu(w), c.bias ? gpu(b) : Tensor());
      ops::set_launch_settings({});
      EXPECT_EQ(test::max_abs_diff(early.to_device(Device::cpu), got.to_device(Device::cpu)).diff, 0.0f) << label;
      // Split-K shares each row among warps: another summation order, same tolerance.
      ops::set_launch_settings({.matvec_split_k = true});
      Tensor split = ops::rms_norm_linear(gpu(h), gpu(norm), 1e-6f, gpu(w), c.bias ? gpu(b) : Tensor());
      Tensor split_plain = ops::linear(gpu(h), gpu(w), c.bias ? gpu(b) : Tensor());
      ops::set_launch_settings({});
      EXPECT_LE(relative_error(split, want, "split-K rms_norm_linear " + label), tol);
      EXPECT_LE(relative_error(split_plain, ops::linear(h, w, b), "split-K linear " + label), tol);

      Tensor x = random({c.T, c.in}, DType::f32, 25), residual = random({c.T, c.out}, DType::f32, 26);
      Tensor want_add = residual.clone();
      ops::add_inplace(want_add, ops::linear(x, w, b));
      Tensor got_add = gpu(residual);
      ops::linear_add(got_add, gpu(x), gpu(w), c.bias ? gpu(b) : Tensor());
      EXPECT_LE(relative_error(got_add, want_add, "linear_add " + label), tol);

      Tensor gate_up = random({c.T, 2 * c.in}, DType::f32, 27, 3.0f);
      Tensor want_swiglu = residual.clone();
      ops::add_inplace(want_swiglu, ops::linear(ops::silu_mul_halves(gate_up), w, b));
      Tensor got_swiglu = gpu(residual);
      ops::swiglu_linear_add(got_swiglu, gpu(gate_up), gpu(w), c.bias ? gpu(b) : Tensor());
      EXPECT_LE(relative_error(got_swiglu, want_swiglu, "swiglu_linear_add " + label), tol);
    }
}

// A prefill's swiglu_linear through bf16/f16 weights forms the GEMM's input in
// the weight's dtype at once: the same bits as silu_mul_halves then linear (which
// converts the f32 activations), one kernel fewer; decode rows take the matvec.
TEST_F(CudaOps, SwigluLinearFormsTheGemmInputInTheWeightsDtype) {
  const int64_t f = 264, out = 96;
  for (DType dt : {DType::bf16, DType::f16})
    for (int64_t T : {3, 40})
      for (bool with_bias : {false, true}) {
        const std::string label = fmt::format("{} T={}{}", dtype_name(dt), T, with_bias ? " bias" : "");
        const Tensor gate_up = random({T, 2 * f}, DType::f32, 31, 3.0f), w = random({out, f}, dt, 32, 0.1f);
        const Tensor b = with_bias ? gpu(random({out}, DType::f32, 33)) : Tensor();
        const Tensor gu = gpu(gate_up), wg = gpu(w);
        const Tensor got = ops::swiglu_linear(gu, wg, b);
        const Tensor composed = ops::linear(ops::silu_mul_halves(gu), wg, b);
        EXPECT_EQ(test::max_abs_diff(got.to_device(Device::cpu), composed.to_device(Device::cpu)).diff, 0.0f) << label;
        const Tensor b_cpu = with_bias ? b.to_device(Device::cpu) : Tensor();
        const Tensor want = ops::linear(ops::silu_mul_halves(gate_up), w, b_cpu);
        EXPECT_LE(relative_error(got, want, "swiglu_linear " + label), T > 8 ? 1e-2f : 1e-5f);
        const size_t fused = test::kernels_launched_by([&] { ops::swiglu_linear(gu, wg, b); });
        const size_t plain = test::kernels_launched_by([&] { ops::linear(ops::silu_mul_halves(gu), wg, b); });
        EXPECT_EQ(fused + (T > 8 ? 1 : 0), plain) << label;
      }
}

// The fused epilogue against the CPU composition (rms_norm, rope, rope, store, store).
TEST_F(CudaOps, QkNormRopeStoreMatchesTheComposition) {
  struct Case { int64_t T, heads, kv_heads, head_dim; bool norm, interleaved; };
  for (Case c : {Case{1, 32, 8, 128, false, false}, Case{1, 16, 8, 128, true, false}, Case{5, 4, 2, 64, true, true},
                 Case{3, 4, 1, 16, false, false}, Case{2, 6, 2, 256, true, false}, Case{1, 4, 2, 32, false, true}}) {
    ops::RopeTable table;
    for (int i = 0; i < c.head_dim / 2; ++i) table.inv_freq.push_back(std::pow(10000.0f, -2.0f * i / c.head_dim));
    table.attention_factor = 1.05f;
    table.interleaved = c.interleaved;
    const int64_t S = 64;
    Tensor q = random({c.T, c.heads, c.head_dim}, DType::f32, 1), k = random({c.T, c.kv_heads, c.head_dim}, DType::f32, 2);
    Tensor v = random({c.T, c.kv_heads, c.head_dim}, DType::f32, 3);
    Tensor qn = c.norm ? random({c.head_dim}, DType::bf16, 4, 0.2f, 1.0f) : Tensor();
    Tensor kn = c.norm ? random({c.head_dim}, DType::bf16, 5, 0.2f, 1.0f) : Tensor();
    Tensor pos = Tensor::empty({1}, DType::i32);
    pos.data<int32_t>()[0] = 37;
    Tensor kc = Tensor::zeros({S, c.kv_heads, c.head_dim}, DType::f32), vc = Tensor::zeros({S, c.kv_heads, c.head_dim}, DType::f32);
    Tensor q_cpu = q.clone();
    ops::qk_norm_rope_store(q_cpu, k, v, qn, kn, 1e-6f, table, pos, kc, vc);
    Tensor q_gpu = gpu(q), kc_gpu = Tensor::zeros({S, c.kv_heads, c.head_dim}, DType::bf16, Device::cuda);
    Tensor vc_gpu = Tensor::zeros({S, c.kv_heads, c.head_dim}, DType::bf16, Device::cuda);
    ops::qk_norm_rope_store(q_gpu, gpu(k), gpu(v), c.norm ? gpu(qn) : Tensor(), c.norm ? gpu(kn) : Tensor(), 1e-6f,
                            table, gpu(pos), kc_gpu, vc_gpu);
    std::string label = fmt::format("qk_norm_rope_store T={} {}/{}x{}{}{}", c.T, c.heads, c.kv_heads, c.head_dim,
                                    c.norm ? " norm" : "", c.interleaved ? " interleaved" : "");
    EXPECT_LE(relative_error(q_gpu, q_cpu, label + " q"), 2e-5f);
    // The GPU cache is bf16: compare against the CPU rows rounded the same way.
    EXPECT_LE(relative_error(kc_gpu.to_device(Device::cpu).to(DType::f32), kc.to(DType::bf16).to(DType::f32), label + " k cache"), 8e-3f);
    EXPECT_LE(relative_error(vc_gpu.to_device(Device::cpu).to(DType::f32), vc.to(DType::bf16).to(DType::f32), label + " v cache"), 0.0f);
  }
}

TEST_F(CudaOps, Rope) {
  for (bool interleaved : {false, true})
    for (int head_dim : {16, 64, 128}) {
      ops::RopeTable table;
      for (int i = 0; i < head_dim / 2; ++i) table.inv_freq.push_back(std::pow(10000.0f, -2.0f * i / head_dim));
      table.attention_factor = 1.1f;
      table.interleaved = interleaved;
      Tensor x = random({5, 3, head_dim}, DType::f32, uint64_t(head_dim));
      Tensor xd = gpu(x);
      for (std::vector<int32_t> pos : {std::vector<int32_t>{1000, 1001, 1002, 1003, 1004}, std::vector<int32_t>{7, 3, 90, 4095, 0}}) {
        Tensor want = x.clone(), got = xd.clone();
        ops::rope(want, pos, table);
        ops::rope(got, pos, table);
        EXPECT_LE(relative_error(got, want, fmt::format("rope d={} {}", head_dim, interleaved ? "interleaved" : "half")),
                  2e-5f);
      }
    }
}

TEST_F(CudaOps, AttentionDecodeAndPrefillWithGqa) {
  struct Case { int64_t T, pos0, heads, kv_heads, head_dim; };
  for (Case c : {Case{1, 0, 8, 2, 64}, Case{1, 300, 32, 8, 128}, Case{1, 4100, 16, 4, 128}, Case{17, 0, 4, 1, 32},
                 Case{24, 100, 4, 2, 16}, Case{3, 600, 6, 2, 256},
                 // Groups of 8 (Qwen3-30B-A3B's heads): the GQA kernel's eight-warp form.
                 Case{1, 63, 32, 4, 128}, Case{1, 8200, 32, 4, 128}, Case{1, 700, 16, 2, 64}})
    for (DType kv : {DType::f32, DType::bf16}) {
      int64_t S = c.pos0 + c.T;
      Tensor q = random({c.T, c.heads, c.head_dim}, DType::f32, 1);
      // The CPU reference reads the same values the GPU cache holds (bf16 rounded).
      Tensor k = random({S, c.kv_heads, c.head_dim}, kv, 2), v = random({S, c.kv_heads, c.head_dim}, kv, 3);
      float scale = 1.0f / std::sqrt(float(c.head_dim));
      Tensor want = ops::attention(q, k.to(DType::f32), v.to(DType::f32), c.pos0, scale);
      EXPECT_LE(relative_error(ops::attention(gpu(q), gpu(k), gpu(v), c.pos0, scale), want,
                               fmt::format("attention T={} pos0={} {}/{}x{} kv {}", c.T, c.pos0, c.heads, c.kv_heads,
                                           c.head_dim, dtype_name(kv))),
                1e-4f);
    }
}

}  // namespace
}  // namespace mere

// The quantized KV cache on CUDA (ctest label gpu) against the CPU reference:
// the quantizing write (codes within 1, scales and biases equal), the fused
// rope-store into a quantized cache, the bf16 copy prefill reads, and attention
// over the codes (dequantized in registers) against the CPU's attention over the
// dequantized rows. Rows past the visible ones carry NaN scales: a kernel that
// reads a key no token sees turns its output into NaN.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "core/device.h"
#include "gpu_test_util.h"
#include "ops/cuda/launchers.h"
#include "ops/ops.h"
#include "test_util.h"

namespace mere {
namespace {

using test::gpu;
using test::random;
using test::relative_error;

class KvQuantGpu : public test::NeedsGpu<> {};

// Rows with awkward groups: a constant group, an outlier, a tiny value.
Tensor awkward_rows(int64_t T, int64_t heads, int64_t d, uint64_t seed) {
  Tensor x = random({T, heads, d}, DType::f32, seed, 3.0f);
  float* p = x.data<float>();
  for (int64_t i = 0; i < std::min<int64_t>(d, 64); ++i) p[i] = 0.25f;
  if (x.numel() > 200) p[130] = 40.0f, p[200] = -1e-3f;
  return x;
}

ops::AffineRows to_device(const ops::AffineRows& q, Device device) {
  return {q.codes.to_device(device), q.scales.to_device(device), q.biases.to_device(device), q.bits};
}

ops::AffineRows zeros_affine(int64_t rows, int64_t heads, int64_t d, int bits, Device device) {
  const int64_t groups = d / ops::kv_quant_group(d);
  return {Tensor::zeros({rows, heads, d * bits / 8}, DType::u8, device),
          Tensor::zeros({rows, heads, groups}, DType::bf16, device),
          Tensor::zeros({rows, heads, groups}, DType::bf16, device), bits};
}

int code_at(const ops::AffineRows& q, int64_t i) {  // element i of the flattened rows
  const uint8_t* c = q.codes.data<uint8_t>();
  return q.bits == 8 ? c[i] : (c[i / 2] >> ((i % 2) * 4)) & 0xf;
}

// Rows [pos, pos + T) of got (GPU, copied back) against want (CPU rows [0, T)):
// scales and biases equal, codes within 1 (reports how many differ at all).
void expect_same_quantization(const ops::AffineRows& got_device, const ops::AffineRows& want, int64_t pos,
                              const std::string& label) {
  const ops::AffineRows got = to_device(got_device, Device::cpu);
  const int64_t per_row_groups = want.scales.numel() / want.scales.dim(0);
  const int64_t per_row = want.codes.dim(1) * want.head_dim();
  int64_t differ = 0;
  for (int64_t g = 0; g < want.scales.numel(); ++g) {
    const int64_t gg = pos * per_row_groups + g;
    ASSERT_EQ(bf16_to_f32(got.scales.data<uint16_t>()[gg]), bf16_to_f32(want.scales.data<uint16_t>()[g]))
        << label << " scale of group " << g;
    ASSERT_EQ(bf16_to_f32(got.biases.data<uint16_t>()[gg]), bf16_to_f32(want.biases.data<uint16_t>()[g]))
        << label << " bias of group " << g;
  }
  for (int64_t i = 0; i < want.codes.dim(0) * per_row; ++i) {
    const int a = code_at(got, pos * per_row + i), b = code_at(want, i);
    ASSERT_LE(std::abs(a - b), 1) << label << " element " << i;
    differ += a != b;
  }
  std::printf("[ gpu      ] %-56s %lld of %lld codes differ (by 1)\n", label.c_str(), (long long)differ,
              (long long)(want.codes.dim(0) * per_row));
}

TEST_F(KvQuantGpu, StoreRowsMatchesTheCpuQuantizer) {
  for (int bits : {8, 4})
    for (int64_t d : {16, 32, 64, 128, 256})
      for (int64_t heads : {1, 3, 8}) {
        const int64_t T = 5, S = 20, pos0 = 7;
        Tensor x = awkward_rows(T, heads, d, uint64_t(bits * 1000 + d + heads));
        ops::AffineRows want = ops::quantize_kv_rows(x, bits);
        ops::AffineRows dst = zeros_affine(S, heads, d, bits, Device::cuda);
        Tensor pos = Tensor::empty({1}, DType::i32);
        pos.data<int32_t>()[0] = int32_t(pos0);
        ops::store_rows(gpu(x), dst, gpu(pos));
        expect_same_quantization(dst, want, pos0, fmt::format("store_rows affine{} {}x{}", bits, heads, d));
        // Rows outside [pos0, pos0 + T) are untouched.
        const ops::AffineRows back = to_device(dst, Device::cpu);
        for (int64_t r : {int64_t(0), pos0 - 1, pos0 + T, S - 1})
          for (int64_t b = 0; b < back.codes.dim(1) * back.codes.dim(2); ++b)
            ASSERT_EQ(back.codes.data<uint8_t>()[r * back.codes.dim(1) * back.codes.dim(2) + b], 0) << r;
      }
}

TEST_F(KvQuantGpu, DequantizedCopyMatchesTheCpu) {
  for (int bits : {8, 4})
    for (int64_t d : {32, 128}) {
      ops::AffineRows q = ops::quantize_kv_rows(awkward_rows(9, 4, d, uint64_t(d + bits)), bits);
      Tensor want = ops::dequantize_kv_rows(q, 6, d);
      Tensor got = Tensor::empty({8, 4, d}, DType::bf16, Device::cuda);
      ops::dequantize_rows_into(to_device(q, Device::cuda), 6, got);
      Tensor rows = got.to_device(Device::cpu).to(DType::f32).slice_rows(0, 6);
      EXPECT_LE(relative_error(rows, want, fmt::format("dequantize_rows affine{} x{}", bits, d)), 4e-3f);
    }
}

// The fused epilogue into a quantized cache against the CPU composition
// (rms_norm, rope, quantizing store). RoPE differs in the last bits between the
// devices, so a code may move by one: every dequantized value is within one
// step (the CPU group's scale) of the CPU's.
TEST_F(KvQuantGpu, FusedRopeStoreQuantizesLikeTheComposition) {
  struct Case { int64_t T, heads, kv_heads, head_dim; bool norm; };
  for (int bits : {8, 4})
    for (Case c : {Case{1, 32, 8, 128, false}, Case{1, 16, 8, 128, true}, Case{5, 4, 2, 64, true},
                   Case{3, 4, 1, 16, false}, Case{2, 6, 2, 256, true}, Case{1, 4, 2, 32, false}}) {
      ops::RopeTable table;
      for (int i = 0; i < c.head_dim / 2; ++i) table.inv_freq.push_back(std::pow(10000.0f, -2.0f * i / c.head_dim));
      const int64_t S = 64;
      Tensor q = random({c.T, c.heads, c.head_dim}, DType::f32, 1);
      Tensor k = random({c.T, c.kv_heads, c.head_dim}, DType::f32, 2);
      Tensor v = random({c.T, c.kv_heads, c.head_dim}, DType::f32, 3);
      Tensor qn = c.norm ? random({c.head_dim}, DType::bf16, 4, 0.2f, 1.0f) : Tensor();
      Tensor kn = c.norm ? random({c.head_dim}, DType::bf16, 5, 0.2f, 1.0f) : Tensor();
      Tensor pos = Tensor::empty({1}, DType::i32);
      pos.data<int32_t>()[0] = 37;
      ops::AffineRows kc = zeros_affine(S, c.kv_heads, c.head_dim, bits, Device::cpu);
      ops::AffineRows vc = zeros_affine(S, c.kv_heads, c.head_dim, bits, Device::cpu);
      Tensor q_cpu = q.clone();
      ops::qk_norm_rope_store(q_cpu, k, v, qn, kn, 1e-6f, table, pos, kc, vc);
      ops::AffineRows kg = zeros_affine(S, c.kv_heads, c.head_dim, bits, Device::cuda);
      ops::AffineRows vg = zeros_affine(S, c.kv_heads, c.head_dim, bits, Device::cuda);
      Tensor q_gpu = gpu(q);
      ops::qk_norm_rope_store(q_gpu, gpu(k), gpu(v), c.norm ? gpu(qn) : Tensor(), c.norm ? gpu(kn) : Tensor(), 1e-6f,
                              table, gpu(pos), kg, vg);
      const std::string label = fmt::format("qk_norm_rope_store affine{} T={} {}/{}x{}{}", bits, c.T, c.heads,
                                            c.kv_heads, c.head_dim, c.norm ? " norm" : "");
      EXPECT_LE(relative_error(q_gpu, q_cpu, label + " q"), 2e-5f);
      for (auto [got_dev, want, name] : {std::tuple{&kg, &kc, "k"}, std::tuple{&vg, &vc, "v"}}) {
        const ops::AffineRows got = to_device(*got_dev, Device::cpu);
        Tensor a = ops::dequantize_kv_rows(got, S, c.head_dim), b = ops::dequantize_kv_rows(*want, S, c.head_dim);
        const int64_t group = ops::kv_quant_group(c.head_dim);
        float worst = 0;
        for (int64_t i = 0; i < b.numel(); ++i) {
          const float step = bf16_to_f32(want->scales.data<uint16_t>()[i / group]);
          const float err = std::fabs(a.data<float>()[i] - b.data<float>()[i]);
          ASSERT_LE(err, 1.01f * step + 1e-6f) << label << " " << name << " element " << i;
          worst = std::max(worst, step > 0 ? err / step : 0.0f);
        }
        std::printf("[ gpu      ] %-56s %s cache: worst %.2f steps\n", label.c_str(), name, worst);
      }
    }
}

// A quantized cache of `rows` visible rows and kPoisoned more with NaN scales.
constexpr int64_t kPoisoned = 40;
ops::AffineRows poisoned_quantized(int64_t rows, int64_t kv_heads, int64_t d, int bits, uint64_t seed) {
  ops::AffineRows q = ops::quantize_kv_rows(random({rows + kPoisoned, kv_heads, d}, DType::f32, seed, 2.0f), bits);
  const size_t row_bytes = q.scales.size_bytes() / size_t(q.scales.dim(0));
  std::memset(static_cast<char*>(q.scales.raw()) + rows * row_bytes, 0xff, kPoisoned * row_bytes);
  return q;
}

struct AttentionCase {
  int64_t T, pos0, heads, kv_heads, head_dim;
};

// q and poisoned affine K/V of a case (on the GPU), and the CPU's attention over
// the dequantized rows.
struct AffineAttentionInputs {
  Tensor q, pos, want;
  ops::AffineRows k, v;
  float scale;
};
AffineAttentionInputs affine_attention_inputs(const AttentionCase& c, int bits, uint64_t seed) {
  const int64_t S = c.pos0 + c.T;
  Tensor q = random({c.T, c.heads, c.head_dim}, DType::f32, uint64_t(c.T * seed + c.pos0), 3.0f);
  ops::AffineRows k = poisoned_quantized(S, c.kv_heads, c.head_dim, bits, seed);
  ops::AffineRows v = poisoned_quantized(S, c.kv_heads, c.head_dim, bits, seed + 1);
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  Tensor want = ops::attention(q, ops::dequantize_kv_rows(k, S, c.head_dim),
                               ops::dequantize_kv_rows(v, S, c.head_dim), c.pos0, scale);
  Tensor pos = Tensor::empty({1}, DType::i32);
  pos.data<int32_t>()[0] = int32_t(c.pos0);
  return {gpu(q), gpu(pos), want, to_device(k, Device::cuda), to_device(v, Device::cuda), scale};
}

TEST_F(KvQuantGpu, AttentionReadsTheCodesLikeTheCpuReadsDequantizedRows) {
  for (int bits : {8, 4})
    for (AttentionCase c : {AttentionCase{1, 0, 8, 2, 64}, {1, 300, 32, 8, 128}, {1, 4100, 32, 8, 128},
                            {1, 1000, 16, 2, 128}, {3, 600, 6, 2, 256}, {5, 37, 4, 2, 16}, {1, 100, 4, 1, 32},
                            {4, 70, 8, 8, 64}, {1, 9000, 64, 8, 128}, {17, 0, 4, 1, 32}, {24, 100, 4, 2, 64},
                            {40, 300, 32, 8, 128}}) {
      const AffineAttentionInputs in = affine_attention_inputs(c, bits, 7);
      const std::string label = fmt::format("attention affine{} T={} pos0={} {}/{}x{}", bits, c.T, c.pos0, c.heads,
                                            c.kv_heads, c.head_dim);
      // The device-position form always reads the codes; the host form copies
      // the visible rows to bf16 for a prefill (T >= 16: bf16 rounding and the
      // tensor cores, as the dense prefill test allows).
      EXPECT_LE(relative_error(ops::attention(in.q, in.k, in.v, in.pos, in.scale), in.want, label + " codes"), 1e-4f);
      EXPECT_LE(relative_error(ops::attention(in.q, in.k, in.v, c.pos0, in.scale), in.want, label + " host pos"),
                c.T >= 16 ? 2e-2f : 1e-4f);
    }
}

// Lever tensor_core_kv_attention: the same cases on the tensor-core kernel where
// head_dim is 64 or 128 (the rest fall back to the CUDA-core kernel, bit for
// bit). q and p s are rounded to f16 (11 bits against the codes' 8 or 4), so the
// bound is 2e-3 rather than 1e-4. Poisoned rows past the visible ones stay unread.
TEST_F(KvQuantGpu, TensorCoreAttentionReadsTheCodesLikeTheCpu) {
  for (int bits : {8, 4})
    for (AttentionCase c : {AttentionCase{1, 0, 8, 2, 64}, {1, 300, 32, 8, 128}, {1, 4100, 32, 8, 128},
                            {1, 1000, 16, 2, 128}, {1, 5, 40, 8, 128}, {3, 600, 6, 2, 256}, {5, 37, 4, 2, 16},
                            {4, 70, 8, 8, 64}, {1, 9000, 64, 8, 128}, {1, 2047, 28, 4, 128}, {40, 300, 32, 8, 128}}) {
      const AffineAttentionInputs in = affine_attention_inputs(c, bits, 11);
      const std::string label = fmt::format("tensor-core attention affine{} T={} pos0={} {}/{}x{}", bits, c.T, c.pos0,
                                            c.heads, c.kv_heads, c.head_dim);
      ops::set_launch_settings({});
      const Tensor cuda_cores = ops::attention(in.q, in.k, in.v, in.pos, in.scale).to_device(Device::cpu);
      ops::set_launch_settings({.tensor_core_kv_attention = true});
      const Tensor tensor_cores = ops::attention(in.q, in.k, in.v, in.pos, in.scale).to_device(Device::cpu);
      ops::set_launch_settings({});
      EXPECT_LE(relative_error(tensor_cores, in.want, label), 2e-3f);
      // Structural: the lever changes the kernel exactly where it applies (with
      // more than one key: one key's output is its V row on either kernel).
      const bool applies = cuda::attention_affine_mma_supports(int(c.head_dim), bits);
      const bool same = std::memcmp(tensor_cores.raw(), cuda_cores.raw(), tensor_cores.size_bytes()) == 0;
      if (c.pos0 + c.T > 1) {
        EXPECT_EQ(same, !applies) << label;
      }
    }
}

// V groups wider than f16 can carry through p s (a range above 2.6e5) saturate
// on the tensor-core kernel: the output stays finite, never inf or NaN.
TEST_F(KvQuantGpu, TensorCoreAttentionStaysFiniteOnHugeValues) {
  const int64_t S = 300, heads = 8, kv_heads = 2, d = 128;
  for (int bits : {8, 4}) {
    Tensor q = random({1, heads, d}, DType::f32, 3, 1.0f);
    ops::AffineRows k = to_device(ops::quantize_kv_rows(random({S, kv_heads, d}, DType::f32, 4, 1.0f), bits),
                                  Device::cuda);
    ops::AffineRows v = to_device(ops::quantize_kv_rows(random({S, kv_heads, d}, DType::f32, 5, 1e6f), bits),
                                  Device::cuda);
    Tensor pos = Tensor::empty({1}, DType::i32);
    pos.data<int32_t>()[0] = int32_t(S - 1);
    ops::set_launch_settings({.tensor_core_kv_attention = true});
    const Tensor out = ops::attention(gpu(q), k, v, gpu(pos), 1.0f / std::sqrt(float(d))).to_device(Device::cpu);
    ops::set_launch_settings({});
    for (int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isfinite(out.at(i))) << "affine" << bits << " " << i;
  }
}

float time_ms(const std::function<cudaError_t()>& launch, int reps = 20) {
  cudaStream_t stream = static_cast<cudaStream_t>(cuda_stream());
  EXPECT_EQ(launch(), cudaSuccess);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, stream);
  for (int i = 0; i < reps; ++i) EXPECT_EQ(launch(), cudaSuccess);
  cudaEventRecord(stop, stream);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / float(reps);
}

// One layer's decode attention of the Llama-3-8B shape (32 query heads over 8 kv
// heads of 128) at 1k, 8k and 32k cached positions, as a decode graph launches it
// (splits fixed by the cache, at most 64), for each KV mode: time and the K/V
// bytes read per second. Printed, not asserted (performance lives in benchmarks);
// the target is affine8 no slower than bf16 at 1k and faster from 8k.
TEST_F(KvQuantGpu, DecodeAttentionSpeedByMode) {
  cudaStream_t stream = static_cast<cudaStream_t>(cuda_stream());
  const int heads = 32, kv_heads = 8, d = 128;
  const float scale = 1.0f / std::sqrt(float(d));
  for (int64_t S : {1024, 8192, 32768}) {
    const int splits = cuda::attention_splits(S, kv_heads);
    Tensor q = Tensor::empty({1, heads, d}, DType::f32, Device::cuda);
    ops::fill_random(q, 1, 1.0f);
    Tensor out = Tensor::empty({1, heads, d}, DType::f32, Device::cuda);
    Tensor part_m = Tensor::empty({1, heads, splits}, DType::f32, Device::cuda);
    Tensor part_l = Tensor::empty({1, heads, splits}, DType::f32, Device::cuda);
    Tensor part_o = Tensor::empty({1, heads, splits, d}, DType::f32, Device::cuda);
    const int32_t pos_host = int32_t(S - 1);
    Tensor pos = Tensor::empty({1}, DType::i32);
    pos.data<int32_t>()[0] = pos_host;
    Tensor pos_dev = gpu(pos);
    auto report = [&](const char* mode, float ms, double bytes) {
      std::printf("[ gpu      ] decode attention 32/8x128 S=%-6lld kv %-11s %8.1f us  %7.0f GB/s of K/V\n",
                  (long long)S, mode, ms * 1e3, bytes / (ms * 1e-3) / 1e9);
    };
    Tensor k = Tensor::empty({S, kv_heads, d}, DType::bf16, Device::cuda), v = k.clone();
    ops::fill_random(k, 2, 1.0f);
    ops::fill_random(v, 3, 1.0f);
    report("bf16", time_ms([&] {
             return cuda::launch_attention(q.data<float>(), k.raw(), v.raw(), DType::bf16, part_m.data<float>(),
                                           part_l.data<float>(), part_o.data<float>(), out.data<float>(), 1, heads,
                                           kv_heads, d, pos_dev.data<int32_t>(), 0, splits, scale, cuda::KvTables{},
                                           stream);
           }),
           2.0 * double(S) * kv_heads * d * 2);
    for (int bits : {8, 4}) {
      ops::AffineRows kq = zeros_affine(S, kv_heads, d, bits, Device::cuda), vq = zeros_affine(S, kv_heads, d, bits, Device::cuda);
      for (ops::AffineRows* r : {&kq, &vq}) {
        ops::fill_random_bytes(r->codes, 4, 0xff);
        ops::fill_random(r->scales, 5, 0.002f, 0.005f);
        ops::fill_random(r->biases, 6, 0.5f);
      }
      const cuda::AffineKv kv{kq.codes.raw(), vq.codes.raw(), kq.scales.raw(), kq.biases.raw(),
                              vq.scales.raw(), vq.biases.raw(), bits};
      const double bytes = 2.0 * (kq.codes.size_bytes() + kq.scales.size_bytes() + kq.biases.size_bytes());
      for (bool tensor_cores : {false, true}) {
        cuda::set_tensor_core_kv_attention(tensor_cores);
        const char* mode = bits == 8 ? (tensor_cores ? "affine8 mma" : "affine8")
                                     : (tensor_cores ? "affine4 mma" : "affine4");
        report(mode, time_ms([&] {
                 return cuda::launch_attention_affine(q.data<float>(), kv, part_m.data<float>(), part_l.data<float>(),
                                                      part_o.data<float>(), out.data<float>(), 1, heads, kv_heads, d,
                                                      pos_dev.data<int32_t>(), 0, splits, scale,
                                                      cuda::KvTables{}, stream);
               }),
               bytes);
      }
      cuda::set_tensor_core_kv_attention(false);
    }
  }
}

}  // namespace
}  // namespace mere

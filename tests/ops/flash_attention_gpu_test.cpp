// The tensor-core prefill attention (ops/cuda/flash_attention.cu) against the CPU
// reference, through both ops::attention overloads and for every compiled tile
// shape (ctest label gpu), and its speed against split-K flash decoding, printed
// and not asserted. q and P go through the tensor cores as bf16, so errors are
// about 1e-3 of the largest output, and a wrong mask or fragment shows as 1e-1.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>

#include "core/device.h"
#include "ops/cuda/launchers.h"
#include "ops/ops.h"
#include "gpu_test_util.h"
#include "test_util.h"

namespace mere {
namespace {

using test::gpu;
using test::random;
using test::relative_error;

constexpr float kTolerance = 2e-2f;
constexpr int64_t kPoisonedRows = 5;


// A bf16 cache [rows + kPoisonedRows, kv_heads, head_dim] whose rows past `rows`
// are NaN: a kernel that reads a key no token sees turns its output into NaN.
Tensor poisoned_cache(int64_t rows, int64_t kv_heads, int64_t head_dim, uint64_t seed) {
  Tensor t = random({rows + kPoisonedRows, kv_heads, head_dim}, DType::bf16, seed);
  const size_t row_bytes = size_t(kv_heads * head_dim) * 2;
  std::memset(static_cast<char*>(t.raw()) + rows * row_bytes, 0xff, kPoisonedRows * row_bytes);
  return t;
}

struct Inputs {
  Tensor q, k, v, want;  // q, k, v on the host; want: the CPU reference
  float scale;
};

// Scores of a few units (q up to 3), so the softmax is neither flat nor one-hot.
Inputs make_inputs(int64_t T, int64_t pos0, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  Inputs in;
  const int64_t S = pos0 + T;
  in.q = random({T, heads, head_dim}, DType::f32, uint64_t(T * 131 + pos0), 3.0f);
  in.k = poisoned_cache(S, kv_heads, head_dim, 2);
  in.v = poisoned_cache(S, kv_heads, head_dim, 3);
  in.scale = 1.0f / std::sqrt(float(head_dim));
  in.want = ops::attention(in.q, in.k.to(DType::f32), in.v.to(DType::f32), pos0, in.scale);
  return in;
}

class FlashAttention : public test::NeedsGpu<> {};

TEST_F(FlashAttention, MatchesCpuThroughBothOverloads) {
  struct Heads { int64_t heads, kv_heads; };
  for (int64_t head_dim : {64, 128})
    for (Heads hh : {Heads{2, 2}, Heads{8, 2}, Heads{8, 1}})
      for (int64_t T : {16, 17, 100, 512, 1000})
        for (int64_t pos0 : {0, 37, 300}) {
          Inputs in = make_inputs(T, pos0, hh.heads, hh.kv_heads, head_dim);
          Tensor q = gpu(in.q), k = gpu(in.k), v = gpu(in.v);
          Tensor pos = Tensor::empty({1}, DType::i32);
          pos.data<int32_t>()[0] = int32_t(pos0);
          std::string label = fmt::format("flash T={} pos0={} {}/{}x{}", T, pos0, hh.heads, hh.kv_heads, head_dim);
          EXPECT_LE(relative_error(ops::attention(q, k, v, pos0, in.scale), in.want, label + " host pos"), kTolerance);
          EXPECT_LE(relative_error(ops::attention(q, k, v, gpu(pos), in.scale), in.want, label + " device pos"),
                    kTolerance);
        }
}

// Model-sized heads (Llama-3 8B, 32 / 8 x 128) and head_dim 256 (Gemma).
TEST_F(FlashAttention, ModelShapesAndHeadDim256) {
  struct Case { int64_t T, pos0, heads, kv_heads, head_dim; };
  for (Case c : {Case{512, 300, 32, 8, 128}, Case{100, 37, 8, 2, 256}, Case{517, 300, 4, 4, 256},
                 Case{64, 1000, 16, 2, 256}}) {
    Inputs in = make_inputs(c.T, c.pos0, c.heads, c.kv_heads, c.head_dim);
    Tensor pos = Tensor::empty({1}, DType::i32);
    pos.data<int32_t>()[0] = int32_t(c.pos0);
    std::string label = fmt::format("flash T={} pos0={} {}/{}x{}", c.T, c.pos0, c.heads, c.kv_heads, c.head_dim);
    EXPECT_LE(relative_error(ops::attention(gpu(in.q), gpu(in.k), gpu(in.v), c.pos0, in.scale), in.want,
                             label + " host pos"), kTolerance);
    EXPECT_LE(relative_error(ops::attention(gpu(in.q), gpu(in.k), gpu(in.v), gpu(pos), in.scale), in.want,
                             label + " device pos"), kTolerance);
  }
}

// Each compiled tile shape, not only the default the dispatch picks.
TEST_F(FlashAttention, EveryTileShapeMatchesCpu) {
  struct Case { int64_t T, pos0, heads, kv_heads; };
  for (int head_dim : {64, 128, 256})
    for (Case c : {Case{100, 37, 8, 2}, Case{1000, 300, 4, 1}}) {
      if (head_dim == 256 && c.T == 1000) c.T = 300;
      Inputs in = make_inputs(c.T, c.pos0, c.heads, c.kv_heads, head_dim);
      Tensor q = gpu(in.q), k = gpu(in.k), v = gpu(in.v);
      for (int variant = 0; variant < cuda::flash_attention_variants(head_dim); ++variant) {
        Tensor out = Tensor::empty(in.want.shape(), DType::f32, Device::cuda);
        ASSERT_EQ(cuda::launch_flash_attention(q.data<float>(), k.raw(), v.raw(), out.data<float>(), int(c.T),
                                               int(c.heads), int(c.kv_heads), head_dim, nullptr, c.pos0, in.scale,
                                               static_cast<cudaStream_t>(cuda_stream()), variant),
                  cudaSuccess);
        cuda::FlashAttentionTile t = cuda::flash_attention_tile(head_dim, variant);
        std::string label = fmt::format("tile {}w x {} rows, {} keys{}, {} blk: T={} pos0={} {}/{}x{}", t.warps,
                                        16 * t.warp_m_tiles, t.keys, t.q_in_registers ? ", q regs" : "",
                                        t.min_blocks, c.T, c.pos0, c.heads, c.kv_heads, head_dim);
        EXPECT_LE(relative_error(out, in.want, label), kTolerance);
      }
    }
}

// Milliseconds per launch: one warm-up, then the mean of `reps` launches.
template <typename Launch>
float time_ms(Launch&& launch, int reps = 5) {
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

// Causal attention FLOPs: 4 * head_dim per (query head, visible key) pair. The
// H200's dense bf16 rate is about 790 TFLOP/s.
TEST_F(FlashAttention, SpeedAgainstSplitK) {
  cudaStream_t stream = static_cast<cudaStream_t>(cuda_stream());
  struct Case { int T; int64_t pos0; int heads, kv_heads, head_dim; };
  for (Case c : {Case{4096, 0, 32, 8, 128}, Case{4096, 0, 32, 8, 64}, Case{2048, 0, 16, 8, 256},
                 Case{512, 0, 32, 8, 128}, Case{16, 4080, 32, 8, 128}, Case{64, 4032, 32, 8, 128},
                 Case{256, 3840, 32, 8, 128}}) {
    const int64_t S = c.pos0 + c.T;
    Tensor q = Tensor::empty({c.T, c.heads, c.head_dim}, DType::f32, Device::cuda);
    Tensor k = Tensor::empty({S, c.kv_heads, c.head_dim}, DType::bf16, Device::cuda);
    Tensor v = Tensor::empty({S, c.kv_heads, c.head_dim}, DType::bf16, Device::cuda);
    Tensor out = Tensor::empty({c.T, c.heads, c.head_dim}, DType::f32, Device::cuda);
    ops::fill_random(q, 1, 1.0f);
    ops::fill_random(k, 2, 1.0f);
    ops::fill_random(v, 3, 1.0f);
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    const double flops = 4.0 * c.heads * c.head_dim * (double(c.T) * c.pos0 + double(c.T) * (c.T + 1) / 2);
    auto report = [&](const std::string& what, float ms) {
      std::printf("[ gpu      ] T=%d pos0=%lld %d/%dx%d %-40s %8.3f ms %6.1f TFLOP/s\n", c.T, (long long)c.pos0,
                  c.heads, c.kv_heads, c.head_dim, what.c_str(), ms, flops / (ms * 1e-3) / 1e12);
    };

    const int splits = cuda::attention_splits(S, c.kv_heads);
    Tensor part_m = Tensor::empty({c.T, c.heads, splits}, DType::f32, Device::cuda);
    Tensor part_l = Tensor::empty({c.T, c.heads, splits}, DType::f32, Device::cuda);
    Tensor part_o = Tensor::empty({c.T, c.heads, splits, c.head_dim}, DType::f32, Device::cuda);
    report("split-K (old)", time_ms([&] {
             return cuda::launch_attention(q.data<float>(), k.raw(), v.raw(), DType::bf16, part_m.data<float>(),
                                           part_l.data<float>(), part_o.data<float>(), out.data<float>(), c.T,
                                           c.heads, c.kv_heads, c.head_dim, nullptr, c.pos0, splits, scale,
                                           cuda::KvTables{}, stream);
           }));
    for (int variant = 0; variant < cuda::flash_attention_variants(c.head_dim); ++variant) {
      cuda::FlashAttentionTile t = cuda::flash_attention_tile(c.head_dim, variant);
      report(fmt::format("flash {}w x {} rows, {} keys{}, {} blk{}", t.warps, 16 * t.warp_m_tiles, t.keys,
                         t.q_in_registers ? ", q regs" : "", t.min_blocks, variant == 0 ? " (default)" : ""),
             time_ms([&] {
               return cuda::launch_flash_attention(q.data<float>(), k.raw(), v.raw(), out.data<float>(), c.T, c.heads,
                                                   c.kv_heads, c.head_dim, nullptr, c.pos0, scale, stream, variant);
             }));
    }
  }
}

}  // namespace
}  // namespace mere

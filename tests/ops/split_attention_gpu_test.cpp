// The split-K decode attention's fallback kernel (ops/cuda/attention.cu,
// attention_split_kernel): it takes K/V rows the GQA kernel's 16-byte loads
// cannot, a head_dim whose rows are not a multiple of 16 bytes or a cache base
// off 16 bytes. Against the CPU reference over the same (bf16-rounded) cache,
// with the split count a graph would use (most splits empty) and the eager one.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>

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

class SplitAttentionGpu : public test::NeedsGpu<> {};

TEST_F(SplitAttentionGpu, RowsOffSixteenBytesMatchTheCpu) {
  cudaStream_t stream = static_cast<cudaStream_t>(cuda_stream());
  struct Case {
    int heads, kv_heads, head_dim;
    int64_t offset;  // elements the cache base sits past a 16-byte boundary
  };
  // head_dim 20 and 36: bf16 rows of 40 and 72 bytes; head_dim 64 with the
  // base 2 bytes off.
  for (const Case& c : {Case{8, 2, 20, 0}, Case{6, 6, 36, 0}, Case{8, 4, 64, 1}})
    for (int64_t T : {1, 3})
      for (int64_t keys : {1, 100, 700})
        for (bool graph_like : {false, true}) {
          const int splits = cuda::attention_splits(graph_like ? 4096 : keys, c.kv_heads);
          const int64_t pos0 = keys > T ? keys - T : 0, S = pos0 + T;
          const std::string label = fmt::format("{}/{}x{} base+{} T={} keys={} splits={}", c.heads, c.kv_heads,
                                                c.head_dim, c.offset, T, S, splits);
          const Tensor q = random({T, c.heads, c.head_dim}, DType::f32, uint64_t(S + T), 3.0f);
          const Tensor k = random({S, c.kv_heads, c.head_dim}, DType::bf16, 2);
          const Tensor v = random({S, c.kv_heads, c.head_dim}, DType::bf16, 3);
          const float scale = 1.0f / std::sqrt(float(c.head_dim));
          const Tensor want = ops::attention(q, k.to(DType::f32), v.to(DType::f32), pos0, scale);

          // The caches at `offset` elements into a larger buffer.
          const int64_t n = S * c.kv_heads * c.head_dim;
          Tensor k_buf = Tensor::empty({n + 8}, DType::bf16, Device::cuda);
          Tensor v_buf = Tensor::empty({n + 8}, DType::bf16, Device::cuda);
          auto* k_dev = static_cast<uint16_t*>(k_buf.raw()) + c.offset;
          auto* v_dev = static_cast<uint16_t*>(v_buf.raw()) + c.offset;
          ASSERT_EQ(cudaMemcpy(k_dev, k.raw(), k.size_bytes(), cudaMemcpyHostToDevice), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(v_dev, v.raw(), v.size_bytes(), cudaMemcpyHostToDevice), cudaSuccess);
          const Tensor q_gpu = gpu(q);
          Tensor part_m = Tensor::empty({T, c.heads, splits}, DType::f32, Device::cuda);
          Tensor part_l = Tensor::empty({T, c.heads, splits}, DType::f32, Device::cuda);
          Tensor part_o = Tensor::empty({T, c.heads, splits, c.head_dim}, DType::f32, Device::cuda);
          Tensor out = Tensor::empty({T, c.heads, c.head_dim}, DType::f32, Device::cuda);
          ASSERT_EQ(cuda::launch_attention(q_gpu.data<float>(), k_dev, v_dev, DType::bf16, part_m.data<float>(),
                                           part_l.data<float>(), part_o.data<float>(), out.data<float>(), int(T),
                                           c.heads, c.kv_heads, c.head_dim, nullptr, pos0, splits, scale,
                                           cuda::KvTables{}, stream),
                    cudaSuccess)
              << label;
          EXPECT_LE(relative_error(out, want, label), 1e-4f);
        }
}

}  // namespace
}  // namespace mere

#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/random_hash.h"

namespace mere::ops::cpu {

void fill_random(Tensor& t, uint64_t seed, float scale, float offset) {
  parallel_for(t.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float v = offset + scale * random_uniform_pm1(seed, uint64_t(i));
      switch (t.dtype()) {
        case DType::f32: t.data<float>()[i] = v; break;
        case DType::bf16: t.data<uint16_t>()[i] = f32_to_bf16(v); break;
        default: t.data<uint16_t>()[i] = f32_to_f16(v); break;
      }
    }
  });
}

}  // namespace mere::ops::cpu

#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {

void embed(const Tensor& table, const std::vector<int32_t>& ids, Tensor& out) {
  int64_t d = table.dim(1);
  for (size_t t = 0; t < ids.size(); ++t) load_f32(table, int64_t(ids[t]) * d, d, out.data<float>() + t * d);
}

}  // namespace mere::ops::cpu

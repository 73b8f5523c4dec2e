#include <cmath>

#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {

void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* y = out.data<float>();
  for (int64_t i = 0; i < gate.numel(); ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void add_inplace(Tensor& h, const Tensor& x) {
  float* a = h.data<float>();
  const float* b = x.data<float>();
  for (int64_t i = 0; i < h.numel(); ++i) a[i] += b[i];
}

}  // namespace mere::ops::cpu

#include <cmath>
#include <cstring>

#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {

void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* y = out.data<float>();
  for (int64_t i = 0; i < gate.numel(); ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void silu_mul_halves(const Tensor& gate_up, Tensor& out) {
  const int64_t T = out.dim(0), f = out.dim(1);
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up.data<float>() + t * 2 * f;
    const float* u = g + f;
    float* y = out.data<float>() + t * f;
    for (int64_t i = 0; i < f; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void split_columns(const Tensor& x, std::vector<Tensor>& parts) {
  const int64_t n = x.dim(1);
  const size_t elem = dtype_size(x.dtype());
  int64_t offset = 0;
  for (Tensor& dst : parts) {
    const int64_t T = dst.dim(0), w = dst.dim(1);
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(dst.data<char>() + t * w * int64_t(elem), x.data<char>() + (t * n + offset) * int64_t(elem),
                  size_t(w) * elem);
    offset += w;
  }
}

void add_inplace(Tensor& h, const Tensor& x) {
  float* a = h.data<float>();
  const float* b = x.data<float>();
  for (int64_t i = 0; i < h.numel(); ++i) a[i] += b[i];
}

}  // namespace mere::ops::cpu

#include <cmath>
#include <vector>

#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {

// Accumulate the mean square in f32 as transformers does (hidden states upcast to float32).
void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  int64_t d = x.dim(-1), rows = x.numel() / d;
  std::vector<float> weight(static_cast<size_t>(d));
  load_f32(w, 0, d, weight.data());
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data<float>() + r * d;
    float* yr = out.data<float>() + r * d;
    float mean_square = dot(xr, xr, d) / float(d);
    float inv = 1.0f / std::sqrt(mean_square + eps);
    for (int64_t i = 0; i < d; ++i) yr[i] = weight[size_t(i)] * (xr[i] * inv);
  }
}

}  // namespace mere::ops::cpu

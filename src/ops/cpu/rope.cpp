#include <cmath>
#include <vector>

#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {

// The angle is inv_freq * pos in f32, as transformers computes it, so long
// positions round the same way; cos/sin of that f32 angle are then exact.
void rope(Tensor& x, const std::vector<int32_t>& positions, const RopeTable& table) {
  const int64_t T = x.dim(0), heads = x.dim(1), head_dim = x.dim(2);
  const int half = table.rotary_dim() / 2;
  std::vector<float> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half));
  for (int64_t t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      float angle = table.inv_freq[size_t(i)] * float(positions[size_t(t)]);
      cos_t[size_t(i)] = float(std::cos(double(angle))) * table.attention_factor;
      sin_t[size_t(i)] = float(std::sin(double(angle))) * table.attention_factor;
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x.data<float>() + (t * heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        // Interleaved rotates the pair (2i, 2i+1); rotate-half pairs i with i + half.
        int a = table.interleaved ? 2 * i : i;
        int b = table.interleaved ? 2 * i + 1 : i + half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * cos_t[size_t(i)] - x1 * sin_t[size_t(i)];
        v[b] = x1 * cos_t[size_t(i)] + x0 * sin_t[size_t(i)];
      }
    }
  }
}

}  // namespace mere::ops::cpu

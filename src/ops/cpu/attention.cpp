#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {

// One task per (token, query head): scores over the visible keys, a max-shifted
// softmax in f32, then the weighted sum of values.
void attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale,
               Tensor& out) {
  const int64_t T = q.dim(0), n_heads = q.dim(1), head_dim = q.dim(2), n_kv_heads = k.dim(1);
  const int64_t group = n_heads / n_kv_heads;
  parallel_for(T * n_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / n_heads, h = task % n_heads, kv_h = h / group;
      const int64_t n_keys = pos0 + t + 1;
      const float* qv = q.data<float>() + (t * n_heads + h) * head_dim;
      scores.resize(size_t(n_keys));
      float max_score = -INFINITY;
      for (int64_t s = 0; s < n_keys; ++s) {
        const float* kv = k.data<float>() + (s * n_kv_heads + kv_h) * head_dim;
        scores[size_t(s)] = dot(qv, kv, head_dim) * scale;
        max_score = std::max(max_score, scores[size_t(s)]);
      }
      float sum = 0;
      for (auto& s : scores) sum += (s = std::exp(s - max_score));
      float* o = out.data<float>() + (t * n_heads + h) * head_dim;
      std::fill(o, o + head_dim, 0.0f);
      for (int64_t s = 0; s < n_keys; ++s) {
        const float* vv = v.data<float>() + (s * n_kv_heads + kv_h) * head_dim;
        float p = scores[size_t(s)] / sum;
        for (int64_t i = 0; i < head_dim; ++i) o[i] += p * vv[i];
      }
    }
  });
}

}  // namespace mere::ops::cpu

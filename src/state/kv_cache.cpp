#include "state/kv_cache.h"

#include <algorithm>
#include <cstring>

namespace mere {

KvCache::KvCache(int64_t n_kv_heads, int64_t head_dim, int64_t capacity)
    : n_kv_heads_(n_kv_heads), head_dim_(head_dim), capacity_(capacity) {}

void KvCache::reserve(int64_t n) {
  int64_t have = k_.defined() ? k_.dim(0) : 0;
  if (n <= have) return;
  // Double so a long generation reallocates O(log n) times.
  int64_t grown = std::min(capacity_, std::max({n, 2 * have, int64_t(256)}));
  Tensor k = Tensor::empty({grown, n_kv_heads_, head_dim_}, DType::f32);
  Tensor v = Tensor::empty({grown, n_kv_heads_, head_dim_}, DType::f32);
  if (have) {
    std::memcpy(k.raw(), k_.raw(), k_.size_bytes());
    std::memcpy(v.raw(), v_.raw(), v_.size_bytes());
  }
  k_ = k;
  v_ = v;
}

void KvCache::write(int64_t pos, const Tensor& k, const Tensor& v) {
  const int64_t T = k.dim(0);
  MERE_CHECK(pos + T <= capacity_, "context is full: position {} exceeds the cache capacity of {} tokens",
             pos + T, capacity_);
  MERE_ASSERT(k.shape() == v.shape() && k.dim(1) == n_kv_heads_ && k.dim(2) == head_dim_);
  reserve(pos + T);
  size_t row_bytes = size_t(n_kv_heads_ * head_dim_) * 4;
  std::memcpy(k_.data<char>() + pos * row_bytes, k.raw(), size_t(T) * row_bytes);
  std::memcpy(v_.data<char>() + pos * row_bytes, v.raw(), size_t(T) * row_bytes);
}

SeqState::SeqState(int n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t capacity)
    : capacity_(capacity) {
  layers_.reserve(size_t(n_layers));
  for (int l = 0; l < n_layers; ++l) layers_.emplace_back(n_kv_heads, head_dim, capacity);
}

void SeqState::advance(int64_t T) { length_ += T; }

void SeqState::truncate(int64_t length) {
  MERE_CHECK(length >= 0 && length <= length_, "truncate: cannot roll back from {} to {}", length_, length);
  length_ = length;
}

}  // namespace mere

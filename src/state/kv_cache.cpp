#include "state/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "ops/ops.h"

namespace mere {

KvCache::KvCache(int64_t n_kv_heads, int64_t head_dim, int64_t capacity, Device device)
    : n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      capacity_(capacity),
      device_(device),
      dtype_(device == Device::cpu ? DType::f32 : DType::bf16) {}

void KvCache::reserve(int64_t n) {
  MERE_CHECK(n <= capacity_, "context is full: {} positions exceed the cache capacity of {} tokens", n, capacity_);
  int64_t have = k_.defined() ? k_.dim(0) : 0;
  if (n <= have) return;
  // Double so a long generation reallocates O(log n) times.
  int64_t grown = std::min(capacity_, std::max({n, 2 * have, int64_t(256)}));
  Tensor k = Tensor::empty({grown, n_kv_heads_, head_dim_}, dtype_, device_);
  Tensor v = Tensor::empty({grown, n_kv_heads_, head_dim_}, dtype_, device_);
  if (have) {
    copy_bytes(k.raw(), device_, k_.raw(), device_, k_.size_bytes());
    copy_bytes(v.raw(), device_, v_.raw(), device_, v_.size_bytes());
  }
  k_ = k;
  v_ = v;
}

void KvCache::write(const Tensor& start_pos, const Tensor& k, const Tensor& v) {
  MERE_ASSERT(k.shape() == v.shape() && k.dim(1) == n_kv_heads_ && k.dim(2) == head_dim_ && k_.defined());
  ops::store_rows(k, k_, start_pos);
  ops::store_rows(v, v_, start_pos);
}

SeqState::SeqState(int n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t capacity, Device device)
    : capacity_(capacity), device_(device) {
  layers_.reserve(size_t(n_layers));
  for (int l = 0; l < n_layers; ++l) layers_.emplace_back(n_kv_heads, head_dim, capacity, device);
}

void SeqState::advance(int64_t T) { length_ += T; }

void SeqState::reserve(int64_t n) {
  for (KvCache& kv : layers_) kv.reserve(n);
}

void SeqState::truncate(int64_t length) {
  MERE_CHECK(length >= 0 && length <= length_, "truncate: cannot roll back from {} to {}", length_, length);
  length_ = length;
}

}  // namespace mere

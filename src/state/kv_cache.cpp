#include "state/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/ops.h"

namespace mere {

std::string_view kv_cache_mode_name(KvCacheMode mode) {
  switch (mode) {
    case KvCacheMode::native: return "default";
    case KvCacheMode::bf16: return "bf16";
    case KvCacheMode::affine8: return "affine8";
    case KvCacheMode::affine4: return "affine4";
  }
  return "?";
}

std::optional<KvCacheMode> parse_kv_cache_mode(std::string_view text) {
  for (KvCacheMode m : {KvCacheMode::native, KvCacheMode::bf16, KvCacheMode::affine8, KvCacheMode::affine4})
    if (text == kv_cache_mode_name(m)) return m;
  return std::nullopt;
}

namespace {

int mode_bits(KvCacheMode mode) { return mode == KvCacheMode::affine8 ? 8 : mode == KvCacheMode::affine4 ? 4 : 0; }

}  // namespace

uint64_t kv_row_bytes(int64_t n_kv_heads, int64_t head_dim, KvCacheMode mode, Device device) {
  const uint64_t row = uint64_t(n_kv_heads) * uint64_t(head_dim);
  const uint64_t groups = uint64_t(n_kv_heads) * uint64_t(head_dim / kv_quant_group(head_dim));
  switch (mode) {
    case KvCacheMode::native: return row * (device == Device::cpu ? 4 : 2);
    case KvCacheMode::bf16: return row * 2;
    case KvCacheMode::affine8: return row + groups * 4;  // codes, bf16 scale and bias
    case KvCacheMode::affine4: return row / 2 + groups * 4;
  }
  return 0;
}

KvCache::KvCache(int64_t n_kv_heads, int64_t head_dim, int64_t capacity, Device device, KvCacheMode mode)
    : n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      capacity_(capacity),
      device_(device),
      mode_(mode),
      dtype_(mode == KvCacheMode::native && device == Device::cpu ? DType::f32 : DType::bf16) {
  MERE_CHECK(!quantized() || (head_dim % kv_quant_group(head_dim) == 0 && head_dim % 2 == 0),
             "kv cache mode {}: head_dim {} does not split into quantization groups of {}", kv_cache_mode_name(mode),
             head_dim, kv_quant_group(head_dim));
  // The CUDA kernel reads codes 8 at a time (one 8- or 4-byte load).
  MERE_CHECK(!quantized() || device == Device::cpu || head_dim % 8 == 0,
             "kv cache mode {}: refused on cuda for head_dim {}: the attention kernel needs a multiple of 8",
             kv_cache_mode_name(mode), head_dim);
}

namespace {

// A copy of t with `rows` leading rows (the first `have` copied over).
Tensor grown(const Tensor& t, int64_t rows, int64_t have, Device device) {
  Shape shape = t.shape();
  shape[0] = rows;
  Tensor out = Tensor::empty(shape, t.dtype(), device);
  if (have) copy_bytes(out.raw(), device, t.raw(), device, size_t(have) * (t.size_bytes() / size_t(t.dim(0))));
  return out;
}

}  // namespace

void KvCache::reserve(int64_t n) {
  MERE_CHECK(n <= capacity_, "context is full: {} positions exceed the cache capacity of {} tokens", n, capacity_);
  if (n <= reserved_) return;
  // Double so a long generation reallocates O(log n) times.
  const int64_t rows = std::min(capacity_, std::max({n, 2 * reserved_, int64_t(256)}));
  if (quantized()) {
    const int bits = mode_bits(mode_);
    for (QuantizedRows* q : {&qk_, &qv_}) {
      if (!q->codes.defined()) {
        q->bits = bits;
        q->codes = Tensor::empty({0, n_kv_heads_, head_dim_ * bits / 8}, DType::u8);
        q->scales = Tensor::empty({0, n_kv_heads_, head_dim_ / kv_quant_group(head_dim_)}, DType::bf16);
        q->biases = Tensor::empty({0, n_kv_heads_, head_dim_ / kv_quant_group(head_dim_)}, DType::bf16);
      }
      q->codes = grown(q->codes, rows, reserved_, device_);
      q->scales = grown(q->scales, rows, reserved_, device_);
      q->biases = grown(q->biases, rows, reserved_, device_);
    }
  } else {
    if (!k_.defined()) {
      k_ = Tensor::empty({0, n_kv_heads_, head_dim_}, dtype_, device_);
      v_ = Tensor::empty({0, n_kv_heads_, head_dim_}, dtype_, device_);
    }
    k_ = grown(k_, rows, reserved_, device_);
    v_ = grown(v_, rows, reserved_, device_);
  }
  reserved_ = rows;
}

void KvCache::write(const Tensor& start_pos, const Tensor& k, const Tensor& v, const ops::KvPages& pages) {
  MERE_ASSERT(k.shape() == v.shape() && k.dim(1) == n_kv_heads_ && k.dim(2) == head_dim_ && reserved_ > 0);
  if (!quantized()) {
    ops::store_rows(k, k_, start_pos, pages);
    ops::store_rows(v, v_, start_pos, pages);
    return;
  }
  ops::store_rows(k, qk_, start_pos, pages);
  ops::store_rows(v, qv_, start_pos, pages);
}

const Tensor& KvCache::keys() const {
  MERE_CHECK(!quantized(), "kv cache: the {} cache has no dense keys", kv_cache_mode_name(mode_));
  return k_;
}
const Tensor& KvCache::values() const {
  MERE_CHECK(!quantized(), "kv cache: the {} cache has no dense values", kv_cache_mode_name(mode_));
  return v_;
}
Tensor& KvCache::keys_for_write() {
  MERE_CHECK(!quantized(), "kv cache: the {} cache has no dense keys", kv_cache_mode_name(mode_));
  return k_;
}
Tensor& KvCache::values_for_write() {
  MERE_CHECK(!quantized(), "kv cache: the {} cache has no dense values", kv_cache_mode_name(mode_));
  return v_;
}
QuantizedRows& KvCache::quantized_keys_for_write() {
  MERE_CHECK(quantized(), "kv cache: the {} cache has no quantized keys", kv_cache_mode_name(mode_));
  return qk_;
}
QuantizedRows& KvCache::quantized_values_for_write() {
  MERE_CHECK(quantized(), "kv cache: the {} cache has no quantized values", kv_cache_mode_name(mode_));
  return qv_;
}

bool KvCache::attend_unmerged(const Tensor& q, const Tensor& pos, float scale, const ops::KvPages& pages,
                              ops::AttentionSplits& out) const {
  const int64_t T = q.dim(0);
  if (device_ != Device::cuda) return false;
  if (pages.paged()) {
    if (!pages.per_sequence_rows() && T >= kPagedGatherMinTokens) return false;  // a prefill: gathered first
    return quantized() ? ops::attention_unmerged(q, qk_, qv_, pos, scale, pages, out)
                       : ops::attention_unmerged(q, k_, v_, pos, scale, pages, out);
  }
  if (quantized()) return T == 1 && ops::attention_unmerged(q, qk_, qv_, pos, scale, {}, out);
  return ops::attention_unmerged(q, k_, v_, pos, scale, {}, out);
}

Tensor KvCache::attend(const Tensor& q, const Tensor& pos, int64_t length, float scale,
                       const ops::KvPages& pages) const {
  ops::AttentionSplits splits;
  if (attend_unmerged(q, pos, scale, pages, splits)) return ops::merge_attention(splits);
  const int64_t T = q.dim(0);
  if (pages.paged()) {
    const bool gather = !pages.per_sequence_rows() && T >= kPagedGatherMinTokens;
    if (quantized())
      return gather ? ops::attention(q, qk_, qv_, length, scale, pages)
                    : ops::attention(q, qk_, qv_, pos, scale, pages);
    return gather ? ops::attention(q, k_, v_, length, scale, pages) : ops::attention(q, k_, v_, pos, scale, pages);
  }
  if (quantized())
    return T == 1 ? ops::attention(q, qk_, qv_, pos, scale) : ops::attention(q, qk_, qv_, length, scale);
  return ops::attention(q, k_, v_, pos, scale);
}

const QuantizedRows& KvCache::quantized_keys() const {
  MERE_CHECK(quantized(), "kv cache: the {} cache has no quantized keys", kv_cache_mode_name(mode_));
  return qk_;
}
const QuantizedRows& KvCache::quantized_values() const {
  MERE_CHECK(quantized(), "kv cache: the {} cache has no quantized values", kv_cache_mode_name(mode_));
  return qv_;
}

size_t KvCache::size_bytes() const {
  if (!quantized()) return k_.defined() ? k_.size_bytes() + v_.size_bytes() : 0;
  size_t n = 0;
  for (const QuantizedRows* q : {&qk_, &qv_})
    if (q->codes.defined()) n += q->codes.size_bytes() + q->scales.size_bytes() + q->biases.size_bytes();
  return n;
}

Tensor KvCache::rows_f32(bool values, int64_t begin, int64_t n) const {
  MERE_CHECK(device_ == Device::cpu && begin >= 0 && begin + n <= reserved_,
             "kv cache: rows {}..{} of {} cannot be read on the host", begin, begin + n, reserved_);
  if (quantized()) {
    const QuantizedRows& q = values ? qv_ : qk_;
    const QuantizedRows rows{q.codes.slice_rows(begin, begin + n), q.scales.slice_rows(begin, begin + n),
                             q.biases.slice_rows(begin, begin + n), q.bits};
    return dequantize_kv_rows(rows, n, head_dim_);
  }
  return (values ? v_ : k_).slice_rows(begin, begin + n).to(DType::f32);
}

namespace {

// The storage tensors of a cache, each [reserved, ...] with whole rows.
std::vector<Tensor*> storage(Tensor& k, Tensor& v, QuantizedRows& qk, QuantizedRows& qv, bool quantized) {
  if (!quantized) return {&k, &v};
  return {&qk.codes, &qk.scales, &qk.biases, &qv.codes, &qv.scales, &qv.biases};
}

}  // namespace

void KvCache::copy_rows(int64_t dst, int64_t src, int64_t n) {
  MERE_CHECK(dst >= 0 && src >= 0 && dst + n <= reserved_ && src + n <= reserved_ && (dst + n <= src || src + n <= dst),
             "kv cache: cannot copy rows {}..{} to {}..{} of {}", src, src + n, dst, dst + n, reserved_);
  for (Tensor* t : storage(k_, v_, qk_, qv_, quantized())) {
    const size_t row_bytes = t->size_bytes() / size_t(t->dim(0));
    char* base = static_cast<char*>(t->raw());
    copy_bytes(base + size_t(dst) * row_bytes, device_, base + size_t(src) * row_bytes, device_, size_t(n) * row_bytes);
  }
}

KvCache KvCache::clone() const {
  KvCache c(n_kv_heads_, head_dim_, capacity_, device_, mode_);
  if (reserved_ == 0) return c;
  c.reserve(reserved_);
  MERE_ASSERT(c.reserved_ == reserved_);
  KvCache& self = const_cast<KvCache&>(*this);  // storage() hands out the tensors; nothing is written here
  std::vector<Tensor*> from = storage(self.k_, self.v_, self.qk_, self.qv_, quantized());
  std::vector<Tensor*> to = storage(c.k_, c.v_, c.qk_, c.qv_, quantized());
  for (size_t i = 0; i < from.size(); ++i) copy_bytes(to[i]->raw(), device_, from[i]->raw(), device_, from[i]->size_bytes());
  return c;
}

}  // namespace mere

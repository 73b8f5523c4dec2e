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

// bf16 rounding toward -inf / +inf, so the rounded range still covers the group.
float bf16_next(float r, bool up) {  // r is a bf16 value: its neighbour one step up or down
  uint16_t bits = f32_to_bf16(r);
  if (r == 0) bits = up ? 0x0001 : 0x8001;
  else bits = uint16_t((r > 0) == up ? bits + 1 : bits - 1);
  return bf16_to_f32(bits);
}
float bf16_down(float x) {
  const float r = bf16_to_f32(f32_to_bf16(x));
  return r <= x ? r : bf16_next(r, false);
}
float bf16_up(float x) {
  const float r = bf16_to_f32(f32_to_bf16(x));
  return r >= x ? r : bf16_next(r, true);
}

// One 64-wide group of rows' values [n] to codes; scale and bias as stored (bf16).
void quantize_group(const float* x, int n, int bits, uint8_t* codes, uint16_t& scale_bits, uint16_t& bias_bits) {
  const int levels = (1 << bits) - 1;
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  const float bias = bf16_down(lo);
  float scale = bf16_up((hi - bias) / float(levels));
  if (scale <= 0) scale = bf16_up(1e-8f);  // a constant group: any positive step
  bias_bits = f32_to_bf16(bias);
  scale_bits = f32_to_bf16(scale);
  for (int i = 0; i < n; ++i) {
    const int q = std::clamp(int(std::lround((x[i] - bias) / scale)), 0, levels);
    if (bits == 8) codes[i] = uint8_t(q);
    else if (i % 2 == 0) codes[i / 2] = uint8_t(q);
    else codes[i / 2] |= uint8_t(q << 4);
  }
}

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

QuantizedRows quantize_kv_rows(const Tensor& x, int bits) {
  MERE_CHECK(x.device() == Device::cpu && x.dtype() == DType::f32 && x.rank() == 3,
             "quantize_kv_rows: expected f32 [T, kv_heads, head_dim] on the CPU, got {} {}", dtype_name(x.dtype()),
             shape_str(x.shape()));
  const int64_t T = x.dim(0), heads = x.dim(1), d = x.dim(2);
  const int64_t group = kv_quant_group(d);
  MERE_CHECK(d % group == 0 && group % 2 == 0, "kv cache: head_dim {} does not split into quantization groups of {}",
             d, group);
  QuantizedRows q;
  q.bits = bits;
  q.codes = Tensor::empty({T, heads, d * bits / 8}, DType::u8);
  q.scales = Tensor::empty({T, heads, d / group}, DType::bf16);
  q.biases = Tensor::empty({T, heads, d / group}, DType::bf16);
  const int64_t groups = T * heads * (d / group);
  for (int64_t g = 0; g < groups; ++g)
    quantize_group(x.data<float>() + g * group, int(group), bits, q.codes.data<uint8_t>() + g * group * bits / 8,
                   q.scales.data<uint16_t>()[g], q.biases.data<uint16_t>()[g]);
  return q;
}

Tensor dequantize_kv_rows(const QuantizedRows& q, int64_t n, int64_t head_dim) {
  const int64_t heads = q.codes.dim(1);
  Tensor out = Tensor::empty({n, heads, head_dim}, DType::f32);
  float* dst = out.data<float>();
  const uint8_t* codes = q.codes.data<uint8_t>();
  const int64_t group = head_dim / q.scales.dim(2), groups = n * heads * q.scales.dim(2);
  for (int64_t g = 0; g < groups; ++g) {
    const float scale = bf16_to_f32(q.scales.data<uint16_t>()[g]), bias = bf16_to_f32(q.biases.data<uint16_t>()[g]);
    const uint8_t* c = codes + g * group * q.bits / 8;
    for (int64_t i = 0; i < group; ++i) {
      const int code = q.bits == 8 ? c[i] : (c[i / 2] >> ((i % 2) * 4)) & 0xf;
      dst[g * group + i] = scale * float(code) + bias;
    }
  }
  return out;
}

KvCache::KvCache(int64_t n_kv_heads, int64_t head_dim, int64_t capacity, Device device, KvCacheMode mode)
    : n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      capacity_(capacity),
      device_(device),
      mode_(mode),
      dtype_(mode == KvCacheMode::native && device == Device::cpu ? DType::f32 : DType::bf16) {
  MERE_CHECK(!quantized() || device == Device::cpu,
             "kv cache mode {}: refused on cuda: the CUDA attention kernels do not read quantized caches yet",
             kv_cache_mode_name(mode));
  MERE_CHECK(!quantized() || (head_dim % kv_quant_group(head_dim) == 0 && head_dim % 2 == 0),
             "kv cache mode {}: head_dim {} does not split into quantization groups of {}", kv_cache_mode_name(mode),
             head_dim, kv_quant_group(head_dim));
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

void KvCache::write(const Tensor& start_pos, const Tensor& k, const Tensor& v) {
  MERE_ASSERT(k.shape() == v.shape() && k.dim(1) == n_kv_heads_ && k.dim(2) == head_dim_ && reserved_ > 0);
  if (!quantized()) {
    ops::store_rows(k, k_, start_pos);
    ops::store_rows(v, v_, start_pos);
    return;
  }
  const int64_t pos = start_pos.data<int32_t>()[0], T = k.dim(0);
  MERE_CHECK(pos + T <= reserved_, "kv cache: rows {}..{} are not reserved ({} are)", pos, pos + T, reserved_);
  auto store = [&](const Tensor& x, QuantizedRows& dst) {
    QuantizedRows q = quantize_kv_rows(x, dst.bits);
    for (auto [from, to] : {std::pair{&q.codes, &dst.codes}, {&q.scales, &dst.scales}, {&q.biases, &dst.biases}}) {
      const size_t row_bytes = to->size_bytes() / size_t(to->dim(0));
      std::memcpy(static_cast<char*>(to->raw()) + size_t(pos) * row_bytes, from->raw(), from->size_bytes());
    }
  };
  store(k, qk_);
  store(v, qv_);
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
  MERE_CHECK(!quantized(), "kv cache: the {} cache is written through write()", kv_cache_mode_name(mode_));
  return k_;
}
Tensor& KvCache::values_for_write() {
  MERE_CHECK(!quantized(), "kv cache: the {} cache is written through write()", kv_cache_mode_name(mode_));
  return v_;
}

bool KvCache::attention_reads_storage() const {
  return !quantized() && (device_ == Device::cuda || dtype_ == DType::f32);
}

Tensor KvCache::keys_for_attention(int64_t n) const {
  if (quantized()) return dequantize_kv_rows(qk_, n, head_dim_);
  return attention_reads_storage() ? k_ : k_.slice_rows(0, n).to(DType::f32);
}
Tensor KvCache::values_for_attention(int64_t n) const {
  if (quantized()) return dequantize_kv_rows(qv_, n, head_dim_);
  return attention_reads_storage() ? v_ : v_.slice_rows(0, n).to(DType::f32);
}

size_t KvCache::size_bytes() const {
  if (!quantized()) return k_.defined() ? k_.size_bytes() + v_.size_bytes() : 0;
  size_t n = 0;
  for (const QuantizedRows* q : {&qk_, &qv_})
    if (q->codes.defined()) n += q->codes.size_bytes() + q->scales.size_bytes() + q->biases.size_bytes();
  return n;
}

SeqState::SeqState(int n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t capacity, Device device,
                   KvCacheMode mode)
    : capacity_(capacity), device_(device) {
  layers_.reserve(size_t(n_layers));
  for (int l = 0; l < n_layers; ++l) layers_.emplace_back(n_kv_heads, head_dim, capacity, device, mode);
}

size_t SeqState::kv_bytes() const {
  size_t n = 0;
  for (const KvCache& kv : layers_) n += kv.size_bytes();
  return n;
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

#include "ops/ops.h"

#include <algorithm>

#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/paged_ops.h"
#include "ops/quantized_ops.h"

namespace mere::ops {
namespace {

bool is_float(DType dt) { return dt == DType::f32 || dt == DType::f16 || dt == DType::bf16; }

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  MERE_CHECK(!b.defined() || a.device() == b.device(), "{}: operands on different devices", op);
}

}  // namespace

Tensor embed(const Tensor& table, const std::vector<int32_t>& ids) {
  MERE_CHECK(table.rank() == 2 && is_float(table.dtype()), "embed: table must be a 2-D float tensor, got {} {}",
             dtype_name(table.dtype()), shape_str(table.shape()));
  for (int32_t id : ids)
    MERE_CHECK(id >= 0 && id < table.dim(0), "embed: token id {} is outside the vocabulary [0, {})", id,
               table.dim(0));
  Tensor out = Tensor::empty({int64_t(ids.size()), table.dim(1)}, DType::f32, table.device());
  switch (table.device()) {
    case Device::cpu: cpu::embed(table, ids, out); break;
    case Device::cuda: cuda::embed(table, ids, out); break;
  }
  return out;
}

// The start position as the CPU backend reads it (its tensors live on the host).
int32_t host_scalar(const Tensor& t, const char* op) {
  MERE_CHECK(t.dtype() == DType::i32 && t.numel() >= 1 && t.device() == Device::cpu,
             "{}: position must be an i32 tensor on the CPU", op);
  return t.data<int32_t>()[0];
}

Tensor embed(const Tensor& table, const Tensor& ids) {
  MERE_CHECK(ids.dtype() == DType::i32 && ids.rank() == 1, "embed: ids must be i32 [T], got {} {}",
             dtype_name(ids.dtype()), shape_str(ids.shape()));
  check_same_device("embed", table, ids);
  if (table.device() == Device::cpu)
    return embed(table, std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + ids.numel()));
  Tensor out = Tensor::empty({ids.numel(), table.dim(1)}, DType::f32, table.device());
  cuda::embed(table, ids, out);
  return out;
}

Tensor rms_norm(const Tensor& x, const Tensor& w, float eps) {
  MERE_CHECK(x.dtype() == DType::f32 && x.rank() >= 1, "rms_norm: x must be f32, got {}", dtype_name(x.dtype()));
  MERE_CHECK(w.shape() == Shape{x.dim(-1)}, "rms_norm: weight has shape {} but x has last dim {}",
             shape_str(w.shape()), x.dim(-1));
  check_same_device("rms_norm", x, w);
  Tensor out = Tensor::empty(x.shape(), DType::f32, x.device());
  switch (x.device()) {
    case Device::cpu: cpu::rms_norm(x, w, eps, out); break;
    case Device::cuda: cuda::rms_norm(x, w, eps, out); break;
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  MERE_CHECK(x.dtype() == DType::f32 && x.rank() == 2, "linear: x must be f32 [T, in], got {} {}",
             dtype_name(x.dtype()), shape_str(x.shape()));
  MERE_CHECK(w.rank() == 2 && w.dim(1) == x.dim(1) && is_float(w.dtype()),
             "linear: weight {} {} does not match x {}", dtype_name(w.dtype()), shape_str(w.shape()),
             shape_str(x.shape()));
  MERE_CHECK(!bias.defined() || bias.shape() == Shape{w.dim(0)}, "linear: bias {} for {} outputs",
             shape_str(bias.shape()), w.dim(0));
  check_same_device("linear", x, w);
  check_same_device("linear", x, bias);
  Tensor out = Tensor::empty({x.dim(0), w.dim(0)}, DType::f32, x.device());
  switch (x.device()) {
    case Device::cpu: cpu::linear(x, w, bias, out); break;
    case Device::cuda: cuda::linear(x, w, bias, out); break;
  }
  return out;
}

Tensor silu_mul(const Tensor& gate, const Tensor& up) {
  MERE_CHECK(gate.shape() == up.shape() && gate.dtype() == DType::f32 && up.dtype() == DType::f32,
             "silu_mul: gate {} and up {} must be f32 of one shape", shape_str(gate.shape()),
             shape_str(up.shape()));
  check_same_device("silu_mul", gate, up);
  Tensor out = Tensor::empty(gate.shape(), DType::f32, gate.device());
  switch (gate.device()) {
    case Device::cpu: cpu::silu_mul(gate, up, out); break;
    case Device::cuda: cuda::silu_mul(gate, up, out); break;
  }
  return out;
}

Tensor silu_mul_halves(const Tensor& gate_up) {
  MERE_CHECK(gate_up.dtype() == DType::f32 && gate_up.rank() == 2 && gate_up.dim(1) % 2 == 0,
             "silu_mul_halves: gate_up must be f32 [T, 2f], got {}", shape_str(gate_up.shape()));
  Tensor out = Tensor::empty({gate_up.dim(0), gate_up.dim(1) / 2}, DType::f32, gate_up.device());
  switch (gate_up.device()) {
    case Device::cpu: cpu::silu_mul_halves(gate_up, out); break;
    case Device::cuda: cuda::silu_mul_halves(gate_up, out); break;
  }
  return out;
}

Tensor linear(const Tensor& x, const Weight& w, const Tensor& bias) {
  if (w.is_dense()) return linear(x, w.dense(), bias);
  MERE_CHECK(w.defined(), "linear: the weight is not set");
  MERE_CHECK(x.dtype() == DType::f32 && x.rank() == 2 && x.dim(1) == w.cols(),
             "linear: x {} {} does not match a {} weight of [{}, {}]", dtype_name(x.dtype()), shape_str(x.shape()),
             w.describe(), w.rows(), w.cols());
  MERE_CHECK(!bias.defined() || bias.shape() == Shape{w.rows()}, "linear: bias {} for {} outputs",
             shape_str(bias.shape()), w.rows());
  MERE_CHECK(x.device() == w.device(), "linear: operands on different devices");
  check_same_device("linear", x, bias);
  Tensor out = Tensor::empty({x.dim(0), w.rows()}, DType::f32, x.device());
  quantized_linear(x, w, bias, out);
  return out;
}

Tensor embed(const Weight& table, const Tensor& ids) {
  if (table.is_dense()) return embed(table.dense(), ids);
  MERE_CHECK(ids.dtype() == DType::i32 && ids.rank() == 1, "embed: ids must be i32 [T], got {} {}",
             dtype_name(ids.dtype()), shape_str(ids.shape()));
  MERE_CHECK(ids.device() == table.device(), "embed: operands on different devices");
  Tensor out = Tensor::empty({ids.numel(), table.cols()}, DType::f32, table.device());
  quantized_embed(table, ids, out);
  return out;
}

Tensor rms_norm_linear(const Tensor& h, const Tensor& norm_w, float eps, const Weight& w, const Tensor& bias) {
  MERE_CHECK(h.dtype() == DType::f32 && h.rank() == 2 && w.cols() == h.dim(1),
             "rms_norm_linear: h {} does not match a weight of [{}, {}]", shape_str(h.shape()), w.rows(), w.cols());
  MERE_CHECK(norm_w.shape() == Shape{h.dim(1)}, "rms_norm_linear: norm weight {} for rows of {}",
             shape_str(norm_w.shape()), h.dim(1));
  check_same_device("rms_norm_linear", h, norm_w);
  if (h.device() == Device::cuda && w.device() == Device::cuda) {
    MERE_CHECK(!bias.defined() || bias.shape() == Shape{w.rows()}, "rms_norm_linear: bias {} for {} outputs",
               shape_str(bias.shape()), w.rows());
    Tensor out = Tensor::empty({h.dim(0), w.rows()}, DType::f32, Device::cuda);
    switch (w.kind()) {
      case Weight::Kind::dense:
        if (cuda::rms_norm_linear(h, norm_w, eps, w.dense(), bias, out)) return out;
        break;
      case Weight::Kind::affine:
        if (cuda::affine_rms_norm_linear(h, norm_w, eps, w.affine(), bias, out)) return out;
        break;
      case Weight::Kind::fp8:
        if (cuda::fp8_rms_norm_linear(h, norm_w, eps, w.fp8(), bias, out)) return out;
        break;
      default: break;
    }
  }
  return linear(rms_norm(h, norm_w, eps), w, bias);
}

void linear_add(Tensor& h, const Tensor& x, const Weight& w, const Tensor& bias) {
  MERE_CHECK(h.dtype() == DType::f32 && h.rank() == 2 && h.dim(0) == x.dim(0) && h.dim(1) == w.rows(),
             "linear_add: {} += linear of {} by [{}, {}] does not fit", shape_str(h.shape()), shape_str(x.shape()),
             w.rows(), w.cols());
  if (h.device() == Device::cuda && x.device() == Device::cuda && w.is_dense() && x.dtype() == DType::f32 &&
      x.rank() == 2 && w.cols() == x.dim(1) && w.device() == Device::cuda &&
      (!bias.defined() || bias.shape() == Shape{w.rows()}) && cuda::linear_add(h, x, w.dense(), bias))
    return;
  if (h.device() == Device::cuda && x.device() == Device::cuda && w.kind() == Weight::Kind::affine &&
      x.dtype() == DType::f32 && x.rank() == 2 && w.cols() == x.dim(1) && w.device() == Device::cuda &&
      (!bias.defined() || bias.shape() == Shape{w.rows()}) && cuda::affine_linear_add(h, x, w.affine(), bias))
    return;
  if (h.device() == Device::cuda && x.device() == Device::cuda && w.kind() == Weight::Kind::fp8 &&
      x.dtype() == DType::f32 && x.rank() == 2 && w.cols() == x.dim(1) && w.device() == Device::cuda &&
      (!bias.defined() || bias.shape() == Shape{w.rows()}) && cuda::fp8_linear_add(h, x, w.fp8(), bias))
    return;
  add_inplace(h, linear(x, w, bias));
}

Tensor swiglu_linear(const Tensor& gate_up, const Weight& w, const Tensor& bias) {
  MERE_CHECK(gate_up.rank() == 2 && gate_up.dim(1) == 2 * w.cols(),
             "swiglu_linear: linear of swiglu({}) by [{}, {}] does not fit", shape_str(gate_up.shape()), w.rows(),
             w.cols());
  const bool bias_fits = !bias.defined() || (bias.shape() == Shape{w.rows()} && bias.dtype() == DType::f32 &&
                                             bias.device() == Device::cuda);
  if (gate_up.device() == Device::cuda && gate_up.dtype() == DType::f32 && w.device() == Device::cuda && bias_fits) {
    Tensor out = Tensor::empty({gate_up.dim(0), w.rows()}, DType::f32, Device::cuda);
    switch (w.kind()) {
      case Weight::Kind::dense:
        if (cuda::swiglu_linear(gate_up, w.dense(), bias, out)) return out;
        break;
      case Weight::Kind::affine:
        if (cuda::affine_swiglu_linear(gate_up, w.affine(), bias, out)) return out;
        break;
      case Weight::Kind::fp8:
        if (cuda::fp8_swiglu_linear(gate_up, w.fp8(), bias, out)) return out;
        break;
      default: break;
    }
  }
  return linear(silu_mul_halves(gate_up), w, bias);
}

void swiglu_linear_add(Tensor& h, const Tensor& gate_up, const Weight& w, const Tensor& bias) {
  MERE_CHECK(gate_up.rank() == 2 && gate_up.dim(1) == 2 * w.cols() && h.rank() == 2 && h.dim(0) == gate_up.dim(0) &&
                 h.dim(1) == w.rows(),
             "swiglu_linear_add: {} += linear of swiglu({}) by [{}, {}] does not fit", shape_str(h.shape()),
             shape_str(gate_up.shape()), w.rows(), w.cols());
  if (h.device() == Device::cuda && gate_up.device() == Device::cuda && w.is_dense() && w.device() == Device::cuda &&
      gate_up.dtype() == DType::f32 && h.dtype() == DType::f32 &&
      (!bias.defined() || bias.shape() == Shape{w.rows()}) && cuda::swiglu_linear_add(h, gate_up, w.dense(), bias))
    return;
  if (h.device() == Device::cuda && gate_up.device() == Device::cuda && w.kind() == Weight::Kind::affine &&
      w.device() == Device::cuda && gate_up.dtype() == DType::f32 && h.dtype() == DType::f32 &&
      (!bias.defined() || bias.shape() == Shape{w.rows()}) &&
      cuda::affine_swiglu_linear_add(h, gate_up, w.affine(), bias))
    return;
  if (h.device() == Device::cuda && gate_up.device() == Device::cuda && w.kind() == Weight::Kind::fp8 &&
      w.device() == Device::cuda && gate_up.dtype() == DType::f32 && h.dtype() == DType::f32 &&
      (!bias.defined() || bias.shape() == Shape{w.rows()}) && cuda::fp8_swiglu_linear_add(h, gate_up, w.fp8(), bias))
    return;
  add_inplace(h, linear(silu_mul_halves(gate_up), w, bias));
}

void set_launch_settings(const LaunchSettings& settings) { cuda::set_launch_settings(settings); }
void set_cpu_settings(const CpuSettings& settings) {
  cpu::set_direct_matvec(settings.direct_matvec);
  cpu::set_tiled_matmul(settings.tiled_matmul);
  cpu::set_vnni_matvec(settings.vnni_matvec);
  cpu::set_vector_attention(settings.vector_attention);
  cpu::set_avx512_matmul(settings.avx512_matmul);
  cpu::set_packed_matmul(settings.packed_matmul);
  cpu::set_avx512_attention(settings.avx512_attention);
}
void set_decode_keys(int64_t keys) { cuda::set_decode_keys(keys); }
void set_cached_rows_final(bool final) { cuda::set_cached_rows_final(final); }
KeyCountRange decode_keys_range() { return cuda::decode_keys_range(); }

void fill_random_bytes(Tensor& t, uint64_t seed, uint8_t mask) {
  if (t.device() == Device::cuda) {
    cuda::fill_random_bytes(t, seed, mask);
    return;
  }
  auto* bytes = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.size_bytes(); i += 8) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + i / 8 + 0x632BE59BD9B4E019ull;  // SplitMix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (size_t j = i; j < std::min(i + 8, t.size_bytes()); ++j) bytes[j] = uint8_t(z >> (8 * (j - i))) & mask;
  }
}

namespace {
void check_position(const Tensor& pos) {
  MERE_CHECK(pos.dtype() == DType::i32 && pos.numel() == 1, "advance_position: expected an i32 scalar, got {} {}",
             dtype_name(pos.dtype()), shape_str(pos.shape()));
}
}  // namespace

void advance_position(Tensor& pos, int32_t by) {
  check_position(pos);
  if (pos.device() == Device::cpu) {
    pos.data<int32_t>()[0] += by;
    return;
  }
  cuda::advance_position(pos, by);
}

void advance_position(Tensor& pos, int32_t by, const Tensor& tokens, int32_t* host_ring, int64_t slots) {
  check_position(pos);
  MERE_CHECK(tokens.dtype() == DType::i32 && tokens.shape().size() == 1 && tokens.device() == pos.device(),
             "advance_position: expected i32 [B] tokens on the position's device, got {} {}",
             dtype_name(tokens.dtype()), shape_str(tokens.shape()));
  MERE_CHECK(host_ring != nullptr && slots >= 1, "advance_position: no host ring to write the tokens to");
  if (pos.device() == Device::cpu) {
    const int32_t next = pos.data<int32_t>()[0] + by;
    std::copy_n(tokens.data<int32_t>(), tokens.numel(), host_ring + (next % slots) * tokens.numel());
    pos.data<int32_t>()[0] = next;
    return;
  }
  cuda::advance_position(pos, by, tokens, host_ring, slots);
}

Tensor add_rms_norm(Tensor& h, const Tensor& x, const Tensor& w, float eps) {
  MERE_CHECK(h.shape() == x.shape() && h.dtype() == DType::f32 && x.dtype() == DType::f32,
             "add_rms_norm: {} += {} must be f32 of one shape", shape_str(h.shape()), shape_str(x.shape()));
  MERE_CHECK(w.shape() == Shape{h.dim(-1)}, "add_rms_norm: weight has shape {} but h has last dim {}",
             shape_str(w.shape()), h.dim(-1));
  check_same_device("add_rms_norm", h, x);
  check_same_device("add_rms_norm", h, w);
  Tensor out = Tensor::empty(h.shape(), DType::f32, h.device());
  switch (h.device()) {
    case Device::cpu:
      cpu::add_inplace(h, x);
      cpu::rms_norm(h, w, eps, out);
      break;
    case Device::cuda: cuda::add_rms_norm(h, x, w, eps, out); break;
  }
  return out;
}

std::vector<Tensor> split_columns(const Tensor& x, const std::vector<int64_t>& widths) {
  int64_t total = 0;
  for (int64_t w : widths) total += w;
  MERE_CHECK(x.rank() == 2 && x.dim(1) == total, "split_columns: {} does not split into widths summing to {}",
             shape_str(x.shape()), total);
  std::vector<Tensor> out;
  const int64_t T = x.dim(0);
  if (T == 1) {
    Tensor flat = x.reshape({-1});
    int64_t offset = 0;
    for (int64_t w : widths) {
      out.push_back(flat.slice_rows(offset, offset + w).reshape({1, w}));
      offset += w;
    }
    return out;
  }
  for (int64_t w : widths) out.push_back(Tensor::empty({T, w}, x.dtype(), x.device()));
  switch (x.device()) {  // all parts at once (one kernel on the GPU)
    case Device::cpu: cpu::split_columns(x, out); break;
    case Device::cuda: cuda::split_columns(x, out); break;
  }
  return out;
}

Tensor concat_rows(const std::vector<Tensor>& parts, std::optional<Device> device) {
  MERE_CHECK(!parts.empty(), "concat_rows: nothing to concatenate");
  const Tensor& first = parts.front();
  Shape shape = first.shape();
  shape[0] = 0;
  for (const Tensor& p : parts) {
    MERE_CHECK(p.dtype() == first.dtype() && (device || p.device() == first.device()) && p.rank() == first.rank() &&
                   p.numel() / std::max<int64_t>(p.dim(0), 1) == first.numel() / std::max<int64_t>(first.dim(0), 1),
               "concat_rows: {} {} does not stack with {} {}", dtype_name(p.dtype()), shape_str(p.shape()),
               dtype_name(first.dtype()), shape_str(first.shape()));
    shape[0] += p.dim(0);
  }
  Tensor out = Tensor::empty(shape, first.dtype(), device.value_or(first.device()));
  size_t offset = 0;
  for (const Tensor& p : parts) {
    copy_bytes(static_cast<char*>(out.raw()) + offset, out.device(), p.raw(), p.device(), p.size_bytes());
    offset += p.size_bytes();
  }
  return out;
}

void add_inplace(Tensor& h, const Tensor& x) {
  MERE_CHECK(h.shape() == x.shape() && h.dtype() == DType::f32 && x.dtype() == DType::f32,
             "add_inplace: {} += {} must be f32 of one shape", shape_str(h.shape()), shape_str(x.shape()));
  check_same_device("add_inplace", h, x);
  switch (h.device()) {
    case Device::cpu: cpu::add_inplace(h, x); break;
    case Device::cuda: cuda::add_inplace(h, x); break;
  }
}

void rope(Tensor& x, const std::vector<int32_t>& positions, const RopeTable& table) {
  MERE_CHECK(x.dtype() == DType::f32 && x.rank() == 3 && x.dim(0) == int64_t(positions.size()),
             "rope: x must be f32 [T, heads, head_dim] with T = {} positions, got {}", positions.size(),
             shape_str(x.shape()));
  MERE_CHECK(table.rotary_dim() > 0 && table.rotary_dim() <= x.dim(2),
             "rope: rotary dim {} does not fit head_dim {}", table.rotary_dim(), x.dim(2));
  switch (x.device()) {
    case Device::cpu: cpu::rope(x, positions, table); break;
    case Device::cuda: cuda::rope(x, positions, table); break;
  }
}

void rope(Tensor& x, const Tensor& start_pos, const RopeTable& table) {
  check_same_device("rope", x, start_pos);
  if (x.device() == Device::cpu) {
    int32_t p0 = host_scalar(start_pos, "rope");
    std::vector<int32_t> positions(static_cast<size_t>(x.dim(0)));
    for (size_t t = 0; t < positions.size(); ++t) positions[t] = p0 + int32_t(t);
    rope(x, positions, table);
    return;
  }
  MERE_CHECK(x.dtype() == DType::f32 && x.rank() == 3, "rope: x must be f32 [T, heads, head_dim], got {}",
             shape_str(x.shape()));
  cuda::rope(x, start_pos, table);
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& start_pos, float scale,
                 const KvPages& pages) {
  check_same_device("attention", q, start_pos);
  if (pages.paged()) {
    MERE_CHECK(q.rank() == 3 && k.rank() == 3 && v.shape() == k.shape() && q.dim(2) == k.dim(2) &&
                   q.dim(1) % k.dim(1) == 0 && q.dtype() == DType::f32,
               "attention: q {} k {} v {} do not fit", shape_str(q.shape()), shape_str(k.shape()),
               shape_str(v.shape()));
    check_same_device("attention", q, k);
    return paged::attention(q, k, v, start_pos, scale, pages);
  }
  if (q.device() == Device::cpu) {
    int64_t p0 = host_scalar(start_pos, "attention");
    return attention(q, k.slice_rows(0, p0 + q.dim(0)), v.slice_rows(0, p0 + q.dim(0)), p0, scale);
  }
  MERE_CHECK(q.rank() == 3 && k.rank() == 3 && v.shape() == k.shape() && q.dim(2) == k.dim(2) &&
                 q.dim(1) % k.dim(1) == 0 && q.dtype() == DType::f32,
             "attention: q {} k {} v {} do not fit", shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  check_same_device("attention", q, k);
  Tensor out = Tensor::empty(q.shape(), DType::f32, q.device());
  cuda::attention(q, k, v, start_pos, scale, out);
  return out;
}

bool attention_unmerged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& start_pos, float scale,
                        const KvPages& pages, AttentionSplits& out) {
  if (q.device() != Device::cuda) return false;
  check_same_device("attention", q, start_pos);
  MERE_CHECK(q.rank() == 3 && k.rank() == 3 && v.shape() == k.shape() && q.dim(2) == k.dim(2) &&
                 q.dim(1) % k.dim(1) == 0 && q.dtype() == DType::f32,
             "attention: q {} k {} v {} do not fit", shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  check_same_device("attention", q, k);
  if (pages.paged()) return paged::attention_unmerged(q, k, v, start_pos, scale, pages, out);
  return cuda::attention_unmerged(q, k, v, start_pos, scale, pages, out);
}

bool rope_in_attention_unmerged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                const Tensor& k_norm, float eps, const RopeTable& rope, const Tensor& start_pos,
                                Tensor& k_cache, Tensor& v_cache, float scale, const KvPages& pages,
                                AttentionSplits& out) {
  if (q.device() != Device::cuda) return false;
  MERE_CHECK(q.rank() == 3 && k.rank() == 3 && v.shape() == k.shape() && q.dim(0) == k.dim(0) &&
                 q.dim(2) == k.dim(2) && k.dim(1) > 0 && q.dim(1) % k.dim(1) == 0 && q.dtype() == DType::f32 &&
                 k.dtype() == DType::f32 && v.dtype() == DType::f32,
             "rope_in_attention: q {} k {} v {} do not fit", shape_str(q.shape()), shape_str(k.shape()),
             shape_str(v.shape()));
  MERE_CHECK(k_cache.rank() == 3 && v_cache.shape() == k_cache.shape() && k_cache.dim(1) == k.dim(1) &&
                 k_cache.dim(2) == k.dim(2),
             "rope_in_attention: caches {} and {} do not hold rows of {}", shape_str(k_cache.shape()),
             shape_str(v_cache.shape()), shape_str(k.shape()));
  check_same_device("rope_in_attention", q, start_pos);
  check_same_device("rope_in_attention", q, k_cache);
  if (pages.paged()) return paged::rope_in_attention_unmerged(q, k, v, q_norm, k_norm, eps, rope, start_pos, k_cache,
                                                              v_cache, scale, pages, out);
  return cuda::rope_in_attention_unmerged(q, k, v, q_norm, k_norm, eps, rope, start_pos, k_cache, v_cache, scale,
                                          pages, out);
}

Tensor merge_attention(const AttentionSplits& splits) {
  if (splits.merged.defined()) return splits.merged;
  const Tensor& o = splits.out;
  const bool fits = o.rank() == 4 && splits.max.shape() == Shape({o.dim(0), o.dim(1), o.dim(2)}) &&
                    splits.sum.shape() == splits.max.shape();
  MERE_CHECK(fits && o.dtype() == DType::f32 && o.device() == Device::cuda,
             "merge_attention: splits of outputs {} and maxima {} do not fit (or are not on the GPU)",
             shape_str(o.shape()), shape_str(splits.max.shape()));
  Tensor out = Tensor::empty({o.dim(0), o.dim(1), o.dim(3)}, DType::f32, Device::cuda);
  cuda::merge_attention(splits, out);
  return out;
}

void attention_linear_add(Tensor& h, const AttentionSplits& splits, const Weight& w, const Tensor& bias) {
  // The partials [T, heads, splits, head_dim], or the output merged in clusters [T, heads, head_dim].
  const bool merged = splits.merged.defined();
  const Tensor& o = merged ? splits.merged : splits.out;
  MERE_CHECK(o.rank() == (merged ? 3 : 4) && h.rank() == 2 && h.dim(0) == o.dim(0) && h.dim(1) == w.rows() &&
                 w.cols() == o.dim(1) * o.dim(o.rank() - 1),
             "attention_linear_add: {} += linear of attention {} {} by [{}, {}] does not fit", shape_str(h.shape()),
             merged ? "output" : "splits", shape_str(o.shape()), w.rows(), w.cols());
  if (h.device() == Device::cuda && h.dtype() == DType::f32 && w.kind() == Weight::Kind::affine &&
      w.device() == Device::cuda && (!bias.defined() || bias.shape() == Shape{w.rows()}) &&
      cuda::affine_attention_linear_add(h, splits, w.affine(), bias))
    return;
  if (h.device() == Device::cuda && h.dtype() == DType::f32 && w.kind() == Weight::Kind::fp8 &&
      w.device() == Device::cuda && (!bias.defined() || bias.shape() == Shape{w.rows()}) &&
      cuda::fp8_attention_linear_add(h, splits, w.fp8(), bias))
    return;
  linear_add(h, merge_attention(splits).reshape({o.dim(0), -1}), w, bias);
}

void store_rows(const Tensor& src, Tensor& dst, const Tensor& start_pos, const KvPages& pages) {
  MERE_CHECK(src.rank() >= 1 && dst.rank() == src.rank() && src.numel() / std::max<int64_t>(src.dim(0), 1) ==
                 dst.numel() / std::max<int64_t>(dst.dim(0), 1) && src.dtype() == DType::f32,
             "store_rows: {} rows do not fit {}", shape_str(src.shape()), shape_str(dst.shape()));
  check_same_device("store_rows", src, dst);
  check_same_device("store_rows", src, start_pos);
  if (pages.paged()) return paged::store_rows(src, dst, start_pos, pages);
  if (src.device() == Device::cpu) {
    int64_t p0 = host_scalar(start_pos, "store_rows");
    MERE_CHECK(p0 + src.dim(0) <= dst.dim(0), "store_rows: rows {}..{} past {}", p0, p0 + src.dim(0), dst.dim(0));
    Tensor rows = dst.slice_rows(p0, p0 + src.dim(0));
    cpu::convert(src, rows);
    return;
  }
  cuda::store_rows(src, dst, start_pos);
}

namespace {

// qk_norm_rope_store as the composition of the plain ops, into a dense or a
// quantized cache (store_rows has both forms): the CPU's reference.
template <typename Cache>
void compose_qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                const Tensor& k_norm, float eps, const RopeTable& table, const Tensor& start_pos,
                                Cache& k_cache, Cache& v_cache) {
  Tensor kk = k.clone();
  if (q_norm.defined()) {
    Tensor qn = rms_norm(q, q_norm, eps);
    copy_bytes(q.raw(), Device::cpu, qn.raw(), Device::cpu, q.size_bytes());
    kk = rms_norm(k, k_norm, eps);
  }
  rope(q, start_pos, table);
  rope(kk, start_pos, table);
  store_rows(kk, k_cache, start_pos);
  store_rows(v, v_cache, start_pos);
}

// The checks and the dispatch of both cache forms' qk_norm_rope_store;
// cache_fits: the cache's own shape checks; cache_kind and cache_shape name it in the error.
template <typename Cache>
void checked_qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                const Tensor& k_norm, float eps, const RopeTable& table, const Tensor& start_pos,
                                Cache& k_cache, Cache& v_cache, const KvPages& pages, bool cache_fits,
                                const char* cache_kind, const Shape& cache_shape) {
  MERE_CHECK(q.rank() == 3 && k.rank() == 3 && v.shape() == k.shape() && q.dim(0) == k.dim(0) &&
                 q.dim(2) == k.dim(2) && cache_fits && q.dtype() == DType::f32 && k.dtype() == DType::f32 &&
                 v.dtype() == DType::f32,
             "qk_norm_rope_store: q {} k {} v {} {} {} do not fit", shape_str(q.shape()), shape_str(k.shape()),
             shape_str(v.shape()), cache_kind, shape_str(cache_shape));
  MERE_CHECK(q_norm.defined() == k_norm.defined(), "qk_norm_rope_store: q_norm and k_norm go together");
  MERE_CHECK(q.device() == Device::cpu || (q.dim(2) <= 256 && int(table.inv_freq.size()) * 2 <= q.dim(2)),
             "qk_norm_rope_store (CUDA): head_dim {} exceeds 256 or rotary dim", q.dim(2));
  if (pages.paged())
    return paged::qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, table, start_pos, k_cache, v_cache, pages);
  if (q.device() == Device::cpu)  // the composition: the reference
    return compose_qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, table, start_pos, k_cache, v_cache);
  cuda::qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, table, start_pos, k_cache, v_cache);
}

}  // namespace

void qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                        float eps, const RopeTable& table, const Tensor& start_pos, Tensor& k_cache, Tensor& v_cache,
                        const KvPages& pages) {
  const bool fits = k_cache.rank() == 3 && k_cache.shape() == v_cache.shape() && k.rank() == 3 &&
                    k_cache.dim(1) == k.dim(1) && k_cache.dim(2) == k.dim(2);
  checked_qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, table, start_pos, k_cache, v_cache, pages, fits, "cache",
                             k_cache.shape());
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale) {
  MERE_CHECK(q.rank() == 3 && k.rank() == 3 && v.shape() == k.shape(),
             "attention: q {} k {} v {} must be [tokens, heads, head_dim]", shape_str(q.shape()),
             shape_str(k.shape()), shape_str(v.shape()));
  MERE_CHECK(q.dim(2) == k.dim(2) && k.dim(1) > 0 && q.dim(1) % k.dim(1) == 0,
             "attention: {} query heads cannot share {} kv heads of dim {} (query head_dim {})", q.dim(1),
             k.dim(1), k.dim(2), q.dim(2));
  MERE_CHECK(pos0 >= 0 && k.dim(0) >= pos0 + q.dim(0), "attention: cache holds {} positions, need {}",
             k.dim(0), pos0 + q.dim(0));
  check_same_device("attention", q, k);
  check_same_device("attention", q, v);
  MERE_CHECK(q.dtype() == DType::f32, "attention: q must be f32, got {}", dtype_name(q.dtype()));
  Tensor out = Tensor::empty(q.shape(), DType::f32, q.device());
  switch (q.device()) {
    case Device::cpu: cpu::attention(q, k, v, pos0, scale, out); break;
    case Device::cuda: cuda::attention(q, k, v, pos0, scale, out); break;
  }
  return out;
}

namespace {

AffineRows empty_affine(int64_t rows, int64_t heads, int64_t head_dim, int bits, Device device) {
  const int64_t groups = head_dim / kv_quant_group(head_dim);
  return {Tensor::empty({rows, heads, head_dim * bits / 8}, DType::u8, device),
          Tensor::empty({rows, heads, groups}, DType::bf16, device),
          Tensor::empty({rows, heads, groups}, DType::bf16, device), bits};
}

void check_affine(const char* op, const AffineRows& q) {
  MERE_CHECK(q.codes.defined() && (q.bits == 8 || q.bits == 4) && q.codes.rank() == 3 && q.codes.dtype() == DType::u8 &&
                 q.scales.dtype() == DType::bf16 && q.biases.shape() == q.scales.shape() &&
                 q.scales.rank() == 3 && q.scales.dim(0) == q.codes.dim(0) && q.scales.dim(1) == q.codes.dim(1) &&
                 q.head_dim() % q.scales.dim(2) == 0 &&
                 q.head_dim() / q.scales.dim(2) == kv_quant_group(q.head_dim()),
             "{}: malformed affine rows (codes {} scales {} bits {})", op, shape_str(q.codes.shape()),
             shape_str(q.scales.shape()), q.bits);
  MERE_CHECK(q.scales.device() == q.codes.device() && q.biases.device() == q.codes.device(),
             "{}: affine rows on different devices", op);
}

void check_affine_attention(const Tensor& q, const AffineRows& k, const AffineRows& v) {
  check_affine("attention", k);
  check_affine("attention", v);
  MERE_CHECK(q.rank() == 3 && q.dtype() == DType::f32 && k.codes.shape() == v.codes.shape() && k.bits == v.bits &&
                 q.dim(2) == k.head_dim() && k.heads() > 0 && q.dim(1) % k.heads() == 0,
             "attention: q {} does not fit a quantized cache of {} heads x {}", shape_str(q.shape()), k.heads(),
             k.head_dim());
  MERE_CHECK(q.device() == k.device() && q.device() == v.device(), "attention: operands on different devices");
}

}  // namespace

AffineRows quantize_kv_rows(const Tensor& x, int bits) {
  MERE_CHECK(x.device() == Device::cpu && x.dtype() == DType::f32 && x.rank() == 3,
             "quantize_kv_rows: expected f32 [T, kv_heads, head_dim] on the CPU, got {} {}", dtype_name(x.dtype()),
             shape_str(x.shape()));
  MERE_CHECK(bits == 8 || bits == 4, "quantize_kv_rows: {} bits (8 or 4)", bits);
  const int64_t d = x.dim(2), group = kv_quant_group(d);
  MERE_CHECK(d % group == 0 && group % 2 == 0, "kv cache: head_dim {} does not split into quantization groups of {}",
             d, group);
  AffineRows q = empty_affine(x.dim(0), x.dim(1), d, bits, Device::cpu);
  cpu::quantize_kv_rows(x, q);
  return q;
}

Tensor dequantize_kv_rows(const AffineRows& q, int64_t n, int64_t head_dim) {
  check_affine("dequantize_kv_rows", q);
  MERE_CHECK(q.device() == Device::cpu && q.head_dim() == head_dim && n >= 0 && n <= q.rows(),
             "dequantize_kv_rows: {} rows of head_dim {} from {} of head_dim {} (on the CPU only)", n, head_dim,
             q.rows(), q.head_dim());
  Tensor out = Tensor::empty({n, q.heads(), head_dim}, DType::f32);
  cpu::dequantize_kv_rows(q, n, out);
  return out;
}

void store_rows(const Tensor& x, AffineRows& dst, const Tensor& start_pos, const KvPages& pages) {
  check_affine("store_rows", dst);
  MERE_CHECK(x.rank() == 3 && x.dtype() == DType::f32 && x.dim(1) == dst.heads() && x.dim(2) == dst.head_dim(),
             "store_rows: rows {} do not fit a quantized cache of {} heads x {}", shape_str(x.shape()), dst.heads(),
             dst.head_dim());
  check_same_device("store_rows", x, dst.codes);
  check_same_device("store_rows", x, start_pos);
  if (pages.paged()) return paged::store_rows(x, dst, start_pos, pages);
  if (x.device() == Device::cpu) {
    const int64_t p0 = host_scalar(start_pos, "store_rows");
    MERE_CHECK(p0 >= 0 && p0 + x.dim(0) <= dst.rows(), "store_rows: rows {}..{} past {}", p0, p0 + x.dim(0),
               dst.rows());
    cpu::store_rows(x, dst, p0);
    return;
  }
  cuda::store_rows(x, dst, start_pos);
}

void dequantize_rows_into(const AffineRows& src, int64_t n, Tensor& dst) {
  check_affine("dequantize_rows_into", src);
  MERE_CHECK(n >= 0 && n <= src.rows() && dst.rank() == 3 && dst.dim(0) >= n && dst.dim(1) == src.heads() &&
                 dst.dim(2) == src.head_dim() && dst.device() == src.device() &&
                 dst.dtype() == (src.device() == Device::cpu ? DType::f32 : DType::bf16),
             "dequantize_rows_into: {} rows into {} {}", n, dtype_name(dst.dtype()), shape_str(dst.shape()));
  switch (src.device()) {
    case Device::cpu: cpu::dequantize_kv_rows(src, n, dst); break;
    case Device::cuda: cuda::dequantize_rows(src, n, dst); break;
  }
}

void qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                        float eps, const RopeTable& table, const Tensor& start_pos, AffineRows& k_cache,
                        AffineRows& v_cache, const KvPages& pages) {
  check_affine("qk_norm_rope_store", k_cache);
  check_affine("qk_norm_rope_store", v_cache);
  const bool fits = k_cache.codes.shape() == v_cache.codes.shape() && k_cache.bits == v_cache.bits && k.rank() == 3 &&
                    k_cache.heads() == k.dim(1) && k_cache.head_dim() == k.dim(2);
  checked_qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, table, start_pos, k_cache, v_cache, pages, fits,
                             "quantized cache", k_cache.codes.shape());
}

Tensor attention(const Tensor& q, const AffineRows& k, const AffineRows& v, const Tensor& start_pos, float scale,
                 const KvPages& pages) {
  check_same_device("attention", q, start_pos);
  if (pages.paged()) {
    check_affine_attention(q, k, v);
    return paged::attention(q, k, v, start_pos, scale, pages);
  }
  if (q.device() == Device::cpu) return attention(q, k, v, int64_t(host_scalar(start_pos, "attention")), scale);
  check_affine_attention(q, k, v);
  Tensor out = Tensor::empty(q.shape(), DType::f32, q.device());
  cuda::attention(q, k, v, start_pos, scale, out);
  return out;
}

bool attention_unmerged(const Tensor& q, const AffineRows& k, const AffineRows& v, const Tensor& start_pos,
                        float scale, const KvPages& pages, AttentionSplits& out) {
  if (q.device() != Device::cuda) return false;
  check_same_device("attention", q, start_pos);
  check_affine_attention(q, k, v);
  if (pages.paged()) return paged::attention_unmerged(q, k, v, start_pos, scale, pages, out);
  return cuda::attention_unmerged(q, k, v, start_pos, scale, pages, out);
}

Tensor attention(const Tensor& q, const AffineRows& k, const AffineRows& v, int64_t pos0, float scale) {
  check_affine_attention(q, k, v);
  const int64_t n = pos0 + q.dim(0);
  MERE_CHECK(pos0 >= 0 && k.rows() >= n, "attention: cache holds {} positions, need {}", k.rows(), n);
  if (q.device() == Device::cuda && q.dim(0) < cuda::kQuantizedPrefillMinTokens) {
    Tensor out = Tensor::empty(q.shape(), DType::f32, q.device());
    cuda::attention(q, k, v, pos0, scale, out);
    return out;
  }
  if (q.device() == Device::cpu) {
    Tensor out = Tensor::empty(q.shape(), DType::f32);
    cpu::attention(q, k, v, pos0, scale, out);
    return out;
  }
  // A GPU prefill: the visible rows dequantized for the dense kernels.
  Tensor kd = Tensor::empty({n, k.heads(), k.head_dim()}, DType::bf16, q.device());
  Tensor vd = Tensor::empty({n, v.heads(), v.head_dim()}, DType::bf16, q.device());
  dequantize_rows_into(k, n, kd);
  dequantize_rows_into(v, n, vd);
  return attention(q, kd, vd, pos0, scale);
}

void fill_random(Tensor& t, uint64_t seed, float scale, float offset) {
  MERE_CHECK(is_float(t.dtype()), "fill_random: {} is not a float dtype", dtype_name(t.dtype()));
  switch (t.device()) {
    case Device::cpu: cpu::fill_random(t, seed, scale, offset); break;
    case Device::cuda: cuda::fill_random(t, seed, scale, offset); break;
  }
}

void convert_into(const Tensor& src, Tensor& dst) {
  MERE_CHECK(src.numel() == dst.numel() && is_float(src.dtype()) && is_float(dst.dtype()),
             "convert_into: {} {} into {} {}", dtype_name(src.dtype()), shape_str(src.shape()),
             dtype_name(dst.dtype()), shape_str(dst.shape()));
  check_same_device("convert_into", src, dst);
  switch (src.device()) {
    case Device::cpu: cpu::convert(src, dst); break;
    case Device::cuda: cuda::convert(src, dst); break;
  }
}

}  // namespace mere::ops

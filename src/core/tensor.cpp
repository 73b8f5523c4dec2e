#include "core/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace mere {
namespace {

std::atomic<uint64_t> g_host_live{0}, g_host_peak{0};

void count_host_alloc(uint64_t bytes) {
  const uint64_t live = g_host_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  uint64_t peak = g_host_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_host_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

}  // namespace

uint64_t host_tensor_bytes_live() { return g_host_live.load(std::memory_order_relaxed); }
uint64_t host_tensor_bytes_peak() { return g_host_peak.load(std::memory_order_relaxed); }
void reset_host_tensor_bytes_peak() { g_host_peak.store(g_host_live.load(std::memory_order_relaxed)); }

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  for (int64_t d : shape) MERE_CHECK(d >= 0, "Tensor::empty: negative dimension in {}", shape_str(shape));
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  if (device == Device::cuda) {
    void* p = device_alloc(t.size_bytes());
    t.data_ = p;
    t.owner_ = std::shared_ptr<void>(p, device_free);
    return t;
  }
  // 64-byte alignment so vector loads never straddle cache lines.
  size_t bytes = (std::max<size_t>(t.size_bytes(), 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  MERE_CHECK(p != nullptr, "out of memory allocating {} bytes", bytes);
  t.data_ = p;
  count_host_alloc(bytes);
  t.owner_ = std::shared_ptr<void>(p, [bytes](void* q) {
    g_host_live.fetch_sub(bytes, std::memory_order_relaxed);
    std::free(q);
  });
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  zero_bytes(t.data_, device, t.size_bytes());
  return t;
}

Tensor Tensor::borrow(void* data, Shape shape, DType dtype, std::shared_ptr<const void> owner,
                      Device device) {
  Tensor t;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.owner_ = std::move(owner);
  return t;
}

Tensor Tensor::from_floats(const std::vector<float>& values, Shape shape) {
  MERE_CHECK(int64_t(values.size()) == shape_numel(shape), "from_floats: {} values for shape {}",
             values.size(), shape_str(shape));
  Tensor t = empty(std::move(shape), DType::f32);
  std::memcpy(t.data_, values.data(), values.size() * 4);
  return t;
}

int64_t Tensor::dim(int i) const {
  int r = rank();
  if (i < 0) i += r;
  MERE_ASSERT(i >= 0 && i < r);
  return shape_[i];
}

Tensor Tensor::reshape(Shape shape) const {
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MERE_CHECK(infer < 0, "reshape: more than one -1 in {}", shape_str(shape));
      infer = int(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    MERE_CHECK(known > 0 && numel() % known == 0, "reshape: cannot view {} as {}", shape_str(shape_),
               shape_str(shape));
    shape[infer] = numel() / known;
  }
  MERE_CHECK(shape_numel(shape) == numel(), "reshape: cannot view {} as {}", shape_str(shape_),
             shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  MERE_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
             "slice_rows: [{}, {}) out of range for shape {}", begin, end, shape_str(shape_));
  Tensor t = *this;
  int64_t row = numel() / std::max<int64_t>(shape_[0], 1);
  t.data_ = static_cast<char*>(data_) + begin * row * int64_t(dtype_size(dtype_));
  t.shape_[0] = end - begin;
  return t;
}

float Tensor::at(int64_t i) const {
  MERE_ASSERT(device_ == Device::cpu && i >= 0 && i < numel());
  switch (dtype_) {
    case DType::f32: return data<float>()[i];
    case DType::f16: return f16_to_f32(data<uint16_t>()[i]);
    case DType::bf16: return bf16_to_f32(data<uint16_t>()[i]);
    case DType::i32: return float(data<int32_t>()[i]);
    case DType::u32: return float(data<uint32_t>()[i]);
    case DType::u8: return float(data<uint8_t>()[i]);
    case DType::f8_e4m3: return f8_e4m3_to_f32(data<uint8_t>()[i]);
  }
  return 0;
}

std::vector<float> Tensor::to_floats() const {
  if (device_ != Device::cpu) return to_device(Device::cpu).to_floats();
  std::vector<float> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[size_t(i)] = at(i);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  MERE_CHECK(device_ == Device::cpu, "Tensor::to: CPU tensors only");
  Tensor out = empty(shape_, dtype);
  int64_t n = numel();
  if (dtype == dtype_) {
    std::memcpy(out.data_, data_, size_bytes());
    return out;
  }
  switch (dtype) {
    case DType::f32:
      for (int64_t i = 0; i < n; ++i) out.data<float>()[i] = at(i);
      break;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) out.data<uint16_t>()[i] = f32_to_f16(at(i));
      break;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) out.data<uint16_t>()[i] = f32_to_bf16(at(i));
      break;
    default:
      fail("Tensor::to: cannot convert {} to {}", dtype_name(dtype_), dtype_name(dtype));
  }
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_, device_);
  copy_bytes(out.data_, device_, data_, device_, size_bytes());
  return out;
}

Tensor Tensor::to_device(Device device) const {
  if (device == device_) return *this;
  Tensor out = empty(shape_, dtype_, device);
  copy_bytes(out.data_, device, data_, device_, size_bytes());
  return out;
}

}  // namespace mere

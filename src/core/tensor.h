// Tensor: a contiguous, row-major array with a dtype, a shape and a device.
// Storage is shared: copies of a Tensor alias the same bytes (like torch), and
// a tensor can borrow memory it does not own (an mmap'ed checkpoint) through an
// owner handle that keeps the mapping alive.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace mere {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(Shape shape, DType dtype, Device device = Device::cpu);
  static Tensor zeros(Shape shape, DType dtype, Device device = Device::cpu);
  // Wraps memory owned by `owner` (kept alive as long as any alias lives).
  static Tensor borrow(void* data, Shape shape, DType dtype, std::shared_ptr<const void> owner,
                       Device device = Device::cpu);
  static Tensor from_floats(const std::vector<float>& values, Shape shape);

  bool defined() const { return owner_ != nullptr || data_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return int(shape_.size()); }
  int64_t dim(int i) const;  // negative counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t size_bytes() const { return size_t(numel()) * dtype_size(dtype_); }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <typename T> T* data() { return static_cast<T*>(data_); }
  template <typename T> const T* data() const { return static_cast<const T*>(data_); }

  // Same bytes, new shape (numel must match); one dim may be -1.
  Tensor reshape(Shape shape) const;
  // Rows [begin, end) of the leading dimension, sharing storage.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // A copy on `device` (the same tensor if already there).
  Tensor to_device(Device device) const;
  // A copy converted to `dtype` (f32/f16/bf16 only; CPU tensors).
  Tensor to(DType dtype) const;
  Tensor clone() const;
  // Element i (flat) as float, for tests and small reads; any float dtype.
  float at(int64_t i) const;
  std::vector<float> to_floats() const;

 private:
  std::shared_ptr<const void> owner_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
};

// CPU tensor storage allocated by Tensor::empty and alive now, and the most alive at
// once since the last reset: how mere audit measures a run's workspace on the CPU.
// (Memory-mapped checkpoint weights are borrowed, not allocated, so they do not count.)
uint64_t host_tensor_bytes_live();
uint64_t host_tensor_bytes_peak();
void reset_host_tensor_bytes_peak();  // the peak becomes the live figure

}  // namespace mere

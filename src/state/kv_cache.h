// Contiguous per-layer K/V cache, grown on demand up to a fixed capacity: f32 on
// the CPU (the reference), bf16 on CUDA (half the bytes attention reads).
// Keys are stored post-RoPE. (Paged blocks and quantized modes
// replace this in the sequence-state work; the interface stays.)
#pragma once

#include "core/tensor.h"

namespace mere {

class KvCache {
 public:
  KvCache(int64_t n_kv_heads, int64_t head_dim, int64_t capacity, Device device);

  // Writes k, v [T, n_kv_heads, head_dim] at positions pos .. pos+T-1.
  void write(int64_t pos, const Tensor& k, const Tensor& v);
  // The first n positions, [n, n_kv_heads, head_dim], sharing storage.
  Tensor keys(int64_t n) const { return k_.slice_rows(0, n); }
  Tensor values(int64_t n) const { return v_.slice_rows(0, n); }
  int64_t capacity() const { return capacity_; }
  size_t size_bytes() const { return k_.size_bytes() + v_.size_bytes(); }

 private:
  void reserve(int64_t n);

  int64_t n_kv_heads_, head_dim_, capacity_;
  Device device_;
  DType dtype_;
  Tensor k_, v_;  // [allocated, n_kv_heads, head_dim]
};

// Everything one sequence carries between forwards: its length and, per layer,
// the state that layer kind needs.
class SeqState {
 public:
  SeqState(int n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t capacity, Device device);

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  KvCache& kv(int layer) { return layers_[size_t(layer)]; }
  // Called by the model once every layer has consumed T new tokens.
  void advance(int64_t T);
  // Rolls back to an earlier length (the cached positions past it are ignored).
  void truncate(int64_t length);

 private:
  std::vector<KvCache> layers_;
  int64_t length_ = 0, capacity_;
};

}  // namespace mere

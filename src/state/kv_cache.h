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

  // Makes room for n positions (n <= capacity); existing rows are kept.
  void reserve(int64_t n);
  // Writes k, v [T, n_kv_heads, head_dim] at positions *start_pos .. +T-1 (an i32
  // [1] tensor on the cache's device, so a CUDA graph can replay the write).
  // The caller has reserved the rows.
  void write(const Tensor& start_pos, const Tensor& k, const Tensor& v);
  // Every reserved position, [reserved, n_kv_heads, head_dim], sharing storage;
  // attention reads the visible prefix.
  const Tensor& keys() const { return k_; }
  const Tensor& values() const { return v_; }
  // For fused ops that write new rows themselves (same contract as write()).
  Tensor& keys_for_write() { return k_; }
  Tensor& values_for_write() { return v_; }
  int64_t capacity() const { return capacity_; }
  int64_t reserved() const { return k_.defined() ? k_.dim(0) : 0; }
  size_t size_bytes() const { return k_.size_bytes() + v_.size_bytes(); }

 private:
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
  Device device() const { return device_; }
  // Makes room for n positions in every layer (a CUDA graph needs all of them up front).
  void reserve(int64_t n);
  // Called by the model once every layer has consumed T new tokens.
  void advance(int64_t T);
  // Rolls back to an earlier length (the cached positions past it are ignored).
  void truncate(int64_t length);

 private:
  std::vector<KvCache> layers_;
  int64_t length_ = 0, capacity_;
  Device device_;
};

}  // namespace mere

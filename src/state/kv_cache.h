// Contiguous per-layer K/V cache, grown on demand up to a fixed capacity. Keys
// are stored post-RoPE. The storage follows the cache mode:
//   native   f32 on the CPU (the reference), bf16 on CUDA (half the bytes attention reads)
//   bf16     bf16 on either device
//   affine8  groupwise affine 8-bit: groups of 64 along head_dim (the whole head
//            when head_dim is smaller), one bf16 scale and bias per group, u8
//            codes (53.125% of bf16 at head_dim 128)
//   affine4  the same with 4-bit codes, two per byte (the first in the low nibble)
// Attention reads f32 (CPU) and bf16 (CUDA) caches directly; on the CPU a bf16
// or quantized cache is converted to f32 for it (the CUDA attention kernels do
// not read quantized caches yet: refused there).
// (Paged blocks replace the contiguous rows in the sequence-state work; the
// interface stays.)
#pragma once

#include <optional>
#include <string_view>

#include "core/tensor.h"

namespace mere {

enum class KvCacheMode : uint8_t { native, bf16, affine8, affine4 };
std::string_view kv_cache_mode_name(KvCacheMode mode);
std::optional<KvCacheMode> parse_kv_cache_mode(std::string_view text);
inline constexpr const char* kKvCacheModeNames = "default, bf16, affine8 or affine4";
inline constexpr int kKvQuantGroup = 64;  // elements per scale/bias group along head_dim
// The group for a head: 64, or the whole head when it is shorter.
inline int64_t kv_quant_group(int64_t head_dim) { return head_dim < kKvQuantGroup ? head_dim : kKvQuantGroup; }

// Bytes of one position of one layer's K (or V) as `mode` stores it on `device`.
uint64_t kv_row_bytes(int64_t n_kv_heads, int64_t head_dim, KvCacheMode mode, Device device);

// Rows quantized as above: codes [rows, kv_heads, head_dim * bits / 8] u8,
// scales and biases [rows, kv_heads, head_dim / group] bf16.
struct QuantizedRows {
  Tensor codes, scales, biases;
  int bits = 0;
};

// x [T, kv_heads, head_dim] (f32, CPU) quantized, with each value within half a
// step of its group (scale / 2) after dequantization.
QuantizedRows quantize_kv_rows(const Tensor& x, int bits);
// Rows [0, n) back to f32 [n, kv_heads, head_dim] (CPU).
Tensor dequantize_kv_rows(const QuantizedRows& q, int64_t n, int64_t head_dim);

class KvCache {
 public:
  KvCache(int64_t n_kv_heads, int64_t head_dim, int64_t capacity, Device device,
          KvCacheMode mode = KvCacheMode::native);

  // Makes room for n positions (n <= capacity); existing rows are kept.
  void reserve(int64_t n);
  // Writes k, v [T, n_kv_heads, head_dim] at positions *start_pos .. +T-1 (an i32
  // [1] tensor on the cache's device, so a CUDA graph can replay the write).
  // The caller has reserved the rows.
  void write(const Tensor& start_pos, const Tensor& k, const Tensor& v);
  // Dense caches: every reserved position, [reserved, n_kv_heads, head_dim],
  // sharing storage; attention reads the visible prefix.
  const Tensor& keys() const;
  const Tensor& values() const;
  // Whether attention reads the stored rows as they are (f32 on the CPU, any
  // dense dtype on CUDA); otherwise it reads keys/values_for_attention.
  bool attention_reads_storage() const;
  // What attention reads for the first n positions: the stored rows, or (CPU) an
  // f32 copy of them, dequantized or converted from bf16.
  Tensor keys_for_attention(int64_t n) const;
  Tensor values_for_attention(int64_t n) const;
  // For fused ops that write new rows themselves (dense modes; same contract as write()).
  Tensor& keys_for_write();
  Tensor& values_for_write();
  KvCacheMode mode() const { return mode_; }
  bool quantized() const { return mode_ == KvCacheMode::affine8 || mode_ == KvCacheMode::affine4; }
  int64_t capacity() const { return capacity_; }
  int64_t reserved() const { return reserved_; }
  // Resident bytes of the reserved rows (codes, scales and biases for quantized modes).
  size_t size_bytes() const;

 private:
  int64_t n_kv_heads_, head_dim_, capacity_, reserved_ = 0;
  Device device_;
  KvCacheMode mode_;
  DType dtype_;    // dense modes
  Tensor k_, v_;   // dense: [reserved, n_kv_heads, head_dim]
  QuantizedRows qk_, qv_;
};

// Everything one sequence carries between forwards: its length and, per layer,
// the state that layer kind needs.
class SeqState {
 public:
  SeqState(int n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t capacity, Device device,
           KvCacheMode mode = KvCacheMode::native);

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  KvCache& kv(int layer) { return layers_[size_t(layer)]; }
  Device device() const { return device_; }
  KvCacheMode kv_mode() const { return layers_.empty() ? KvCacheMode::native : layers_[0].mode(); }
  // Resident KV bytes over every layer.
  size_t kv_bytes() const;
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

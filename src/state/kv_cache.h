// Contiguous per-layer K/V cache, grown on demand up to a fixed capacity. Keys
// are stored post-RoPE. The storage follows the cache mode:
//   native   f32 on the CPU (the reference), bf16 on CUDA (half the bytes attention reads)
//   bf16     bf16 on either device
//   affine8  groupwise affine 8-bit: groups of 64 along head_dim (the whole head
//            when head_dim is smaller), one bf16 scale and bias per group, u8
//            codes (53.125% of bf16 at head_dim 128)
//   affine4  the same with 4-bit codes, two per byte (the first in the low nibble)
// Attention reads dense caches directly (the CPU widens bf16 rows in
// registers). A decode step reads the quantized codes directly too (CUDA: in
// registers; CPU: a block of rows at a time into L1); a CUDA prefill (T >= 16)
// reads a bf16 copy of the visible rows made for that call, a CPU prompt of
// several tiles an f32 copy.
// A KvCache is also the storage of a BlockPool (state/block_pool.h): block b's
// row r is row b * block_size + r. SeqState (state/seq_state.h) puts the two
// together; write and attend then take the sequence's block tables (KvPages).
#pragma once

#include <optional>
#include <string_view>

#include "core/tensor.h"
#include "ops/ops.h"

namespace mere {

enum class KvCacheMode : uint8_t { native, bf16, affine8, affine4 };
std::string_view kv_cache_mode_name(KvCacheMode mode);
std::optional<KvCacheMode> parse_kv_cache_mode(std::string_view text);
inline constexpr const char* kKvCacheModeNames = "default, bf16, affine8 or affine4";
using ops::kKvQuantGroup;   // elements per scale/bias group along head_dim
using ops::kv_quant_group;  // 64, or the whole head when it is shorter

// Bytes of one position of one layer's K (or V) as `mode` stores it on `device`.
uint64_t kv_row_bytes(int64_t n_kv_heads, int64_t head_dim, KvCacheMode mode, Device device);

// Rows quantized as above (ops.h): codes [rows, kv_heads, head_dim * bits / 8] u8,
// scales and biases [rows, kv_heads, head_dim / group] bf16; quantize_kv_rows
// keeps each value within half a step of its group (scale / 2).
using QuantizedRows = ops::AffineRows;
using ops::dequantize_kv_rows;
using ops::quantize_kv_rows;

class KvCache {
 public:
  KvCache(int64_t n_kv_heads, int64_t head_dim, int64_t capacity, Device device,
          KvCacheMode mode = KvCacheMode::native);

  // Makes room for n positions (n <= capacity); existing rows are kept.
  void reserve(int64_t n);
  // Writes k, v [T, n_kv_heads, head_dim] at positions *start_pos .. +T-1 (an i32
  // [1] tensor on the cache's device, so a CUDA graph can replay the write).
  // The caller has reserved the rows. Paged: the positions' rows through the tables.
  void write(const Tensor& start_pos, const Tensor& k, const Tensor& v, const ops::KvPages& pages = {});
  // Dense caches: every reserved position, [reserved, n_kv_heads, head_dim],
  // sharing storage; attention reads the visible prefix.
  const Tensor& keys() const;
  const Tensor& values() const;
  // Quantized caches: every reserved position's codes, scales and biases.
  const QuantizedRows& quantized_keys() const;
  const QuantizedRows& quantized_values() const;
  // For fused ops that write new rows themselves (same contract as write()):
  // dense modes, and the quantized modes' codes.
  Tensor& keys_for_write();
  Tensor& values_for_write();
  QuantizedRows& quantized_keys_for_write();
  QuantizedRows& quantized_values_for_write();
  // Causal attention of q [T, n_heads, head_dim] at positions *pos .. + T - 1
  // over the cached rows (written already); `length` is *pos as the host knows
  // it. One token (a decode step, which a CUDA graph may capture) reads only
  // *pos; more tokens also use `length`. Returns [T, n_heads, head_dim].
  // Paged (this is a pool's storage): decode steps and batches (a row per
  // sequence) read the rows through the tables; a prefill (kPagedGatherMinTokens
  // or more tokens of one sequence) gathers its visible rows first.
  Tensor attend(const Tensor& q, const Tensor& pos, int64_t length, float scale, const ops::KvPages& pages = {}) const;
  // The same without the merge where attend runs split-K on the GPU (decode):
  // the partials go to `out` (ops::attention_unmerged). False, with nothing
  // run, elsewhere.
  bool attend_unmerged(const Tensor& q, const Tensor& pos, float scale, const ops::KvPages& pages,
                       ops::AttentionSplits& out) const;
  static constexpr int64_t kPagedGatherMinTokens = 16;
  // Key (or value) rows [begin, begin + n) as f32 [n, n_kv_heads, head_dim]
  // (CPU): copied, converted from bf16 or dequantized.
  Tensor rows_f32(bool values, int64_t begin, int64_t n) const;
  // Rows [src, src + n) copied to rows [dst, dst + n) (reserved; ranges apart).
  void copy_rows(int64_t dst, int64_t src, int64_t n);
  // A copy of the reserved rows, on the same device.
  KvCache clone() const;
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

}  // namespace mere

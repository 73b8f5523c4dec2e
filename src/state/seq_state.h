// Everything one sequence carries between forwards: its length, its K/V and,
// per layer, any recurrent state its layer kind needs.
//
// K/V live in one of two ways behind the same interface:
//   paged       blocks of a BlockPool (shared with other sequences) through a
//               block table; fork shares blocks and copies the last partly
//               filled one on its first write; truncate releases whole blocks.
//               The states models make are paged, on the CPU and on CUDA.
//   contiguous  one KvCache per layer owned by the sequence (a block table that
//               is the identity); fork copies the rows.
// The block table is also a tensor on the state's device (ops.h KvPages), at a
// fixed address for the state's life: reserve() writes new entries there (on
// CUDA an async copy queued on the compute stream before the step), so a CUDA
// graph reads the table's current contents.
// Models touch K/V only through write_kv and attend (models/blocks/attention_inputs).
#pragma once

#include <memory>
#include <vector>

#include "state/block_pool.h"
#include "state/kv_cache.h"

namespace mere {

// A layer's state that is not K/V (conv state, linear-attention state, ...), as
// a family defines it. Forks copy it; rollback restores a snapshot of it.
class RecurrentState {
 public:
  virtual ~RecurrentState() = default;
  virtual std::unique_ptr<RecurrentState> clone() const = 0;
  virtual size_t size_bytes() const = 0;
};

class SeqState;

// What SeqState::restore needs to roll a sequence back: its length then and a
// copy of each recurrent state.
struct SeqSnapshot {
  int64_t length = 0;
  std::vector<std::unique_ptr<RecurrentState>> recurrent;  // per layer, null where none
};

class SeqState {
 public:
  // A contiguous state holding up to `capacity` tokens.
  SeqState(int n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t capacity, Device device,
           KvCacheMode mode = KvCacheMode::native);
  // A paged state on `pool` holding up to `capacity` tokens (blocks taken as it grows).
  SeqState(std::shared_ptr<BlockPool> pool, int64_t capacity);
  // The state a model makes for one sequence: paged, on a pool of its own.
  static std::unique_ptr<SeqState> for_layout(const KvLayout& layout, int64_t capacity);
  ~SeqState();
  SeqState(const SeqState&) = delete;
  SeqState& operator=(const SeqState&) = delete;

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  Device device() const { return layout_.device; }
  KvCacheMode kv_mode() const { return layout_.mode; }
  int n_layers() const { return layout_.n_layers; }
  bool is_paged() const { return pool_ != nullptr; }
  const std::shared_ptr<BlockPool>& pool() const { return pool_; }
  const std::vector<int32_t>& block_table() const { return table_; }
  // Resident KV bytes: the sequence's own rows (contiguous) or the blocks in its
  // table (paged, shared ones counted in full).
  size_t kv_bytes() const;

  // Makes room for n positions in every layer (a CUDA graph needs all of them up
  // front). Paged: takes blocks, and copies any shared block at or past length()
  // (copy on write) so the next forward writes only blocks this sequence owns.
  void reserve(int64_t n);
  // Called by the model once every layer has consumed T new tokens.
  void advance(int64_t T);
  // Rolls back to an earlier length; paged states release the blocks past it.
  void truncate(int64_t length);
  // A new sequence with this one's tokens: paged, sharing its blocks; contiguous,
  // with a copy of its rows. Recurrent states are copied either way.
  std::unique_ptr<SeqState> fork() const;
  // Paged: the first blocks of the table set to `blocks` (each already retained
  // for this sequence) holding `tokens` positions; the state must be empty.
  void adopt_prefix(const std::vector<int32_t>& blocks, int64_t tokens);

  // Rollback with recurrent state: a snapshot now, restored later (truncating
  // K/V to the snapshot's length and putting back each recurrent state).
  SeqSnapshot snapshot() const;
  void restore(const SeqSnapshot& snapshot);
  // The layer's recurrent state slot (null until the family sets one).
  std::unique_ptr<RecurrentState>& recurrent(int layer) { return recurrent_[size_t(layer)]; }

  // The K/V of one layer, as models see it. k, v [T, n_kv_heads, head_dim] go to
  // positions *pos .. + T - 1 (pos i32 [1] on the state's device; paged states
  // read it on the host).
  void write_kv(int layer, const Tensor& pos, const Tensor& k, const Tensor& v);
  // Causal attention of q [T, n_heads, head_dim] at positions *pos .. + T - 1
  // over the layer's cached rows (written already) -> [T, n_heads, head_dim].
  // `pos` equals length() on the host until advance().
  Tensor attend(int layer, const Tensor& q, const Tensor& pos, float scale) const;
  // The same without the merge where it runs split-K on the GPU
  // (KvCache::attend_unmerged); false, with nothing run, elsewhere.
  bool attend_unmerged(int layer, const Tensor& q, const Tensor& pos, float scale, ops::AttentionSplits& out) const;
  // The layer's storage (the pool's for a paged state), for fused kernels that
  // write rows themselves at the positions pages() maps.
  KvCache& storage(int layer) { return pool_ ? pool_->layer(layer) : layers_[size_t(layer)]; }
  const KvCache& storage(int layer) const { return pool_ ? pool_->layer(layer) : layers_[size_t(layer)]; }
  // The block table as the ops take it (paged), or none (contiguous).
  ops::KvPages pages() const { return pool_ ? ops::KvPages{{table_tensor_}} : ops::KvPages{}; }

 private:
  KvLayout layout_;
  int64_t length_ = 0, capacity_;
  std::vector<KvCache> layers_;        // contiguous
  std::shared_ptr<BlockPool> pool_;    // paged
  std::vector<int32_t> table_;         // paged: block ids of positions [i * block_size, (i + 1) * block_size)
  Tensor table_tensor_;                   // paged: i32 [capacity in blocks] on the state's device, table_ mirrored
  void sync_table(size_t from);        // entries [from, table_.size()) of table_ into table_tensor_
  std::vector<std::unique_ptr<RecurrentState>> recurrent_;
};

}  // namespace mere

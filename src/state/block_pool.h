// Paged K/V storage: fixed-size blocks of positions for every layer, shared by
// the sequences that hold them (reference counts), and an index of the blocks
// that hold a known token prefix (the prefix cache) with LRU eviction.
//
// Block size: 16 positions. Prefixes are shared and reused in whole blocks, so a
// small block loses at most 15 positions of reuse and copies at most 15 rows on
// copy-on-write; a block table of a 32k context is 2k entries. For a GPU kernel
// a block of Llama-3-8B K (16 x 8 heads x 128 x bf16) is 32 KB, large enough for
// full-width loads, and a 256-key split of the decode kernel is 16 blocks.
//
// Physical row r of block b is row b * block_size + r of each layer's storage
// (a KvCache reserved for every block), so a block id is all a table holds.
#pragma once

#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "state/kv_cache.h"

namespace mere {

inline constexpr int64_t kKvBlockSize = ops::kKvPageRows;  // what the paged kernels take

// What one position of a model's K/V looks like: every layer has K and V of
// n_kv_heads x head_dim, stored as `mode` says on `device`.
struct KvLayout {
  int n_layers = 0;
  int64_t n_kv_heads = 0, head_dim = 0;
  KvCacheMode mode = KvCacheMode::native;
  Device device = Device::cpu;
  // Bytes of one position over every layer (K and V).
  uint64_t position_bytes() const { return 2 * uint64_t(n_layers) * kv_row_bytes(n_kv_heads, head_dim, mode, device); }
};

class BlockPool {
 public:
  BlockPool(const KvLayout& layout, int64_t n_blocks, int64_t block_size = kKvBlockSize);

  // Capacity from a token count (rounded up to whole blocks), or from a fraction
  // of `available_bytes` (at least one block).
  static int64_t blocks_for_tokens(int64_t tokens, int64_t block_size = kKvBlockSize);
  static int64_t blocks_for_memory(double fraction, uint64_t available_bytes, const KvLayout& layout,
                                   int64_t block_size = kKvBlockSize);

  const KvLayout& layout() const { return layout_; }
  int64_t block_size() const { return block_size_; }
  int64_t n_blocks() const { return int64_t(refs_.size()); }
  int64_t capacity_tokens() const { return n_blocks() * block_size_; }  // one sequence holding every block
  // Blocks no sequence holds (free or cached), and of those the cached ones.
  int64_t available_blocks() const { return int64_t(free_.size() + lru_.size()); }
  int64_t cached_blocks() const { return int64_t(lru_.size()); }
  int refs(int32_t block) const { return refs_[size_t(block)]; }
  // Whether the block holds a prefix-cache entry (its rows must not change).
  bool is_published(int32_t block) const { return entries_[size_t(block)].published; }
  size_t size_bytes() const;

  // A block for a sequence (reference count 1): a free one, else the least
  // recently used cached one (its prefix entry dropped). Error when every block
  // is held by a sequence.
  int32_t allocate();
  void retain(int32_t block);
  // One reference fewer; at zero the block becomes cached if it holds a known
  // prefix (most recently used), free otherwise.
  void release(int32_t block);
  // Rows [0, rows) of block src copied into block dst, in every layer (copy on write).
  void copy_rows(int32_t dst, int32_t src, int64_t rows);

  // The prefix cache: `hash` names a whole block of tokens after a given prefix
  // (prefix_cache.h computes it); `tokens` are kept to rule out collisions.
  // Registers a full block; a hash already known keeps its first block.
  void publish(int32_t block, uint64_t hash, const std::vector<int32_t>& tokens);
  // The block holding (hash, tokens), retained for the caller, or -1.
  int32_t lookup(uint64_t hash, const std::vector<int32_t>& tokens);
  int64_t evictions() const { return evictions_; }

  KvCache& layer(int l) { return layers_[size_t(l)]; }
  const KvCache& layer(int l) const { return layers_[size_t(l)]; }

 private:
  struct Entry {
    uint64_t hash = 0;
    std::vector<int32_t> tokens;
    bool published = false;
    std::list<int32_t>::iterator lru;  // valid while cached (refs 0)
    bool in_lru = false;
  };
  void forget(int32_t block);  // drops the block's prefix entry

  KvLayout layout_;
  int64_t block_size_;
  std::vector<KvCache> layers_;  // each [n_blocks * block_size] rows: CUDA from the start, CPU as blocks are handed out
  std::vector<int> refs_;
  std::vector<int32_t> free_;    // unreferenced, no prefix
  std::list<int32_t> lru_;       // unreferenced with a prefix; front = least recently used
  std::vector<Entry> entries_;
  std::unordered_map<uint64_t, int32_t> index_;
  int64_t evictions_ = 0;
};

}  // namespace mere

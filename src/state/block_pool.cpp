#include "state/block_pool.h"

#include <algorithm>

namespace mere {

BlockPool::BlockPool(const KvLayout& layout, int64_t n_blocks, int64_t block_size)
    : layout_(layout), block_size_(block_size) {
  MERE_CHECK(n_blocks > 0 && block_size > 0, "block pool: {} blocks of {} positions", n_blocks, block_size);
  // On the CPU storage grows (doubling) as higher block ids are first handed
  // out, so a pool sized for a long context costs memory only for what is used.
  // On CUDA it is allocated in full now: a captured graph bakes in its address.
  const int64_t rows = n_blocks * block_size;
  layers_.reserve(size_t(layout.n_layers));
  for (int l = 0; l < layout.n_layers; ++l) {
    layers_.emplace_back(layout.n_kv_heads, layout.head_dim, rows, layout.device, layout.mode);
    if (layout.device == Device::cuda) layers_.back().reserve(rows);
  }
  refs_.assign(size_t(n_blocks), 0);
  entries_.resize(size_t(n_blocks));
  free_.reserve(size_t(n_blocks));
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(int32_t(b));  // block 0 is handed out first
}

int64_t BlockPool::blocks_for_tokens(int64_t tokens, int64_t block_size) {
  return std::max<int64_t>(1, (tokens + block_size - 1) / block_size);
}

int64_t BlockPool::blocks_for_memory(double fraction, uint64_t available_bytes, const KvLayout& layout,
                                     int64_t block_size) {
  MERE_CHECK(fraction > 0 && fraction <= 1, "kv cache memory fraction {} is not in (0, 1]", fraction);
  const double block_bytes = double(layout.position_bytes()) * double(block_size);
  return std::max<int64_t>(1, int64_t(fraction * double(available_bytes) / block_bytes));
}

size_t BlockPool::size_bytes() const {
  size_t n = 0;
  for (const KvCache& kv : layers_) n += kv.size_bytes();
  return n;
}

int32_t BlockPool::allocate() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    MERE_CHECK(!lru_.empty(), "kv cache is full: all {} blocks of {} positions are held by sequences", n_blocks(),
               block_size_);
    b = lru_.front();  // the least recently used cached prefix block
    lru_.pop_front();
    entries_[size_t(b)].in_lru = false;
    forget(b);
    ++evictions_;
  }
  MERE_ASSERT(refs_[size_t(b)] == 0);
  refs_[size_t(b)] = 1;
  for (KvCache& kv : layers_) kv.reserve((int64_t(b) + 1) * block_size_);
  return b;
}

void BlockPool::retain(int32_t block) {
  Entry& e = entries_[size_t(block)];
  if (refs_[size_t(block)]++ == 0) {  // a cached block comes back into use
    MERE_ASSERT(e.in_lru);
    lru_.erase(e.lru);
    e.in_lru = false;
  }
}

void BlockPool::release(int32_t block) {
  MERE_ASSERT(refs_[size_t(block)] > 0);
  if (--refs_[size_t(block)] > 0) return;
  Entry& e = entries_[size_t(block)];
  if (e.published) {
    e.lru = lru_.insert(lru_.end(), block);
    e.in_lru = true;
  } else {
    free_.push_back(block);
  }
}

void BlockPool::copy_rows(int32_t dst, int32_t src, int64_t rows) {
  MERE_ASSERT(rows <= block_size_ && dst != src);
  for (KvCache& kv : layers_) kv.copy_rows(int64_t(dst) * block_size_, int64_t(src) * block_size_, rows);
}

void BlockPool::publish(int32_t block, uint64_t hash, const std::vector<int32_t>& tokens) {
  MERE_ASSERT(int64_t(tokens.size()) == block_size_ && refs_[size_t(block)] > 0);
  Entry& e = entries_[size_t(block)];
  if (e.published || index_.count(hash)) return;
  e.hash = hash;
  e.tokens = tokens;
  e.published = true;
  index_[hash] = block;
}

int32_t BlockPool::lookup(uint64_t hash, const std::vector<int32_t>& tokens) {
  auto it = index_.find(hash);
  if (it == index_.end() || entries_[size_t(it->second)].tokens != tokens) return -1;
  retain(it->second);
  return it->second;
}

void BlockPool::forget(int32_t block) {
  Entry& e = entries_[size_t(block)];
  if (!e.published) return;
  index_.erase(e.hash);
  e.published = false;
  e.tokens.clear();
}

}  // namespace mere

#include "state/seq_state.h"

#include <algorithm>
#include <cstring>

namespace mere {

SeqState::SeqState(int n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t capacity, Device device,
                   KvCacheMode mode)
    : layout_{n_layers, n_kv_heads, head_dim, mode, device}, capacity_(capacity) {
  layers_.reserve(size_t(n_layers));
  for (int l = 0; l < n_layers; ++l) layers_.emplace_back(n_kv_heads, head_dim, capacity, device, mode);
  recurrent_.resize(size_t(n_layers));
}

SeqState::SeqState(std::shared_ptr<BlockPool> pool, int64_t capacity)
    : layout_(pool->layout()), capacity_(capacity), pool_(std::move(pool)) {
  MERE_CHECK(pool_->block_size() == ops::kKvPageRows, "paged sequence state: blocks of {} positions (the kernels take {})",
             pool_->block_size(), ops::kKvPageRows);
  MERE_CHECK(capacity > 0, "paged sequence state: capacity {} tokens", capacity);
  const int64_t max_blocks = BlockPool::blocks_for_tokens(capacity, pool_->block_size());
  table_.reserve(size_t(max_blocks));
  // Zeros: an entry not yet written names block 0, still inside the storage.
  table_tensor_ = Tensor::zeros({max_blocks}, DType::i32, layout_.device);
  recurrent_.resize(size_t(layout_.n_layers));
}

std::unique_ptr<SeqState> SeqState::for_layout(const KvLayout& l, int64_t capacity) {
  return std::make_unique<SeqState>(std::make_shared<BlockPool>(l, BlockPool::blocks_for_tokens(capacity)), capacity);
}

void SeqState::sync_table(size_t from) {
  if (from >= table_.size()) return;
  MERE_ASSERT(int64_t(table_.size()) <= table_tensor_.numel());
  int32_t* dst = table_tensor_.data<int32_t>() + from;
  const size_t bytes = (table_.size() - from) * sizeof(int32_t);
  // On CUDA queued behind the work already on the stream (which may still read
  // the old entries); a pageable source is staged before the call returns.
  if (layout_.device == Device::cuda) copy_to_device_async(dst, table_.data() + from, bytes);
  else std::memcpy(dst, table_.data() + from, bytes);
}

SeqState::~SeqState() {
  if (pool_)
    for (int32_t b : table_) pool_->release(b);
}

size_t SeqState::kv_bytes() const {
  if (pool_) return table_.size() * size_t(pool_->block_size()) * size_t(layout_.position_bytes());
  size_t n = 0;
  for (const KvCache& kv : layers_) n += kv.size_bytes();
  return n;
}

void SeqState::reserve(int64_t n) {
  MERE_CHECK(n <= capacity_, "context is full: {} positions exceed the cache capacity of {} tokens", n, capacity_);
  if (!pool_) {
    for (KvCache& kv : layers_) kv.reserve(n);
    return;
  }
  const int64_t bs = pool_->block_size();
  size_t changed = table_.size();  // the first entry to write to the table tensor
  // Copy on write: the blocks that the next writes (positions from length_) may
  // touch and that another sequence or the prefix cache also holds.
  for (size_t i = size_t(length_ / bs); i < table_.size(); ++i) {
    const int32_t b = table_[i];
    if (pool_->refs(b) == 1 && !pool_->is_published(b)) continue;
    const int32_t copy = pool_->allocate();
    pool_->copy_rows(copy, b, bs);
    pool_->release(b);
    table_[i] = copy;
    changed = std::min(changed, i);
  }
  while (int64_t(table_.size()) * bs < n) table_.push_back(pool_->allocate());
  sync_table(changed);
}

void SeqState::advance(int64_t T) { length_ += T; }

void SeqState::truncate(int64_t length) {
  MERE_CHECK(length >= 0 && length <= length_, "truncate: cannot roll back from {} to {}", length_, length);
  length_ = length;
  if (!pool_) return;
  const size_t keep = size_t((length + pool_->block_size() - 1) / pool_->block_size());
  while (table_.size() > keep) {
    pool_->release(table_.back());
    table_.pop_back();
  }
}

std::unique_ptr<SeqState> SeqState::fork() const {
  std::unique_ptr<SeqState> f;
  if (pool_) {
    f = std::make_unique<SeqState>(pool_, capacity_);
    const size_t used = size_t((length_ + pool_->block_size() - 1) / pool_->block_size());
    for (size_t i = 0; i < used; ++i) {
      pool_->retain(table_[i]);
      f->table_.push_back(table_[i]);
    }
    f->sync_table(0);
  } else {
    f = std::make_unique<SeqState>(layout_.n_layers, layout_.n_kv_heads, layout_.head_dim, capacity_, layout_.device,
                                   layout_.mode);
    for (size_t l = 0; l < layers_.size(); ++l) f->layers_[l] = layers_[l].clone();
  }
  f->length_ = length_;
  for (size_t l = 0; l < recurrent_.size(); ++l)
    if (recurrent_[l]) f->recurrent_[l] = recurrent_[l]->clone();
  return f;
}

void SeqState::adopt_prefix(const std::vector<int32_t>& blocks, int64_t tokens) {
  MERE_CHECK(pool_ && length_ == 0 && table_.empty(), "adopt_prefix: needs an empty paged state");
  MERE_CHECK(tokens <= int64_t(blocks.size()) * pool_->block_size() && tokens < capacity_,
             "adopt_prefix: {} tokens in {} blocks (capacity {})", tokens, blocks.size(), capacity_);
  table_ = blocks;
  length_ = tokens;
  sync_table(0);
}

SeqSnapshot SeqState::snapshot() const {
  SeqSnapshot s;
  s.length = length_;
  for (const auto& r : recurrent_) s.recurrent.push_back(r ? r->clone() : nullptr);
  return s;
}

void SeqState::restore(const SeqSnapshot& snapshot) {
  MERE_CHECK(snapshot.recurrent.size() == recurrent_.size(), "restore: a snapshot of {} layers for {}",
             snapshot.recurrent.size(), recurrent_.size());
  truncate(snapshot.length);
  for (size_t l = 0; l < recurrent_.size(); ++l)
    recurrent_[l] = snapshot.recurrent[l] ? snapshot.recurrent[l]->clone() : nullptr;
}

void SeqState::write_kv(int layer, const Tensor& pos, const Tensor& k, const Tensor& v) {
  if (pool_) {
    // The host knows *pos: length() until advance().
    const int64_t bs = pool_->block_size(), T = k.dim(0);
    MERE_CHECK(length_ + T <= int64_t(table_.size()) * bs, "kv cache: positions {}..{} are not reserved", length_,
               length_ + T);
    for (int64_t b = length_ / bs; b * bs < length_ + T; ++b)
      MERE_ASSERT(pool_->refs(table_[size_t(b)]) == 1);  // reserve() made it private
  }
  storage(layer).write(pos, k, v, pages());
}

bool SeqState::attend_unmerged(int layer, const Tensor& q, const Tensor& pos, float scale,
                               ops::AttentionSplits& out) const {
  if (!pool_) return layers_[size_t(layer)].attend_unmerged(q, pos, scale, {}, out);
  return pool_->layer(layer).attend_unmerged(q, pos, scale, pages(), out);
}

Tensor SeqState::attend(int layer, const Tensor& q, const Tensor& pos, float scale) const {
  if (!pool_) return layers_[size_t(layer)].attend(q, pos, length_, scale);
  const int64_t bs = pool_->block_size(), n = length_ + q.dim(0);
  const KvCache& storage = pool_->layer(layer);
  // CPU fast path: blocks that follow each other in storage (a sequence alone
  // on its pool gets them in order) are read in place, dense or quantized.
  const size_t used = size_t((n + bs - 1) / bs);
  bool in_order = layout_.device == Device::cpu;
  for (size_t i = 1; i < used && in_order; ++i) in_order = table_[i] == table_[0] + int32_t(i);
  if (in_order) {
    const int64_t first = int64_t(table_[0]) * bs;
    if (storage.quantized()) {
      auto visible = [&](const QuantizedRows& rows) {
        return QuantizedRows{rows.codes.slice_rows(first, first + n), rows.scales.slice_rows(first, first + n),
                             rows.biases.slice_rows(first, first + n), rows.bits};
      };
      return ops::attention(q, visible(storage.quantized_keys()), visible(storage.quantized_values()), length_, scale);
    }
    return ops::attention(q, storage.keys().slice_rows(first, first + n), storage.values().slice_rows(first, first + n),
                          length_, scale);
  }
  // Otherwise through the table: the kernels read it (decode), or a prefill
  // gathers the visible rows (ops/paged_ops.cpp).
  return storage.attend(q, pos, length_, scale, pages());
}

}  // namespace mere

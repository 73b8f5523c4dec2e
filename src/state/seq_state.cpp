#include "state/seq_state.h"

#include <algorithm>

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
  MERE_CHECK(layout_.device == Device::cpu,
             "paged sequence state: the CUDA kernels do not read block tables yet (CUDA states are contiguous)");
  recurrent_.resize(size_t(layout_.n_layers));
}

std::unique_ptr<SeqState> SeqState::for_layout(const KvLayout& l, int64_t capacity) {
  if (l.device == Device::cpu)
    return std::make_unique<SeqState>(std::make_shared<BlockPool>(l, BlockPool::blocks_for_tokens(capacity)), capacity);
  return std::make_unique<SeqState>(l.n_layers, l.n_kv_heads, l.head_dim, capacity, l.device, l.mode);
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
  // Copy on write: the blocks that the next writes (positions from length_) may
  // touch and that another sequence or the prefix cache also holds.
  for (size_t i = size_t(length_ / bs); i < table_.size(); ++i) {
    const int32_t b = table_[i];
    if (pool_->refs(b) == 1 && !pool_->is_published(b)) continue;
    const int32_t copy = pool_->allocate();
    pool_->copy_rows(copy, b, bs);
    pool_->release(b);
    table_[i] = copy;
  }
  while (int64_t(table_.size()) * bs < n) table_.push_back(pool_->allocate());
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
  if (!pool_) {
    layers_[size_t(layer)].write(pos, k, v);
    return;
  }
  // Paged (CPU): each block's share of the T rows goes to its physical rows.
  const int64_t bs = pool_->block_size(), T = k.dim(0), p0 = pos.data<int32_t>()[0];
  MERE_CHECK(p0 + T <= int64_t(table_.size()) * bs, "kv cache: positions {}..{} are not reserved", p0, p0 + T);
  KvCache& storage = pool_->layer(layer);
  Tensor at = Tensor::empty({1}, DType::i32);
  for (int64_t t = 0; t < T;) {
    const int64_t p = p0 + t, n = std::min(T - t, bs - p % bs);
    MERE_ASSERT(pool_->refs(table_[size_t(p / bs)]) == 1);  // reserve() made it private
    at.data<int32_t>()[0] = int32_t(int64_t(table_[size_t(p / bs)]) * bs + p % bs);
    storage.write(at, k.slice_rows(t, t + n), v.slice_rows(t, t + n));
    t += n;
  }
}

Tensor SeqState::attend(int layer, const Tensor& q, const Tensor& pos, float scale) const {
  if (!pool_) return layers_[size_t(layer)].attend(q, pos, length_, scale);
  const int64_t bs = pool_->block_size(), n = length_ + q.dim(0);
  const KvCache& storage = pool_->layer(layer);
  // Fast path: blocks that follow each other in storage (a sequence alone on its
  // pool gets them in order) are read in place when attention reads the storage
  // dtype (f32 on the CPU).
  const size_t used = size_t((n + bs - 1) / bs);
  bool in_order = storage.attention_reads_storage();
  for (size_t i = 1; i < used && in_order; ++i) in_order = table_[i] == table_[0] + int32_t(i);
  if (in_order) {
    const int64_t first = int64_t(table_[0]) * bs;
    return ops::attention(q, storage.keys().slice_rows(first, first + n), storage.values().slice_rows(first, first + n),
                          length_, scale);
  }
  // Otherwise the visible rows are gathered block by block into f32.
  Tensor k = Tensor::empty({n, layout_.n_kv_heads, layout_.head_dim}, DType::f32);
  Tensor v = Tensor::empty({n, layout_.n_kv_heads, layout_.head_dim}, DType::f32);
  const size_t row_bytes = size_t(layout_.n_kv_heads * layout_.head_dim) * sizeof(float);
  for (int64_t p = 0; p < n; p += bs) {
    const int64_t rows = std::min(bs, n - p), phys = int64_t(table_[size_t(p / bs)]) * bs;
    for (auto [dst, values] : {std::pair{&k, false}, {&v, true}}) {
      Tensor part = storage.rows_f32(values, phys, rows);
      std::copy_n(static_cast<const char*>(part.raw()), size_t(rows) * row_bytes,
                  static_cast<char*>(dst->raw()) + size_t(p) * row_bytes);
    }
  }
  return ops::attention(q, k, v, length_, scale);
}

}  // namespace mere

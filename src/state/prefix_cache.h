// The prefix cache: a new sequence whose tokens start with a prefix that an
// earlier sequence on the same pool has run reuses that prefix's K/V blocks
// instead of recomputing them. Blocks are keyed by a hash of their tokens chained
// through every token before them (so a block matches only after the same
// prefix); reuse is in whole blocks. Cached blocks that no sequence holds are
// evicted least recently used first when the pool needs blocks (BlockPool).
#pragma once

#include <memory>
#include <vector>

#include "state/seq_state.h"

namespace mere {

// One hash per whole block of `tokens`: block i's hash covers tokens [0, (i + 1) * block_size).
std::vector<uint64_t> prefix_block_hashes(const std::vector<int32_t>& tokens, int64_t block_size);

class PrefixCache {
 public:
  explicit PrefixCache(std::shared_ptr<BlockPool> pool) : pool_(std::move(pool)) {}

  const std::shared_ptr<BlockPool>& pool() const { return pool_; }
  // A fresh paged state holding up to `capacity` tokens whose first positions
  // are the longest cached prefix of `tokens`, in whole blocks and leaving at
  // least one token to run (its logits start the generation). length() says
  // how many positions were reused.
  std::unique_ptr<SeqState> start(const std::vector<int32_t>& tokens, int64_t capacity);
  // Makes the state's whole blocks among its first tokens.size() positions
  // (which hold `tokens`) available to later sequences.
  void publish(const SeqState& state, const std::vector<int32_t>& tokens);

  // Counters: start() calls, those that reused something, positions reused.
  int64_t lookups() const { return lookups_; }
  int64_t hits() const { return hits_; }
  int64_t reused_tokens() const { return reused_tokens_; }

 private:
  std::shared_ptr<BlockPool> pool_;
  int64_t lookups_ = 0, hits_ = 0, reused_tokens_ = 0;
};

}  // namespace mere

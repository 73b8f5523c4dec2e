#include "state/prefix_cache.h"

namespace mere {
namespace {

// splitmix64's finaliser: a well-mixed 64-bit step.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::vector<int32_t> block_tokens(const std::vector<int32_t>& tokens, size_t block, int64_t block_size) {
  auto begin = tokens.begin() + long(block * size_t(block_size));
  return std::vector<int32_t>(begin, begin + long(block_size));
}

}  // namespace

std::vector<uint64_t> prefix_block_hashes(const std::vector<int32_t>& tokens, int64_t block_size) {
  std::vector<uint64_t> hashes;
  uint64_t h = mix(uint64_t(block_size));
  for (size_t i = 0; i < tokens.size(); ++i) {
    h = mix(h ^ uint64_t(uint32_t(tokens[i])));
    if ((i + 1) % size_t(block_size) == 0) hashes.push_back(h);
  }
  return hashes;
}

std::unique_ptr<SeqState> PrefixCache::start(const std::vector<int32_t>& tokens, int64_t capacity) {
  ++lookups_;
  auto state = std::make_unique<SeqState>(pool_, capacity);
  if (tokens.size() < 2) return state;
  const int64_t bs = pool_->block_size();
  // At most tokens.size() - 1 positions: the last token must run.
  const std::vector<int32_t> usable(tokens.begin(), tokens.end() - 1);
  const std::vector<uint64_t> hashes = prefix_block_hashes(usable, bs);
  std::vector<int32_t> blocks;
  for (size_t i = 0; i < hashes.size(); ++i) {
    const int32_t b = pool_->lookup(hashes[i], block_tokens(usable, i, bs));
    if (b < 0) break;
    blocks.push_back(b);
  }
  if (blocks.empty()) return state;
  ++hits_;
  reused_tokens_ += int64_t(blocks.size()) * bs;
  state->adopt_prefix(blocks, int64_t(blocks.size()) * bs);
  return state;
}

void PrefixCache::publish(const SeqState& state, const std::vector<int32_t>& tokens) {
  MERE_CHECK(state.pool() == pool_, "prefix cache: the state is not on this cache's pool");
  MERE_CHECK(int64_t(tokens.size()) <= state.length(), "prefix cache: {} tokens but the state holds {}",
             tokens.size(), state.length());
  const int64_t bs = pool_->block_size();
  const std::vector<uint64_t> hashes = prefix_block_hashes(tokens, bs);
  for (size_t i = 0; i < hashes.size(); ++i)
    pool_->publish(state.block_table()[i], hashes[i], block_tokens(tokens, i, bs));
}

}  // namespace mere

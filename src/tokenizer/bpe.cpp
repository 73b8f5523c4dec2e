#include "tokenizer/bpe.h"

#include <queue>

#include "tokenizer/json_util.h"
#include "tokenizer/unicode.h"

namespace mere {

using tokenizer_json::Json;

Bpe Bpe::from_json(const Json& model) {
  const std::string where = "model";
  Bpe bpe;
  const Json& vocab = tokenizer_json::require(model, "vocab", where);
  MERE_CHECK(vocab.is_object(), "model.vocab: expected an object of token -> id, got {}",
             vocab.type_name());
  bpe.vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    MERE_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0 &&
                   it.value().get<int64_t>() < INT32_MAX,
               "model.vocab: token '{}' has id {}, expected a non-negative integer", it.key(),
               it.value().dump());
    int32_t id = it.value().get<int32_t>();
    bpe.vocab_.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  bpe.id_to_token_.assign(max_id + 1, nullptr);
  for (const auto& [token, id] : bpe.vocab_) bpe.id_to_token_[id] = &token;

  bpe.continuing_subword_prefix_ =
      tokenizer_json::get_or<std::string>(model, "continuing_subword_prefix", "", where);
  bpe.end_of_word_suffix_ =
      tokenizer_json::get_or<std::string>(model, "end_of_word_suffix", "", where);
  bpe.fuse_unk_ = tokenizer_json::get_or<bool>(model, "fuse_unk", false, where);
  bpe.byte_fallback_ = tokenizer_json::get_or<bool>(model, "byte_fallback", false, where);
  bpe.ignore_merges_ = tokenizer_json::get_or<bool>(model, "ignore_merges", false, where);
  double dropout = tokenizer_json::get_or<double>(model, "dropout", 0.0, where);
  MERE_CHECK(dropout == 0.0, "model.dropout is {}: BPE dropout is random, refused for inference",
             dropout);
  if (auto unk = tokenizer_json::get_or<std::string>(model, "unk_token", "", where); !unk.empty()) {
    auto id = bpe.token_to_id(unk);
    MERE_CHECK(id.has_value(), "model.unk_token '{}' is not in model.vocab", unk);
    bpe.unk_id_ = *id;
  }
  for (int b = 0; b < 256; ++b) {
    auto id = bpe.token_to_id(fmt::format("<0x{:02X}>", b));
    bpe.byte_ids_[b] = id.value_or(-1);
  }

  const Json& merges = tokenizer_json::require(model, "merges", where);
  MERE_CHECK(merges.is_array(), "model.merges: expected an array, got {}", merges.type_name());
  bpe.merges_.reserve(merges.size());
  const std::string& prefix = bpe.continuing_subword_prefix_;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Json& m = merges[rank];
    std::string a, b;
    if (m.is_string()) {  // "a b"
      const std::string& s = m.get_ref<const std::string&>();
      size_t space = s.find(' ');
      MERE_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
                 "model.merges[{}]: '{}' is not two tokens separated by one space", rank, s);
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      fail("model.merges[{}]: expected \"a b\" or [\"a\", \"b\"], got {}", rank, m.dump());
    }
    auto a_id = bpe.token_to_id(a), b_id = bpe.token_to_id(b);
    MERE_CHECK(a_id && b_id, "model.merges[{}]: '{}' is not in model.vocab", rank, a_id ? b : a);
    std::string_view b_rest = b;
    if (!prefix.empty() && b_rest.starts_with(prefix)) b_rest.remove_prefix(prefix.size());
    std::string merged = a + std::string(b_rest);
    auto new_id = bpe.token_to_id(merged);
    MERE_CHECK(new_id.has_value(), "model.merges[{}]: the merged token '{}' is not in model.vocab",
               rank, merged);
    // Like tokenizers' HashMap collect, a repeated pair keeps its last rank.
    bpe.merges_.insert_or_assign(pair_key(*a_id, *b_id),
                                 Merge{static_cast<int32_t>(rank), *new_id});
  }
  return bpe;
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size())) return nullptr;
  return id_to_token_[id];
}

const Bpe::Merge* Bpe::find_merge(int32_t a, int32_t b) const {
  auto it = merges_.find(pair_key(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = token_to_id(word)) {
      ids.push_back(*id);
      return;
    }
  }

  // One symbol per character; unknown characters become bytes or (fused) unk.
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  std::optional<int32_t> pending_unk;
  bool decorate = !continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty();
  std::string decorated;
  for (size_t i = 0; i < word.size();) {
    size_t n = std::min<size_t>(unicode::utf8_length(static_cast<uint8_t>(word[i])),
                                word.size() - i);
    std::string_view ch = word.substr(i, n);
    if (decorate) {
      decorated.clear();
      if (i > 0) decorated += continuing_subword_prefix_;
      decorated += ch;
      if (i + n == word.size()) decorated += end_of_word_suffix_;
      ch = decorated;
    }
    i += n;
    if (auto id = token_to_id(ch)) {
      if (pending_unk) symbols.push_back(*std::exchange(pending_unk, std::nullopt));
      symbols.push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (char c : ch) all_bytes &= byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all_bytes) {
        // As in tokenizers, a pending unk is not flushed before the bytes.
        for (char c : ch) symbols.push_back(byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_) symbols.push_back(*pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk) symbols.push_back(*pending_unk);

  merge(symbols);
  ids.insert(ids.end(), symbols.begin(), symbols.end());
}

// Applies merges lowest rank first (leftmost among equal ranks) until none applies, in
// O(n log n): a heap of candidate pairs over a linked list of symbols.
void Bpe::merge(std::vector<int32_t>& symbols) const {
  const int32_t n = static_cast<int32_t>(symbols.size());
  if (n < 2) return;
  struct Symbol {
    int32_t id, prev, next;
    bool alive;
  };
  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<Symbol> sym(n);
  for (int32_t i = 0; i < n; ++i) sym[i] = {symbols[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const Merge* m = find_merge(sym[i].id, sym[i + 1].id)) heap.push({m->rank, i, m->new_id});
  }
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[c.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = sym[left.next];
    // A stale candidate: the pair at pos changed since it was queued (tokenizers compares ids).
    const Merge* m = find_merge(left.id, right.id);
    if (m == nullptr || m->new_id != c.new_id) continue;
    left.id = c.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.pos;
    if (left.prev >= 0) {
      if (const Merge* p = find_merge(sym[left.prev].id, left.id))
        heap.push({p->rank, left.prev, p->new_id});
    }
    if (left.next >= 0) {
      if (const Merge* p = find_merge(left.id, sym[left.next].id))
        heap.push({p->rank, c.pos, p->new_id});
    }
  }
  symbols.clear();
  for (int32_t i = 0; i >= 0; i = sym[i].next) symbols.push_back(sym[i].id);
}

}  // namespace mere

// Added and special tokens: found in the text before pre-tokenization, leftmost-longest,
// honouring single_word / lstrip / rstrip. Reference: huggingface/tokenizers
// src/tokenizer/added_vocabulary.rs (find_matches, extract_and_normalize).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mere {

struct AddedToken {
  std::string content;
  int32_t id;
  bool special, single_word, lstrip, rstrip, normalized;
};

// A part of the text: an added token (token >= 0, an index into the token list) or plain text.
struct Segment {
  size_t begin, end;
  int32_t token;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // `patterns[k]` is what the text must contain to match `tokens[indices[k]]`.
  AddedTokenMatcher(const std::vector<AddedToken>* tokens, const std::vector<int32_t>& indices,
                    const std::vector<std::string>& patterns);

  // Covers all of `s` with segments, in order; empty text gives one empty plain segment.
  std::vector<Segment> split(std::string_view s) const;

 private:
  // Longest pattern starting at s[pos]: {length, token index}, or {0, -1}.
  std::pair<size_t, int32_t> longest_at(std::string_view s, size_t pos) const;

  const std::vector<AddedToken>* tokens_ = nullptr;
  // Trie over bytes: edge (node << 8 | byte) -> child; node 0 is the root.
  std::unordered_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> terminal_;  // per node: token index ending here, or -1
  bool starts_[256] = {};          // bytes that begin some pattern
};

}  // namespace mere

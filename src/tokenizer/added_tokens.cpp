#include "tokenizer/added_tokens.h"

#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace mere {

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>* tokens,
                                     const std::vector<int32_t>& indices,
                                     const std::vector<std::string>& patterns)
    : tokens_(tokens), terminal_(1, -1) {
  for (size_t k = 0; k < indices.size(); ++k) {
    const std::string& p = patterns[k];
    if (p.empty()) continue;
    starts_[static_cast<uint8_t>(p[0])] = true;
    int32_t node = 0;
    for (char c : p) {
      uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
      auto [it, inserted] = edges_.try_emplace(key, static_cast<int32_t>(terminal_.size()));
      if (inserted) terminal_.push_back(-1);
      node = it->second;
    }
    if (terminal_[node] < 0) terminal_[node] = indices[k];  // the first of equal patterns wins
  }
}

std::pair<size_t, int32_t> AddedTokenMatcher::longest_at(std::string_view s, size_t pos) const {
  std::pair<size_t, int32_t> best{0, -1};
  int32_t node = 0;
  for (size_t i = pos; i < s.size(); ++i) {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(s[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) best = {i + 1 - pos, terminal_[node]};
  }
  return best;
}

namespace {

// Rust regex's Unicode \w at the end / start of a string (single_word boundaries).
bool ends_with_word(std::string_view s) {
  static const Regex re("[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200c}\\x{200d}]$");
  return !s.empty() && re.matches_anywhere(s);
}

bool starts_with_word(std::string_view s) {
  static const Regex re("^[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200c}\\x{200d}]");
  return !s.empty() && re.matches_anywhere(s);
}

// Start of the whitespace run that ends s.
size_t trailing_space_start(std::string_view s) {
  size_t start = s.size();
  size_t i = 0;
  while (i < s.size()) {
    size_t begin = i;
    char32_t cp = unicode::next_code_point(s, i);
    if (!unicode::is_whitespace(cp))
      start = s.size();
    else if (start == s.size())
      start = begin;
  }
  return start;
}

// Length of the whitespace run that starts s.
size_t leading_space_length(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t next = i;
    if (!unicode::is_whitespace(unicode::next_code_point(s, next))) break;
    i = next;
  }
  return i;
}

}  // namespace

std::vector<Segment> AddedTokenMatcher::split(std::string_view s) const {
  std::vector<Segment> out;
  size_t last = 0;  // end of the previous added token
  size_t pos = 0;
  while (pos < s.size() && tokens_ != nullptr && !edges_.empty()) {
    if (!starts_[static_cast<uint8_t>(s[pos])]) {
      ++pos;
      continue;
    }
    auto [length, index] = longest_at(s, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + length;
    pos = end;  // matching resumes after this match even when it is discarded
    const AddedToken& token = (*tokens_)[index];
    if (token.single_word) {
      bool space_before = begin == 0 || !ends_with_word(s.substr(0, begin));
      bool space_after = end == s.size() || !starts_with_word(s.substr(end));
      if (!space_before || !space_after) continue;
    }
    if (token.lstrip) begin = std::max(trailing_space_start(s.substr(0, begin)), last);
    if (token.rstrip) end += leading_space_length(s.substr(end));
    if (begin > last) out.push_back({last, begin, -1});
    out.push_back({begin, end, index});
    last = end;
    pos = end;
  }
  if (last < s.size() || out.empty()) out.push_back({last, s.size(), -1});
  return out;
}

}  // namespace mere

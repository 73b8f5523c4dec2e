// PCRE2 (UTF + UCP, JIT) behind the small interface the tokenizer needs: all non-overlapping
// matches in a string, as Oniguruma's find_iter in Hugging Face tokenizers yields them.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mere {

class Regex {
 public:
  // `pattern` is in the Oniguruma dialect of tokenizer.json; see translate_pattern().
  explicit Regex(const std::string& pattern);
  // A pattern matching `literal` exactly.
  static Regex literal(std::string_view literal);

  // [start, end) byte ranges of the matches, left to right. `s` must be valid UTF-8.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;
  bool matches_anywhere(std::string_view s) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::string pattern_;
  std::shared_ptr<const Code> code_;
};

// Rewrites the Oniguruma-isms PCRE2 reads differently: \s and \S become explicit classes of
// the White_Space property (PCRE2's UCP \s also matches U+180E, Oniguruma's does not).
std::string translate_pattern(const std::string& pattern);

}  // namespace mere

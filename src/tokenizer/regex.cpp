#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace mere {

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

constexpr const char* kWhitespaceClass =
    "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

}  // namespace

std::string translate_pattern(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char e = pattern[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhitespaceClass) : fmt::format("[{}]", kWhitespaceClass);
      } else if (e == 'S') {
        MERE_CHECK(!in_class, "regex '{}': \\S inside a character class is not supported", pattern);
        out += fmt::format("[^{}]", kWhitespaceClass);
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];  // literal ]
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      size_t end = pattern.find(":]", i + 2);  // POSIX class such as [:alpha:]
      MERE_CHECK(end != std::string::npos, "regex '{}': unterminated POSIX class", pattern);
      out.append(pattern, i, end + 2 - i);
      i = end + 1;
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
  std::string translated = translate_pattern(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail("regex '{}' does not compile at offset {}: {}", pattern, offset,
         reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT, pcre2_match interprets
  auto owned = std::make_shared<Code>();
  owned->code = code;
  code_ = std::move(owned);
}

Regex Regex::literal(std::string_view literal) {
  std::string escaped;
  for (char c : literal) {
    bool plain = static_cast<uint8_t>(c) >= 0x80 || (c >= '0' && c <= '9') ||
                 (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (!plain) escaped += '\\';
    escaped += c;
  }
  return Regex(escaped);
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view s) const {
  std::vector<std::pair<size_t, size_t>> matches;
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t start = 0;
  while (start <= s.size()) {
    // The caller validated the UTF-8 once; checking it on every call would be quadratic.
    int rc = pcre2_match(code_->code, subject, s.size(), start, PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(data);
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      fail("regex '{}': matching failed: {}", pattern_, reinterpret_cast<const char*>(message));
    }
    PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    size_t begin = ovector[0], end = ovector[1];
    if (end == begin) {
      // An empty match: Oniguruma moves on by one character and keeps no piece for it.
      if (begin >= s.size()) break;
      size_t next = begin;
      unicode::next_code_point(s, next);
      start = next;
      continue;
    }
    matches.emplace_back(begin, end);
    start = end;
  }
  pcre2_match_data_free(data);
  return matches;
}

bool Regex::matches_anywhere(std::string_view s) const {
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0,
                       PCRE2_NO_UTF_CHECK, data, nullptr);
  pcre2_match_data_free(data);
  return rc >= 0;
}

}  // namespace mere

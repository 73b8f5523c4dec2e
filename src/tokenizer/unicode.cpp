#include "tokenizer/unicode.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <array>
#include <vector>

#include "core/error.h"

namespace mere::unicode {

int utf8_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  if (lead >= 0xE0) return lead <= 0xEF ? 3 : 1;
  if (lead >= 0xC2) return 2;
  return 1;
}

char32_t next_code_point(std::string_view s, size_t& i) {
  auto b = static_cast<uint8_t>(s[i]);
  int n = utf8_length(b);
  if (n == 1 || i + n > s.size()) {
    ++i;
    return b;
  }
  char32_t cp = b & (0x7F >> n);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

// Bytes of the longest valid prefix of a UTF-8 sequence at s[i], and whether it is complete.
// A result of {0, false} means s[i] cannot start a sequence (Unicode "maximal subpart" rule).
struct SequenceCheck {
  size_t valid_bytes;
  bool complete;
};

SequenceCheck check_sequence(std::string_view s, size_t i) {
  auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) return {1, true};
  int n = utf8_length(b);
  if (n == 1) return {0, false};
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b == 0xE0) lo = 0xA0;
  if (b == 0xED) hi = 0x9F;
  if (b == 0xF0) lo = 0x90;
  if (b == 0xF4) hi = 0x8F;
  size_t k = 1;
  for (; k < static_cast<size_t>(n); ++k) {
    if (i + k >= s.size()) return {k, false};
    auto c = static_cast<uint8_t>(s[i + k]);
    if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return {k, false};
  }
  return {k, true};
}

}  // namespace

std::optional<size_t> find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    SequenceCheck c = check_sequence(s, i);
    if (!c.complete) return i;
    i += c.valid_bytes;
  }
  return std::nullopt;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    if (static_cast<uint8_t>(bytes[i]) < 0x80) {
      out += bytes[i++];
      continue;
    }
    SequenceCheck c = check_sequence(bytes, i);
    if (c.complete) {
      out.append(bytes.substr(i, c.valid_bytes));
      i += c.valid_bytes;
    } else {
      out += "\xEF\xBF\xBD";
      i += c.valid_bytes == 0 ? 1 : c.valid_bytes;
    }
  }
  return out;
}

bool is_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::string normalize(std::string_view s, NormalForm form) {
  bool ascii = true;
  for (char c : s) ascii &= static_cast<uint8_t>(c) < 0x80;
  if (ascii) return std::string(s);  // every normal form leaves ASCII unchanged

  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* normalizer = nullptr;
  switch (form) {
    case NormalForm::nfc:  normalizer = unorm2_getNFCInstance(&status); break;
    case NormalForm::nfd:  normalizer = unorm2_getNFDInstance(&status); break;
    case NormalForm::nfkc: normalizer = unorm2_getNFKCInstance(&status); break;
    case NormalForm::nfkd: normalizer = unorm2_getNFKDInstance(&status); break;
  }
  MERE_CHECK(U_SUCCESS(status), "unicode normalization: ICU has no normalizer: {}",
             u_errorName(status));

  int32_t len16 = 0;
  u_strFromUTF8(nullptr, 0, &len16, s.data(), static_cast<int32_t>(s.size()), &status);
  status = U_ZERO_ERROR;  // preflighting reports U_BUFFER_OVERFLOW_ERROR
  std::vector<UChar> in(len16 + 1);
  u_strFromUTF8(in.data(), len16 + 1, nullptr, s.data(), static_cast<int32_t>(s.size()), &status);
  MERE_CHECK(U_SUCCESS(status), "unicode normalization: bad UTF-8: {}", u_errorName(status));

  // Decompositions grow text by at most a factor of 3 per code unit in NFC/NFD, 18 for NFKx.
  std::vector<UChar> out(static_cast<size_t>(len16) * 4 + 16);
  int32_t out_len = unorm2_normalize(normalizer, in.data(), len16, out.data(),
                                     static_cast<int32_t>(out.size()), &status);
  if (status == U_BUFFER_OVERFLOW_ERROR) {
    status = U_ZERO_ERROR;
    out.resize(out_len + 1);
    out_len = unorm2_normalize(normalizer, in.data(), len16, out.data(),
                               static_cast<int32_t>(out.size()), &status);
  }
  MERE_CHECK(U_SUCCESS(status), "unicode normalization failed: {}", u_errorName(status));

  int32_t len8 = 0;
  u_strToUTF8(nullptr, 0, &len8, out.data(), out_len, &status);
  status = U_ZERO_ERROR;
  std::string result(len8, '\0');
  u_strToUTF8(result.data(), len8, nullptr, out.data(), out_len, &status);
  MERE_CHECK(U_SUCCESS(status) || status == U_STRING_NOT_TERMINATED_WARNING,
             "unicode normalization: cannot write UTF-8: {}", u_errorName(status));
  return result;
}

namespace {

struct ByteLevelAlphabet {
  std::array<std::string, 256> chars;
  std::array<int16_t, 512> bytes;  // indexed by code point; every stand-in is below U+0200

  ByteLevelAlphabet() {
    bytes.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      char32_t cp = printable ? b : next++;
      append_utf8(chars[b], cp);
      bytes[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelAlphabet& alphabet() {
  static const ByteLevelAlphabet a;
  return a;
}

}  // namespace

const std::string& byte_to_chars(uint8_t b) { return alphabet().chars[b]; }

int char_to_byte(char32_t cp) { return cp < 512 ? alphabet().bytes[cp] : -1; }

}  // namespace mere::unicode

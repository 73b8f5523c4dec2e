// UTF-8 helpers for the tokenizer: decoding code points, validation, Rust-compatible lossy
// conversion, Unicode normalization forms (ICU) and the GPT-2 byte-level alphabet.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mere::unicode {

// Length in bytes of the UTF-8 sequence starting with `lead` (1 for a stray byte).
int utf8_length(uint8_t lead);

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i past it.
char32_t next_code_point(std::string_view s, size_t& i);

void append_utf8(std::string& out, char32_t cp);

// Byte offset of the first invalid UTF-8 sequence, or nullopt when s is valid.
std::optional<size_t> find_invalid_utf8(std::string_view s);

// Valid UTF-8, replacing each maximal invalid subsequence by U+FFFD, exactly as Rust's
// String::from_utf8_lossy does (Hugging Face decoders rely on it).
std::string utf8_lossy(std::string_view bytes);

// White_Space property: what Oniguruma's and Rust's \s match.
bool is_whitespace(char32_t cp);

enum class NormalForm { nfc, nfd, nfkc, nfkd };
std::string normalize(std::string_view s, NormalForm form);

// GPT-2 byte-level alphabet: every byte has a printable stand-in character.
const std::string& byte_to_chars(uint8_t b);
// The byte that code point `cp` stands for, or -1 when cp is not in the alphabet.
int char_to_byte(char32_t cp);

}  // namespace mere::unicode

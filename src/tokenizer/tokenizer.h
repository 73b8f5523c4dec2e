// Hugging Face tokenizer.json, byte-exact with the `tokenizers` library for the BPE
// tokenizers of Llama 2/3, Qwen3, DeepSeek V3, Gemma 3 and gpt-oss:
//   added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor (encode)
//   ids -> tokens -> decoder chain (decode)
// Reference: huggingface/tokenizers src/tokenizer/mod.rs (encode_single_sequence, decode).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mere {

class Tokenizer {
 public:
  // A directory holding tokenizer.json (and tokenizer_config.json, read for the bos/eos
  // names when present), or the tokenizer.json file itself. Throws mere::Error naming the
  // file for anything malformed or unsupported.
  static Tokenizer load(const std::filesystem::path& dir_or_file);
  // From the text of a tokenizer.json; `name` is used in error messages.
  static Tokenizer from_json(std::string_view json, const std::string& name = "tokenizer.json");

  // `text` must be valid UTF-8. add_special_tokens adds what the post-processor adds (BOS...).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Ids without a token are dropped, as tokenizers does (a model's padded vocab rows).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  int32_t vocab_size() const;  // including added tokens
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // throws for an id with no token
  bool is_special(int32_t id) const;
  std::optional<int32_t> bos_id() const;  // tokenizer_config.json bos_token, when present
  std::optional<int32_t> eos_id() const;  // tokenizer_config.json eos_token, when present

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;  // immutable: copies share it, threads may encode at once
};

// Incremental decoding of generated ids: push() returns the text that became final, never a
// partial UTF-8 sequence (bytes of a character split over byte-level or <0xNN> tokens wait
// for the rest). The concatenation of all push() results and flush() equals decode(ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string push(int32_t id);
  std::string flush();  // what is still held back (incomplete characters as U+FFFD); resets

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;  // context already emitted, then ids not yet emitted
  size_t emitted_ = 0;        // ids_[0, emitted_) are context
  std::string emitted_text_;  // decode(ids_[0, emitted_))
};

}  // namespace mere

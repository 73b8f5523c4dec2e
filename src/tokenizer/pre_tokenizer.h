// Pre-tokenizers of tokenizer.json: Split, ByteLevel, Digits, Metaspace, Whitespace,
// WhitespaceSplit, Sequence. Reference: huggingface/tokenizers src/pre_tokenizers.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace mere {

// A piece of (normalized) text on its way to the model.
struct Piece {
  std::string text;
  bool at_start;  // begins at offset 0 of the original text (Metaspace's prepend_scheme "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits and/or rewrites the pieces in place; empty pieces are dropped.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j);

}  // namespace mere

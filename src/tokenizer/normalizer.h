// Normalizers of tokenizer.json: NFC/NFD/NFKC/NFKD, Replace, Prepend, Sequence.
// Reference: huggingface/tokenizers src/normalizers.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace mere {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string s) const = 0;
};

// Builds the normalizer described by `j` (not null); unknown types are an error naming them.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j);

}  // namespace mere

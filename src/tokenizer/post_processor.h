// Post-processors of tokenizer.json, for a single sequence with add_special_tokens:
// TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel (adds nothing), Sequence.
// Reference: huggingface/tokenizers src/processors.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace mere {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Adds the special tokens around the ids of one encoded sequence.
  virtual void process(std::vector<int32_t>& ids) const = 0;
};

std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j);

}  // namespace mere

#include "chat/turn_stops.h"

#include <algorithm>
#include <string_view>

namespace mere {

std::vector<int32_t> chat_stop_ids(const Tokenizer& tokenizer, const std::vector<int32_t>& eos_ids) {
  std::vector<int32_t> ids = eos_ids;
  if (tokenizer.eos_id()) ids.push_back(*tokenizer.eos_id());
  // ChatML (Qwen), Llama 3, Phi-3, Gemma, DeepSeek, gpt-oss. Harmony (gpt-oss) ends
  // every message with <|end|>, its reasoning included, and the answer at <|return|>.
  const bool harmony = tokenizer.token_to_id("<|channel|>").has_value();
  for (std::string_view token : {"<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<｜end▁of▁sentence｜>",
                                 "<|end▁of▁sentence|>", "<|return|>"}) {
    if (harmony && token == "<|end|>") continue;
    if (auto id = tokenizer.token_to_id(token)) ids.push_back(*id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace mere

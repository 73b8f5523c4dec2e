// Where a chat answer ends: the model's EOS tokens and the end-of-turn token of its
// chat template (<|im_end|>, <|eot_id|>, ...), whichever the model writes first.
#pragma once

#include <cstdint>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace mere {

// eos_ids (generation_config.json) ∪ the tokenizer's eos token ∪ the end-of-turn
// tokens of the common templates that this vocabulary has; sorted, no repeats.
std::vector<int32_t> chat_stop_ids(const Tokenizer& tokenizer, const std::vector<int32_t>& eos_ids);

}  // namespace mere

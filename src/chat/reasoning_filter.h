// Reasoning text (<think> ... </think>) in a streamed answer: hidden from the
// output for `mere text chat --reasoning hide`, and dropped from the history the
// way transformers' chat templates drop it from earlier assistant turns.
#pragma once

#include <string>
#include <string_view>

namespace mere {

class ReasoningFilter {
 public:
  // starts_inside: the prompt already opened the block (a generation prompt ending
  // in "<think>\n"), so the answer begins with reasoning and only closes it.
  explicit ReasoningFilter(bool starts_inside = false) : inside_(starts_inside) {}

  // The answer text that is now final, reasoning removed, along with the newlines
  // that follow a closing tag. A tag split across pushes is held back until whole.
  std::string push(std::string_view text);
  // What was held back; reasoning never closed is dropped.
  std::string finish();
  bool is_inside() const { return inside_; }

 private:
  std::string pending_;
  bool inside_;
  bool skip_newlines_ = false;
};

// The reply as transformers' templates keep it in history (Qwen3: the text after the
// last </think>, leading newlines dropped); a reply without </think> is unchanged.
std::string strip_reasoning(std::string_view reply);

// True when a rendered prompt ends inside an opened <think> block.
bool ends_inside_reasoning(std::string_view prompt);

}  // namespace mere

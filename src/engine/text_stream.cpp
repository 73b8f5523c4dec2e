#include "engine/text_stream.h"

#include <algorithm>

namespace mere {

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop_strings)
    : decoder_(tokenizer, /*skip_special_tokens=*/true), stops_(std::move(stop_strings)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string TextStream::push(int32_t id) {
  if (stopped_) return "";
  pending_ += decoder_.push(id);
  size_t stop_at = std::string::npos;
  for (const auto& s : stops_) stop_at = std::min(stop_at, pending_.find(s));
  if (stop_at != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, stop_at);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that is a prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n)
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string TextStream::finish() {
  if (stopped_) return "";
  std::string out = pending_ + decoder_.flush();
  pending_.clear();
  return out;
}

}  // namespace mere

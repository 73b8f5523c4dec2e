#include "chat/reasoning_filter.h"

#include <algorithm>

namespace mere {
namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";

// Length of the longest tail of `s` that is a proper prefix of `tag`.
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

std::string ReasoningFilter::push(std::string_view text) {
  pending_ += text;
  std::string out;
  auto emit = [&](std::string_view s) {
    if (skip_newlines_) {
      size_t first = s.find_first_not_of('\n');
      s = first == std::string_view::npos ? std::string_view() : s.substr(first);
      if (!s.empty()) skip_newlines_ = false;
    }
    out += s;
  };
  for (;;) {
    std::string_view p = pending_;
    std::string_view tag = inside_ ? kClose : kOpen;
    size_t at = p.find(tag);
    if (at != std::string_view::npos) {
      if (!inside_) emit(p.substr(0, at));
      pending_.erase(0, at + tag.size());
      inside_ = !inside_;
      if (!inside_) skip_newlines_ = true;
      continue;
    }
    size_t hold = partial_tag(p, tag);
    if (!inside_) emit(p.substr(0, p.size() - hold));
    pending_.erase(0, p.size() - hold);
    return out;
  }
}

std::string ReasoningFilter::finish() {
  std::string out = inside_ ? "" : pending_;
  pending_.clear();
  if (skip_newlines_) out.erase(0, std::min(out.size(), out.find_first_not_of('\n')));
  return out;
}

std::string strip_reasoning(std::string_view reply) {
  size_t at = reply.rfind(kClose);
  if (at == std::string_view::npos) return std::string(reply);
  std::string_view rest = reply.substr(at + kClose.size());
  size_t first = rest.find_first_not_of('\n');
  return first == std::string_view::npos ? "" : std::string(rest.substr(first));
}

bool ends_inside_reasoning(std::string_view prompt) {
  size_t end = prompt.find_last_not_of(" \n");
  if (end == std::string_view::npos) return false;
  std::string_view trimmed = prompt.substr(0, end + 1);
  return trimmed.size() >= kOpen.size() && trimmed.substr(trimmed.size() - kOpen.size()) == kOpen;
}

}  // namespace mere

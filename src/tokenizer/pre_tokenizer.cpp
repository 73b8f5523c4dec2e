#include "tokenizer/pre_tokenizer.h"

#include <algorithm>

#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace mere {

namespace {

using tokenizer_json::Json;

// What happens to the matched delimiters (tokenizers' SplitDelimiterBehavior).
enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

Behavior parse_behavior(const std::string& name, std::string_view where) {
  if (name == "Removed") return Behavior::removed;
  if (name == "Isolated") return Behavior::isolated;
  if (name == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (name == "MergedWithNext") return Behavior::merged_with_next;
  if (name == "Contiguous") return Behavior::contiguous;
  fail("{}: behavior '{}' is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, "
       "Contiguous",
       where, name);
}

struct Span {
  size_t begin, end;
  bool is_match;
};

// Cuts `piece` at the `matches` (sorted, non-overlapping) as `behavior` says and appends the
// non-empty parts to `out`.
void split_piece(const Piece& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                 Behavior behavior, bool invert, std::vector<Piece>& out) {
  const std::string& s = piece.text;
  std::vector<Span> spans;
  size_t last = 0;
  for (auto [begin, end] : matches) {
    if (begin > last) spans.push_back({last, begin, invert});
    spans.push_back({begin, end, !invert});
    last = end;
  }
  if (last < s.size()) spans.push_back({last, s.size(), invert});

  std::vector<Span> parts;  // is_match no longer used past this point
  switch (behavior) {
    case Behavior::removed:
      for (const Span& sp : spans)
        if (!sp.is_match) parts.push_back(sp);
      break;
    case Behavior::isolated:
      parts = spans;
      break;
    case Behavior::merged_with_previous: {
      bool previous_match = false;
      for (const Span& sp : spans) {
        if (sp.is_match && !previous_match && !parts.empty())
          parts.back().end = sp.end;
        else
          parts.push_back(sp);
        previous_match = sp.is_match;
      }
      break;
    }
    case Behavior::merged_with_next: {
      bool previous_match = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& sp = spans[k];
        if (sp.is_match && !previous_match && !parts.empty())
          parts.back().begin = sp.begin;
        else
          parts.push_back(sp);
        previous_match = sp.is_match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
    }
    case Behavior::contiguous:
      for (const Span& sp : spans) {
        if (!parts.empty() && parts.back().is_match == sp.is_match)
          parts.back().end = sp.end;
        else
          parts.push_back(sp);
      }
      break;
  }
  for (const Span& sp : parts) {
    if (sp.end > sp.begin)
      out.push_back({s.substr(sp.begin, sp.end - sp.begin), piece.at_start && sp.begin == 0});
  }
}

// Applies `split` to every piece.
template <typename F>
void split_each(std::vector<Piece>& pieces, F&& split) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (const Piece& p : pieces) split(p, out);
  pieces = std::move(out);
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(const tokenizer_json::PatternSpec& pattern, Behavior behavior, bool invert)
      : regex_(pattern.is_regex ? Regex(pattern.text) : Regex::literal(pattern.text)),
        behavior_(behavior),
        invert_(invert) {}

  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_each(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      split_piece(p, regex_.find_all(p.text), behavior_, invert_, out);
    });
  }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

// Maps every byte to its printable stand-in; optionally splits with the GPT-2 regex first.
class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}

  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_) {
      for (Piece& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, 1, ' ');
    }
    if (use_regex_) {
      static const Regex gpt2(
          "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
      split_each(pieces, [&](const Piece& p, std::vector<Piece>& out) {
        split_piece(p, gpt2.find_all(p.text), Behavior::isolated, false, out);
      });
    }
    for (Piece& p : pieces) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (char c : p.text) mapped += unicode::byte_to_chars(static_cast<uint8_t>(c));
      p.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  bool use_regex_;
};

class DigitsPreTokenizer : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual)
      : regex_(individual ? "\\p{N}" : "\\p{N}+") {}

  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_each(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      split_piece(p, regex_.find_all(p.text), Behavior::isolated, false, out);
    });
  }

 private:
  Regex regex_;
};

// Spaces become the replacement character (U+2581 "▁"), prepended per prepend_scheme, and
// the text is split before each replacement character.
class MetaspacePreTokenizer : public PreTokenizer {
 public:
  enum class Prepend { always, first, never };

  MetaspacePreTokenizer(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)),
        prepend_(prepend),
        split_(split),
        regex_(Regex::literal(replacement_)) {}

  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (Piece& p : pieces) {
      std::string s;
      for (char c : p.text) {
        if (c == ' ')
          s += replacement_;
        else
          s += c;
      }
      bool starts = s.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (prepend_ == Prepend::always || (prepend_ == Prepend::first && p.at_start)))
        s.insert(0, replacement_);
      p.text = std::move(s);
    }
    if (split_) {
      split_each(pieces, [&](const Piece& p, std::vector<Piece>& out) {
        split_piece(p, regex_.find_all(p.text), Behavior::merged_with_next, false, out);
      });
    }
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
  Regex regex_;
};

// tokenizers' \w+|[^\w\s]+, with Rust regex's Unicode \w (Alphabetic, M, Nd, Pc, joiners)
// spelled out, since PCRE2's \w differs.
std::string whitespace_pattern() {
  const std::string word = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200c}\\x{200d}";
  return "[" + word + "]+|[^" + word + "\\s]+";
}

class WhitespacePreTokenizer : public PreTokenizer {
 public:
  WhitespacePreTokenizer() : regex_(whitespace_pattern()) {}

  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_each(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      split_piece(p, regex_.find_all(p.text), Behavior::removed, true, out);
    });
  }

 private:
  Regex regex_;
};

class WhitespaceSplitPreTokenizer : public PreTokenizer {
 public:
  WhitespaceSplitPreTokenizer() : regex_("\\s+") {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_each(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      split_piece(p, regex_.find_all(p.text), Behavior::removed, false, out);
    });
  }

 private:
  Regex regex_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& step : steps_) step->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

MetaspacePreTokenizer::Prepend parse_prepend(const Json& j, std::string_view where) {
  auto it = j.find("prepend_scheme");
  if (it == j.end() || it->is_null()) {  // older files: add_prefix_space
    return tokenizer_json::get_or<bool>(j, "add_prefix_space", true, where)
               ? MetaspacePreTokenizer::Prepend::always
               : MetaspacePreTokenizer::Prepend::never;
  }
  std::string scheme = tokenizer_json::get<std::string>(j, "prepend_scheme", where);
  if (scheme == "always") return MetaspacePreTokenizer::Prepend::always;
  if (scheme == "first") return MetaspacePreTokenizer::Prepend::first;
  if (scheme == "never") return MetaspacePreTokenizer::Prepend::never;
  fail("{}: prepend_scheme '{}' is not one of always, first, never", where, scheme);
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j) {
  std::string type = tokenizer_json::type_of(j, "pre_tokenizer");
  const std::string where = "pre_tokenizer " + type;
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(
        tokenizer_json::pattern_of(j, where),
        parse_behavior(tokenizer_json::get<std::string>(j, "behavior", where), where),
        tokenizer_json::get_or<bool>(j, "invert", false, where));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(
        tokenizer_json::get_or<bool>(j, "add_prefix_space", true, where),
        tokenizer_json::get_or<bool>(j, "use_regex", true, where));
  }
  if (type == "Digits") {
    return std::make_unique<DigitsPreTokenizer>(
        tokenizer_json::get_or<bool>(j, "individual_digits", false, where));
  }
  if (type == "Metaspace") {
    return std::make_unique<MetaspacePreTokenizer>(
        tokenizer_json::get_or<std::string>(j, "replacement", "\xE2\x96\x81", where),
        parse_prepend(j, where), tokenizer_json::get_or<bool>(j, "split", true, where));
  }
  if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>();
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplitPreTokenizer>();
  if (type == "Sequence") {
    tokenizer_json::SequenceLevel level(where);
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const Json& step : tokenizer_json::require(j, "pretokenizers", where))
      steps.push_back(make_pre_tokenizer(step));
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  fail("pre_tokenizer type '{}' is not supported (supported: Split, ByteLevel, Digits, Metaspace, "
       "Whitespace, WhitespaceSplit, Sequence)",
       type);
}

}  // namespace mere

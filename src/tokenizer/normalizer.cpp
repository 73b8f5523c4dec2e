#include "tokenizer/normalizer.h"

#include <optional>
#include <vector>

#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace mere {

namespace {

using tokenizer_json::Json;

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(unicode::NormalForm form) : form_(form) {}
  std::string normalize(std::string s) const override { return unicode::normalize(s, form_); }

 private:
  unicode::NormalForm form_;
};

// Replaces every match of a literal or a regex.
class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(const tokenizer_json::PatternSpec& pattern, std::string content)
      : content_(std::move(content)) {
    if (pattern.is_regex)
      regex_.emplace(pattern.text);
    else
      literal_ = pattern.text;
  }

  std::string normalize(std::string s) const override {
    std::string out;
    size_t last = 0;
    if (regex_) {
      for (auto [begin, end] : regex_->find_all(s)) {
        out.append(s, last, begin - last);
        out += content_;
        last = end;
      }
    } else {
      if (literal_.empty()) return s;
      for (size_t pos; (pos = s.find(literal_, last)) != std::string::npos;) {
        out.append(s, last, pos - last);
        out += content_;
        last = pos + literal_.size();
      }
    }
    out.append(s, last, std::string::npos);
    return out;
  }

 private:
  std::optional<Regex> regex_;
  std::string literal_;
  std::string content_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string s) const override {
    return s.empty() ? s : prefix_ + s;  // tokenizers prepends to non-empty text only
  }

 private:
  std::string prefix_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  std::string normalize(std::string s) const override {
    for (const auto& step : steps_) s = step->normalize(std::move(s));
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const Json& j) {
  const std::string where = "normalizer";
  std::string type = tokenizer_json::type_of(j, where);
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::nfc);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::nfd);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::nfkc);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::nfkd);
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(
        tokenizer_json::pattern_of(j, "normalizer Replace"),
        tokenizer_json::get<std::string>(j, "content", "normalizer Replace"));
  }
  if (type == "Prepend") {
    return std::make_unique<PrependNormalizer>(
        tokenizer_json::get<std::string>(j, "prepend", "normalizer Prepend"));
  }
  if (type == "Sequence") {
    tokenizer_json::SequenceLevel level(where);
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const Json& step : tokenizer_json::require(j, "normalizers", "normalizer Sequence"))
      steps.push_back(make_normalizer(step));
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  fail("normalizer type '{}' is not supported (supported: NFC, NFD, NFKC, NFKD, Replace, "
       "Prepend, Sequence)",
       type);
}

}  // namespace mere

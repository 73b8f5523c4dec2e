#include "tokenizer/decoder.h"

#include <optional>

#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace mere {

namespace {

using tokenizer_json::Json;

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Maps byte-level stand-ins back to bytes; a token with any other character (an added token)
// keeps its own bytes. All tokens become one string, invalid UTF-8 replaced.
class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    std::string token_bytes;
    for (const std::string& t : tokens) {
      token_bytes.clear();
      bool mapped = true;
      for (size_t i = 0; i < t.size() && mapped;) {
        int b = unicode::char_to_byte(unicode::next_code_point(t, i));
        if (b < 0)
          mapped = false;
        else
          token_bytes += static_cast<char>(b);
      }
      bytes += mapped ? token_bytes : t;
    }
    tokens.assign(1, unicode::utf8_lossy(bytes));
  }
};

// The replacement character becomes a space, except in the first token where the
// pre-tokenizer prepended it.
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}

  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string out;
      const std::string& t = tokens[k];
      for (size_t i = 0; i < t.size();) {
        if (!replacement_.empty() && t.compare(i, replacement_.size(), replacement_) == 0) {
          if (!(k == 0 && strip_first_)) out += ' ';
          i += replacement_.size();
        } else {
          out += t[i++];
        }
      }
      tokens[k] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

// Runs of <0xNN> tokens become the text they encode; an invalid run becomes one U+FFFD per byte.
class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_len = 0;
    auto flush = [&] {
      if (run_len == 0) return;
      if (unicode::find_invalid_utf8(run)) {
        for (size_t i = 0; i < run_len; ++i) out.emplace_back(kReplacementChar);
      } else {
        out.push_back(run);
      }
      run.clear();
      run_len = 0;
    };
    for (std::string& t : tokens) {
      if (auto b = parse_byte(t)) {
        run += static_cast<char>(*b);
        ++run_len;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }

 private:
  static std::optional<uint8_t> parse_byte(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return std::nullopt;
    int value = 0;
    for (int i = 3; i < 5; ++i) {
      char c = t[i];
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0) return std::nullopt;
      value = value * 16 + d;
    }
    return static_cast<uint8_t>(value);
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters of every token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}

  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::vector<std::pair<size_t, size_t>> chars;  // byte offset, length
      for (size_t i = 0; i < t.size();) {
        size_t begin = i;
        unicode::next_code_point(t, i);
        chars.emplace_back(begin, i - begin);
      }
      auto is_content = [&](size_t k) {
        return t.compare(chars[k].first, chars[k].second, content_) == 0;
      };
      size_t start_cut = 0;
      for (size_t k = 0; k < std::min(start_, chars.size()) && is_content(k); ++k) start_cut = k + 1;
      size_t stop_cut = chars.size();
      for (size_t k = 0; k < std::min(stop_, chars.size() - start_cut); ++k) {
        size_t index = chars.size() - k - 1;
        if (!is_content(index)) break;
        stop_cut = index;
      }
      size_t begin = start_cut < chars.size() ? chars[start_cut].first : t.size();
      size_t end = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
      t = end > begin ? t.substr(begin, end - begin) : std::string();
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(const tokenizer_json::PatternSpec& pattern, std::string content)
      : regex_(pattern.is_regex ? Regex(pattern.text) : Regex::literal(pattern.text)),
        content_(std::move(content)) {}

  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::string out;
      size_t last = 0;
      for (auto [begin, end] : regex_.find_all(t)) {
        out.append(t, last, begin - last);
        out += content_;
        last = end;
      }
      out.append(t, last, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  Regex regex_;
  std::string content_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const Json& j) {
  std::string type = tokenizer_json::type_of(j, "decoder");
  const std::string where = "decoder " + type;
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    bool strip_first = true;
    auto scheme = j.find("prepend_scheme");
    if (scheme != j.end() && scheme->is_string())
      strip_first = scheme->get<std::string>() != "never";
    else
      strip_first = tokenizer_json::get_or<bool>(j, "add_prefix_space", true, where);
    return std::make_unique<MetaspaceDecoder>(
        tokenizer_json::get_or<std::string>(j, "replacement", "\xE2\x96\x81", where), strip_first);
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(tokenizer_json::get<std::string>(j, "content", where),
                                          tokenizer_json::get<size_t>(j, "start", where),
                                          tokenizer_json::get<size_t>(j, "stop", where));
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(tokenizer_json::pattern_of(j, where),
                                            tokenizer_json::get<std::string>(j, "content", where));
  }
  if (type == "Sequence") {
    tokenizer_json::SequenceLevel level(where);
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const Json& step : tokenizer_json::require(j, "decoders", where))
      steps.push_back(make_decoder(step));
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  fail("decoder type '{}' is not supported (supported: ByteLevel, Metaspace, ByteFallback, Fuse, "
       "Strip, Replace, Sequence)",
       type);
}

}  // namespace mere

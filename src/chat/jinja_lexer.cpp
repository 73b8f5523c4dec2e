#include "chat/jinja_lexer.h"

#include <algorithm>

#include "chat/jinja_value.h"
#include "core/error.h"

namespace mere::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// Python's str.isspace() over a UTF-8 tail: lstrip_blocks only strips a line made of whitespace.
bool all_space(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();)
    if (!is_py_space(utf8_decode(s, i))) return false;
  return true;
}

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& origin) : src_(src), origin_(origin) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0, n = src_.size();
    bool line_starting = true;
    while (pos < n) {
      size_t t = pos;
      char kind = 0;
      while ((t = src_.find('{', t)) != std::string::npos) {
        if (t + 1 < n && (src_[t + 1] == '%' || src_[t + 1] == '{' || src_[t + 1] == '#')) {
          kind = src_[t + 1];
          break;
        }
        ++t;
      }
      if (!kind) {
        push(Token::data, src_.substr(pos), pos);
        break;
      }
      char sign = t + 2 < n && (src_[t + 2] == '-' || src_[t + 2] == '+') ? src_[t + 2] : 0;
      std::string text = src_.substr(pos, t - pos);
      if (sign == '-') {
        text = py_strip(text, std::nullopt, false, true);
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks: not for {{ }}
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && all_space(std::string_view(text).substr(l_pos))) text.resize(l_pos);
      }
      if (!text.empty()) push(Token::data, text, pos);
      size_t p = t + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        size_t j = src_.find("#}", p);
        if (j == std::string::npos) fail("{} line {}: missing end of comment tag", origin_, line_of(t));
        size_t end = j + 2;
        if (j > p && src_[j - 1] == '-') {
          while (end < n && is_space(src_[end])) ++end;
        } else if (!(j > p && src_[j - 1] == '+') && end < n && src_[end] == '\n') {
          ++end;  // trim_blocks
        }
        line_starting = src_[end - 1] == '\n';
        pos = end;
        continue;
      }
      push(kind == '%' ? Token::block_begin : Token::var_begin, src_.substr(t, p - t), t);
      pos = lex_tag(p, kind == '%');
      line_starting = src_[pos - 1] == '\n';
    }
    tokens_.push_back({Token::eof, "", line_of(n)});
    return std::move(tokens_);
  }

 private:
  int line_of(size_t pos) const {
    return int(std::upper_bound(line_starts_.begin(), line_starts_.end(), pos) - line_starts_.begin());
  }
  void push(Token::Type type, std::string text, size_t pos) { tokens_.push_back({type, std::move(text), line_of(pos)}); }
  bool at(size_t p, std::string_view s) const { return src_.compare(p, s.size(), s) == 0; }

  // Tokens inside {% %} or {{ }} from p; returns the position after the closing tag.
  size_t lex_tag(size_t p, bool block) {
    size_t n = src_.size(), begin = p;
    std::string balance;
    while (true) {
      if (p >= n) fail("{} line {}: unexpected end of template inside a tag", origin_, line_of(begin));
      if (balance.empty()) {
        size_t end = 0;
        if (block && at(p, "+%}")) {
          end = p + 3;
        } else if (at(p, block ? "-%}" : "-}}")) {
          end = p + 3;
          while (end < n && is_space(src_[end])) ++end;
        } else if (at(p, block ? "%}" : "}}")) {
          end = p + 2;
          if (block && end < n && src_[end] == '\n') ++end;  // trim_blocks
        }
        if (end) {
          push(block ? Token::block_end : Token::var_end, src_.substr(p, 2), p);
          return end;
        }
      }
      char c = src_[p];
      if (is_space(c)) {
        ++p;
      } else if (is_digit(c)) {
        size_t s = p;
        while (p < n && is_digit(src_[p])) ++p;
        bool is_float = false;
        bool after_dot = s > 0 && src_[s - 1] == '.';
        if (!after_dot && p + 1 < n && src_[p] == '.' && is_digit(src_[p + 1])) {
          is_float = true;
          ++p;
          while (p < n && is_digit(src_[p])) ++p;
        }
        if (!after_dot && p < n && (src_[p] == 'e' || src_[p] == 'E')) {
          size_t q = p + 1;
          if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
          if (q < n && is_digit(src_[q])) {
            while (q < n && is_digit(src_[q])) ++q;
            p = q;
            is_float = true;
          }
        }
        push(is_float ? Token::floating : Token::integer, src_.substr(s, p - s), s);
      } else if (is_name_start(c)) {
        size_t s = p;
        while (p < n && is_name_char(src_[p])) ++p;
        push(Token::name, src_.substr(s, p - s), s);
      } else if (c == '\'' || c == '"') {
        size_t s = p++;
        std::string value;
        while (true) {
          if (p >= n) fail("{} line {}: unterminated string", origin_, line_of(s));
          if (src_[p] == c) break;
          if (src_[p] == '\\' && p + 1 < n) {
            char e = src_[p + 1];
            p += 2;
            switch (e) {
              case 'n': value += '\n'; break;
              case 't': value += '\t'; break;
              case 'r': value += '\r'; break;
              case '\\': value += '\\'; break;
              case '\'': value += '\''; break;
              case '"': value += '"'; break;
              case '0': value += '\0'; break;
              case '\n': break;
              case 'u':
              case 'x': {
                size_t digits = e == 'u' ? 4 : 2;
                uint32_t cp = uint32_t(std::stoul(src_.substr(p, digits), nullptr, 16));
                p += digits;
                value += encode_utf8(cp);
                break;
              }
              default: value += '\\'; value += e;  // Python keeps unknown escapes
            }
            continue;
          }
          value += src_[p++];
        }
        ++p;
        push(Token::string, value, s);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                     "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
        const char* op = nullptr;
        for (const char* o : kOps)
          if (at(p, o)) {
            op = o;
            break;
          }
        if (!op) fail("{} line {}: unexpected character '{}'", origin_, line_of(p), c);
        std::string s = op;
        if (s == "(" || s == "[" || s == "{") {
          balance += s == "(" ? ')' : s == "[" ? ']' : '}';
        } else if (s == ")" || s == "]" || s == "}") {
          if (balance.empty() || balance.back() != s[0]) fail("{} line {}: unexpected '{}'", origin_, line_of(p), s);
          balance.pop_back();
        }
        push(Token::op, s, p);
        p += s.size();
      }
    }
  }

  const std::string& src_;
  const std::string& origin_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex_template(const std::string& source, const std::string& origin) {
  return Lexer(source, origin).run();
}

}  // namespace mere::jinja

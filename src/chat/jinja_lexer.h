// The lexer of the Jinja subset: template text to tokens, with jinja2's whitespace rules
// (lexer.py, 3.1) for trim_blocks and lstrip_blocks, since whitespace is where renderings differ.
#pragma once

#include <string>
#include <vector>

namespace mere::jinja {

struct Token {
  enum Type { data, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };
  Type type;
  std::string text;
  int line;
};

// Tokens of `source` (newline-normalised); errors name `origin` and the line.
std::vector<Token> lex_template(const std::string& source, const std::string& origin);

}  // namespace mere::jinja

// Small helpers shared by the JSON readers in io/: how to name a value's type
// in an error message, and a parse error without nlohmann's internal prefix.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace mere::io_detail {

// "a string", "an integer", "a number", ... for "field 'x' is a string, expected ...".
inline std::string json_kind(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return "an integer";
    case nlohmann::json::value_t::number_float: return "a number";
    case nlohmann::json::value_t::array: return "a list";
    case nlohmann::json::value_t::object: return "an object";
    default: return "a binary value";
  }
}

// nlohmann's message already says "parse error at line L, column C: ..."; drop
// the "[json.exception.parse_error.101] " tag, which means nothing to a user.
inline std::string parse_error_text(const nlohmann::json::exception& e) {
  std::string s = e.what();
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find("] ");
    if (close != std::string::npos) s = s.substr(close + 2);
  }
  return s;
}

}  // namespace mere::io_detail

// Reading tokenizer.json components: typed field access with errors that name the field.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "core/error.h"

namespace mere::tokenizer_json {

using Json = nlohmann::json;

inline const Json& require(const Json& j, const char* key, std::string_view where) {
  MERE_CHECK(j.is_object(), "{}: expected an object, got {}", where, j.type_name());
  auto it = j.find(key);
  MERE_CHECK(it != j.end(), "{}: missing field '{}'", where, key);
  return *it;
}

template <typename T>
T get(const Json& j, const char* key, std::string_view where) {
  const Json& v = require(j, key, where);
  try {
    return v.get<T>();
  } catch (const Json::exception&) {
    fail("{}: field '{}' has the wrong type ({})", where, key, v.type_name());
  }
}

// The field when present and not null, else `fallback`.
template <typename T>
T get_or(const Json& j, const char* key, T fallback, std::string_view where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const Json::exception&) {
    fail("{}: field '{}' has the wrong type ({})", where, key, it->type_name());
  }
}

inline std::string type_of(const Json& j, std::string_view where) {
  return get<std::string>(j, "type", where);
}

// {"String": "..."} or {"Regex": "..."}, the pattern of Split and Replace.
struct PatternSpec {
  std::string text;
  bool is_regex;
};

inline PatternSpec pattern_of(const Json& j, std::string_view where) {
  const Json& p = require(j, "pattern", where);
  if (p.contains("String")) return {get<std::string>(p, "String", where), false};
  if (p.contains("Regex")) return {get<std::string>(p, "Regex", where), true};
  fail("{}: pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}, got {}", where, p.dump());
}

// A component's Sequence holds components, which may be Sequences. Real tokenizers nest
// two at most (and Hugging Face's JSON reader stops at 128 levels); a bound keeps a hostile
// file from exhausting the stack. Counts one level while it lives.
class SequenceLevel {
 public:
  static constexpr int kMaxDepth = 32;
  explicit SequenceLevel(std::string_view where) {
    if (++depth() > kMaxDepth) {
      --depth();
      fail("{}: Sequences nested more than {} deep", where, kMaxDepth);
    }
  }
  ~SequenceLevel() { --depth(); }
  SequenceLevel(const SequenceLevel&) = delete;
  SequenceLevel& operator=(const SequenceLevel&) = delete;

 private:
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
};

}  // namespace mere::tokenizer_json

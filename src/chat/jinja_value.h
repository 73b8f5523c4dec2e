// Values of the Jinja interpreter, with Python's semantics where templates can see them:
// truthiness, equality, str()/repr() (True, None, 1.0, ['a']), and json.dumps for tojson.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/error.h"

namespace mere::jinja {

// Bounds on what a template builds. A chat template is input like any other (it comes with
// the checkpoint); past these it is an error, never a crash or an exhausted machine. Real
// chat templates stay far inside each.
inline constexpr int kMaxValueDepth = 128;                    // lists, dicts, namespaces in one value
inline constexpr size_t kMaxStringBytes = size_t(64) << 20;  // one string, and the rendered prompt
inline constexpr size_t kMaxListItems = size_t(1) << 20;

// An error that the renderer has not yet placed at a template line (a mere::Error still,
// so that one escaping a render is reported like any bad input).
struct EvalError : Error {
  using Error::Error;
};

template <typename... Args>
[[noreturn]] void eval_fail(fmt::format_string<Args...> format, Args&&... args) {
  throw EvalError(fmt::format(format, std::forward<Args>(args)...));
}

class Value;
using List = std::vector<Value>;

// A Python dict with string keys, in insertion order (JSON input and templates only make those).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value value);
};

// Jinja's namespace(): the one mutable object (`set ns.x = ...`).
struct Namespace {
  Dict attrs;
  int depth = 1;  // 1 + the deepest value it has held (a namespace may hold itself)
  void set(const std::string& key, Value value);
};

// What a missing variable, key or attribute evaluates to. Falsy, renders as "", iterates
// as empty; anything else done with it is an error carrying `hint` (Jinja's message).
struct Undefined {
  std::string hint;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Builtin globals (namespace, raise_exception, strftime_now, range) and macros.
struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

class Value {
 public:
  // Strings, lists and dicts are immutable once built, so copies share them: a list of many
  // references to one long string costs a pointer an item, as in Python.
  using StringPtr = std::shared_ptr<const std::string>;
  using ListPtr = std::shared_ptr<const List>;
  using DictPtr = std::shared_ptr<const Dict>;
  using Data = std::variant<Undefined, std::nullptr_t, bool, int64_t, double, StringPtr, ListPtr, DictPtr,
                            std::shared_ptr<Namespace>, std::shared_ptr<Callable>>;

  Value() : data_(Undefined{}) {}
  Value(std::nullptr_t) : data_(nullptr) {}
  Value(bool b) : data_(b) {}
  Value(int64_t i) : data_(i) {}
  Value(int i) : data_(int64_t(i)) {}
  Value(double d) : data_(d) {}
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  Value(List l);
  Value(Dict d);
  Value(std::shared_ptr<Namespace> n) : data_(std::move(n)) {}
  Value(std::shared_ptr<Callable> c) : data_(std::move(c)) {}
  static Value undefined(std::string hint) { Value v; v.data_ = Undefined{std::move(hint)}; return v; }
  static Value tuple(List l) { Value v(std::move(l)); v.tuple_ = true; return v; }
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return std::holds_alternative<Undefined>(data_); }
  bool is_none() const { return std::holds_alternative<std::nullptr_t>(data_); }
  bool is_bool() const { return std::holds_alternative<bool>(data_); }
  bool is_int() const { return std::holds_alternative<int64_t>(data_); }
  bool is_float() const { return std::holds_alternative<double>(data_); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is an int
  bool is_string() const { return std::holds_alternative<StringPtr>(data_); }
  bool is_list() const { return std::holds_alternative<ListPtr>(data_); }
  bool is_dict() const { return std::holds_alternative<DictPtr>(data_); }
  bool is_namespace() const { return std::holds_alternative<std::shared_ptr<Namespace>>(data_); }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<Callable>>(data_); }
  bool is_tuple() const { return tuple_; }  // a list that Python would print as (a, b)

  const std::string& undefined_hint() const { return std::get<Undefined>(data_).hint; }
  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return is_bool() ? int64_t(as_bool()) : std::get<int64_t>(data_); }
  double as_float() const { return is_float() ? std::get<double>(data_) : double(as_int()); }
  const std::string& as_string() const { return *std::get<StringPtr>(data_); }
  const List& as_list() const { return *std::get<ListPtr>(data_); }
  const Dict& as_dict() const { return *std::get<DictPtr>(data_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(data_); }
  const Callable& as_callable() const { return *std::get<std::shared_ptr<Callable>>(data_); }

  // Python's type name, for error messages: 'str', 'int', 'NoneType', 'dict', ...
  std::string type_name() const;
  bool truthy() const;
  // Lists, dicts and namespaces nested in this value, itself included (0 for a scalar).
  int depth() const { return is_namespace() ? as_namespace().depth : depth_; }

 private:
  Data data_;
  bool tuple_ = false;
  int depth_ = 0;
};

bool py_equal(const Value& a, const Value& b);
std::string py_str(const Value& v);   // str(v); Undefined renders as ""
std::string py_repr(const Value& v);  // repr(v)
std::string py_float_repr(double d);

struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // None: one line
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
};
// json.dumps(v, ...) exactly; throws mere::Error naming the type for what JSON cannot hold.
std::string py_json_dumps(const Value& v, const JsonOptions& options);

// UTF-8 helpers: templates count and slice strings by code point, like Python.
uint32_t utf8_decode(std::string_view s, size_t& i);  // advances i past one code point
std::string encode_utf8(uint32_t cp);
std::vector<std::string> utf8_chars(std::string_view s);
size_t utf8_length(std::string_view s);
bool is_py_space(uint32_t cp);  // str.isspace()
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);

}  // namespace mere::jinja

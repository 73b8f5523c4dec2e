#include "chat/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

namespace mere::jinja {
namespace {

const std::set<std::string> kFilters = {
    "tojson", "trim",  "length", "count", "join",    "default", "d",      "items",   "first", "last",
    "map",    "select", "reject", "selectattr", "rejectattr", "upper", "lower", "capitalize", "title",
    "string", "list",  "int",    "float", "replace", "safe",    "reverse", "abs"};
const std::set<std::string> kTests = {
    "defined", "undefined", "none", "string", "mapping", "sequence", "iterable", "number", "integer",
    "float",   "boolean",   "true", "false",  "callable", "eq",      "equalto",  "ne",     "gt",
    "greaterthan", "ge",    "lt",   "lessthan", "le",   "odd",     "even",     "divisibleby", "in",
    "lower",   "upper"};

// Python's case mapping for the scripts chat text mostly uses: ASCII, Latin-1, Latin
// Extended-A, basic Greek and Cyrillic. Other letters are left as they are.
uint32_t to_upper_cp(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 32;
  if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17f) {
    bool odd_is_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    if (odd_is_lower ? (c % 2 == 0) : (c % 2 == 1)) return c - 1;
    return c;
  }
  if (c >= 0x3b1 && c <= 0x3c9) return c == 0x3c2 ? 0x3a3 : c - 32;
  if (c >= 0x430 && c <= 0x44f) return c - 32;
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  return c;
}

uint32_t to_lower_cp(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xc0 && c <= 0xde && c != 0xd7)) return c + 32;
  if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17f) {
    bool odd_is_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    if (odd_is_lower ? (c % 2 == 1) : (c % 2 == 0)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
  if (c >= 0x410 && c <= 0x42f) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  return c;
}

bool is_cased(uint32_t c) { return to_upper_cp(c) != c || to_lower_cp(c) != c || c == 0xdf; }
bool is_upper_cp(uint32_t c) { return to_lower_cp(c) != c; }
bool is_lower_cp(uint32_t c) { return to_upper_cp(c) != c || c == 0xdf; }

std::string map_case(const std::string& s, uint32_t (*f)(uint32_t)) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    uint32_t c = utf8_decode(s, i);
    if (f == to_upper_cp && c == 0xdf) out += "SS";
    else out += encode_utf8(f(c));
  }
  return out;
}

std::string py_title(const std::string& s) {  // str.title()
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    uint32_t c = utf8_decode(s, i);
    out += encode_utf8(prev_cased ? to_lower_cp(c) : to_upper_cp(c));
    prev_cased = is_cased(c);
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::string out;
  bool first = true;
  for (size_t i = 0; i < s.size();) {
    uint32_t c = utf8_decode(s, i);
    out += encode_utf8(first ? to_upper_cp(c) : to_lower_cp(c));
    first = false;
  }
  return out;
}

// Jinja's |title: each word split at whitespace, '-', or an opening bracket gets a capital first letter.
std::string jinja_title(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (size_t i = 0; i < s.size();) {
    uint32_t c = utf8_decode(s, i);
    bool sep = is_py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    out += encode_utf8(sep ? c : word_start ? to_upper_cp(c) : to_lower_cp(c));
    word_start = sep;
  }
  return out;
}

const std::string& need_string(const Value& v, const char* what) {
  require_defined(v);
  if (!v.is_string()) eval_fail("{} must be a string, not {}", what, v.type_name());
  return v.as_string();
}

int64_t need_int(const Value& v, const char* what) {
  require_defined(v);
  if (!v.is_int() && !v.is_bool()) eval_fail("{} must be an integer, not {}", what, v.type_name());
  return v.as_int();
}

// Binds call arguments to named parameters like a Python signature; absent ones stay Undefined.
std::vector<Value> bind(CallArgs& args, std::initializer_list<const char*> names, const std::string& what) {
  std::vector<Value> out(names.size());
  std::vector<const char*> ns(names);
  if (args.positional.size() > ns.size())
    eval_fail("{} takes at most {} argument(s), got {}", what, ns.size(), args.positional.size());
  for (size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
  for (auto& [k, v] : args.keyword) {
    auto it = std::find_if(ns.begin(), ns.end(), [&](const char* n) { return k == n; });
    if (it == ns.end()) eval_fail("{} got an unexpected keyword argument '{}'", what, k);
    out[size_t(it - ns.begin())] = v;
  }
  return out;
}

std::optional<std::string> opt_chars(const Value& v, const char* what) {
  if (v.is_undefined() || v.is_none()) return std::nullopt;
  return need_string(v, what);
}

std::vector<std::string> py_split(const std::string& s, const Value& sep_v, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep_v.is_undefined() || sep_v.is_none()) {
    std::vector<std::string> cs = utf8_chars(s);
    size_t i = 0, n = cs.size();
    auto space = [&](size_t k) {
      size_t p = 0;
      return is_py_space(utf8_decode(cs[k], p));
    };
    while (true) {
      while (i < n && space(i)) ++i;
      if (i >= n) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        std::string rest;
        for (size_t k = i; k < n; ++k) rest += cs[k];
        out.push_back(rest);
        break;
      }
      std::string word;
      while (i < n && !space(i)) word += cs[i++];
      out.push_back(word);
    }
    return out;
  }
  const std::string& sep = need_string(sep_v, "split(): the separator");
  if (sep.empty()) eval_fail("split(): empty separator");
  size_t pos = 0;
  while (true) {
    size_t f = s.find(sep, pos);
    if (f == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) break;
    out.push_back(s.substr(pos, f - pos));
    pos = f + sep.size();
  }
  out.push_back(s.substr(pos));
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    std::vector<std::string> cs = utf8_chars(s);
    for (const auto& c : cs) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      out += c;
    }
    if (count < 0 || done < count) out += repl;
    return out;
  }
  size_t pos = 0;
  while (true) {
    size_t f = s.find(old, pos);
    if (f == std::string::npos || (count >= 0 && done == count)) break;
    out += s.substr(pos, f - pos) + repl;
    pos = f + old.size();
    ++done;
  }
  return out + s.substr(pos);
}

List string_list(const std::vector<std::string>& parts) {
  List l;
  for (const auto& p : parts) l.push_back(Value(p));
  return l;
}

bool matches_prefix(const std::string& s, const Value& arg, bool suffix, const char* what) {
  std::vector<std::string> options;
  if (arg.is_list())
    for (const Value& v : arg.as_list()) options.push_back(need_string(v, what));
  else
    options.push_back(need_string(arg, what));
  for (const auto& p : options) {
    if (p.size() > s.size()) continue;
    if (suffix ? s.compare(s.size() - p.size(), p.size(), p) == 0 : s.compare(0, p.size(), p) == 0) return true;
  }
  return false;
}

// A dotted attribute path ("function.name") looked up item-first, like jinja2's make_attrgetter.
Value lookup_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t pos = 0;
  while (true) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = numeric ? get_item(v, Value(int64_t(std::stoll(part)))) : get_item(v, Value(part));
    if (dot == std::string::npos) return v;
    pos = dot + 1;
  }
}

Value select_filter(const std::string& name, const Value& v, CallArgs& args) {
  bool by_attr = name == "selectattr" || name == "rejectattr";
  bool reject = name == "reject" || name == "rejectattr";
  std::vector<Value> pos = args.positional;
  if (!args.keyword.empty()) eval_fail("filter '{}' takes no keyword arguments", name);
  std::string attr;
  if (by_attr) {
    if (pos.empty()) eval_fail("filter '{}' needs an attribute name", name);
    attr = need_string(pos[0], "the attribute");
    pos.erase(pos.begin());
  }
  std::string test;
  if (!pos.empty()) {
    test = need_string(pos[0], "the test name");
    if (!is_known_test(test)) eval_fail("unsupported construct: test '{}'", test);
    pos.erase(pos.begin());
  }
  List out;
  for (const Value& item : iterate(v)) {
    Value x = by_attr ? lookup_path(item, attr) : item;
    bool keep = test.empty() ? x.truthy() : apply_test(test, x, pos);
    if (keep != reject) out.push_back(item);
  }
  return Value(std::move(out));
}

Value map_filter(const Value& v, CallArgs& args) {
  List out;
  if (args.positional.empty()) {
    std::vector<Value> b = bind(args, {"attribute", "default"}, "filter 'map'");
    const std::string& attr = need_string(b[0], "map(attribute=...)");
    for (const Value& item : iterate(v)) {
      Value x = lookup_path(item, attr);
      out.push_back(x.is_undefined() && !b[1].is_undefined() ? b[1] : x);
    }
    return Value(std::move(out));
  }
  std::string filter = need_string(args.positional[0], "map(): the filter name");
  if (!is_known_filter(filter)) eval_fail("unsupported construct: filter '{}'", filter);
  CallArgs rest{{args.positional.begin() + 1, args.positional.end()}, args.keyword};
  for (const Value& item : iterate(v)) {
    CallArgs a = rest;
    out.push_back(apply_filter(filter, item, a));
  }
  return Value(std::move(out));
}

Value tojson_filter(const Value& v, CallArgs& args) {
  // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  std::vector<Value> b = bind(args, {"ensure_ascii", "indent", "separators", "sort_keys"}, "filter 'tojson'");
  JsonOptions o;
  o.ensure_ascii = b[0].truthy();
  if (b[1].is_int() && b[1].as_int() > int64_t(kMaxStringBytes)) eval_fail("tojson: indent {} is too wide", b[1].as_int());
  if (b[1].is_int()) o.indent = std::string(size_t(std::max<int64_t>(0, b[1].as_int())), ' ');
  else if (b[1].is_string()) o.indent = b[1].as_string();
  else if (!b[1].is_undefined() && !b[1].is_none()) eval_fail("tojson: indent must be an integer or a string");
  if (b[2].is_list() && b[2].as_list().size() == 2)
    o.separators = {need_string(b[2].as_list()[0], "tojson separators"), need_string(b[2].as_list()[1], "tojson separators")};
  else if (!b[2].is_undefined() && !b[2].is_none()) eval_fail("tojson: separators must be a pair of strings");
  o.sort_keys = b[3].truthy();
  try {
    return Value(py_json_dumps(v, o));
  } catch (const Error& e) {
    eval_fail("tojson: {}", e.what());
  }
}

// int(d) as Jinja2's int filter takes it: NaN and infinities (ValueError, OverflowError)
// give the fallback; a finite value past 64 bits, which Python would hold, is an error.
Value float_to_int(double d, const Value& fallback) {
  if (!std::isfinite(d)) return fallback;
  const double t = std::trunc(d);
  if (t < -9223372036854775808.0 || t >= 9223372036854775808.0)
    eval_fail("integer overflow: int({}) is past 64 bits", py_float_repr(d));
  return Value(int64_t(t));
}

Value to_int(const Value& v, const Value& fallback) {
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) return float_to_int(v.as_float(), fallback);
  if (v.is_string()) {
    // int(s), else int(float(s)), as Jinja2's int filter tries them.
    const std::string s = py_strip(v.as_string(), std::nullopt, true, true);
    size_t used = 0;
    try {
      const int64_t i = std::stoll(s, &used);
      if (used == s.size()) return Value(i);
    } catch (const std::exception&) {  // not an integer, or past 64 bits: float(s) below decides
    }
    try {
      const double d = std::stod(s, &used);
      if (used != s.size()) return fallback;
      return float_to_int(d, fallback);
    } catch (const std::logic_error&) {  // stod's invalid_argument and out_of_range
    }
  }
  return fallback;
}

Value to_float(const Value& v, const Value& fallback) {
  if (v.is_number()) return Value(v.as_float());
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), std::nullopt, true, true);
    try {
      size_t used = 0;
      double d = std::stod(s, &used);
      if (used == s.size()) return Value(d);
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

}  // namespace

bool is_known_filter(const std::string& name) { return kFilters.count(name) > 0; }
bool is_known_test(const std::string& name) { return kTests.count(name) > 0; }

void require_defined(const Value& v) {
  if (v.is_undefined()) eval_fail("{}", v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
}

List iterate(const Value& v) {
  if (v.is_undefined()) return {};
  if (v.is_list()) return v.as_list();
  if (v.is_dict()) {
    List keys;
    for (const auto& [k, e] : v.as_dict().items) keys.push_back(Value(k));
    return keys;
  }
  if (v.is_string()) return string_list(utf8_chars(v.as_string()));
  eval_fail("'{}' object is not iterable", v.type_name());
}

bool py_less(const Value& a, const Value& b, const char* op) {
  require_defined(a);
  require_defined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() < b.as_float();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 order is code point order
  if (a.is_list() && b.is_list()) {
    const List &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      if (py_equal(x[i], y[i])) continue;
      return py_less(x[i], y[i], op);
    }
    return x.size() < y.size();
  }
  eval_fail("'{}' not supported between instances of '{}' and '{}'", op, a.type_name(), b.type_name());
}

Value get_attr(const Value& obj, const std::string& name) {
  require_defined(obj);
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().find(name)) return *v;
    return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
  }
  if (obj.is_namespace()) {
    if (const Value* v = obj.as_namespace().attrs.find(name)) return *v;
    return Value::undefined(fmt::format("'Namespace' has no attribute '{}'", name));
  }
  if (obj.is_none()) return Value::undefined(fmt::format("'None' has no attribute '{}'", name));
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", obj.type_name(), name));
}

Value get_item(const Value& obj, const Value& key) {
  require_defined(obj);
  require_defined(key);
  if (obj.is_dict()) {
    if (key.is_string())
      if (const Value* v = obj.as_dict().find(key.as_string())) return *v;
    return Value::undefined(fmt::format("'dict object' has no attribute {}", py_repr(key)));
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      int64_t n = int64_t(obj.as_list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.as_list()[size_t(i)];
      return Value::undefined(fmt::format("'list object' has no element {}", key.as_int()));
    }
    std::vector<std::string> cs = utf8_chars(obj.as_string());
    int64_t n = int64_t(cs.size());
    if (i < 0) i += n;
    if (i >= 0 && i < n) return Value(cs[size_t(i)]);
    return Value::undefined(fmt::format("'str object' has no element {}", key.as_int()));
  }
  if (key.is_string()) return get_attr(obj, key.as_string());
  return Value::undefined(fmt::format("'{} object' has no element {}", obj.type_name(), py_repr(key)));
}

Value get_slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  require_defined(obj);
  auto opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    return need_int(v, what);
  };
  std::optional<int64_t> start = opt(start_v, "slice start"), stop = opt(stop_v, "slice stop"),
                         step_o = opt(step_v, "slice step");
  int64_t step = step_o.value_or(1);
  if (step == 0) eval_fail("slice step cannot be zero");
  std::vector<Value> items;
  bool is_str = obj.is_string();
  if (is_str) items = string_list(utf8_chars(obj.as_string()));
  else if (obj.is_list()) items = obj.as_list();
  else eval_fail("'{}' object is not subscriptable", obj.type_name());
  int64_t n = int64_t(items.size());
  // Python's slice.indices()
  auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t v = *x < 0 ? *x + n : *x;
    if (step > 0) return std::clamp<int64_t>(v, 0, n);
    return std::clamp<int64_t>(v, -1, n - 1);
  };
  int64_t b = clamp(start, step > 0 ? 0 : n - 1), e = clamp(stop, step > 0 ? n : -1);
  List out;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) out.push_back(items[size_t(i)]);
  if (!is_str) return Value(std::move(out));
  std::string s;
  for (const Value& c : out) s += c.as_string();
  return Value(std::move(s));
}

Value call_method(const Value& obj, const std::string& name, CallArgs& args) {
  require_defined(obj);
  std::string what = fmt::format("{}.{}()", obj.type_name(), name);
  if (obj.is_string()) {
    const std::string& s = obj.as_string();
    if (name == "startswith" || name == "endswith") {
      std::vector<Value> b = bind(args, {"prefix"}, what);
      return Value(matches_prefix(s, b[0], name == "endswith", what.c_str()));
    }
    if (name == "split") {
      std::vector<Value> b = bind(args, {"sep", "maxsplit"}, what);
      return Value(string_list(py_split(s, b[0], b[1].is_undefined() ? -1 : need_int(b[1], "maxsplit"))));
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      std::vector<Value> b = bind(args, {"chars"}, what);
      return Value(py_strip(s, opt_chars(b[0], what.c_str()), name != "rstrip", name != "lstrip"));
    }
    if (name == "replace") {
      std::vector<Value> b = bind(args, {"old", "new", "count"}, what);
      return Value(py_replace(s, need_string(b[0], what.c_str()), need_string(b[1], what.c_str()),
                              b[2].is_undefined() ? -1 : need_int(b[2], "count")));
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      bind(args, {}, what);
      if (name == "upper") return Value(map_case(s, to_upper_cp));
      if (name == "lower") return Value(map_case(s, to_lower_cp));
      return Value(name == "title" ? py_title(s) : py_capitalize(s));
    }
    if (name == "find" || name == "count") {
      std::vector<Value> b = bind(args, {"sub"}, what);
      const std::string& sub = need_string(b[0], what.c_str());
      if (name == "find") {
        size_t f = s.find(sub);
        return Value(f == std::string::npos ? int64_t(-1) : int64_t(utf8_length(s.substr(0, f))));
      }
      if (sub.empty()) return Value(int64_t(utf8_length(s) + 1));
      int64_t c = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++c;
      return Value(c);
    }
    if (name == "join") {
      std::vector<Value> b = bind(args, {"iterable"}, what);
      std::string out;
      size_t i = 0;
      for (const Value& v : iterate(b[0])) {
        if (!v.is_string()) eval_fail("sequence item {}: expected str instance, {} found", i, v.type_name());
        out += (i++ ? s : "") + v.as_string();
      }
      return Value(std::move(out));
    }
    if (name == "isdigit" || name == "isspace" || name == "islower" || name == "isupper") {
      bind(args, {}, what);
      bool any = false, all = !s.empty();
      for (size_t i = 0; i < s.size();) {
        uint32_t c = utf8_decode(s, i);
        if (name == "isdigit") all = all && c >= '0' && c <= '9';
        else if (name == "isspace") all = all && is_py_space(c);
        else if (name == "islower") { all = all && !is_upper_cp(c); any = any || is_lower_cp(c); }
        else { all = all && !is_lower_cp(c); any = any || is_upper_cp(c); }
      }
      return Value(name == "islower" || name == "isupper" ? all && any : all);
    }
  } else if (obj.is_dict()) {
    const Dict& d = obj.as_dict();
    if (name == "get") {
      std::vector<Value> b = bind(args, {"key", "default"}, what);
      if (b[0].is_string())
        if (const Value* v = d.find(b[0].as_string())) return *v;
      return b[1].is_undefined() ? Value(nullptr) : b[1];
    }
    if (name == "items" || name == "keys" || name == "values") {
      bind(args, {}, what);
      List out;
      for (const auto& [k, v] : d.items) {
        if (name == "items") out.push_back(Value::tuple(List{Value(k), v}));
        else out.push_back(name == "keys" ? Value(k) : v);
      }
      return Value(std::move(out));
    }
  } else if (obj.is_none()) {
    eval_fail("'None' has no attribute '{}'", name);
  }
  eval_fail("unsupported construct: method {}", what);
}

Value apply_filter(const std::string& name, const Value& v, CallArgs& args) {
  std::string what = "filter '" + name + "'";
  if (name == "tojson") return tojson_filter(v, args);
  if (name == "default" || name == "d") {
    std::vector<Value> b = bind(args, {"default_value", "boolean"}, what);
    bool use_default = v.is_undefined() || (b[1].truthy() && !v.truthy());
    return use_default ? (b[0].is_undefined() ? Value("") : b[0]) : v;
  }
  if (name == "trim") {
    std::vector<Value> b = bind(args, {"chars"}, what);
    return Value(py_strip(py_str(v), opt_chars(b[0], what.c_str()), true, true));
  }
  if (name == "length" || name == "count") {
    bind(args, {}, what);
    if (v.is_undefined()) return Value(int64_t(0));
    if (v.is_string()) return Value(int64_t(utf8_length(v.as_string())));
    if (v.is_list()) return Value(int64_t(v.as_list().size()));
    if (v.is_dict()) return Value(int64_t(v.as_dict().items.size()));
    eval_fail("object of type '{}' has no len()", v.type_name());
  }
  if (name == "join") {
    std::vector<Value> b = bind(args, {"d", "attribute"}, what);
    std::string sep = b[0].is_undefined() ? "" : py_str(b[0]), out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      out += (first ? "" : sep) + py_str(b[1].is_undefined() ? item : lookup_path(item, py_str(b[1])));
      first = false;
    }
    return Value(std::move(out));
  }
  if (name == "items") {
    bind(args, {}, what);
    if (v.is_undefined()) return Value(List{});
    if (!v.is_dict()) eval_fail("Can only get item pairs from a mapping.");
    CallArgs none;
    return call_method(v, "items", none);
  }
  if (name == "first" || name == "last") {
    bind(args, {}, what);
    List items = iterate(v);
    if (items.empty()) return Value::undefined(fmt::format("No {} item, sequence was empty.", name));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "map") return map_filter(v, args);
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr")
    return select_filter(name, v, args);
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title" || name == "string") {
    bind(args, {}, what);
    std::string s = py_str(v);
    if (name == "upper") return Value(map_case(s, to_upper_cp));
    if (name == "lower") return Value(map_case(s, to_lower_cp));
    if (name == "capitalize") return Value(py_capitalize(s));
    if (name == "title") return Value(jinja_title(s));
    return Value(s);
  }
  if (name == "list") {
    bind(args, {}, what);
    return Value(iterate(v));
  }
  if (name == "int") {
    std::vector<Value> b = bind(args, {"default"}, what);
    return to_int(v, b[0].is_undefined() ? Value(int64_t(0)) : b[0]);
  }
  if (name == "float") {
    std::vector<Value> b = bind(args, {"default"}, what);
    return to_float(v, b[0].is_undefined() ? Value(0.0) : b[0]);
  }
  if (name == "replace") {
    std::vector<Value> b = bind(args, {"old", "new", "count"}, what);
    return Value(py_replace(py_str(v), py_str(b[0]), py_str(b[1]),
                            b[2].is_undefined() || b[2].is_none() ? -1 : need_int(b[2], "count")));
  }
  if (name == "safe") {
    bind(args, {}, what);
    return v;
  }
  if (name == "reverse") {
    bind(args, {}, what);
    if (v.is_string()) return get_slice(v, Value(), Value(), Value(int64_t(-1)));
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "abs") {
    bind(args, {}, what);
    if (v.is_float()) return Value(std::fabs(v.as_float()));
    if (v.is_int() || v.is_bool()) {
      if (v.as_int() == INT64_MIN) eval_fail("integer overflow: abs({}) is past 64 bits", v.as_int());
      return Value(std::abs(v.as_int()));
    }
    eval_fail("bad operand type for abs(): '{}'", v.type_name());
  }
  eval_fail("unsupported construct: filter '{}'", name);
}

bool apply_test(const std::string& name, const Value& v, const std::vector<Value>& args) {
  auto arg = [&]() -> const Value& {
    if (args.size() != 1) eval_fail("test '{}' takes one argument, got {}", name, args.size());
    return args[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "callable") return v.is_callable();
  if (name == "eq" || name == "equalto") return py_equal(v, arg());
  if (name == "ne") return !py_equal(v, arg());
  if (name == "lt" || name == "lessthan") return py_less(v, arg(), "<");
  if (name == "gt" || name == "greaterthan") return py_less(arg(), v, ">");
  if (name == "le") return !py_less(arg(), v, "<=");
  if (name == "ge") return !py_less(v, arg(), ">=");
  if (name == "odd" || name == "even") {
    int64_t i = need_int(v, "the value tested for odd/even");
    return (((i % 2) + 2) % 2 == 1) == (name == "odd");
  }
  if (name == "divisibleby") {
    int64_t d = need_int(arg(), "divisibleby's argument");
    if (d == 0) eval_fail("integer division or modulo by zero");
    return need_int(v, "the value tested for divisibleby") % d == 0;
  }
  if (name == "in") {
    const Value& c = arg();
    if (c.is_string()) return c.as_string().find(need_string(v, "'in <string>' left operand")) != std::string::npos;
    for (const Value& x : iterate(c))
      if (py_equal(x, v)) return true;
    return false;
  }
  if (name == "lower" || name == "upper") {
    CallArgs none;
    return call_method(Value(py_str(v)), name == "lower" ? "islower" : "isupper", none).as_bool();
  }
  eval_fail("unsupported construct: test '{}'", name);
}

}  // namespace mere::jinja

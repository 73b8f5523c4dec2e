#include "chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/error.h"

namespace mere::jinja {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value value) {
  for (auto& [k, v] : items)
    if (k == key) {
      v = std::move(value);
      return;
    }
  items.emplace_back(key, std::move(value));
}

namespace {

// The depth of a list or dict of these items, within kMaxValueDepth. Bounding it bounds
// the recursion of printing, comparing and destroying the value.
int container_depth(int deepest_item) {
  if (deepest_item >= kMaxValueDepth)
    eval_fail("lists, dicts and namespaces nested more than {} deep", kMaxValueDepth);
  return deepest_item + 1;
}

// Printing a value (str, repr, tojson) can multiply its size: a list of many references to
// one long string. Each printer checks its output as it grows.
void check_printed(const std::string& out) {
  if (out.size() > kMaxStringBytes)
    eval_fail("a printed value grew past {} MiB, more than a template may build", kMaxStringBytes >> 20);
}

}  // namespace

void Namespace::set(const std::string& key, Value value) {
  depth = std::max(depth, container_depth(value.depth()));
  attrs.set(key, std::move(value));
}

Value::Value(std::string s) {
  if (s.size() > kMaxStringBytes)
    eval_fail("a string of {} bytes is longer than a template may build ({} MiB)", s.size(), kMaxStringBytes >> 20);
  data_ = std::make_shared<const std::string>(std::move(s));
}

Value::Value(List l) {
  if (l.size() > kMaxListItems) eval_fail("a list of {} items is longer than a template may build ({})", l.size(), kMaxListItems);
  int deepest = 0;
  for (const Value& v : l) deepest = std::max(deepest, v.depth());
  depth_ = container_depth(deepest);
  data_ = std::make_shared<const List>(std::move(l));
}

Value::Value(Dict d) {
  int deepest = 0;
  for (const auto& [k, v] : d.items) deepest = std::max(deepest, v.depth());
  depth_ = container_depth(deepest);
  data_ = std::make_shared<const Dict>(std::move(d));
}

namespace {

// The conversion of JSON input, nested at most kMaxValueDepth deep: checked on the way
// down, since a deeper document would exhaust the stack before any value is built.
Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  if ((j.is_array() || j.is_object()) && depth >= kMaxValueDepth)
    fail("JSON nested more than {} deep cannot be passed to a template", kMaxValueDepth);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value(nullptr);
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      return u <= uint64_t(INT64_MAX) ? Value(int64_t(u)) : Value(double(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json_at(e, depth + 1));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, e] : j.items()) d.items.emplace_back(k, from_json_at(e, depth + 1));
      return Value(std::move(d));
    }
    default: fail("JSON value of type {} cannot be passed to a template", j.type_name());
  }
}

}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j) {
  try {
    return from_json_at(j, 0);
  } catch (const EvalError& e) {  // a string or list past the bounds
    fail("JSON passed to a template: {}", e.what());
  }
}

std::string Value::type_name() const {
  switch (data_.index()) {
    case 0: return "Undefined";
    case 1: return "NoneType";
    case 2: return "bool";
    case 3: return "int";
    case 4: return "float";
    case 5: return "str";
    case 6: return "list";
    case 7: return "dict";
    case 8: return "Namespace";
    default: return "function";
  }
}

bool Value::truthy() const {
  switch (data_.index()) {
    case 0: return false;
    case 1: return false;
    case 2: return as_bool();
    case 3: return as_int() != 0;
    case 4: return as_float() != 0.0;
    case 5: return !as_string().empty();
    case 6: return !as_list().empty();
    case 7: return !as_dict().items.empty();
    default: return true;
  }
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_none() || b.is_none()) return a.is_none() && b.is_none();
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_list() && b.is_list()) {
    const List &x = a.as_list(), &y = b.as_list();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!py_equal(x[i], y[i])) return false;
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    const Dict &x = a.as_dict(), &y = b.as_dict();
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const Value* w = y.find(k);
      if (!w || !py_equal(v, *w)) return false;
    }
    return true;
  }
  if (a.is_namespace() && b.is_namespace()) return &a.as_namespace() == &b.as_namespace();
  if (a.is_callable() && b.is_callable()) return &a.as_callable() == &b.as_callable();
  return false;
}

// Python's repr(float): the shortest digits that round-trip, positional for exponents in
// [-4, 16), otherwise d.ddde+XX.
std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exp = std::stoi(sci.substr(e + 1));
  int n = int(digits.size());
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= n - 1) out = digits + std::string(size_t(exp - (n - 1)), '0') + ".0";
    else if (exp >= 0) out = digits.substr(0, size_t(exp + 1)) + "." + digits.substr(size_t(exp + 1));
    else out = "0." + std::string(size_t(-exp - 1), '0') + digits;
  } else {
    out = digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  }
  return negative ? "-" + out : out;
}

uint32_t utf8_decode(std::string_view s, size_t& i) {
  auto c = uint8_t(s[i]);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + size_t(n) > s.size()) n = 1;
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(s[i + size_t(k)]) & 0x3f);
  i += size_t(n);
  return cp;
}

std::string encode_utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
  return out;
}

namespace {

// Characters Python's repr() escapes: C0/C1 controls, DEL, and the non-printable spaces.
bool repr_escapes(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200f) ||
         (cp >= 0x2028 && cp <= 0x202f) || (cp >= 0x205f && cp <= 0x206f) || cp == 0x3000 || cp == 0xfeff;
}

std::string repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    uint32_t cp = utf8_decode(s, i);
    if (cp == '\\') out += "\\\\";
    else if (cp == uint32_t(quote)) out += std::string("\\") + quote;
    else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else if (repr_escapes(cp)) out += cp <= 0xff ? fmt::format("\\x{:02x}", cp) : fmt::format("\\u{:04x}", cp);
    else out.append(s, start, i - start);
  }
  return out + quote;
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    uint32_t cp = utf8_decode(s, i);
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7f)) {
          if (cp >= 0x10000) {
            uint32_t v = cp - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
          } else {
            out += fmt::format("\\u{:04x}", cp);
          }
        } else {
          out.append(s, start, i - start);
        }
    }
  }
  out += '"';
}

void json_dump(std::string& out, const Value& v, const JsonOptions& o, const std::string& item_sep,
               const std::string& key_sep, int level) {
  check_printed(out);
  auto newline = [&](int l) {
    out += '\n';
    for (int k = 0; k < l; ++k) {
      out += *o.indent;
      check_printed(out);
    }
  };
  if (v.is_none()) out += "null";
  else if (v.is_bool()) out += v.as_bool() ? "true" : "false";
  else if (v.is_int()) out += std::to_string(v.as_int());
  else if (v.is_float()) {
    double d = v.as_float();
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : py_float_repr(d);
  } else if (v.is_string()) json_string(out, v.as_string(), o.ensure_ascii);
  else if (v.is_list()) {
    const List& l = v.as_list();
    if (l.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < l.size(); ++i) {
      if (i) out += item_sep;
      if (o.indent) newline(level + 1);
      json_dump(out, l[i], o, item_sep, key_sep, level + 1);
    }
    if (o.indent) newline(level);
    out += ']';
  } else if (v.is_dict()) {
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& kv : v.as_dict().items) items.push_back(&kv);
    if (items.empty()) {
      out += "{}";
      return;
    }
    if (o.sort_keys)
      std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep;
      if (o.indent) newline(level + 1);
      json_string(out, items[i]->first, o.ensure_ascii);
      out += key_sep;
      json_dump(out, items[i]->second, o, item_sep, key_sep, level + 1);
    }
    if (o.indent) newline(level);
    out += '}';
  } else {
    fail("Object of type {} is not JSON serializable", v.type_name());
  }
}

}  // namespace

std::string py_str(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.is_string()) return v.as_string();
  return py_repr(v);
}

std::string py_repr(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.is_none()) return "None";
  if (v.is_bool()) return v.as_bool() ? "True" : "False";
  if (v.is_int()) return std::to_string(v.as_int());
  if (v.is_float()) return py_float_repr(v.as_float());
  if (v.is_string()) return repr_string(v.as_string());
  if (v.is_list()) {
    const List& l = v.as_list();
    std::string out = v.is_tuple() ? "(" : "[";
    for (size_t i = 0; i < l.size(); ++i) {
      out += (i ? ", " : "") + py_repr(l[i]);
      check_printed(out);
    }
    if (v.is_tuple()) return out + (l.size() == 1 ? ",)" : ")");
    return out + "]";
  }
  if (v.is_dict()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, e] : v.as_dict().items) {
      out += (first ? "" : ", ") + repr_string(k) + ": " + py_repr(e);
      check_printed(out);
      first = false;
    }
    return out + "}";
  }
  if (v.is_namespace()) {
    // A namespace may hold itself; Python prints the inner one as {...}.
    thread_local std::vector<const Namespace*> printing;
    const Namespace* ns = &v.as_namespace();
    if (std::find(printing.begin(), printing.end(), ns) != printing.end()) return "<Namespace {...}>";
    printing.push_back(ns);
    std::string attrs;
    try {
      attrs = py_repr(Value(ns->attrs));
    } catch (...) {
      printing.pop_back();
      throw;
    }
    printing.pop_back();
    return "<Namespace " + attrs + ">";
  }
  return "<function " + v.as_callable().name + ">";
}

std::string py_json_dumps(const Value& v, const JsonOptions& o) {
  std::string item_sep = o.indent ? "," : ", ", key_sep = ": ";
  if (o.separators) std::tie(item_sep, key_sep) = *o.separators;
  std::string out;
  json_dump(out, v, o, item_sep, key_sep, 0);
  return out;
}

std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    utf8_decode(s, i);
    out.emplace_back(s.substr(start, i - start));
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (uint8_t(c) & 0xc0) != 0x80;
  return n;
}

bool is_py_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
         cp == 0x3000;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::vector<std::string> cs = utf8_chars(s);
  std::vector<std::string> strip_set = chars ? utf8_chars(*chars) : std::vector<std::string>{};
  auto strippable = [&](const std::string& c) {
    if (chars) return std::find(strip_set.begin(), strip_set.end(), c) != strip_set.end();
    size_t i = 0;
    return is_py_space(utf8_decode(c, i));
  };
  size_t b = 0, e = cs.size();
  if (left)
    while (b < e && strippable(cs[b])) ++b;
  if (right)
    while (e > b && strippable(cs[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cs[i];
  return out;
}

}  // namespace mere::jinja

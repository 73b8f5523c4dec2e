// The tree-walking renderer: statements append to the output, expressions evaluate with
// Python's operator semantics. Scopes follow jinja2: a for loop body gets a fresh scope each
// iteration (so `set` inside a loop never leaks; that is what namespace() is for), `if` does
// not open one, a macro body runs in a scope over the one it was defined in.
#include <cmath>
#include <unordered_map>

#include "chat/jinja.h"
#include "chat/jinja_builtins.h"
#include "core/error.h"

namespace mere::jinja {
namespace {

struct Scope {
  Scope* parent = nullptr;
  std::unordered_map<std::string, Value> vars;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

// raise_exception(msg): carried up to the call expression, which adds the line.
struct Raised {
  std::string message;
};

enum class Flow { normal, break_, continue_ };

// Templates hold 64-bit integers where Python's grow without bound: a result past 64 bits is
// an error, never a wrapped value (nor, for INT64_MIN // -1, a trap).
[[noreturn]] void integer_overflow(const std::string& op, int64_t a, int64_t b) {
  eval_fail("integer overflow: {} {} {} is past 64 bits", a, op, b);
}

int64_t checked(const std::string& op, int64_t a, int64_t b) {
  int64_t r = 0;
  const bool over = op == "+"   ? __builtin_add_overflow(a, b, &r)
                    : op == "-" ? __builtin_sub_overflow(a, b, &r)
                                : __builtin_mul_overflow(a, b, &r);
  if (over) integer_overflow(op, a, b);
  return r;
}

int64_t floor_div(int64_t a, int64_t b) {
  if (b == -1) return checked("*", a, -1);  // INT64_MIN / -1 traps
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// a ** b for b >= 0. Where |a| >= 2 the loop overflows within 63 steps, so a huge exponent
// ends quickly.
int64_t checked_pow(int64_t a, int64_t b) {
  if (a == 0 || a == 1) return b == 0 ? 1 : a;
  if (a == -1) return b % 2 ? -1 : 1;
  int64_t r = 1;
  for (int64_t i = 0; i < b; ++i)
    if (__builtin_mul_overflow(r, a, &r)) integer_overflow("**", a, b);
  return r;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  bool nums = a.is_number() && b.is_number();
  bool floats = nums && (a.is_float() || b.is_float());
  if (op == "+") {
    if (nums) return floats ? Value(a.as_float() + b.as_float()) : Value(checked("+", a.as_int(), b.as_int()));
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list()) {
      List l = a.as_list();
      l.insert(l.end(), b.as_list().begin(), b.as_list().end());
      return Value(std::move(l));
    }
    if (a.is_string() || a.is_list())
      eval_fail("can only concatenate {} (not \"{}\") to {}", a.type_name(), b.type_name(), a.type_name());
  } else if (op == "-" && nums) {
    return floats ? Value(a.as_float() - b.as_float()) : Value(checked("-", a.as_int(), b.as_int()));
  } else if (op == "*") {
    if (nums) return floats ? Value(a.as_float() * b.as_float()) : Value(checked("*", a.as_int(), b.as_int()));
    const Value *seq = &a, *n = &b;
    if (b.is_string() || b.is_list()) std::swap(seq, n);
    if ((seq->is_string() || seq->is_list()) && (n->is_int() || n->is_bool())) {
      const size_t unit = seq->is_string() ? seq->as_string().size() : seq->as_list().size();
      if (n->as_int() > 0 && unit > 0 &&
          uint64_t(n->as_int()) > (seq->is_string() ? kMaxStringBytes : kMaxListItems) / unit)
        eval_fail("{} repeated {} times is longer than a template may build", seq->type_name(), n->as_int());
      if (seq->is_string()) {
        std::string s;
        for (int64_t i = 0; i < n->as_int(); ++i) s += seq->as_string();
        return Value(std::move(s));
      }
      List l;
      for (int64_t i = 0; i < n->as_int(); ++i) l.insert(l.end(), seq->as_list().begin(), seq->as_list().end());
      return Value(std::move(l));
    }
  } else if (op == "/" && nums) {
    if (b.as_float() == 0) eval_fail("division by zero");
    return Value(a.as_float() / b.as_float());
  } else if ((op == "//" || op == "%") && nums) {
    if (b.as_float() == 0) eval_fail("integer division or modulo by zero");
    if (!floats) {
      if (op == "%" && b.as_int() == -1) return Value(int64_t(0));
      int64_t q = floor_div(a.as_int(), b.as_int());
      return op == "//" ? Value(q) : Value(a.as_int() - q * b.as_int());
    }
    double q = std::floor(a.as_float() / b.as_float());
    return op == "//" ? Value(q) : Value(a.as_float() - q * b.as_float());
  } else if (op == "**" && nums) {
    if (!floats && b.as_int() >= 0) return Value(checked_pow(a.as_int(), b.as_int()));
    return Value(std::pow(a.as_float(), b.as_float()));
  } else if (op == "%" && a.is_string()) {
    eval_fail("unsupported construct: printf-style '%' string formatting");
  }
  eval_fail("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
}

bool contains(const Value& container, const Value& item) {
  require_defined(item);
  if (container.is_undefined()) return false;
  if (container.is_string()) {
    if (!item.is_string()) eval_fail("'in <string>' requires string as left operand, not {}", item.type_name());
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& x : container.as_list())
      if (py_equal(x, item)) return true;
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
  eval_fail("argument of type '{}' is not iterable", container.type_name());
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return py_equal(a, b);
  if (op == "!=") return !py_equal(a, b);
  if (op == "<") return py_less(a, b, "<");
  if (op == ">") return py_less(b, a, ">");
  if (op == "<=") return !py_less(b, a, "<=");
  if (op == ">=") return !py_less(a, b, ">=");
  if (op == "in") return contains(b, a);
  return !contains(b, a);  // not in
}

// The template's output and its string concatenations grow piece by piece; each stays
// within kMaxStringBytes as it grows.
void append(std::string& out, std::string_view part) {
  if (part.size() > kMaxStringBytes - out.size())
    eval_fail("the text grew past {} MiB, more than a template may build", kMaxStringBytes >> 20);
  out += part;
}

// Recursion and work inside one render: each statement and expression entered counts one
// level (so nesting, however written, and a macro that calls itself without end are both
// bounded well inside the stack), and loop iterations count against one budget.
constexpr int kMaxRenderDepth = 1000;
constexpr int64_t kMaxLoopIterations = 10'000'000;

class Renderer {
 public:
  Renderer(const std::string& origin, const RenderOptions& options) : origin_(origin), options_(options) {}

  void install_globals(Scope& root) {
    root.vars["namespace"] = callable("namespace", [](CallArgs& args) {
      auto ns = std::make_shared<Namespace>();
      for (const Value& p : args.positional) {
        if (!p.is_dict()) eval_fail("namespace() takes keyword arguments or a dict");
        for (const auto& [k, v] : p.as_dict().items) ns->set(k, v);
      }
      for (auto& [k, v] : args.keyword) ns->set(k, v);
      return Value(ns);
    });
    root.vars["raise_exception"] = callable("raise_exception", [](CallArgs& args) -> Value {
      throw Raised{args.positional.empty() ? std::string() : py_str(args.positional[0])};
    });
    root.vars["strftime_now"] = callable("strftime_now", [this](CallArgs& args) {
      if (args.positional.size() != 1 || !args.positional[0].is_string())
        eval_fail("strftime_now() takes one format string");
      std::tm tm;
      if (options_.now) {
        tm = options_.now();
      } else {
        std::time_t t = std::time(nullptr);
        localtime_r(&t, &tm);
      }
      char buf[512];
      size_t n = std::strftime(buf, sizeof buf, args.positional[0].as_string().c_str(), &tm);
      return Value(std::string(buf, n));
    });
    root.vars["range"] = callable("range", [](CallArgs& args) {
      std::vector<int64_t> a;
      for (const Value& v : args.positional) {
        if (!v.is_int()) eval_fail("range() takes integers, not {}", v.type_name());
        a.push_back(v.as_int());
      }
      if (a.empty() || a.size() > 3 || !args.keyword.empty()) eval_fail("range() takes 1 to 3 integers");
      int64_t start = a.size() > 1 ? a[0] : 0, stop = a.size() > 1 ? a[1] : a[0], step = a.size() > 2 ? a[2] : 1;
      if (step == 0) eval_fail("range() arg 3 must not be zero");
      // The count in 128 bits, so that no bound or step wraps around (jinja2's sandbox
      // refuses ranges past 100,000 items).
      const __int128 span = step > 0 ? __int128(stop) - start : __int128(start) - stop;
      const __int128 count = span <= 0 ? 0 : (span - 1) / (step > 0 ? __int128(step) : -__int128(step)) + 1;
      if (count > 100000) eval_fail("range() is too long");
      List l;
      for (int64_t k = 0; k < int64_t(count); ++k) l.push_back(Value(int64_t(start + __int128(k) * step)));
      return Value(std::move(l));
    });
  }

  Flow exec(const Body& body, Scope& scope, std::string& out) {
    for (const StmtPtr& s : body) {
      Flow f = exec(*s, scope, out);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

 private:
  static Value callable(std::string name, std::function<Value(CallArgs&)> f) {
    return Value(std::make_shared<Callable>(Callable{std::move(name), std::move(f)}));
  }

  [[noreturn]] void located(int line, const std::string& msg) const { fail("{} line {}: {}", origin_, line, msg); }

  // Counts one level of the render's recursion while it lives.
  class Level {
   public:
    Level(Renderer& r, int line) : r_(r) {
      if (++r_.depth_ > kMaxRenderDepth) {
        --r_.depth_;
        r_.located(line, fmt::format("the template nests or recurses more than {} levels deep (a macro that "
                                     "calls itself without end?)", kMaxRenderDepth));
      }
    }
    ~Level() { --r_.depth_; }
    Level(const Level&) = delete;
    Level& operator=(const Level&) = delete;

   private:
    Renderer& r_;
  };

  Flow exec(const Stmt& s, Scope& scope, std::string& out) {
    Level level(*this, s.line);
    try {
      return exec_statement(s, scope, out);
    } catch (const EvalError& e) {  // a value past its bounds, built outside an expression
      located(s.line, e.what());
    }
  }

  Flow exec_statement(const Stmt& s, Scope& scope, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::text: append(out, s.text); return Flow::normal;
      case Stmt::Kind::output: append(out, py_str(eval(*s.expr, scope))); return Flow::normal;
      case Stmt::Kind::if_:
        for (const auto& [cond, body] : s.branches)
          if (eval(*cond, scope).truthy()) return exec(body, scope, out);
        return exec(s.else_body, scope, out);
      case Stmt::Kind::for_: return exec_for(s, scope, out);
      case Stmt::Kind::set: {
        Value v = eval(*s.expr, scope);
        if (!s.attr.empty()) {
          const Value* ns = scope.find(s.targets[0]);
          if (!ns || !ns->is_namespace())
            located(s.line, fmt::format("set {}.{}: cannot assign an attribute of a non-namespace object",
                                        s.targets[0], s.attr));
          ns->as_namespace().set(s.attr, std::move(v));
        } else {
          assign(s, s.targets, v, scope);
        }
        return Flow::normal;
      }
      case Stmt::Kind::set_block: {
        std::string text;
        exec(s.body, scope, text);
        scope.vars[s.targets[0]] = Value(std::move(text));
        return Flow::normal;
      }
      case Stmt::Kind::macro: scope.vars[s.text] = make_macro(s, scope); return Flow::normal;
      case Stmt::Kind::break_: return Flow::break_;
      case Stmt::Kind::continue_: return Flow::continue_;
      case Stmt::Kind::scope: return exec(s.body, scope, out);
    }
    return Flow::normal;
  }

  void assign(const Stmt& s, const std::vector<std::string>& targets, const Value& v, Scope& scope) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = v;
      return;
    }
    List items;
    try {
      items = iterate(v);
    } catch (const EvalError& e) {
      located(s.line, fmt::format("cannot unpack: {}", e.what()));
    }
    if (items.size() != targets.size())
      located(s.line, fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
    for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = items[i];
  }

  Flow exec_for(const Stmt& s, Scope& scope, std::string& out) {
    Value seq = eval(*s.expr, scope);
    List items;
    try {
      items = iterate(seq);
    } catch (const EvalError& e) {
      located(s.line, fmt::format("for loop: {}", e.what()));
    }
    if (s.filter) {
      List kept;
      for (const Value& item : items) {
        count_iteration(s.line);
        Scope inner{&scope, {}};
        assign(s, s.targets, item, inner);
        if (eval(*s.filter, inner).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    int64_t n = int64_t(items.size());
    for (int64_t i = 0; i < n; ++i) {
      count_iteration(s.line);
      Scope inner{&scope, {}};
      assign(s, s.targets, items[size_t(i)], inner);
      Dict loop;
      loop.items = {{"index", Value(i + 1)},
                    {"index0", Value(i)},
                    {"revindex", Value(n - i)},
                    {"revindex0", Value(n - i - 1)},
                    {"first", Value(i == 0)},
                    {"last", Value(i == n - 1)},
                    {"length", Value(n)},
                    {"depth", Value(int64_t(1))},
                    {"depth0", Value(int64_t(0))},
                    {"previtem", i > 0 ? items[size_t(i - 1)] : Value::undefined("there is no previous item")},
                    {"nextitem", i + 1 < n ? items[size_t(i + 1)] : Value::undefined("there is no next item")}};
      inner.vars["loop"] = Value(std::move(loop));
      if (exec(s.body, inner, out) == Flow::break_) break;
    }
    if (n == 0) return exec(s.else_body, scope, out);
    return Flow::normal;
  }

  void count_iteration(int line) {
    if (++iterations_ > kMaxLoopIterations)
      located(line, fmt::format("the template ran more than {} loop iterations", kMaxLoopIterations));
  }

  Value make_macro(const Stmt& s, Scope& scope) {
    Scope* defined_in = &scope;  // a macro never outlives the render that defined it
    return callable(s.text, [this, &s, defined_in](CallArgs& args) {
      Scope local{defined_in, {}};
      if (args.positional.size() > s.params.size())
        eval_fail("macro '{}' takes not more than {} argument(s)", s.text, s.params.size());
      std::vector<bool> given(s.params.size(), false);
      for (size_t i = 0; i < args.positional.size(); ++i) {
        local.vars[s.params[i].first] = args.positional[i];
        given[i] = true;
      }
      for (auto& [k, v] : args.keyword) {
        size_t i = 0;
        while (i < s.params.size() && s.params[i].first != k) ++i;
        if (i == s.params.size()) eval_fail("macro '{}' takes no keyword argument '{}'", s.text, k);
        local.vars[k] = v;
        given[i] = true;
      }
      for (size_t i = 0; i < s.params.size(); ++i)
        if (!given[i])
          local.vars[s.params[i].first] =
              s.params[i].second ? eval(*s.params[i].second, local)
                                 : Value::undefined(fmt::format("parameter '{}' was not provided", s.params[i].first));
      std::string text;
      exec(s.body, local, text);
      return Value(std::move(text));
    });
  }

  CallArgs eval_args(const Expr& e, Scope& scope) {
    CallArgs args;
    for (const ExprPtr& a : e.args) args.positional.push_back(eval(*a, scope));
    for (const auto& [k, a] : e.keyword) args.keyword.emplace_back(k, eval(*a, scope));
    return args;
  }

  // What an error says the failing construct was.
  static std::string construct(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::filter: return "filter '" + e.name + "'";
      case Expr::Kind::test: return "test '" + e.name + "'";
      case Expr::Kind::call:
        if (e.a->kind == Expr::Kind::attr) return "method '" + e.a->name + "()'";
        if (e.a->kind == Expr::Kind::name) return "call of '" + e.a->name + "()'";
        return "call";
      case Expr::Kind::binary: return "operator '" + e.name + "'";
      case Expr::Kind::compare: return "comparison";
      case Expr::Kind::attr: return "attribute '." + e.name + "'";
      case Expr::Kind::item: return "subscript";
      case Expr::Kind::slice: return "slice";
      case Expr::Kind::neg:
      case Expr::Kind::pos: return "unary operator";
      default: return "expression";
    }
  }

  Value eval(const Expr& e, Scope& scope) {
    Level level(*this, e.line);
    try {
      return eval_node(e, scope);
    } catch (const EvalError& x) {
      located(e.line, fmt::format("{}: {}", construct(e), x.what()));
    } catch (const Raised& r) {
      located(e.line, fmt::format("raise_exception: {}", r.message));
    }
  }

  Value eval_node(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case Expr::Kind::literal: return e.value;
      case Expr::Kind::name: {
        const Value* v = scope.find(e.name);
        return v ? *v : Value::undefined(fmt::format("'{}' is undefined", e.name));
      }
      case Expr::Kind::list: {
        List l;
        for (const ExprPtr& a : e.args) l.push_back(eval(*a, scope));
        return e.name == "tuple" ? Value::tuple(std::move(l)) : Value(std::move(l));
      }
      case Expr::Kind::dict: {
        Dict d;
        for (size_t i = 0; i < e.args.size(); ++i) {
          Value k = eval(*e.args[i], scope);
          if (!k.is_string()) eval_fail("unsupported construct: dict literal key of type {}", k.type_name());
          d.set(k.as_string(), eval(*e.args2[i], scope));
        }
        return Value(std::move(d));
      }
      case Expr::Kind::attr: return get_attr(eval(*e.a, scope), e.name);
      case Expr::Kind::item: {
        Value obj = eval(*e.a, scope);
        return get_item(obj, eval(*e.b, scope));
      }
      case Expr::Kind::slice: {
        Value obj = eval(*e.a, scope);
        Value part[3];
        for (int i = 0; i < 3; ++i)
          if (e.args[size_t(i)]) part[i] = eval(*e.args[size_t(i)], scope);
        return get_slice(obj, part[0], part[1], part[2]);
      }
      case Expr::Kind::call: {
        if (e.a->kind == Expr::Kind::attr) {
          Value obj = eval(*e.a->a, scope);
          if (!obj.is_namespace()) {
            CallArgs args = eval_args(e, scope);
            return call_method(obj, e.a->name, args);
          }
        }
        Value f = eval(*e.a, scope);
        require_defined(f);
        if (!f.is_callable()) eval_fail("'{}' object is not callable", f.type_name());
        CallArgs args = eval_args(e, scope);
        return f.as_callable().call(args);
      }
      case Expr::Kind::filter: {
        Value v = eval(*e.a, scope);
        CallArgs args = eval_args(e, scope);
        return apply_filter(e.name, v, args);
      }
      case Expr::Kind::test: {
        Value v = eval(*e.a, scope);
        std::vector<Value> args;
        for (const ExprPtr& a : e.args) args.push_back(eval(*a, scope));
        return Value(apply_test(e.name, v, args) != e.negated);
      }
      case Expr::Kind::not_: return Value(!eval(*e.a, scope).truthy());
      case Expr::Kind::neg:
      case Expr::Kind::pos: {
        Value v = eval(*e.a, scope);
        require_defined(v);
        if (!v.is_number()) eval_fail("bad operand type for unary {}: '{}'", e.kind == Expr::Kind::neg ? '-' : '+', v.type_name());
        if (e.kind == Expr::Kind::pos) return v.is_float() ? v : Value(v.as_int());
        return v.is_float() ? Value(-v.as_float()) : Value(checked("-", 0, v.as_int()));
      }
      case Expr::Kind::binary: {
        Value a = eval(*e.a, scope);
        return arithmetic(e.name, a, eval(*e.b, scope));
      }
      case Expr::Kind::concat: {
        std::string s;
        for (const ExprPtr& a : e.args) append(s, py_str(eval(*a, scope)));
        return Value(std::move(s));
      }
      case Expr::Kind::compare: {
        Value left = eval(*e.args[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], scope);
          if (!compare(e.ops[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::and_: {
        Value a = eval(*e.a, scope);
        return a.truthy() ? eval(*e.b, scope) : a;
      }
      case Expr::Kind::or_: {
        Value a = eval(*e.a, scope);
        return a.truthy() ? a : eval(*e.b, scope);
      }
      case Expr::Kind::cond:
        if (eval(*e.a, scope).truthy()) return eval(*e.b, scope);
        return e.c ? eval(*e.c, scope) : Value::undefined("the inline if-expression had no else branch");
    }
    return Value();
  }

  const std::string& origin_;
  const RenderOptions& options_;
  int depth_ = 0;             // statements and expressions being run
  int64_t iterations_ = 0;    // loop iterations run
};

}  // namespace

Template::Template(const std::string& source, std::string origin)
    : origin_(std::move(origin)), body_(std::make_shared<const Body>(parse_template(source, origin_))) {}

std::string Template::render(const Dict& vars, const RenderOptions& options) const {
  Renderer renderer(origin_, options);
  Scope globals;
  renderer.install_globals(globals);
  Scope root{&globals, {}};
  for (const auto& [k, v] : vars.items) root.vars[k] = v;
  std::string out;
  if (renderer.exec(*body_, root, out) != Flow::normal) fail("{}: 'break' or 'continue' outside a loop", origin_);
  return out;
}

}  // namespace mere::jinja

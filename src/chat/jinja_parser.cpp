// Parser for the Jinja subset chat templates use, mirroring jinja2's parser.py precedence
// (filters bind tighter than arithmetic: `a + b | trim` is `a + (b | trim)`).
#include <algorithm>
#include <set>

#include "chat/jinja_ast.h"
#include "chat/jinja_builtins.h"
#include "chat/jinja_lexer.h"
#include "core/error.h"

namespace mere::jinja {
namespace {

// Bounds on a template's shape, so that parsing, running and freeing it stay well inside
// the stack whatever the input: blocks and sub-expressions nested (parentheses, `not`,
// unary signs, statements), and the nodes of one statement's or output's expression (its
// height: `a + b + ...` nests to the left). Real chat templates stay far inside both.
constexpr int kMaxNesting = 256;
constexpr int kMaxExpressionNodes = 2000;

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& origin) : t_(std::move(tokens)), origin_(origin) {}

  Body parse() { return subparse({}); }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool is_op(const char* s) const { return cur().type == Token::op && cur().text == s; }
  bool is_name(const char* s) const { return cur().type == Token::name && cur().text == s; }
  bool skip_op(const char* s) {
    if (!is_op(s)) return false;
    next();
    return true;
  }
  bool skip_name(const char* s) {
    if (!is_name(s)) return false;
    next();
    return true;
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case Token::eof: return "end of template";
      case Token::block_end: return "end of statement block";
      case Token::var_end: return "end of print statement";
      case Token::data: return "template text";
      default: return "'" + t.text + "'";
    }
  }
  [[noreturn]] void error(const std::string& msg) const { fail("{} line {}: {}", origin_, cur().line, msg); }
  void expect_op(const char* s) {
    if (!skip_op(s)) error(fmt::format("expected '{}', got {}", s, describe(cur())));
  }
  void expect_block_end() {
    if (cur().type != Token::block_end) error(fmt::format("expected end of statement block, got {}", describe(cur())));
    next();
  }
  std::string expect_name() {
    if (cur().type != Token::name) error(fmt::format("expected a name, got {}", describe(cur())));
    std::string s = cur().text;
    next();
    return s;
  }
  ExprPtr make(Expr::Kind kind, int line) {
    if (++expression_nodes_ > kMaxExpressionNodes)
      error(fmt::format("an expression of more than {} parts", kMaxExpressionNodes));
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // One level of nesting while it lives.
  class Nested {
   public:
    explicit Nested(Parser& p) : p_(p) {
      if (++p_.nesting_ > kMaxNesting) {
        --p_.nesting_;
        p_.error(fmt::format("blocks or expressions nested more than {} deep", kMaxNesting));
      }
    }
    ~Nested() { --p_.nesting_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    Parser& p_;
  };

  // Statements until a block tag named in `ends`; leaves the cursor on that name.
  Body subparse(const std::set<std::string>& ends, int opened_line = 0, const char* opened = nullptr) {
    Body body;
    while (cur().type != Token::eof) {
      if (cur().type == Token::data) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::text;
        s->line = cur().line;
        s->text = cur().text;
        body.push_back(std::move(s));
        next();
      } else if (cur().type == Token::var_begin) {
        expression_nodes_ = 0;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::output;
        s->line = cur().line;
        next();
        s->expr = parse_tuple(true, false);
        if (cur().type != Token::var_end) error(fmt::format("expected end of print statement, got {}", describe(cur())));
        next();
        body.push_back(std::move(s));
      } else if (cur().type == Token::block_begin) {
        next();
        if (cur().type == Token::name && ends.count(cur().text)) return body;
        if (cur().type == Token::name &&
            (cur().text.rfind("end", 0) == 0 || cur().text == "elif" || cur().text == "else")) {
          if (ends.empty()) error(fmt::format("'{{% {} %}}' closes no open block", cur().text));
          fail("{} line {}: '{{% {} %}}' found where the '{{% {} %}}' from line {} is never closed (expected {})",
               origin_, cur().line, cur().text, opened, opened_line, fmt::join(ends, " or "));
        }
        expression_nodes_ = 0;
        body.push_back(parse_statement());
      } else {
        error(fmt::format("unexpected {}", describe(cur())));
      }
    }
    if (!ends.empty())
      fail("{} line {}: '{{% {} %}}' is never closed (expected {})", origin_, opened_line, opened,
           fmt::join(ends, " or "));
    return body;
  }

  StmtPtr parse_statement() {
    Nested nested(*this);
    if (cur().type != Token::name) error(fmt::format("expected a statement name, got {}", describe(cur())));
    auto s = std::make_unique<Stmt>();
    s->line = cur().line;
    std::string tag = cur().text;
    next();
    if (tag == "if") {
      s->kind = Stmt::Kind::if_;
      auto cond = parse_tuple(false, false);
      expect_block_end();
      Body body = subparse({"elif", "else", "endif"}, s->line, "if");
      s->branches.emplace_back(std::move(cond), std::move(body));
      while (true) {
        std::string t = cur().text;
        next();
        if (t == "elif") {
          auto c = parse_tuple(false, false);
          expect_block_end();
          Body b = subparse({"elif", "else", "endif"}, s->line, "if");
          s->branches.emplace_back(std::move(c), std::move(b));
        } else if (t == "else") {
          expect_block_end();
          s->else_body = subparse({"endif"}, s->line, "if");
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (tag == "for") {
      s->kind = Stmt::Kind::for_;
      s->targets = parse_targets();
      if (!skip_name("in")) error(fmt::format("expected 'in' in for loop, got {}", describe(cur())));
      s->expr = parse_tuple(false, false);
      if (skip_name("if")) s->filter = parse_expression(true);
      if (is_name("recursive")) error("unsupported construct: recursive for loop");
      expect_block_end();
      s->body = subparse({"endfor", "else"}, s->line, "for");
      if (cur().text == "else") {
        next();
        expect_block_end();
        s->else_body = subparse({"endfor"}, s->line, "for");
      }
      next();
      expect_block_end();
    } else if (tag == "set") {
      s->targets.push_back(expect_name());
      if (skip_op(".")) {
        s->attr = expect_name();
      } else {
        while (skip_op(",")) s->targets.push_back(expect_name());
      }
      if (skip_op("=")) {
        s->kind = Stmt::Kind::set;
        s->expr = parse_tuple(true, false);
        expect_block_end();
      } else {
        if (!s->attr.empty() || s->targets.size() > 1) error("a block set takes one plain name");
        if (is_op("|")) error("unsupported construct: filter on a block set");
        s->kind = Stmt::Kind::set_block;
        expect_block_end();
        s->body = subparse({"endset"}, s->line, "set");
        next();
        expect_block_end();
      }
    } else if (tag == "macro") {
      s->kind = Stmt::Kind::macro;
      s->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        if (!s->params.empty()) expect_op(",");
        if (is_op(")")) break;
        std::string name = expect_name();
        ExprPtr def;
        if (skip_op("=")) def = parse_expression(true);
        s->params.emplace_back(name, std::move(def));
      }
      next();
      expect_block_end();
      s->body = subparse({"endmacro"}, s->line, "macro");
      next();
      if (cur().type == Token::name) next();  // {% endmacro name %}
      expect_block_end();
    } else if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_;
      expect_block_end();
    } else if (tag == "generation") {
      // transformers' AssistantTracker tag: it only marks assistant tokens, the text renders as is.
      s->kind = Stmt::Kind::scope;
      expect_block_end();
      s->body = subparse({"endgeneration"}, s->line, "generation");
      next();
      expect_block_end();
    } else {
      fail("{} line {}: unsupported construct '{{% {} %}}'", origin_, s->line, tag);
    }
    return s;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = skip_op("(");
    names.push_back(expect_name());
    while (skip_op(",")) names.push_back(expect_name());
    if (paren) expect_op(")");
    return names;
  }

  // Comma-separated expressions; a comma makes a tuple (a list here).
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens) {
    int line = cur().line;
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        comma = true;
      }
      if (cur().type == Token::block_end || cur().type == Token::var_end || is_op(")") ||
          (is_name("if") && !items.empty()) || is_name("in") || is_name("recursive"))
        break;
      items.push_back(parse_expression(with_condexpr));
    }
    if (!comma && items.size() == 1) return std::move(items[0]);
    if (items.empty() && !explicit_parens) error(fmt::format("expected an expression, got {}", describe(cur())));
    auto e = make(Expr::Kind::list, line);
    e->name = "tuple";
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Nested nested(*this);
    ExprPtr e = parse_or();
    if (!with_condexpr) return e;
    while (is_name("if")) {
      int line = cur().line;
      next();
      auto c = make(Expr::Kind::cond, line);
      c->a = parse_or();
      c->b = std::move(e);
      if (skip_name("else")) c->c = parse_expression(true);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      auto e = make(Expr::Kind::or_, cur().line);
      next();
      e->a = std::move(left);
      e->b = parse_and();
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      auto e = make(Expr::Kind::and_, cur().line);
      next();
      e->a = std::move(left);
      e->b = parse_not();
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_not() {
    Nested nested(*this);
    if (is_name("not")) {
      auto e = make(Expr::Kind::not_, cur().line);
      next();
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr left = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> args;
    while (true) {
      std::string op;
      if (cur().type == Token::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                      cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == Token::name && peek().text == "in") {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      ops.push_back(op);
      args.push_back(parse_math1());
    }
    if (ops.empty()) return left;
    auto e = make(Expr::Kind::compare, line);
    e->args.push_back(std::move(left));
    for (auto& a : args) e->args.push_back(std::move(a));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, int line) {
    auto e = make(Expr::Kind::binary, line);
    e->name = op;
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      int line = cur().line;
      next();
      left = binary(op, std::move(left), parse_concat(), line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    int line = cur().line;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto e = make(Expr::Kind::concat, line);
    e->args.push_back(std::move(first));
    while (skip_op("~")) e->args.push_back(parse_math2());
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      int line = cur().line;
      next();
      left = binary(op, std::move(left), parse_pow(), line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      int line = cur().line;
      next();
      left = binary("**", std::move(left), parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    Nested nested(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = make(is_op("-") ? Expr::Kind::neg : Expr::Kind::pos, cur().line);
      next();
      node->a = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    if (t.type == Token::name) {
      std::string s = t.text;
      next();
      auto e = make(Expr::Kind::literal, line);
      if (s == "true" || s == "True") e->value = Value(true);
      else if (s == "false" || s == "False") e->value = Value(false);
      else if (s == "none" || s == "None") e->value = Value(nullptr);
      else {
        e->kind = Expr::Kind::name;
        e->name = s;
      }
      return e;
    }
    if (t.type == Token::string) {
      std::string s;
      while (cur().type == Token::string) {  // adjacent literals concatenate
        s += cur().text;
        next();
      }
      auto e = make(Expr::Kind::literal, line);
      e->value = Value(std::move(s));
      return e;
    }
    if (t.type == Token::integer || t.type == Token::floating) {
      auto e = make(Expr::Kind::literal, line);
      try {
        e->value = t.type == Token::integer ? Value(int64_t(std::stoll(t.text))) : Value(std::stod(t.text));
      } catch (const std::exception&) {
        error(fmt::format("number {} is out of range", t.text));
      }
      next();
      return e;
    }
    if (skip_op("(")) {
      ExprPtr e = parse_tuple(true, true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = make(Expr::Kind::list, line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    if (skip_op("{")) {
      auto e = make(Expr::Kind::dict, line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args2.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    error(fmt::format("unexpected {}", describe(t)));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      int line = cur().line;
      if (is_op(".")) {
        next();
        auto e = make(Expr::Kind::attr, line);
        if (cur().type == Token::integer) {  // foo.0 is foo[0]
          e->kind = Expr::Kind::item;
          e->b = make(Expr::Kind::literal, line);
          e->b->value = Value(int64_t(std::stoll(cur().text)));
          next();
        } else {
          e->name = expect_name();
        }
        e->a = std::move(node);
        node = std::move(e);
      } else if (is_op("[")) {
        next();
        node = parse_subscript(std::move(node), line);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node, int line) {
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (!is_op("]")) {
      if (skip_op(":")) {
        is_slice = true;
        if (++part > 2) error("a slice takes at most three parts");
        continue;
      }
      if (parts[part]) error(fmt::format("expected ':' or ']', got {}", describe(cur())));
      if (is_op(",")) error("unsupported construct: tuple subscript");
      parts[part] = parse_expression(true);
    }
    next();
    if (!is_slice) {
      if (!parts[0]) error("empty subscript");
      auto e = make(Expr::Kind::item, line);
      e->a = std::move(node);
      e->b = std::move(parts[0]);
      return e;
    }
    auto e = make(Expr::Kind::slice, line);
    e->a = std::move(node);
    for (auto& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) error("unsupported construct: *args / **kwargs in a call");
      if (cur().type == Token::name && peek().type == Token::op && peek().text == "=") {
        std::string name = cur().text;
        next();
        next();
        e.keyword.emplace_back(name, parse_expression(true));
      } else {
        if (!e.keyword.empty()) error("positional argument after keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(Expr::Kind::call, cur().line);
    e->a = std::move(node);
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      int line = cur().line;
      if (is_op("|")) {
        next();
        auto e = make(Expr::Kind::filter, line);
        e->name = expect_name();
        if (!is_known_filter(e->name))
          fail("{} line {}: unsupported construct: filter '{}'", origin_, line, e->name);
        if (is_op("(")) parse_call_args(*e);
        e->a = std::move(node);
        node = std::move(e);
      } else if (is_name("is")) {
        next();
        auto e = make(Expr::Kind::test, line);
        e->negated = skip_name("not");
        e->name = expect_name();
        if (!is_known_test(e->name)) fail("{} line {}: unsupported construct: test '{}'", origin_, line, e->name);
        if (is_op("(")) {
          parse_call_args(*e);
        } else if ((cur().type == Token::name || cur().type == Token::string || cur().type == Token::integer ||
                    cur().type == Token::floating || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          e->args.push_back(parse_postfix(parse_primary()));
        }
        e->a = std::move(node);
        node = std::move(e);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  const std::string& origin_;
  int nesting_ = 0;            // statements and sub-expressions being parsed
  int expression_nodes_ = 0;   // nodes made since the statement or output began
};

}  // namespace

Body parse_template(const std::string& source, const std::string& origin) {
  // jinja2 normalises newlines and drops one trailing newline (keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  Parser parser(lex_template(src, origin), origin);
  return parser.parse();
}

}  // namespace mere::jinja

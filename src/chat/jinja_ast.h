// The syntax tree of a parsed template: what jinja_parser.cpp builds and jinja_render.cpp runs.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"

namespace mere::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    literal,    // value
    name,       // name
    list,       // args; name "tuple" for (a, b), which prints as Python prints a tuple
    dict,       // keyword: key expressions in args, values in args2
    attr,       // a.name
    item,       // a[b]
    slice,      // a[args[0]:args[1]:args[2]], null entries absent
    call,       // a(args, keyword)
    filter,     // a | name(args, keyword)
    test,       // a is [not] name(args)
    not_,       // not a
    neg,        // -a
    pos,        // +a
    binary,     // a op b: + - * / // % **
    concat,     // args joined with ~
    compare,    // args[0] ops[0] args[1] ops[1] args[2] ...
    and_,       // a and b
    or_,        // a or b
    cond,       // b if a else c (c may be null)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;  // name, attribute, filter, test, operator
  bool negated = false;
  ExprPtr a, b, c;
  std::vector<ExprPtr> args, args2;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  std::vector<std::string> ops;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind { text, output, if_, for_, set, set_block, macro, break_, continue_, scope };
  Kind kind;
  int line = 0;
  std::string text;                                   // text; macro name
  ExprPtr expr;                                       // output; set value; for iterable
  std::vector<std::pair<ExprPtr, Body>> branches;     // if / elif
  Body body, else_body;                               // for, if-else, set_block, macro, scope
  std::vector<std::string> targets;                   // for / set names (several: unpacking)
  std::string attr;                                   // set ns.attr: targets[0] is ns
  ExprPtr filter;                                     // for ... if filter
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters, default or null
};

// Parses Jinja source (already newline-normalised) into statements; errors name `origin`,
// the line and the construct.
Body parse_template(const std::string& source, const std::string& origin);

}  // namespace mere::jinja

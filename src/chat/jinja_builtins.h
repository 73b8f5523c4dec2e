// Filters, tests, attribute/item access and the string/dict methods templates call, with
// jinja2's (and Python's) results. Errors are EvalError; the renderer adds template and line.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "chat/jinja_value.h"
#include "core/error.h"

namespace mere::jinja {

bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);

Value apply_filter(const std::string& name, const Value& v, CallArgs& args);
bool apply_test(const std::string& name, const Value& v, const std::vector<Value>& args);
// obj.name(args) for str and dict methods; an unknown method is an error naming it.
Value call_method(const Value& obj, const std::string& name, CallArgs& args);

Value get_attr(const Value& obj, const std::string& name);  // obj.name
Value get_item(const Value& obj, const Value& key);          // obj[key]
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// The items a for loop visits: list items, dict keys, string characters; Undefined is empty.
List iterate(const Value& v);
// Throws Jinja's UndefinedError message when v is Undefined.
void require_defined(const Value& v);
bool py_less(const Value& a, const Value& b, const char* op);  // a < b, TypeError across types

}  // namespace mere::jinja

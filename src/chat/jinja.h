// A Jinja2 interpreter sized for chat templates: parse once, render many times, with the
// output of jinja2's ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks, loopcontrols)
// as transformers configures it.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <string>

#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace mere::jinja {

struct RenderOptions {
  // The clock behind strftime_now(); tests inject a fixed date so output is stable.
  std::function<std::tm()> now;
};

class Template {
 public:
  // Parses `source`; unsupported syntax is an error naming `origin`, the line and the construct.
  Template(const std::string& source, std::string origin);

  // Renders with `vars` as the template's variables (plus the globals namespace, range,
  // raise_exception, strftime_now). Errors name the origin, line and construct;
  // raise_exception(msg) gives an error whose message contains msg.
  std::string render(const Dict& vars, const RenderOptions& options) const;

  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
  std::shared_ptr<const Body> body_;
};

}  // namespace mere::jinja

#include "chat/chat_template.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace mere {
namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  MERE_CHECK(f, "cannot read {}", path.string());
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A special token is a string or an AddedToken object {"content": ...}; absent or null: unset.
std::optional<std::string> token_text(const nlohmann::ordered_json& config, const char* key,
                                      const std::filesystem::path& file) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  fail("{}: {} is neither a string nor an object with \"content\"", file.string(), key);
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, std::string origin)
    : source_(std::move(source)), template_(source_, std::move(origin)) {}

ChatTemplate ChatTemplate::from_string(std::string source, std::string origin) {
  return ChatTemplate(std::move(source), std::move(origin));
}

ChatTemplate ChatTemplate::from_file(const std::filesystem::path& path) {
  return ChatTemplate(read_text(path), path.string());
}

ChatTemplate ChatTemplate::from_tokenizer_config(const std::filesystem::path& dir_or_file, const std::string& name) {
  std::filesystem::path file = dir_or_file;
  if (std::filesystem::is_directory(file)) file /= "tokenizer_config.json";
  MERE_CHECK(std::filesystem::exists(file), "{} does not exist (expected a tokenizer directory or its tokenizer_config.json)",
             file.string());
  nlohmann::ordered_json config;
  try {
    config = nlohmann::ordered_json::parse(read_text(file));
  } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers past a double
    fail("{}: not valid JSON: {}", file.string(), e.what());
  }
  MERE_CHECK(config.is_object(), "{}: expected a JSON object", file.string());

  std::optional<std::string> source;
  std::string origin = file.string();
  std::vector<std::string> names;
  auto jinja_file = file.parent_path() / "chat_template.jinja";
  auto it = config.find("chat_template");
  if (name == "default" && std::filesystem::exists(jinja_file)) {
    source = read_text(jinja_file);
    origin = jinja_file.string();
  } else if (it != config.end() && it->is_string()) {
    MERE_CHECK(name == "default", "{}: chat_template is a single template; there is no template named '{}'",
               file.string(), name);
    source = it->get<std::string>();
  } else if (it != config.end() && it->is_array()) {
    for (const auto& t : *it) {
      MERE_CHECK(t.is_object() && t.contains("name") && t.contains("template") && t["name"].is_string() &&
                     t["template"].is_string(),
                 "{}: chat_template list entries must be {{\"name\": ..., \"template\": ...}}", file.string());
      names.push_back(t["name"].get<std::string>());
      if (names.back() == name) source = t["template"].get<std::string>();
    }
    MERE_CHECK(source, "{}: no chat_template named '{}' (it has: {})", file.string(), name, fmt::join(names, ", "));
    origin += " (chat_template '" + name + "')";
  } else {
    MERE_CHECK(it == config.end() || it->is_null(), "{}: chat_template must be a string or a list", file.string());
    fail("{} has no chat_template; pass --chat-template FILE", file.string());
  }
  ChatTemplate t(std::move(*source), origin);
  t.names_ = std::move(names);
  t.bos_ = token_text(config, "bos_token", file);
  t.eos_ = token_text(config, "eos_token", file);
  return t;
}

void ChatTemplate::set_special_tokens(std::string bos, std::string eos) {
  bos_ = std::move(bos);
  eos_ = std::move(eos);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt, const nlohmann::ordered_json& extra) const {
  MERE_CHECK(messages.is_array(), "chat messages must be a JSON array, got {}", messages.type_name());
  MERE_CHECK(tools.is_null() || tools.is_array(), "tools must be a JSON array or null, got {}", tools.type_name());
  MERE_CHECK(extra.is_object(), "extra template variables must be a JSON object, got {}", extra.type_name());
  // The variables transformers passes: messages, tools, documents, add_generation_prompt,
  // the special tokens that are set, then the caller's kwargs.
  jinja::Dict vars;
  vars.set("messages", jinja::Value::from_json(messages));
  vars.set("tools", jinja::Value::from_json(tools));
  vars.set("documents", jinja::Value(nullptr));
  vars.set("add_generation_prompt", jinja::Value(add_generation_prompt));
  if (bos_) vars.set("bos_token", jinja::Value(*bos_));
  if (eos_) vars.set("eos_token", jinja::Value(*eos_));
  for (const auto& [k, v] : extra.items()) vars.set(k, jinja::Value::from_json(v));
  return template_.render(vars, options_);
}

}  // namespace mere

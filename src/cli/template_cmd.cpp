// mere text template: print the prompt a model's chat template makes of a conversation,
// exactly (no trailing newline added), for scripts and for checking against transformers.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "chat/chat_template.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"

namespace mere {
namespace {

struct TemplateFlags {
  std::string model, messages, tools, chat_template, template_name = "default";
  std::vector<std::string> sets;
  bool no_generation_prompt = false;
};

nlohmann::ordered_json read_json_file(const std::string& path, const char* flag) {
  std::ifstream f(path, std::ios::binary);
  MERE_CHECK(f, "{} {}: cannot read the file", flag, path);
  std::stringstream s;
  s << f.rdbuf();
  try {
    return nlohmann::ordered_json::parse(s.str());
  } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers past a double
    fail("{} {}: not valid JSON: {}", flag, path, e.what());
  }
}

void run_template(const TemplateFlags& f) {
  std::filesystem::path dir;
  if (!f.model.empty() || f.chat_template.empty()) dir = resolve_model_dir(f.model);
  auto config = std::filesystem::is_directory(dir) ? dir / "tokenizer_config.json" : dir;

  std::unique_ptr<ChatTemplate> tmpl;
  if (!f.chat_template.empty()) {
    tmpl = std::make_unique<ChatTemplate>(ChatTemplate::from_file(f.chat_template));
    if (!dir.empty() && std::filesystem::exists(config)) {
      // The special tokens still come from the model's tokenizer_config.json.
      auto j = read_json_file(config.string(), "-m");
      auto text = [&](const char* key) -> std::string {
        if (!j.contains(key) || j[key].is_null()) return "";
        if (j[key].is_object()) return j[key].value("content", "");
        return j[key].is_string() ? j[key].get<std::string>() : "";
      };
      tmpl->set_special_tokens(text("bos_token"), text("eos_token"));
    }
  } else {
    tmpl = std::make_unique<ChatTemplate>(ChatTemplate::from_tokenizer_config(dir, f.template_name));
  }

  nlohmann::ordered_json messages = read_json_file(f.messages, "--messages"), tools = nullptr;
  if (messages.is_object()) {  // an OpenAI-style request body: {"messages": [...], "tools": [...]}
    if (messages.contains("tools")) tools = messages["tools"];
    MERE_CHECK(messages.contains("messages"), "--messages {}: an object needs a \"messages\" array", f.messages);
    messages = nlohmann::ordered_json(messages["messages"]);
  }
  MERE_CHECK(messages.is_array(), "--messages {}: expected a JSON array of messages", f.messages);
  if (!f.tools.empty()) tools = read_json_file(f.tools, "--tools");
  MERE_CHECK(tools.is_null() || tools.is_array(), "--tools {}: expected a JSON array of tool definitions", f.tools);

  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  for (const std::string& s : f.sets) {
    size_t eq = s.find('=');
    MERE_CHECK(eq != std::string::npos && eq > 0, "--set {}: expected NAME=JSON", s);
    std::string name = s.substr(0, eq), value = s.substr(eq + 1);
    try {
      extra[name] = nlohmann::ordered_json::parse(value);
    } catch (const nlohmann::json::exception&) {
      fail("--set {}: '{}' is not JSON (a string needs quotes: {}='\"text\"')", s, value, name);
    }
  }
  std::string prompt = tmpl->render(messages, tools, !f.no_generation_prompt, extra);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

void add_template_command(CLI::App& text) {
  auto flags = std::make_shared<TemplateFlags>();
  CLI::App* cmd = text.add_subcommand("template", "Print the prompt the chat template makes of a conversation");
  cmd->add_option("-m,--model", flags->model,
                  "Model or tokenizer directory with tokenizer_config.json (default: the embedded demo model)");
  cmd->add_option("--messages", flags->messages,
                  "JSON file: an array of {role, content, ...} messages, or {\"messages\": [...], \"tools\": [...]}")
      ->required();
  cmd->add_option("--tools", flags->tools, "JSON file: an array of tool (function) definitions");
  cmd->add_flag("--no-generation-prompt", flags->no_generation_prompt,
                "Do not end with the assistant turn's opening (add_generation_prompt=false)");
  cmd->add_option("--set", flags->sets, "Template variable NAME=JSON, e.g. enable_thinking=false (repeatable)");
  cmd->add_option("--chat-template", flags->chat_template, "Jinja file to use instead of the model's chat_template");
  cmd->add_option("--template-name", flags->template_name,
                  "Which template when tokenizer_config.json holds several (default: default)");
  cmd->callback([flags] { run_template(*flags); });
}

}  // namespace mere

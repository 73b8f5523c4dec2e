// Chat templates: the Jinja `chat_template` of a tokenizer_config.json rendered the way
// transformers' apply_chat_template does, byte for byte.
#pragma once

#include <nlohmann/json.hpp>

#include <ctime>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "chat/jinja.h"

namespace mere {

class ChatTemplate {
 public:
  // Reads dir/tokenizer_config.json (or the file given): its chat_template (a string, or a
  // list of {name, template} from which `name` is taken) and bos/eos tokens. A
  // chat_template.jinja beside it wins, as in transformers. No template is an error that
  // says to pass --chat-template FILE.
  static ChatTemplate from_tokenizer_config(const std::filesystem::path& dir_or_file,
                                            const std::string& name = "default");
  static ChatTemplate from_string(std::string source, std::string origin);
  // A template file given on the command line: Jinja text.
  static ChatTemplate from_file(const std::filesystem::path& path);

  // messages: JSON array of {role, content, ...}; tools: JSON array or null; extra: object
  // of further template variables (enable_thinking, ...), which override the others.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  void set_special_tokens(std::string bos, std::string eos);
  // Tests fix strftime_now()'s date; by default it reads the local clock.
  void set_clock(std::function<std::tm()> now) { options_.now = std::move(now); }

  const std::vector<std::string>& template_names() const { return names_; }  // from the config's list form
  const std::string& source() const { return source_; }

 private:
  ChatTemplate(std::string source, std::string origin);

  std::string source_;
  jinja::Template template_;
  std::optional<std::string> bos_, eos_;
  std::vector<std::string> names_;
  jinja::RenderOptions options_;
};

}  // namespace mere

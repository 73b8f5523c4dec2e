// Chat templates of real tokenizer_config.json files against Python Jinja2 renderings
// (tests/chat/refs/*.json, made by scripts/make_template_refs.py from tests/chat/conversations.json).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "chat/chat_template.h"
#include "core/error.h"
#include "test_util.h"

namespace mere {
namespace {

using nlohmann::ordered_json;

const char* kTemplates[] = {"qwen3", "llama3", "deepseek_v3", "gemma3"};

std::filesystem::path npm_dir(const std::string& name) { return test::source_dir() / "third_party" / "npm" / name; }

ordered_json read_json(const std::filesystem::path& path) {
  return ordered_json::parse(test::read_file(path));
}

// The date scripts/make_template_refs.py gives strftime_now().
std::tm fixed_now() {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 10;
  tm.tm_mday = 29;
  tm.tm_hour = 14;
  tm.tm_min = 5;
  tm.tm_sec = 9;
  tm.tm_yday = 332;
  return tm;
}

ChatTemplate load(const std::string& name) {
  if (!std::filesystem::exists(npm_dir(name) / "tokenizer_config.json"))
    throw Error(npm_dir(name).string() + "/tokenizer_config.json is missing: run scripts/setup.sh");
  ChatTemplate t = ChatTemplate::from_tokenizer_config(npm_dir(name));
  t.set_clock(fixed_now);
  return t;
}

const ordered_json& conversation(const ordered_json& all, const std::string& name) {
  for (const auto& c : all)
    if (c["name"] == name) return c;
  throw Error("conversations.json has no conversation " + name);
}

TEST(ChatTemplate, RealTemplatesMatchPythonJinja2) {
  auto conversations = read_json(test::source_dir() / "tests" / "chat" / "conversations.json");
  for (const char* name : kTemplates) {
    ASSERT_TRUE(std::filesystem::exists(npm_dir(name) / "tokenizer_config.json"))
        << npm_dir(name) << " is missing: run scripts/setup.sh (or scripts/fetch_tokenizers.sh)";
    auto refs = read_json(test::source_dir() / "tests" / "chat" / "refs" / (std::string(name) + ".json"));
    ChatTemplate tmpl = load(name);
    int rendered = 0, identical = 0, raising = 0, raised_alike = 0;
    for (const auto& ref : refs["cases"]) {
      std::string conv_name = ref["conversation"];
      SCOPED_TRACE(std::string(name) + " / " + conv_name);
      const ordered_json& c = conversation(conversations, conv_name);
      std::string got, error;
      try {
        got = tmpl.render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(), c["extra"]);
      } catch (const Error& e) {
        error = e.what();
      }
      if (ref.contains("output")) {
        ++rendered;
        EXPECT_EQ(error, "") << "Python rendered it";
        EXPECT_EQ(got, ref["output"].get<std::string>());
        identical += error.empty() && got == ref["output"].get<std::string>();
      } else {
        ++raising;
        std::string want = ref["error"];
        // raise_exception messages must match; Python's TypeError/UndefinedError texts we
        // mirror where we can, but only require that we fail too.
        bool alike = !error.empty() &&
                     (ref["error_type"] != "TemplateError" || error.find(want) != std::string::npos);
        EXPECT_TRUE(alike) << "Python raised " << ref["error_type"].get<std::string>() << ": " << want
                           << "\nwe gave: " << (error.empty() ? "(no error) " + got : error);
        raised_alike += alike;
      }
    }
    std::printf("%s: %d/%d identical, %d/%d raise as in Python\n", name, identical, rendered, raised_alike, raising);
    EXPECT_GE(rendered, 20);
  }
}

TEST(ChatTemplate, RaisingTemplateGivesItsMessage) {
  ChatTemplate gemma = load("gemma3");
  ordered_json messages = ordered_json::parse(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  try {
    gemma.render(messages, nullptr, true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Conversation roles must alternate user/assistant/user/assistant/..."),
              std::string::npos)
        << e.what();
  }
}

TEST(ChatTemplate, MissingTemplateIsAClearError) {
  for (const char* name : {"llama2", "gptoss"}) {
    auto file = npm_dir(name) / "tokenizer_config.json";
    ASSERT_TRUE(std::filesystem::exists(file)) << file << " is missing: run scripts/setup.sh";
    try {
      ChatTemplate::from_tokenizer_config(npm_dir(name));
      FAIL() << name << ": expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), file.string() + " has no chat_template; pass --chat-template FILE");
    }
  }
}

TEST(ChatTemplate, NamedTemplatesFromAList) {
  auto dir = test::temp_dir("named");
  test::write_file(dir / "tokenizer_config.json", R"({
    "bos_token": {"content": "<s>", "lstrip": false},
    "eos_token": "</s>",
    "chat_template": [
      {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"},
      {"name": "tool_use", "template": "{{ tools | length }} tools"}
    ]})");
  ordered_json messages = ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  ChatTemplate t = ChatTemplate::from_tokenizer_config(dir);
  EXPECT_EQ(t.render(messages, nullptr, false), "<s>hi</s>");
  EXPECT_EQ(t.template_names(), (std::vector<std::string>{"default", "tool_use"}));
  ChatTemplate tools = ChatTemplate::from_tokenizer_config(dir / "tokenizer_config.json", "tool_use");
  EXPECT_EQ(tools.render(messages, ordered_json::parse("[1, 2]"), false), "2 tools");
  try {
    ChatTemplate::from_tokenizer_config(dir, "rag");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no chat_template named 'rag' (it has: default, tool_use)"), std::string::npos)
        << e.what();
  }
}

TEST(ChatTemplate, ParseErrorNamesTheFileAndLine) {
  try {
    ChatTemplate::from_string("{% for m in messages %}\n{{ m.content|wordcount }}\n{% endfor %}", "my.jinja");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("my.jinja line 2: unsupported construct: filter 'wordcount'"),
              std::string::npos)
        << e.what();
  }
}

TEST(ChatTemplate, CliRendersLikePython) {
  auto conversations = read_json(test::source_dir() / "tests" / "chat" / "conversations.json");
  auto refs = read_json(test::source_dir() / "tests" / "chat" / "refs" / "qwen3.json");
  const ordered_json& c = conversation(conversations, "tool_call_dict_args");
  std::string want;
  for (const auto& r : refs["cases"])
    if (r["conversation"] == "tool_call_dict_args") want = r["output"];
  ASSERT_FALSE(want.empty());
  auto dir = test::temp_dir("cli");
  test::write_file(dir / "messages.json", c["messages"].dump());
  test::write_file(dir / "tools.json", c["tools"].dump());
  auto r = test::run_mere("text template -m " + npm_dir("qwen3").string() + " --messages " +
                          (dir / "messages.json").string() + " --tools " + (dir / "tools.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, want);

  // --no-generation-prompt and --set enable_thinking=false
  const ordered_json& u = conversation(conversations, "enable_thinking_false_no_gen");
  test::write_file(dir / "hi.json", u["messages"].dump());
  refs = read_json(test::source_dir() / "tests" / "chat" / "refs" / "qwen3.json");
  for (const auto& ref : refs["cases"])
    if (ref["conversation"] == "enable_thinking_false_no_gen") want = ref["output"];
  r = test::run_mere("text template -m " + npm_dir("qwen3").string() + " --messages " + (dir / "hi.json").string() +
                     " --no-generation-prompt --set enable_thinking=false");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, want);

  r = test::run_mere("text template -m " + npm_dir("llama2").string() + " --messages " + (dir / "hi.json").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("has no chat_template; pass --chat-template FILE"), std::string::npos) << r.err;

  test::write_file(dir / "t.jinja", "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}{{ eos_token }}\n");
  r = test::run_mere("text template -m " + npm_dir("llama2").string() + " --chat-template " +
                     (dir / "t.jinja").string() + " --messages " + (dir / "hi.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[user] Hello! Who are you?</s>");
}

}  // namespace
}  // namespace mere

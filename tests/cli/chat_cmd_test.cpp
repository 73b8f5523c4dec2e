// mere text chat end to end: one turn with --prompt (against the library's own greedy
// path), the interactive loop on stdin (/reset, /exit, EOF, errors), reasoning
// switches, stop strings, chat templates for the fixtures, and Ctrl-C.
#include <gtest/gtest.h>

#include <cstdlib>

#include "chat/chat_template.h"
#include "chat/turn_stops.h"
#include "engine/generate.h"
#include "io/config.h"
#include "models/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mere {
namespace {

namespace fs = std::filesystem;

fs::path demo_dir() { return test::source_dir() / "models" / "demo"; }

// Runs `mere text chat ARGS` with `input` on stdin.
test::CommandResult chat_with_input(const std::string& args, const std::string& input) {
  auto in = test::temp_dir("stdin") / "input.txt";
  test::write_file(in, input);
  return test::run_mere("text chat " + args + " < " + in.string());
}

// The rendered prompts --show-prompt printed, in order.
std::vector<std::string> prompts(const std::string& err) {
  std::vector<std::string> out;
  const std::string open = "[prompt]\n", close = "\n[/prompt]";
  for (size_t at = err.find(open); at != std::string::npos; at = err.find(open, at + 1)) {
    size_t end = err.find(close, at);
    out.push_back(err.substr(at + open.size(), end - at - open.size()));
  }
  return out;
}

// A ChatML template that, like Qwen3's, reads enable_thinking.
const char* kThinkingTemplate =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}";

TEST(ChatCmd, OneTurnMatchesTheLibrarysGreedyAnswer) {
  auto r = test::run_mere("text chat --temperature 0 --prompt Hello -n 16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"prefill:", "decode:", "tok/s", "stop:"}) EXPECT_NE(r.err.find(s), std::string::npos) << r.err;

  // The same turn by hand: template, tokens without added specials, greedy, end-of-turn stops.
  ChatTemplate tmpl = ChatTemplate::from_tokenizer_config(demo_dir());
  Tokenizer tokenizer = Tokenizer::load(demo_dir());
  auto model = load_model(demo_dir());
  std::string prompt = tmpl.render(nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hello"}])"),
                                   nullptr, true);
  EXPECT_EQ(prompt, "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
  GenerateOptions options;
  options.max_new_tokens = 16;
  options.sampling.temperature = 0;
  options.eos_ids = chat_stop_ids(tokenizer, GenerationConfig::load(demo_dir()).eos_token_ids);
  std::vector<int32_t> ids;
  generate(*model, tokenizer.encode(prompt, false), options, [&](int32_t id) {
    ids.push_back(id);
    return true;
  });
  EXPECT_EQ(r.out, tokenizer.decode(ids, /*skip_special_tokens=*/true) + "\n");
}

TEST(ChatCmd, RegisteredNameAndTheScriptableForm) {
  auto config = test::temp_dir("config");
  std::string env = "MERE_CONFIG_DIR=" + config.string() + " ";
  auto add = std::system((env + MERE_BINARY + " model add demo " + demo_dir().string() + " >/dev/null").c_str());
  ASSERT_EQ(add, 0);
  auto by_path = test::run_mere("text chat --model " + demo_dir().string() + " --temperature 0 --prompt 'Hi there' -n 12");
  ASSERT_EQ(by_path.exit_code, 0) << by_path.err;
  auto out = test::temp_dir("named") / "out.txt";
  ASSERT_EQ(std::system((env + MERE_BINARY + " text chat --model demo --temperature 0 --prompt 'Hi there' -n 12 > " +
                         out.string() + " 2>/dev/null").c_str()),
            0);
  EXPECT_EQ(test::read_file(out), by_path.out);
}

TEST(ChatCmd, InteractiveHistoryAndReset) {
  const std::string flags = "--temperature 0 -n 6 --show-prompt --system 'Be brief.'";
  auto r = chat_with_input(flags, "Hi\nHello\n/exit\nnever read\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto p = prompts(r.err);
  ASSERT_EQ(p.size(), 2u) << r.err;
  EXPECT_EQ(p[0], "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // The second turn carries the first, answer included.
  EXPECT_EQ(p[1].rfind(p[0], 0), 0u) << p[1];
  EXPECT_NE(p[1].find("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"), std::string::npos);
  EXPECT_EQ(r.err.find("never read"), std::string::npos);

  // The second turn reuses the first turn's K/V (prefix_cache, the CPU).
  EXPECT_NE(r.err.find("reused"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("(0 reused)", r.err.find("(0 reused)") + 1), std::string::npos) << r.err;

  r = chat_with_input(flags, "Hi\n/reset\nHello\n");  // EOF ends the chat like /exit
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("(conversation cleared)"), std::string::npos);
  p = prompts(r.err);
  ASSERT_EQ(p.size(), 2u) << r.err;
  EXPECT_EQ(p[1], "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")
      << "/reset keeps the system prompt and drops the rest";
}

TEST(ChatCmd, InteractiveErrorsDoNotEndTheChat) {
  std::string long_line;
  for (int i = 0; i < 1500; ++i) long_line += "word ";
  auto r = chat_with_input("--temperature 0 -n 4 --show-prompt", "/help\n" + long_line + "\n\nHello\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("unknown command /help"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the model's context holds 1024: /reset starts over"), std::string::npos) << r.err;
  auto p = prompts(r.err);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[1], "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n") << "the failed turn is dropped";
}

TEST(ChatCmd, StopStringsEndTheAnswer) {
  auto full = test::run_mere("text chat --temperature 0 -p Hello -n 24");
  ASSERT_EQ(full.exit_code, 0) << full.err;
  std::string answer = full.out.substr(0, full.out.size() - 1);
  ASSERT_GT(answer.size(), 8u) << answer;
  std::string stop = answer.substr(answer.size() / 2, 3);
  std::string quoted = "'" + stop + "'";
  ASSERT_EQ(stop.find('\''), std::string::npos);
  auto r = test::run_mere("text chat --temperature 0 -p Hello -n 24 --stop " + quoted);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, answer.substr(0, answer.find(stop)) + "\n");
  EXPECT_NE(r.err.find("stop: stop"), std::string::npos) << r.err;
}

TEST(ChatCmd, ReasoningSwitches) {
  auto r = test::run_mere("text chat -p Hi --reasoning off");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("this model's chat template has no enable_thinking switch"), std::string::npos) << r.err;
  r = test::run_mere("text chat -p Hi --reasoning loud");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--reasoning"), std::string::npos) << r.err;

  auto tmpl = test::temp_dir("tmpl") / "thinking.jinja";
  test::write_file(tmpl, kThinkingTemplate);
  const std::string base = "text chat --temperature 0 -n 4 -p Hi --show-prompt --chat-template " + tmpl.string();
  r = test::run_mere(base + " --reasoning off");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(prompts(r.err).at(0), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  for (const char* mode : {"show", "hide"}) {
    r = test::run_mere(base + " --reasoning " + mode);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(prompts(r.err).at(0), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n") << mode;
  }
}

TEST(ChatCmd, FixturesNeedAndTakeAChatTemplate) {
  auto tmpl = test::temp_dir("tmpl") / "chatml.jinja";
  test::write_file(tmpl, kThinkingTemplate);
  for (const char* family : {"llama", "qwen2", "qwen3"}) {
    std::string dir = (test::fixtures_dir() / family).string();
    auto r = test::run_mere("text chat -m " + dir + " -p Hi -n 4");
    EXPECT_EQ(r.exit_code, 1) << family;
    EXPECT_NE(r.err.find("--chat-template"), std::string::npos) << r.err;
    r = chat_with_input("-m " + dir + " --temperature 0 -n 4 --chat-template " + tmpl.string(), "Hi\nAgain\n");
    EXPECT_EQ(r.exit_code, 0) << family << r.err;
    EXPECT_NE(r.err.find("prefill:"), std::string::npos) << r.err;
  }
}

// Ctrl-C during an answer stops that answer, not the program; at the prompt the second
// one in a row quits. The script waits for the answer to start streaming first.
TEST(ChatCmd, CtrlCStopsTheAnswerNotTheProgram) {
  auto dir = test::temp_dir("sigint");
  std::string d = dir.string();
  // The writer keeps the fifo open, so only Ctrl-C can end the chat; if it does not,
  // closing the fifo ends it and `alive` records the failure.
  std::string script = "cd " + d + " && mkfifo in\n" + MERE_BINARY +
                       " text chat --temperature 0 -n 100000 --device cpu < in > out 2> err &\n"
                       "pid=$!\n"
                       "exec 3> in\n"
                       "printf 'Write a long story\\n' >&3\n"
                       "for i in $(seq 250); do [ -s out ] && break; sleep 0.02; done\n"
                       "kill -INT $pid; sleep 0.5; kill -INT $pid; sleep 0.2; kill -INT $pid; sleep 0.5\n"
                       "kill -0 $pid 2>/dev/null && echo alive > alive\n"
                       "exec 3>&-\n"
                       "wait $pid; echo $? > rc\n";
  test::write_file(dir / "run.sh", script);
  ASSERT_EQ(std::system(("sh " + d + "/run.sh").c_str()), 0);
  std::string err = test::read_file(dir / "err");
  EXPECT_EQ(test::read_file(dir / "rc"), "0\n") << err;
  EXPECT_FALSE(fs::exists(dir / "alive")) << "two Ctrl-C at the prompt did not quit\n" << err;
  EXPECT_NE(err.find("[answer stopped by Ctrl-C]"), std::string::npos) << err;
  EXPECT_NE(err.find("stop: interrupted"), std::string::npos) << err;
  EXPECT_NE(err.find("(Ctrl-C again, /exit or Ctrl-D quits)"), std::string::npos) << err;
}

}  // namespace
}  // namespace mere

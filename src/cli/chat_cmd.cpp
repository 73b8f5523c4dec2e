// mere text chat: a multi-turn conversation in the terminal (turns read from stdin,
// answers streamed to stdout), or one turn with --prompt for scripts.
//
// Each turn renders the whole conversation with the model's chat template; with
// the prefix_cache lever the turn reuses the K/V of the conversation so far and
// prefills only what is new (on the CPU bit-identically to a prefill from
// scratch; on CUDA the same tokens).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "chat/chat_template.h"
#include "chat/reasoning_filter.h"
#include "chat/turn_stops.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/levers.h"
#include "core/device.h"
#include "core/error.h"
#include "engine/generate.h"
#include "engine/text_stream.h"
#include "io/config.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace mere {
namespace {

// The share of the GPU's free memory a conversation's K/V pool may take (the
// pool is allocated whole on CUDA; the model's context caps it first).
constexpr double kChatPoolMemoryFraction = 0.5;

struct ChatFlags {
  std::string model, system, prompt, device = "auto", chat_template, template_name = "default", reasoning = "show";
  std::vector<std::string> stops;
  int max_new_tokens = 512, threads = 0;
  SamplingFlags sampling;
  RuntimeFlags runtime;
  bool show_prompt = false;
};

// Ctrl-C count since the last reset: during an answer it stops the answer; at the
// prompt the second one in a row quits.
std::atomic<int> g_interrupts{0};

void on_sigint(int) { g_interrupts.fetch_add(1); }

void install_sigint_handler() {
  struct sigaction sa = {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a read() waiting at the prompt returns EINTR
  sigaction(SIGINT, &sa, nullptr);
}

enum class LineRead { line, eof, interrupted };

// One line from stdin (without the newline). Reads fd 0 directly, so that Ctrl-C at
// the prompt interrupts the read instead of leaving std::cin in a failed state.
LineRead read_line(std::string& line) {
  static std::string buffered;
  for (;;) {
    size_t nl = buffered.find('\n');
    if (nl != std::string::npos) {
      line = buffered.substr(0, nl);
      buffered.erase(0, nl + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return LineRead::line;
    }
    char chunk[4096];
    ssize_t n = ::read(0, chunk, sizeof chunk);
    if (n > 0) {
      buffered.append(chunk, size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) {
      if (g_interrupts.load() > 0) return LineRead::interrupted;
      continue;
    }
    MERE_CHECK(n == 0, "cannot read stdin: {}", std::strerror(errno));
    if (buffered.empty()) return LineRead::eof;
    line = std::move(buffered);  // a last line without a newline still counts
    buffered.clear();
    return LineRead::line;
  }
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

class ChatSession {
 public:
  explicit ChatSession(const ChatFlags& f)
      : flags_(f),
        resolved_(resolve_model(f.model)),
        tokenizer_(Tokenizer::load(resolved_.dir)),
        template_(load_template()) {
    MERE_CHECK(f.reasoning == "show" || f.reasoning == "hide" || f.reasoning == "off",
               "--reasoning {}: expected show, hide or off", f.reasoning);
    if (f.reasoning == "off") {
      // Only a template that reads enable_thinking can turn reasoning off; anything
      // else would ignore the switch and think anyway.
      MERE_CHECK(template_.source().find("enable_thinking") != std::string::npos,
                 "--reasoning off: this model's chat template has no enable_thinking switch (use show or hide)");
      extra_["enable_thinking"] = false;
    }
    Device device = resolve_device(f.device);
    options_.kv_cache_mode = effective_runtime(resolved_, f.runtime, device).kv_cache_mode;
    GenerationConfig gen = GenerationConfig::load(resolved_.dir);
    options_.sampling = sampling_from(f.sampling, gen);  // its errors before the model loads
    model_ = load_model(resolved_.dir, device, Levers::from_env().load_options(device));
    options_.max_new_tokens = f.max_new_tokens;
    options_.eos_ids = chat_stop_ids(tokenizer_, gen.eos_token_ids);
    if (options_.levers.prefix_cache) {
      // One pool for the conversation: the model's context, and on CUDA (where a
      // pool is allocated whole) at most half the free memory.
      const KvLayout layout = model_->kv_layout(options_.kv_cache_mode);
      int64_t blocks = BlockPool::blocks_for_tokens(model_->info().max_positions);
      if (device == Device::cuda)
        blocks = std::min(blocks,
                          BlockPool::blocks_for_memory(kChatPoolMemoryFraction, device_bytes_available(), layout));
      prefix_cache_ = std::make_unique<PrefixCache>(std::make_shared<BlockPool>(layout, blocks));
      options_.prefix_cache = prefix_cache_.get();
    }
    reset();
  }

  // Clears the conversation, keeping the system prompt.
  void reset() {
    messages_ = nlohmann::ordered_json::array();
    if (!flags_.system.empty()) messages_.push_back({{"role", "system"}, {"content", flags_.system}});
  }

  // Renders the conversation plus `text`, streams the answer to stdout and keeps both
  // in the history. On an error the user's message is dropped again.
  void answer(const std::string& text) {
    messages_.push_back({{"role", "user"}, {"content", text}});
    try {
      answer_last();
    } catch (...) {
      messages_.erase(messages_.end() - 1);
      throw;
    }
  }

  const std::string& model_name() const { return flags_.model.empty() ? kDemo : flags_.model; }

 private:
  inline static const std::string kDemo = "the demo model";

  ChatTemplate load_template() const {
    if (flags_.chat_template.empty()) return ChatTemplate::from_tokenizer_config(resolved_.dir, flags_.template_name);
    ChatTemplate t = ChatTemplate::from_file(flags_.chat_template);
    // bos_token and eos_token in the template still name the model's own.
    auto text = [&](std::optional<int32_t> id) { return id ? tokenizer_.id_to_token(*id) : std::string(); };
    t.set_special_tokens(text(tokenizer_.bos_id()), text(tokenizer_.eos_id()));
    return t;
  }

  void answer_last() {
    std::string prompt = template_.render(messages_, nullptr, /*add_generation_prompt=*/true, extra_);
    if (flags_.show_prompt) std::fprintf(stderr, "[prompt]\n%s\n[/prompt]\n", prompt.c_str());
    // The template writes BOS itself where the model wants one, as apply_chat_template
    // assumes when it tokenizes with add_special_tokens=False.
    std::vector<int32_t> ids = tokenizer_.encode(prompt, /*add_special_tokens=*/false);
    MERE_CHECK(!ids.empty(), "the chat template rendered an empty prompt");
    const int64_t context = model_->info().max_positions;
    MERE_CHECK(int64_t(ids.size()) < context,
               "the conversation is {} tokens and the model's context holds {}: /reset starts over", ids.size(),
               context);
    if (prefix_cache_) {
      const int64_t pool = prefix_cache_->pool()->capacity_tokens();
      MERE_CHECK(int64_t(ids.size()) < pool,
                 "the conversation is {} tokens and its K/V pool holds {} (at most half the GPU's free memory): "
                 "/reset starts over",
                 ids.size(), pool);
    }

    const bool hide = flags_.reasoning == "hide";
    TextStream stream(tokenizer_, flags_.stops);
    ReasoningFilter filter(ends_inside_reasoning(prompt));
    std::string reply;
    auto show = [&](const std::string& piece) {
      reply += piece;
      std::string visible = hide ? filter.push(piece) : piece;
      std::fputs(visible.c_str(), stdout);
      std::fflush(stdout);
    };
    g_interrupts = 0;
    GenerateStats stats = generate(*model_, ids, options_, [&](int32_t id) {
      if (g_interrupts.load() > 0) return false;
      show(stream.push(id));
      return !stream.is_stopped();
    });
    show(stream.finish());
    if (hide) std::fputs(filter.finish().c_str(), stdout);
    std::fputs("\n", stdout);
    std::fflush(stdout);
    bool interrupted = g_interrupts.load() > 0;
    // A stopped answer stays in the history as far as it got.
    messages_.push_back({{"role", "assistant"}, {"content", strip_reasoning(reply)}});
    std::fprintf(stderr,
                 "%sprefill: %lld tokens (%lld reused), %.1f tok/s | %s | time to first token: %.1f ms | stop: %s\n",
                 interrupted ? "[answer stopped by Ctrl-C] " : "", (long long)stats.prompt_tokens,
                 (long long)stats.reused_prefix_tokens, stats.prefill_tok_s(),
                 decode_summary(stats.generated_tokens, stats.decode_tok_s()).c_str(), stats.ttft_ms,
                 interrupted ? "interrupted" : stats.stop_reason.c_str());
  }

  ChatFlags flags_;
  ResolvedModel resolved_;
  Tokenizer tokenizer_;
  ChatTemplate template_;
  nlohmann::ordered_json extra_ = nlohmann::ordered_json::object();
  std::unique_ptr<Model> model_;
  std::unique_ptr<PrefixCache> prefix_cache_;  // outlives every turn's state
  GenerateOptions options_;
  nlohmann::ordered_json messages_;
};

void run_interactive(ChatSession& session) {
  install_sigint_handler();
  const bool tty = isatty(0) && isatty(1);
  if (tty)
    std::fprintf(stderr, "chat with %s: /reset clears the conversation, /exit or Ctrl-D quits, Ctrl-C stops an answer\n",
                 session.model_name().c_str());
  for (;;) {
    g_interrupts = 0;
    std::string line;
    LineRead got;
    for (;;) {
      if (tty) {
        std::fputs("> ", stdout);
        std::fflush(stdout);
      }
      got = read_line(line);
      if (got != LineRead::interrupted) break;
      if (g_interrupts.load() >= 2) {
        std::fputs("\n", stderr);
        return;
      }
      std::fputs("\n(Ctrl-C again, /exit or Ctrl-D quits)\n", stderr);
    }
    if (got == LineRead::eof) {
      if (tty) std::fputs("\n", stdout);
      return;
    }
    line = trim(line);
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") return;
    if (line == "/reset") {
      session.reset();
      std::fputs("(conversation cleared)\n", stderr);
      continue;
    }
    if (line[0] == '/') {
      std::fprintf(stderr, "unknown command %s: /reset clears the conversation, /exit quits\n", line.c_str());
      continue;
    }
    try {
      session.answer(line);
    } catch (const Error& e) {  // one failed turn (say, the context is full) does not end the chat
      std::fflush(stdout);
      std::fprintf(stderr, "mere: error: %s\n", e.what());
    }
  }
}

void run_chat(const ChatFlags& f) {
  apply_threads(f.threads);
  ChatSession session(f);
  if (!f.prompt.empty()) {
    session.answer(f.prompt);
    return;
  }
  run_interactive(session);
}

}  // namespace

void add_chat_command(CLI::App& text) {
  auto f = std::make_shared<ChatFlags>();
  CLI::App* cmd = text.add_subcommand(
      "chat", "Chat with a model: turns typed (or piped) on stdin, or one turn with --prompt; /reset, /exit");
  cmd->add_option("-m,--model", f->model, kModelFlagHelp);
  cmd->add_option("-p,--prompt", f->prompt, "Answer this one message and exit");
  cmd->add_option("--system", f->system, "System prompt, kept across /reset");
  cmd->add_option("-n,--max-tokens", f->max_new_tokens, "Tokens per answer at most (default: 512)")->check(CLI::NonNegativeNumber);
  add_sampling_options(*cmd, f->sampling);
  cmd->add_option("--stop", f->stops, "End the answer when this string appears (repeatable)");
  cmd->add_option("--reasoning", f->reasoning,
                  "Reasoning (<think>) text: show, hide (generated but not printed) or off (the template's "
                  "enable_thinking=false) (default: show)")
      ->check(CLI::IsMember({"show", "hide", "off"}));
  cmd->add_option("--chat-template", f->chat_template, "Jinja file to use instead of the model's chat_template");
  cmd->add_option("--template-name", f->template_name,
                  "Which template when tokenizer_config.json holds several (default: default)");
  cmd->add_flag("--show-prompt", f->show_prompt, "Print each rendered prompt to stderr (for debugging templates)");
  add_runtime_options(*cmd, f->runtime);
  add_threads_option(*cmd, f->threads);
  add_device_option(*cmd, f->device);
  cmd->callback([f] { run_chat(*f); });
}

}  // namespace mere

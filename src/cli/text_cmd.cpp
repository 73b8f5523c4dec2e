// mere text generate: stream a continuation of a prompt.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/levers.h"
#include "engine/generate.h"
#include "engine/text_stream.h"
#include "io/config.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace mere {
namespace {

struct GenerateFlags {
  std::string model, prompt, device = "auto";
  std::vector<std::string> stops;
  int max_new_tokens = 128, threads = 0;
  SamplingFlags sampling;
  RuntimeFlags runtime;
  bool no_echo = false;
};

void run_generate(const GenerateFlags& f) {
  apply_threads(f.threads);
  ResolvedModel resolved = resolve_model(f.model);
  const auto& dir = resolved.dir;
  Device device = resolve_device(f.device);
  const RuntimeSettings runtime = effective_runtime(resolved, f.runtime, device);
  const Levers levers = Levers::from_env();
  GenerationConfig gen = GenerationConfig::load(dir);
  GenerateOptions options;
  options.sampling = sampling_from(f.sampling, gen);  // its errors before the model loads
  std::unique_ptr<Model> model = load_model(dir, device, levers.load_options(device));
  Tokenizer tokenizer = Tokenizer::load(dir);

  options.levers = levers;
  options.kv_cache_mode = runtime.kv_cache_mode;
  options.max_new_tokens = f.max_new_tokens;
  options.eos_ids = gen.eos_token_ids;
  if (options.eos_ids.empty() && tokenizer.eos_id()) options.eos_ids.push_back(*tokenizer.eos_id());

  std::vector<int32_t> prompt = tokenizer.encode(f.prompt, /*add_special_tokens=*/true);
  MERE_CHECK(!prompt.empty(), "the prompt is empty and the tokenizer adds no BOS token");
  if (!f.no_echo) std::fputs(f.prompt.c_str(), stdout);
  TextStream stream(tokenizer, f.stops);
  GenerateStats stats = generate(*model, prompt, options, [&](int32_t id) {
    std::fputs(stream.push(id).c_str(), stdout);
    std::fflush(stdout);
    return !stream.is_stopped();
  });
  std::fputs(stream.finish().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  std::fprintf(stderr,
               "\nprefill: %lld tokens, %.1f tok/s | %s | time to first token: %.1f ms | stop: %s\n%s\n",
               (long long)stats.prompt_tokens, stats.prefill_tok_s(),
               decode_summary(stats.generated_tokens, stats.decode_tok_s()).c_str(), stats.ttft_ms,
               stats.stop_reason.c_str(),
               options.levers.describe(device).c_str());
}

}  // namespace

void add_text_commands(CLI::App& app) {
  CLI::App* text = app.add_subcommand("text", "Generate text with a language model");
  text->require_subcommand(1);
  add_template_command(*text);
  add_chat_command(*text);
  auto flags = std::make_shared<GenerateFlags>();
  CLI::App* gen = text->add_subcommand("generate", "Stream a continuation of a prompt to stdout");
  gen->add_option("-m,--model", flags->model, kModelFlagHelp);
  gen->add_option("-p,--prompt", flags->prompt, "Prompt text")->required();
  gen->add_option("-n,--max-tokens", flags->max_new_tokens, "Tokens to generate at most")
      ->check(CLI::NonNegativeNumber);
  add_sampling_options(*gen, flags->sampling);
  gen->add_option("--stop", flags->stops, "Stop when this string appears (repeatable)");
  gen->add_flag("--no-echo", flags->no_echo, "Print only the continuation, not the prompt");
  add_runtime_options(*gen, flags->runtime);
  add_threads_option(*gen, flags->threads);
  add_device_option(*gen, flags->device);
  gen->callback([flags] { run_generate(*flags); });
}

}  // namespace mere

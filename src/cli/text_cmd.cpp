// mere text generate: stream a continuation of a prompt.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
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
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  float presence_penalty = 0;
  uint64_t seed = 0;
  bool no_echo = false;
};

// generation_config.json supplies the defaults; flags override them.
SamplingParams sampling_from(const GenerateFlags& f, const GenerationConfig& g) {
  SamplingParams p;
  bool sample = g.do_sample.value_or(g.temperature.has_value());
  p.temperature = f.temperature.value_or(sample ? g.temperature.value_or(1.0f) : 0.0f);
  p.top_p = f.top_p.value_or(sample ? g.top_p.value_or(1.0f) : 1.0f);
  p.top_k = f.top_k.value_or(sample ? g.top_k.value_or(0) : 0);
  p.min_p = f.min_p.value_or(sample ? g.min_p.value_or(0.0f) : 0.0f);
  p.repetition_penalty = f.repetition_penalty.value_or(g.repetition_penalty.value_or(1.0f));
  p.presence_penalty = f.presence_penalty;
  p.seed = f.seed;
  return p;
}

void run_generate(const GenerateFlags& f) {
  apply_threads(f.threads);
  auto dir = resolve_model_dir(f.model);
  std::unique_ptr<Model> model = load_model(dir, resolve_device(f.device));
  Tokenizer tokenizer = Tokenizer::load(dir);
  GenerationConfig gen = GenerationConfig::load(dir);

  GenerateOptions options;
  options.max_new_tokens = f.max_new_tokens;
  options.sampling = sampling_from(f, gen);
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
               "\nprefill: %lld tokens, %.1f tok/s | decode: %lld tokens, %.1f tok/s | time to first token: "
               "%.1f ms | stop: %s\n",
               (long long)stats.prompt_tokens, stats.prefill_tok_s(), (long long)stats.generated_tokens,
               stats.decode_tok_s(), stats.ttft_ms, stats.stop_reason.c_str());
}

}  // namespace

void add_text_commands(CLI::App& app) {
  CLI::App* text = app.add_subcommand("text", "Generate text with a language model");
  text->require_subcommand(1);
  add_template_command(*text);
  auto flags = std::make_shared<GenerateFlags>();
  CLI::App* gen = text->add_subcommand("generate", "Stream a continuation of a prompt to stdout");
  gen->add_option("-m,--model", flags->model, "Model directory (default: the embedded demo model)");
  gen->add_option("-p,--prompt", flags->prompt, "Prompt text")->required();
  gen->add_option("-n,--max-tokens", flags->max_new_tokens, "Tokens to generate at most")
      ->check(CLI::NonNegativeNumber);
  gen->add_option("--temperature", flags->temperature, "Sampling temperature; 0 is greedy (default: generation_config.json, else greedy)")
      ->check(CLI::NonNegativeNumber);
  gen->add_option("--top-p", flags->top_p, "Nucleus sampling: keep the smallest set of tokens with this mass")
      ->check(CLI::Range(0.0, 1.0));
  gen->add_option("--top-k", flags->top_k, "Keep only the k most likely tokens (0: off)")
      ->check(CLI::NonNegativeNumber);
  gen->add_option("--min-p", flags->min_p, "Drop tokens less likely than min-p times the best one")
      ->check(CLI::Range(0.0, 1.0));
  gen->add_option("--repetition-penalty", flags->repetition_penalty,
                  "Penalise tokens already in the context (transformers' rule; 1: off)")
      ->check(CLI::PositiveNumber);
  gen->add_option("--presence-penalty", flags->presence_penalty,
                  "Subtract this from the logit of every token already in the context (0: off)");
  gen->add_option("--seed", flags->seed, "Random seed: the same seed gives the same text");
  gen->add_option("--stop", flags->stops, "Stop when this string appears (repeatable)");
  gen->add_flag("--no-echo", flags->no_echo, "Print only the continuation, not the prompt");
  add_threads_option(*gen, flags->threads);
  add_device_option(*gen, flags->device);
  gen->callback([flags] { run_generate(*flags); });
}

}  // namespace mere

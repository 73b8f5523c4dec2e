// mere eval logits | ppl: numbers to check a model against a reference.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/levers.h"
#include "core/progress.h"
#include "engine/perplexity.h"
#include "io/npy.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace mere {
namespace {

struct LogitsFlags {
  std::string model, ids, out, device = "auto";
  int threads = 0;
  RuntimeFlags runtime;
};

void run_logits(const LogitsFlags& f) {
  apply_threads(f.threads);
  std::vector<int32_t> ids = parse_ids(f.ids);
  MERE_CHECK(!ids.empty(), "--ids: no token ids given");
  const ResolvedModel resolved = resolve_model(f.model);
  const Device device = resolve_device(f.device);
  const RuntimeSettings runtime = effective_runtime(resolved, f.runtime, device);
  std::unique_ptr<Model> model = load_model(resolved.dir, device, Levers::from_env().load_options(device));
  for (int32_t id : ids)
    MERE_CHECK(id < model->info().vocab, "--ids: token id {} is outside the vocabulary of {}", id,
               model->info().vocab);
  auto state = model->make_state(int64_t(ids.size()), runtime.kv_cache_mode);
  Tensor logits = model->forward(ids, *state, /*all_logits=*/true).to_device(Device::cpu);
  write_npy(f.out, logits);
  std::fprintf(stderr, "wrote %s: float32 [%zu, %lld]\n", f.out.c_str(), ids.size(),
               (long long)model->info().vocab);
}

struct PplFlags {
  std::string model, file, device = "auto";
  int64_t ctx = 512, stride = 0;
  int threads = 0;
  bool json = false;
  RuntimeFlags runtime;
};

void run_ppl(const PplFlags& f) {
  apply_threads(f.threads);
  ResolvedModel resolved = resolve_model(f.model);
  const auto& dir = resolved.dir;
  const Device device = resolve_device(f.device);
  const RuntimeSettings runtime = effective_runtime(resolved, f.runtime, device);
  std::ifstream in(f.file, std::ios::binary);
  MERE_CHECK(in.good(), "{}: cannot open", f.file);
  std::stringstream text;
  text << in.rdbuf();
  std::unique_ptr<Model> model = load_model(dir, device, Levers::from_env().load_options(device));
  Tokenizer tokenizer = Tokenizer::load(dir);
  std::vector<int32_t> ids = tokenizer.encode(text.str(), /*add_special_tokens=*/false);
  int64_t ctx = std::min<int64_t>(f.ctx, model->info().max_positions);
  int64_t stride = f.stride > 0 ? f.stride : ctx / 2;
  check_perplexity_inputs(*model, int64_t(ids.size()), ctx, stride);  // before the progress bar shows
  PerplexityResult r;
  {
    Progress progress("perplexity", perplexity_windows(int64_t(ids.size()), ctx, stride));
    r = perplexity(
        *model, ids, ctx, stride, [&](int64_t done, int64_t) { progress.update(done); }, runtime.kv_cache_mode);
  }
  if (f.json) {
    std::printf("{\"ppl\": %.6f, \"nll\": %.6f, \"tokens\": %zu, \"scored\": %lld, \"ctx\": %lld, \"stride\": %lld}\n",
                r.ppl(), r.nll_sum / double(r.scored), ids.size(), (long long)r.scored, (long long)ctx,
                (long long)stride);
  } else {
    std::printf("perplexity: %.4f over %lld scored tokens (%zu tokens, ctx %lld, stride %lld, %lld windows)\n",
                r.ppl(), (long long)r.scored, ids.size(), (long long)ctx, (long long)stride,
                (long long)r.windows);
  }
}

}  // namespace

void add_eval_commands(CLI::App& app) {
  CLI::App* eval = app.add_subcommand("eval", "Evaluate a model: logits and perplexity");
  eval->require_subcommand(1);

  auto lf = std::make_shared<LogitsFlags>();
  CLI::App* logits = eval->add_subcommand("logits", "Write the float32 logits of every position as a .npy file");
  logits->add_option("-m,--model", lf->model, "Model directory (default: the embedded demo model)");
  logits->add_option("--ids", lf->ids, "Token ids, e.g. 1,2,3")->required();
  logits->add_option("--out", lf->out, "Output .npy file; shape [n, vocab]")->required();
  add_threads_option(*logits, lf->threads);
  add_device_option(*logits, lf->device);
  add_runtime_options(*logits, lf->runtime);
  logits->callback([lf] { run_logits(*lf); });

  auto pf = std::make_shared<PplFlags>();
  CLI::App* ppl = eval->add_subcommand("ppl", "Perplexity of a model over a text file (sliding window)");
  ppl->add_option("-m,--model", pf->model, "Model directory (default: the embedded demo model)");
  ppl->add_option("-f,--file", pf->file, "Text file")->required()->check(CLI::ExistingFile);
  ppl->add_option("--ctx", pf->ctx, "Window length in tokens (capped at the model's context)")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 30));
  ppl->add_option("--stride", pf->stride, "Tokens between window starts (default: ctx / 2)")
      ->check(CLI::PositiveNumber);
  ppl->add_flag("--json", pf->json, "Print the result as one JSON object");
  add_threads_option(*ppl, pf->threads);
  add_device_option(*ppl, pf->device);
  add_runtime_options(*ppl, pf->runtime);
  ppl->callback([pf] { run_ppl(*pf); });
}

}  // namespace mere

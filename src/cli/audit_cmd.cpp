// mere audit: the A/B gate of levers on the user's own checkpoint (src/audit/),
// writing report.json, report.md and report.html.
#include <cstdio>
#include <memory>

#include "audit/audit.h"
#include "audit/report.h"
#include "cli/commands.h"
#include "cli/common.h"

namespace mere {
namespace {

struct AuditFlags {
  std::string model, prompts, corpus, out = "mere-audit", device = "auto";
  std::vector<std::string> levers;
  bool combine = false;
  int n = 128, runs = 3, threads = 0;
  uint64_t seed = 0;
  float temperature = 0.8f;
  int64_t corpus_tokens = 2048, window = 256;
  bool decode_steps = false;
};

void run_audit_cmd(const AuditFlags& f) {
  apply_threads(f.threads);
  const ResolvedModel resolved = resolve_model(f.model);
  AuditOptions o;
  o.model_dir = resolved.dir;
  o.model_label = f.model.empty() ? "the embedded demo model" : f.model;
  o.levers = f.levers;
  o.combine = f.combine;
  o.prompts_file = f.prompts.empty() ? default_prompts_file() : std::filesystem::path(f.prompts);
  o.corpus_file = f.corpus.empty() ? default_corpus_file() : std::filesystem::path(f.corpus);
  o.out_dir = f.out;
  o.max_new_tokens = f.n;
  o.seed = f.seed;
  o.runs = f.runs;
  o.temperature = f.temperature;
  o.corpus_tokens = f.corpus_tokens;
  o.window = f.window;
  o.decode_steps = f.decode_steps;
  o.device = resolve_device(f.device);
  const AuditReport r = run_audit(o);
  const auto files = write_reports(r, o.out_dir);
  std::printf("mere audit of %s on %s (%s figures)\n", o.model_label.c_str(), r.device.c_str(), r.speed_label.c_str());
  for (const LeverComparison& c : r.comparisons)
    std::printf("  %-28s %-14s %s\n", c.lever.c_str(), c.verdict.verdict.c_str(), c.verdict.reason.c_str());
  for (const auto& p : files) std::printf("wrote %s\n", p.c_str());
}

}  // namespace

void add_audit_command(CLI::App& app) {
  auto f = std::make_shared<AuditFlags>();
  CLI::App* cmd = app.add_subcommand(
      "audit", "Gate levers on a checkpoint: parity, perplexity + KL, memory and speed against the baseline, and a "
               "verdict (report.json, report.md, report.html)");
  cmd->add_option("-m,--model", f->model, kModelFlagHelp);
  cmd->add_option("--lever", f->levers,
                  "A lever to gate, NAME=VALUE: kv=bf16|affine8|affine4 (kv=default: the baseline itself, an A/A control), "
                  "weights=int8|int4[:g32|:g64|:g128], or an "
                  "engine lever such as fused_projections=on (CUDA) or cpu_direct_matvec=on (CPU); repeatable")
      ->required();
  cmd->add_flag("--combine", f->combine,
                "Also gate the levers together (the last given of each kind: one KV mode, one weight format, each "
                "engine lever)");
  cmd->add_option("--prompts", f->prompts,
                  "JSON Lines: one object per line with \"prompt\" (text) or \"messages\" (chat), optional \"name\" "
                  "and \"kind\" (default: data/audit/prompts.jsonl)");
  cmd->add_option("--corpus", f->corpus, "Plain text for perplexity and KL (default: data/audit/corpus.txt)");
  cmd->add_option("-n,--max-tokens", f->n, "Tokens generated per prompt")->capture_default_str();
  cmd->add_option("--seed", f->seed, "Seed of the sampled comparison")->capture_default_str();
  cmd->add_option("--runs", f->runs, "Timed runs per arm, after one warm-up")->capture_default_str();
  cmd->add_option("--temperature", f->temperature, "Temperature of the sampled comparison")->capture_default_str();
  cmd->add_option("--corpus-tokens", f->corpus_tokens, "Corpus tokens scored, from its start")->capture_default_str();
  cmd->add_option("--window", f->window, "Teacher-forced window in tokens")->capture_default_str();
  cmd->add_flag("--decode-steps", f->decode_steps,
                "Score the corpus one decode step per token (what decode-only levers change) instead of one "
                "prefill per window");
  cmd->add_option("--out", f->out, "Directory for the reports (and scratch/ for quantized copies)")
      ->capture_default_str();
  add_threads_option(*cmd, f->threads);
  add_device_option(*cmd, f->device);
  cmd->callback([f] { run_audit_cmd(*f); });
}

}  // namespace mere

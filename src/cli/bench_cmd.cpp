// mere bench: llama-bench style throughput rows, each against its roofline.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <ctime>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/thread_pool.h"
#include "engine/bench.h"
#include "engine/prefix_bench.h"
#include "models/model.h"
#include "models/shapes.h"

namespace mere {
namespace {

struct BenchFlags {
  std::string model, shape, prompt = "512", gen = "128", depth = "0", device = "auto", quant = "bf16", batch = "1";
  std::string scale_dtype = "bf16";
  std::string kv_cache_mode = "default";
  int reps = 5, threads = 0, group_size = 64;
  int64_t context = 0;  // decode rows' cache per sequence (0: just enough)
  bool json = false, calibrate = false, baseline = false, prefix_cache = false;
  double bandwidth = 0, matmul_rate = 0;
};

void run_bench(const BenchFlags& f) {
  apply_threads(f.threads);
  Device device = resolve_device(f.device);
  Ceilings ceilings;
  if (device == Device::cpu) ceilings = Ceilings{0, 0, false};  // the defaults are the H200's; no CPU ceiling known
  if (f.calibrate) {
    ceilings = calibrate(device);
    if (device == Device::cuda)
      std::fprintf(stderr, "calibrated %s: copy %.3f TB/s, bf16 matmul %.1f TFLOP/s\n",
                   cuda_device_description().c_str(), ceilings.copy_bytes_per_s / 1e12,
                   ceilings.matmul_flop_per_s / 1e12);
    else
      std::fprintf(stderr, "calibrated the CPU (%d threads): read %.1f GB/s, f32 multiply-add peak %.1f GFLOP/s\n",
                   thread_count(), ceilings.copy_bytes_per_s / 1e9, ceilings.matmul_flop_per_s / 1e9);
  }
  if (f.bandwidth > 0) ceilings.copy_bytes_per_s = f.bandwidth;
  if (f.matmul_rate > 0) ceilings.matmul_flop_per_s = f.matmul_rate;
  // The defaults are an H200's: on another GPU the fraction column would misstate it.
  if (device == Device::cuda && !f.calibrate && (f.bandwidth <= 0 || f.matmul_rate <= 0))
    std::fprintf(stderr, "the fractions use copy %.3f TB/s and bf16 matmul %.0f TFLOP/s (an H200's where not "
                 "given); --calibrate measures this GPU's\n",
                 ceilings.copy_bytes_per_s / 1e12, ceilings.matmul_flop_per_s / 1e12);
  if (f.shape.empty() && f.model.empty() && f.calibrate) return;

  MERE_CHECK(f.shape.empty() || f.model.empty(), "give either -m or --shape, not both");
  MERE_CHECK(!f.shape.empty() || f.quant == "bf16",
             "--quant {}: applies to --shape only (a checkpoint given with -m runs as it is stored)", f.quant);
  const RandomQuant quant = RandomQuant::parse(f.quant, f.group_size, f.scale_dtype);
  std::unique_ptr<Model> model;
  std::string name;
  if (!f.shape.empty()) {
    model = random_model(f.shape, device, Levers::from_env().load_options(device), 1, quant);
    name = f.shape + (quant.kind == RandomQuant::Kind::none ? " (random)" : " (random, " + quant.describe() + ")");
  } else {
    auto dir = resolve_model_dir(f.model);
    model = load_model(dir, device, Levers::from_env().load_options(device));
    name = dir.filename().string();
  }
  const ModelInfo info = model->info();  // a copy: --baseline reloads the model
  const double loaded_gb = device_bytes_reserved() / 1e9;
  const char* backend = device == Device::cuda ? "cuda" : "cpu";

  std::vector<BenchRow> rows;
  // One row per (depth, prompt length) and (depth, decode length), llama-bench style.
  // One row per (KV mode, depth, prompt length) and (KV mode, depth, decode length), llama-bench style.
  std::vector<KvCacheMode> kv_modes;
  for (const std::string& name : split_list(f.kv_cache_mode, "--kv-cache-mode")) {
    auto mode = parse_kv_cache_mode(name);
    MERE_CHECK(mode, "--kv-cache-mode {}: expected {}", name, kKvCacheModeNames);
    check_engageable({*mode}, device);
    kv_modes.push_back(*mode);
  }
  auto run_rows = [&](const Model& m, const Levers& levers) {
    for (KvCacheMode kv : kv_modes)
      for (int64_t d : parse_int_list(f.depth, "-d")) {
        for (int64_t p : parse_int_list(f.prompt, "-p"))
          if (p > 0) rows.push_back(bench_prefill(m, p, d, f.reps, ceilings, kv));
        for (int64_t n : parse_int_list(f.gen, "-n"))
          if (n > 0) rows.push_back(bench_decode(m, n, d, f.reps, ceilings, levers, kv, f.context));
        if (f.batch != "1")  // same-offset batched decode, one row per batch size
          for (int64_t b : parse_int_list(f.batch, "--batch"))
            for (int64_t n : parse_int_list(f.gen, "-n"))
              if (n > 0 && b > 0)
                rows.push_back(bench_batched_decode(m, b, n, d, f.reps, ceilings, levers, kv, f.context));
      }
  };
  if (f.prefix_cache) {  // prefix-cache hit against miss prefill instead of the usual rows
    for (KvCacheMode kv : kv_modes)
      for (int64_t p : parse_int_list(f.prompt, "-p"))
        if (p > 0) std::printf("%s\n", bench_prefix_cache(*model, p, 8, f.reps, kv).describe().c_str());
    return;
  }
  run_rows(*model, Levers::from_env());
  // Resident GPU memory: what the allocator holds after the rows ran (weights,
  // the largest cache and activations it needed), and the weights' share.
  const double resident_gb = device_bytes_reserved() / 1e9, cached_gb = device_bytes_cached() / 1e9;
  if (f.baseline) {  // the same rows with every lever off, the weights laid out unfused
    model.reset();
    model = !f.shape.empty() ? random_model(f.shape, device, Levers::all_off().load_options(device), 1, quant)
                             : load_model(resolve_model_dir(f.model), device, Levers::all_off().load_options(device));
    run_rows(*model, Levers::all_off());
  }

  if (f.json) {
    nlohmann::json out = {{"model", name},
                          {"backend", backend},
                          {"device", device == Device::cuda ? cuda_device_description() : "cpu"},
                          {"params", info.n_params},
                          {"weight_bytes", info.weight_bytes},
                          {"copy_bytes_per_s", ceilings.copy_bytes_per_s},
                          {"matmul_flop_per_s", ceilings.matmul_flop_per_s},
                          {"calibrated", ceilings.calibrated},
                          {"gpu_gb_after_load", loaded_gb},
                          {"gpu_gb_resident", resident_gb},
                          {"gpu_gb_cached", cached_gb},
                          {"weights", info.weights},
                          {"rows", nlohmann::json::array()}};
    for (const BenchRow& r : rows)
      out["rows"].push_back({{"test", r.test}, {"levers", r.levers}, {"tok_s", r.tok_s}, {"mean_tok_s", r.mean_tok_s},
                             {"sd_tok_s", r.sd_tok_s}, {"ttft_ms", r.ttft_ms}, {"roofline_tok_s", r.roofline_tok_s},
                             {"fraction", r.fraction}, {"bytes_per_token", r.bytes_per_token}, {"flops", r.flops},
                             {"resident_bytes", r.resident_bytes}, {"kv_bytes", r.kv_bytes}});
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  if (device == Device::cuda)
    std::printf("GPU memory: %.2f GB after loading, %.2f GB held after the rows (%.2f GB of it cached for reuse)\n",
                loaded_gb, resident_gb, cached_gb);
  std::printf("| model | size | params | backend | weights | test | levers | t/s | ttft ms | resident GB | KV MiB "
              "| roofline t/s | fraction |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const BenchRow& r : rows)
    std::printf("| %s | %.2f GB | %.2f B | %s | %s | %s | %s | %.1f ± %.1f | %s | %.2f | %.1f | %s | %s |\n",
                name.c_str(), info.weight_bytes / 1e9, info.n_params / 1e9, backend, info.weights.c_str(),
                r.test.c_str(), r.levers.c_str(), r.mean_tok_s, r.sd_tok_s,
                r.prefill ? fmt::format("{:.1f}", r.ttft_ms).c_str() : "", r.resident_bytes / 1e9,
                double(r.kv_bytes) / (1 << 20),
                r.roofline_tok_s > 0 ? fmt::format("{:.0f}", r.roofline_tok_s).c_str() : "-",
                r.roofline_tok_s > 0
                    ? fmt::format("{:.3f}{}", r.fraction, r.prefill ? " of matmul peak" : " of bandwidth").c_str()
                    : "- (no ceiling for this device; pass --calibrate or --bandwidth)");
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prefill and decode throughput against the roofline");
  cmd->add_option("-m,--model", f->model, "Model directory");
  cmd->add_option("--shape", f->shape,
                  fmt::format("A published shape with random weights: {}", fmt::join(known_shapes(), ", ")));
  cmd->add_option("--quant", f->quant,
                  "With --shape: store the random matrices as bf16, int8 or int4 (MLX affine) or fp8 (E4M3, "
                  "128x128 block scales)");
  cmd->add_option("--batch", f->batch,
                  "Batch sizes, comma-separated: adds same-offset batched decode rows (a graph per step with "
                  "cuda_graphs on, MERERUN_CUDA_GRAPHS=0 or --baseline for eager), e.g. 1,4,16,64");
  cmd->add_option("--group-size", f->group_size, "With --quant int8|int4: values per scale and bias (32, 64, 128)");
  cmd->add_option("--scale-dtype", f->scale_dtype,
                  "With --quant int8|int4: the scales' and biases' dtype, bf16 or f16 (MLX stores an fp16 model's "
                  "as f16)");
  cmd->add_option("-p,--prompt-tokens", f->prompt, "Prefill lengths, comma-separated (pp rows; 0: none)");
  cmd->add_option("-n,--gen-tokens", f->gen, "Decode lengths, comma-separated (tg rows; 0: none)");
  cmd->add_option("-d,--depth", f->depth, "Tokens already in the cache, comma-separated");
  cmd->add_option("-c,--context", f->context,
                  "Decode rows: each sequence's cache holds this many tokens (a server's context length; default: "
                  "just enough)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-cache-mode", f->kv_cache_mode,
                  "KV cache modes, comma-separated: default, bf16, affine8, affine4");
  cmd->add_option("-r,--reps", f->reps, "Repetitions per row, after one warm-up")->check(CLI::PositiveNumber);
  cmd->add_flag("--json", f->json, "Print the rows as JSON");
  cmd->add_flag("--baseline", f->baseline, "Also run every row with all levers off, for comparison");
  cmd->add_flag("--prefix-cache", f->prefix_cache,
                "Instead: prefill time of each -p prompt cold (miss) and of a second prompt sharing all but its "
                "last 8 tokens (hit)");
  cmd->add_flag("--calibrate", f->calibrate, "Measure this device's copy bandwidth and compute ceiling first (GPU: bf16 matmul; CPU: f32 multiply-add peak)");
  cmd->add_option("--bandwidth", f->bandwidth, "Copy bandwidth in bytes/s for the roofline (default: H200, 4.255e12)");
  cmd->add_option("--matmul-rate", f->matmul_rate, "bf16 matmul rate in FLOP/s (default: H200, 770e12)");
  add_device_option(*cmd, f->device);
  add_threads_option(*cmd, f->threads);
  cmd->callback([f] { run_bench(*f); });
}

}  // namespace mere

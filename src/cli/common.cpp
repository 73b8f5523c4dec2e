#include "cli/common.h"

#include <cstdio>

#include "core/error.h"
#include "core/thread_pool.h"
#include "registry/registry.h"

namespace mere {

namespace fs = std::filesystem;

fs::path default_model_dir() { return fs::path(MERE_SOURCE_DIR) / "models" / "demo"; }

ResolvedModel resolve_model(const std::string& flag) {
  ResolvedModel r;
  if (flag.empty()) {
    r.dir = default_model_dir();
    MERE_CHECK(fs::exists(r.dir / "config.json"),
               "no model given (-m DIR) and the embedded default model is missing at {}", r.dir.string());
    return r;
  }
  std::error_code ec;
  if (fs::exists(flag, ec)) {  // a path wins, so a registry problem never blocks a plain directory
    r.dir = flag;
    return r;
  }
  MERE_CHECK(is_valid_model_name(flag),
             "{}: no such file or directory (and not a model name: those are letters, digits, '.', '_' and '-')",
             flag);
  Registry registry = Registry::load(Registry::default_file());
  const RegistryEntry* entry = registry.find(flag);
  if (!entry) {
    std::string names;
    for (const auto& e : registry.entries()) names += (names.empty() ? "" : ", ") + e.name;
    fail("{}: no such file or directory, and no model of that name in the registry {} (registered: {})", flag,
         registry.file().string(), names.empty() ? "none" : names);
  }
  MERE_CHECK(fs::exists(entry->path, ec), "model '{}' (registry {}) points to {}, which does not exist", flag,
             registry.file().string(), entry->path.string());
  r.dir = entry->path;
  r.name = entry->name;
  r.runtime = entry->runtime;
  return r;
}

fs::path resolve_model_dir(const std::string& flag) { return resolve_model(flag).dir; }

void add_runtime_options(CLI::App& cmd, RuntimeFlags& flags) {
  cmd.add_option("--kv-cache-mode", flags.kv_cache_mode,
                 "KV cache: default, bf16, affine8 or affine4 (default: the model's registry setting, else default)");
}

RuntimeSettings effective_runtime(const ResolvedModel& model, const RuntimeFlags& flags, Device device) {
  RuntimeSettings settings = model.runtime;
  std::string source = model.name.empty() ? "built-in default" : "registry entry '" + model.name + "'";
  if (!flags.kv_cache_mode.empty()) {
    auto mode = parse_kv_cache_mode(flags.kv_cache_mode);
    MERE_CHECK(mode, "--kv-cache-mode {}: expected {}", flags.kv_cache_mode, kKvCacheModeNames);
    settings.kv_cache_mode = *mode;
    source = "--kv-cache-mode";
  }
  try {
    check_engageable(settings, device);
  } catch (const Error& e) {
    fail("{} (set by the {}{})", e.what(), source,
         source == "--kv-cache-mode" ? "" : "; override it with --kv-cache-mode");
  }
  std::fprintf(stderr, "runtime: %s (%s)\n", describe(settings).c_str(), source.c_str());
  return settings;
}

void add_sampling_options(CLI::App& cmd, SamplingFlags& flags) {
  cmd.add_option("--temperature", flags.temperature,
                 "Sampling temperature; 0 is greedy (default: generation_config.json, else greedy)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--top-p", flags.top_p, "Nucleus sampling: keep the smallest set of tokens with this mass")
      ->check(CLI::Range(0.0, 1.0));
  cmd.add_option("--top-k", flags.top_k, "Keep only the k most likely tokens (0: off)")->check(CLI::NonNegativeNumber);
  cmd.add_option("--min-p", flags.min_p, "Drop tokens less likely than min-p times the best one")
      ->check(CLI::Range(0.0, 1.0));
  cmd.add_option("--repetition-penalty", flags.repetition_penalty,
                 "Penalise tokens already in the context (transformers' rule; 1: off)")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--presence-penalty", flags.presence_penalty,
                 "Subtract this from the logit of every token already in the context (0: off)");
  cmd.add_option("--seed", flags.seed, "Random seed: the same seed gives the same text");
}

SamplingParams sampling_from(const SamplingFlags& f, const GenerationConfig& g) {
  SamplingParams p;
  bool sample = g.do_sample.value_or(g.temperature.has_value());
  p.temperature = f.temperature.value_or(sample ? g.temperature.value_or(1.0f) : 0.0f);
  p.top_p = f.top_p.value_or(sample ? g.top_p.value_or(1.0f) : 1.0f);
  p.top_k = f.top_k.value_or(sample ? g.top_k.value_or(0) : 0);
  p.min_p = f.min_p.value_or(sample ? g.min_p.value_or(0.0f) : 0.0f);
  p.repetition_penalty = f.repetition_penalty.value_or(g.repetition_penalty.value_or(1.0f));
  p.presence_penalty = f.presence_penalty;
  p.seed = f.seed;
  try {
    p.check();  // NaN passes the flags' range checks
  } catch (const Error& e) {
    fail("{} (from its flag or the model's generation_config.json)", e.what());
  }
  return p;
}

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string item;
  auto flush = [&] {
    if (item.empty()) return;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MERE_CHECK(used == item.size() && v >= 0 && v <= INT32_MAX, "'{}' is not a token id", item);
    ids.push_back(int32_t(v));
    item.clear();
  };
  for (char c : text) {
    if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '[' || c == ']') flush();
    else item += c;
  }
  flush();
  return ids;
}

void add_device_option(CLI::App& cmd, std::string& device) {
  cmd.add_option("--device", device, "cpu, cuda, or auto: cuda when a GPU is present (default)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
}

Device resolve_device(const std::string& flag) {
  if (flag == "cpu") return Device::cpu;
  if (flag == "cuda") {
    MERE_CHECK(cuda_available(), "--device cuda: {}", cuda_device_description());
    return Device::cuda;
  }
  return cuda_available() ? Device::cuda : Device::cpu;
}

std::vector<int64_t> parse_int_list(const std::string& text, const char* flag) {
  std::vector<int64_t> out;
  for (const std::string& item : split_list(text, flag)) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MERE_CHECK(used == item.size() && v >= 0, "{} {}: '{}' is not a non-negative integer", flag, text, item);
    out.push_back(v);
  }
  return out;
}

std::vector<std::string> split_list(const std::string& text, const char* flag) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    MERE_CHECK(!out.back().empty(), "{}: empty entry in '{}'", flag, text);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

std::string decode_summary(int64_t generated_tokens, double decode_tok_s) {
  if (generated_tokens <= 2) return fmt::format("decode: {} tokens (too few for a rate)", generated_tokens);
  return fmt::format("decode: {} tokens, {:.1f} tok/s", generated_tokens, decode_tok_s);
}

void add_threads_option(CLI::App& cmd, int& threads) {
  // A pool of 100,000 threads took minutes to start; no machine mere runs on has 1,024 cores.
  cmd.add_option("-t,--threads", threads, "CPU threads, up to 1024 (default: one per hardware thread)")
      ->check(CLI::Range(0, 1024));
}

void apply_threads(int threads) { set_thread_count(threads); }

}  // namespace mere

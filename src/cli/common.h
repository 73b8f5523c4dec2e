// Pieces several subcommands share: finding the model, sampling and runtime flags,
// parsing id lists.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "io/config.h"
#include "registry/runtime_settings.h"
#include "sampling/sampler.h"

namespace mere {

// What -m named: a path to an existing file or directory wins; otherwise a name in the
// model registry; otherwise an error listing both. Empty: the embedded default model.
struct ResolvedModel {
  std::filesystem::path dir;
  std::string name;          // the registered name, empty when -m was a path
  RuntimeSettings runtime;   // the registry entry's settings; defaults for a path
};
ResolvedModel resolve_model(const std::string& flag);
std::filesystem::path resolve_model_dir(const std::string& flag);
std::filesystem::path default_model_dir();
// Help text for -m.
inline constexpr const char* kModelFlagHelp =
    "Model directory or registered name (mere model add) (default: the embedded demo model)";

// Runtime settings given on the command line; each overrides the registry for one run.
struct RuntimeFlags {
  std::string kv_cache_mode;  // empty: the stored setting
};
void add_runtime_options(CLI::App& cmd, RuntimeFlags& flags);
// The stored settings with the flags applied, checked against the device (a setting
// that cannot engage is an error), and reported on stderr.
RuntimeSettings effective_runtime(const ResolvedModel& model, const RuntimeFlags& flags, Device device);

// The sampling flags of text generate and text chat.
struct SamplingFlags {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  float presence_penalty = 0;
  uint64_t seed = 0;
};
void add_sampling_options(CLI::App& cmd, SamplingFlags& flags);
// generation_config.json supplies the defaults; flags override them.
SamplingParams sampling_from(const SamplingFlags& f, const GenerationConfig& g);

// "1,2,3" or "1 2 3" -> ids; anything else is an error naming the bad item.
std::vector<int32_t> parse_ids(const std::string& text);

// Adds --device cpu|cuda|auto; resolve_device() picks cuda when a GPU is present.
void add_device_option(CLI::App& cmd, std::string& device);
Device resolve_device(const std::string& flag);

// "512,4096" -> {512, 4096}; each item a non-negative integer.
std::vector<int64_t> parse_int_list(const std::string& text, const char* flag);
// "a,b,c" -> {"a", "b", "c"}; empty entries are an error naming the flag.
std::vector<std::string> split_list(const std::string& text, const char* flag);

// "decode: N tokens, R tok/s", or where N is too few to give a rate (it counts from
// the third token: GenerateStats::decode_tok_s) says so instead of printing 0.
std::string decode_summary(int64_t generated_tokens, double decode_tok_s);

// Adds --threads to a subcommand (0: one per hardware thread, at most 1024);
// apply_threads() sets the pool size from it.
void add_threads_option(CLI::App& cmd, int& threads);
void apply_threads(int threads);

}  // namespace mere

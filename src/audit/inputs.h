// What `mere audit` reads: the levers to gate (--lever NAME=VALUE), the prompt
// set (JSON Lines) and the corpus (plain text). Bad input is an error that names
// the flag, or the file, line and field.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "state/kv_cache.h"

namespace mere {

// One lever to audit against the baseline.
struct LeverSpec {
  enum class Kind { kv, weights, engine };
  std::string text;   // as given: "kv=affine8", "weights=int4:g32", "fused_projections=on"
  Kind kind = Kind::kv;
  KvCacheMode kv_mode = KvCacheMode::native;  // kv
  std::string weights;                        // weights: "int8", "int4" or "fp8"
  int group_size = 64;                        // weights int8/int4
  std::string engine_lever;                   // engine: a field of Levers (src/engine/levers.h)
  bool engine_on = true;
};
// Errors name the flag and list what is accepted.
LeverSpec parse_lever(const std::string& text);
// The engine levers --lever accepts (Levers' fields).
std::vector<std::string> engine_lever_names();
// The device an engine lever acts on: the CPU's own (the cpu_* ones) or, for the rest, CUDA.
Device engine_lever_device(const std::string& name);

// One prompt of the set: raw text, or chat messages rendered with the model's template.
struct AuditPrompt {
  std::string name;      // "name" in the file, else "line N"
  std::string kind;      // free label: "prose", "code", "reasoning", ... (default: "prompt" or "chat")
  std::string source;    // "FILE:LINE"
  std::optional<std::string> text;                 // "prompt"
  std::optional<nlohmann::ordered_json> messages;  // "messages"
};
// Each non-blank line one object with "prompt" (a string) or "messages" (an array
// of {role, content}); optional "name" and "kind". Other fields are an error.
std::vector<AuditPrompt> load_prompts(const std::filesystem::path& file);
std::string read_text_file(const std::filesystem::path& file, const char* what);

// The prompt set and corpus that ship with mere (data/audit/).
std::filesystem::path default_prompts_file();
std::filesystem::path default_corpus_file();

}  // namespace mere

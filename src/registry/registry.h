// The model registry: short names for model directories, with per-model runtime
// settings, kept in one JSON file in the user's config directory:
//   { "models": { "NAME": { "path": "/abs/dir", "runtime": { "kv_cache_mode": "bf16" } } } }
// Reading is strict (every field checked, unknown fields refused), and a file that
// does not read cleanly is never rewritten: each command that would modify it fails
// with an error naming the file and the entry instead. Writes are atomic (a temp
// file renamed over the old one), so a crash never leaves half a file.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "registry/runtime_settings.h"

namespace mere {

// $MERE_CONFIG_DIR, else $XDG_CONFIG_HOME/mere, else ~/.config/mere.
std::filesystem::path config_dir();

// Names are [A-Za-z0-9._-]+ and not "." or "..": they must never read as a path.
bool is_valid_model_name(std::string_view name);
// The error for an invalid name, naming it and the allowed characters.
void check_model_name(std::string_view name);

// A directory that holds config.json (an object with a model_type) and safetensors
// weights; otherwise an error naming the path and what is missing.
void check_model_dir(const std::filesystem::path& dir);

struct RegistryEntry {
  std::string name;
  std::filesystem::path path;  // absolute
  RuntimeSettings runtime;
};

class Registry {
 public:
  // config_dir()/models.json.
  static std::filesystem::path default_file();
  // A missing file is an empty registry. Anything malformed is an error naming the
  // file and, where there is one, the entry and field.
  static Registry load(const std::filesystem::path& file);

  const std::filesystem::path& file() const { return file_; }
  const std::vector<RegistryEntry>& entries() const { return entries_; }  // in file order
  const RegistryEntry* find(std::string_view name) const;
  // An error naming the registry file and the registered names when absent.
  const RegistryEntry& get(std::string_view name) const;

  // Errors: invalid name, name already registered. The path is stored as given; the
  // caller checks it (check_model_dir) and makes it absolute.
  void add(RegistryEntry entry);
  void remove(std::string_view name);
  void set_runtime(std::string_view name, const RuntimeSettings& runtime);

  // Writes the file atomically, creating the config directory if needed.
  void save() const;

 private:
  std::filesystem::path file_;
  std::vector<RegistryEntry> entries_;
};

}  // namespace mere

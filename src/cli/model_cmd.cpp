// mere model add | list | show | remove | runtime set | runtime show: the registry of
// named models and their runtime settings (src/registry).
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "registry/model_summary.h"
#include "registry/registry.h"

namespace mere {
namespace {

namespace fs = std::filesystem;

struct ModelFlags {
  std::string name, path, kv_cache_mode;
};

void run_add(const ModelFlags& f) {
  check_model_name(f.name);
  // Load first: a registry that does not read cleanly is left exactly as it is.
  Registry registry = Registry::load(Registry::default_file());
  check_model_dir(f.path);
  registry.add({f.name, fs::weakly_canonical(fs::absolute(f.path)), {}});
  registry.save();
  std::printf("added %s -> %s\n", f.name.c_str(), registry.get(f.name).path.c_str());
}

void run_list() {
  Registry registry = Registry::load(Registry::default_file());
  if (registry.entries().empty()) {
    std::printf("no models registered (add one with: mere model add NAME PATH; registry: %s)\n",
                registry.file().c_str());
    return;
  }
  size_t width = 4;
  for (const auto& e : registry.entries()) width = std::max(width, e.name.size());
  std::printf("%-*s  %-24s  %s\n", int(width), "NAME", "RUNTIME", "PATH");
  for (const auto& e : registry.entries()) {
    std::error_code ec;
    bool missing = !fs::exists(e.path, ec);
    std::printf("%-*s  %-24s  %s%s\n", int(width), e.name.c_str(), describe(e.runtime).c_str(), e.path.c_str(),
                missing ? "  (missing)" : "");
  }
}

void run_show(const ModelFlags& f) {
  ResolvedModel m = resolve_model(f.name);
  ModelSummary s = summarize_model(m.dir);
  std::string arch;
  for (const auto& a : s.architectures) arch += (arch.empty() ? "" : ", ") + a;
  std::string dtypes;
  for (const auto& [dtype, n] : s.tensors_per_dtype)
    dtypes += fmt::format("{}{}: {} tensor{}", dtypes.empty() ? "" : ", ", dtype, n, n == 1 ? "" : "s");
  std::printf("name:          %s\n", m.name.empty() ? "(not registered)" : m.name.c_str());
  std::printf("path:          %s\n", fs::absolute(m.dir).c_str());
  std::printf("model_type:    %s%s\n", s.model_type.c_str(), s.supported ? "" : " (not supported by this mere)");
  if (!arch.empty()) std::printf("architectures: %s\n", arch.c_str());
  std::printf("parameters:    %s (%lld)\n", human_count(double(s.n_params)).c_str(), (long long)s.n_params);
  std::printf("dtypes:        %s\n", dtypes.c_str());
  std::printf("quantization:  %s\n", s.quantization.c_str());
  std::printf("weights:       %s\n", human_bytes(s.weight_bytes).c_str());
  std::printf("size on disk:  %s (%llu bytes)\n", human_bytes(s.size_on_disk_bytes).c_str(),
              (unsigned long long)s.size_on_disk_bytes);
  std::printf("runtime:       %s%s\n", describe(m.runtime).c_str(), m.name.empty() ? " (defaults: not registered)" : "");
}

void run_remove(const ModelFlags& f) {
  Registry registry = Registry::load(Registry::default_file());
  fs::path path = registry.get(f.name).path;
  registry.remove(f.name);
  registry.save();
  std::printf("removed %s (its files in %s are untouched)\n", f.name.c_str(), path.c_str());
}

void run_runtime_set(const ModelFlags& f) {
  Registry registry = Registry::load(Registry::default_file());
  RuntimeSettings settings = registry.get(f.name).runtime;
  MERE_CHECK(!f.kv_cache_mode.empty(), "model runtime set {}: give a setting to change (--kv-cache-mode)", f.name);
  auto mode = parse_kv_cache_mode(f.kv_cache_mode);
  MERE_CHECK(mode, "--kv-cache-mode {}: expected {}", f.kv_cache_mode, kKvCacheModeNames);
  // Stored even when this build cannot engage it yet (affine8): a run that would use
  // it refuses then, saying why.
  settings.kv_cache_mode = *mode;
  registry.set_runtime(f.name, settings);
  registry.save();
  std::printf("%s: %s\n", f.name.c_str(), describe(settings).c_str());
}

void run_runtime_show(const ModelFlags& f) {
  Registry registry = Registry::load(Registry::default_file());
  std::printf("%s\n", describe(registry.get(f.name).runtime).c_str());
}

}  // namespace

void add_model_commands(CLI::App& app) {
  CLI::App* model = app.add_subcommand("model", "Name models and keep their runtime settings (the model registry)");
  model->require_subcommand(1);
  model->footer("The registry is models.json in $MERE_CONFIG_DIR, else $XDG_CONFIG_HOME/mere, else ~/.config/mere. "
                "-m takes a registered name wherever it takes a path.");
  auto f = std::make_shared<ModelFlags>();

  CLI::App* add = model->add_subcommand("add", "Register a model directory under a name");
  add->add_option("name", f->name, "Name: letters, digits, '.', '_' and '-'")->required();
  add->add_option("path", f->path, "Model directory (config.json and safetensors weights)")->required();
  add->callback([f] { run_add(*f); });

  CLI::App* list = model->add_subcommand("list", "List the registered models");
  list->callback([] { run_list(); });

  CLI::App* show = model->add_subcommand(
      "show", "Describe a model: type, parameters, dtypes, quantization, size on disk, runtime settings");
  show->add_option("name", f->name, "Registered name or model directory")->required();
  show->callback([f] { run_show(*f); });

  CLI::App* remove = model->add_subcommand("remove", "Forget a registered name (the files stay)");
  remove->add_option("name", f->name, "Registered name")->required();
  remove->callback([f] { run_remove(*f); });

  CLI::App* runtime = model->add_subcommand("runtime", "A registered model's runtime settings");
  runtime->require_subcommand(1);
  CLI::App* set = runtime->add_subcommand("set", "Store runtime settings; a run's own flag still overrides them");
  set->add_option("name", f->name, "Registered name")->required();
  set->add_option("--kv-cache-mode", f->kv_cache_mode, "KV cache: default, bf16, affine8 or affine4");
  set->callback([f] { run_runtime_set(*f); });
  CLI::App* rshow = runtime->add_subcommand("show", "Print the stored runtime settings");
  rshow->add_option("name", f->name, "Registered name")->required();
  rshow->callback([f] { run_runtime_show(*f); });
}

}  // namespace mere

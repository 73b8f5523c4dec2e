#include "registry/registry.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config.h"
#include "io/json_util.h"

namespace mere {

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using io_detail::json_kind;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string registered_names(const std::vector<RegistryEntry>& entries) {
  if (entries.empty()) return "none";
  std::string s;
  for (const auto& e : entries) s += (s.empty() ? "" : ", ") + e.name;
  return s;
}

// Parses the file's text, refusing duplicate keys at any depth: nlohmann would keep
// the last one silently, and a hand-edited file with two entries of one name is ambiguous.
ordered_json parse_strict(const std::string& text, const std::string& file) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int, ordered_json::parse_event_t event, ordered_json& parsed) {
    if (event == ordered_json::parse_event_t::object_start) open_objects.emplace_back();
    if (event == ordered_json::parse_event_t::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == ordered_json::parse_event_t::key && !open_objects.empty() && duplicate.empty() &&
        !open_objects.back().insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  ordered_json j;
  try {
    j = ordered_json::parse(text, callback);
  } catch (const ordered_json::exception& e) {  // parse errors, and numbers past a double
    fail("{}: malformed JSON: {} (fix or remove the file; mere does not rewrite it)", file,
         io_detail::parse_error_text(e));
  }
  MERE_CHECK(duplicate.empty(), "{}: the key '{}' appears twice in one object (fix the file; mere does not rewrite it)",
             file, duplicate);
  return j;
}

RuntimeSettings parse_runtime(const ordered_json& j, const std::string& where) {
  MERE_CHECK(j.is_object(), "{}: field 'runtime' is {}, expected an object", where, json_kind(j));
  RuntimeSettings r;
  for (const auto& [key, value] : j.items()) {
    if (key == "kv_cache_mode") {
      MERE_CHECK(value.is_string(), "{}: field 'runtime.kv_cache_mode' is {}, expected a string ({})", where,
                 json_kind(value), kKvCacheModeNames);
      auto mode = parse_kv_cache_mode(value.get<std::string>());
      MERE_CHECK(mode, "{}: runtime.kv_cache_mode is '{}', expected {}", where, value.get<std::string>(),
                 kKvCacheModeNames);
      r.kv_cache_mode = *mode;
    } else {
      fail("{}: unknown runtime setting '{}' (known: kv_cache_mode)", where, key);
    }
  }
  return r;
}

RegistryEntry parse_entry(const std::string& name, const ordered_json& j, const std::string& file) {
  const std::string where = fmt::format("{}: model '{}'", file, name);
  MERE_CHECK(is_valid_model_name(name), "{}: not a valid name (letters, digits, '.', '_' and '-' only)", where);
  MERE_CHECK(j.is_object(), "{}: is {}, expected an object with \"path\"", where, json_kind(j));
  RegistryEntry e;
  e.name = name;
  bool has_path = false;
  for (const auto& [key, value] : j.items()) {
    if (key == "path") {
      MERE_CHECK(value.is_string(), "{}: field 'path' is {}, expected a string", where, json_kind(value));
      e.path = value.get<std::string>();
      MERE_CHECK(e.path.is_absolute(), "{}: field 'path' is '{}', expected an absolute path", where,
                 e.path.string());
      has_path = true;
    } else if (key == "runtime") {
      e.runtime = parse_runtime(value, where);
    } else {
      fail("{}: unknown field '{}' (known: path, runtime)", where, key);
    }
  }
  MERE_CHECK(has_path, "{}: missing field 'path'", where);
  return e;
}

}  // namespace

fs::path config_dir() {
  if (std::string d = env("MERE_CONFIG_DIR"); !d.empty()) return d;
  // XDG says a relative XDG_CONFIG_HOME is invalid and must be ignored.
  if (std::string d = env("XDG_CONFIG_HOME"); !d.empty() && fs::path(d).is_absolute()) return fs::path(d) / "mere";
  std::string home = env("HOME");
  MERE_CHECK(!home.empty(), "cannot find the config directory: set MERE_CONFIG_DIR, XDG_CONFIG_HOME or HOME");
  return fs::path(home) / ".config" / "mere";
}

bool is_valid_model_name(std::string_view name) {
  if (name.empty() || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

void check_model_name(std::string_view name) {
  MERE_CHECK(is_valid_model_name(name),
             "'{}' is not a valid model name: use letters, digits, '.', '_' and '-' (and not only dots)", name);
}

void check_model_dir(const fs::path& dir) {
  std::error_code ec;
  MERE_CHECK(fs::exists(dir, ec), "{}: no such directory", dir.string());
  MERE_CHECK(fs::is_directory(dir, ec), "{}: not a directory (expected a model directory with config.json)",
             dir.string());
  MERE_CHECK(fs::exists(dir / "config.json", ec), "{}: not a model directory: no config.json", dir.string());
  ConfigJson config = ConfigJson::load(dir / "config.json");
  config.require<std::string>("model_type");
  MERE_CHECK(fs::exists(dir / "model.safetensors", ec) || fs::exists(dir / "model.safetensors.index.json", ec),
             "{}: not a model directory: no model.safetensors or model.safetensors.index.json", dir.string());
}

fs::path Registry::default_file() { return config_dir() / "models.json"; }

Registry Registry::load(const fs::path& path) {
  Registry r;
  r.file_ = path;
  const std::string file = path.string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return r;
  MERE_CHECK(!fs::is_directory(path, ec), "{}: is a directory, expected the model registry (a JSON file)", file);
  std::ifstream in(path, std::ios::binary);
  MERE_CHECK(in.good(), "{}: cannot open for reading", file);
  std::stringstream text;
  text << in.rdbuf();

  ordered_json j = parse_strict(text.str(), file);
  MERE_CHECK(j.is_object(), "{}: top level is {}, expected an object {{\"models\": {{...}}}}", file, json_kind(j));
  for (const auto& [key, value] : j.items())
    MERE_CHECK(key == "models", "{}: unknown top-level field '{}' (known: models)", file, key);
  auto models = j.find("models");
  MERE_CHECK(models != j.end(), "{}: missing field 'models'", file);
  MERE_CHECK(models->is_object(), "{}: field 'models' is {}, expected an object of NAME: {{\"path\": ...}}", file,
             json_kind(*models));
  for (const auto& [name, entry] : models->items()) r.entries_.push_back(parse_entry(name, entry, file));
  return r;
}

const RegistryEntry* Registry::find(std::string_view name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

const RegistryEntry& Registry::get(std::string_view name) const {
  const RegistryEntry* e = find(name);
  MERE_CHECK(e, "no model named '{}' in {} (registered: {})", name, file_.string(), registered_names(entries_));
  return *e;
}

void Registry::add(RegistryEntry entry) {
  check_model_name(entry.name);
  if (const RegistryEntry* old = find(entry.name))
    fail("a model named '{}' is already registered in {} (path {}); remove it first", entry.name, file_.string(),
         old->path.string());
  entries_.push_back(std::move(entry));
}

void Registry::remove(std::string_view name) {
  get(name);
  std::erase_if(entries_, [&](const RegistryEntry& e) { return e.name == name; });
}

void Registry::set_runtime(std::string_view name, const RuntimeSettings& runtime) {
  get(name);
  for (auto& e : entries_)
    if (e.name == name) e.runtime = runtime;
}

void Registry::save() const {
  ordered_json models = ordered_json::object();
  for (const auto& e : entries_)
    models[e.name] = {{"path", e.path.string()},
                      {"runtime", {{"kv_cache_mode", std::string(kv_cache_mode_name(e.runtime.kv_cache_mode))}}}};
  std::string text = ordered_json{{"models", models}}.dump(2) + "\n";

  std::error_code ec;
  // A symlinked file (dotfiles kept elsewhere) is replaced at its target, keeping the link.
  const fs::path target = fs::is_symlink(file_, ec) ? fs::weakly_canonical(file_) : file_;
  const std::string file = target.string();
  fs::create_directories(target.parent_path(), ec);
  MERE_CHECK(!ec, "{}: cannot create the directory: {}", target.parent_path().string(), ec.message());
  // Same directory as the target, so the rename is atomic.
  fs::path tmp = target;
  tmp += fmt::format(".tmp-{}", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MERE_CHECK(fd >= 0, "{}: cannot write: {}", tmp.string(), std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      fs::remove(tmp, ec);
      fail("{}: cannot write: {}", tmp.string(), std::strerror(err));
    }
    done += size_t(n);
  }
  bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced || ::rename(tmp.c_str(), target.c_str()) != 0) {
    int err = errno;
    fs::remove(tmp, ec);
    fail("{}: cannot replace the file: {}", file, std::strerror(err));
  }
}

}  // namespace mere

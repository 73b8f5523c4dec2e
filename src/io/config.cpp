#include "io/config.h"

#include <cfloat>
#include <climits>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/json_util.h"

namespace mere {

namespace fs = std::filesystem;
using nlohmann::json;
using io_detail::json_kind;

namespace {

// The value itself, for the end of a type error; long values are cut.
std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() <= 60 ? s : s.substr(0, 57) + "...";
}

}  // namespace

ConfigJson ConfigJson::load(const fs::path& path) {
  const std::string file = path.string();
  std::error_code ec;
  MERE_CHECK(fs::exists(path, ec), "{}: file not found", file);
  MERE_CHECK(!fs::is_directory(path, ec), "{}: is a directory, expected a JSON file", file);
  std::ifstream in(path, std::ios::binary);
  MERE_CHECK(in.good(), "{}: cannot open for reading", file);
  std::stringstream text;
  text << in.rdbuf();

  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception& e) {  // parse errors, and numbers past a double (1e400)
    fail("{}: malformed JSON: {}", file, io_detail::parse_error_text(e));
  }
  MERE_CHECK(j.is_object(), "{}: top level is {}, expected a JSON object", file, json_kind(j));
  return from_json(std::move(j), path);
}

ConfigJson ConfigJson::from_json(json json, const fs::path& path) {
  MERE_CHECK(json.is_object(), "{}: top level is {}, expected a JSON object", path.string(), json_kind(json));
  ConfigJson c;
  c.json_ = std::move(json);
  c.path_ = path;
  return c;
}

bool ConfigJson::has(const std::string& key) const {
  auto it = json_.find(key);
  return it != json_.end() && !it->is_null();
}

std::string ConfigJson::field(const std::string& key) const { return "'" + prefix_ + key + "'"; }

const json& ConfigJson::required(const std::string& key) const {
  auto it = json_.find(key);
  MERE_CHECK(it != json_.end(), "{}: missing required field {}", path_.string(), field(key));
  MERE_CHECK(!it->is_null(), "{}: required field {} is null", path_.string(), field(key));
  return *it;
}

ConfigJson ConfigJson::child(const std::string& key) const {
  const json& v = required(key);
  MERE_CHECK(v.is_object(), "{}: field {} is {}, expected an object (got {})", path_.string(), field(key),
             json_kind(v), shown(v));
  ConfigJson c;
  c.json_ = v;
  c.path_ = path_;
  c.prefix_ = prefix_ + key + ".";
  return c;
}

void ConfigJson::refuse_unless(const std::string& key, const std::string& expected_value) const {
  if (!has(key)) return;
  const json& v = json_.at(key);
  MERE_CHECK(v.is_string() && v.get<std::string>() == expected_value,
             "{}: field {} is {}, but mere supports only \"{}\"", path_.string(), field(key), shown(v),
             expected_value);
}

void ConfigJson::read(const json& v, const std::string& key, int64_t& out) const {
  if (v.is_number_unsigned()) {
    MERE_CHECK(v.get<uint64_t>() <= uint64_t(INT64_MAX), "{}: field {} is {}, too large for a 64-bit integer",
               path_.string(), field(key), shown(v));
    out = int64_t(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    out = v.get<int64_t>();
  } else if (v.is_number_float()) {
    // Python writers sometimes emit 4096.0 for an integer field.
    double d = v.get<double>();
    MERE_CHECK(std::isfinite(d) && d == std::trunc(d) && std::fabs(d) <= 9.0e15,
               "{}: field {} is {}, expected an integer", path_.string(), field(key), shown(v));
    out = int64_t(d);
  } else {
    fail("{}: field {} is {}, expected an integer (got {})", path_.string(), field(key), json_kind(v), shown(v));
  }
}

void ConfigJson::read(const json& v, const std::string& key, int& out) const {
  int64_t wide;
  read(v, key, wide);
  MERE_CHECK(wide >= INT_MIN && wide <= INT_MAX, "{}: field {} is {}, too large for a 32-bit integer",
             path_.string(), field(key), wide);
  out = int(wide);
}

void ConfigJson::read(const json& v, const std::string& key, double& out) const {
  MERE_CHECK(v.is_number(), "{}: field {} is {}, expected a number (got {})", path_.string(), field(key),
             json_kind(v), shown(v));
  out = v.get<double>();
}

void ConfigJson::read(const json& v, const std::string& key, float& out) const {
  double d;
  read(v, key, d);
  MERE_CHECK(std::fabs(d) <= FLT_MAX, "{}: field {} is {}, too large for a float", path_.string(), field(key),
             shown(v));
  out = float(d);
}

void ConfigJson::read(const json& v, const std::string& key, bool& out) const {
  MERE_CHECK(v.is_boolean(), "{}: field {} is {}, expected a boolean (got {})", path_.string(), field(key),
             json_kind(v), shown(v));
  out = v.get<bool>();
}

void ConfigJson::read(const json& v, const std::string& key, std::string& out) const {
  MERE_CHECK(v.is_string(), "{}: field {} is {}, expected a string (got {})", path_.string(), field(key),
             json_kind(v), shown(v));
  out = v.get<std::string>();
}

void ConfigJson::read(const json& v, const std::string& key, std::vector<int>& out) const {
  MERE_CHECK(v.is_array(), "{}: field {} is {}, expected a list of integers (got {})", path_.string(), field(key),
             json_kind(v), shown(v));
  out.clear();
  for (size_t i = 0; i < v.size(); ++i) {
    int x;
    read(v[i], fmt::format("{}[{}]", key, i), x);
    out.push_back(x);
  }
}

GenerationConfig GenerationConfig::load(const fs::path& model_dir) {
  GenerationConfig g;
  const fs::path path = model_dir / "generation_config.json";
  std::error_code ec;
  if (!fs::exists(path, ec)) return g;
  const ConfigJson c = ConfigJson::load(path);

  if (c.has("eos_token_id")) {
    const json& eos = c.raw().at("eos_token_id");
    MERE_CHECK(eos.is_array() || eos.is_number(),
               "{}: field 'eos_token_id' is {}, expected an integer or a list of integers", path.string(),
               json_kind(eos));
    if (eos.is_array())
      for (int id : c.require<std::vector<int>>("eos_token_id")) g.eos_token_ids.push_back(id);
    else
      g.eos_token_ids.push_back(c.require<int>("eos_token_id"));
  }
  auto optional = [&]<class T>(const char* key, std::optional<T>& out) {
    if (c.has(key)) out = c.require<T>(key);
  };
  optional("bos_token_id", g.bos_token_id);
  optional("temperature", g.temperature);
  optional("top_p", g.top_p);
  optional("min_p", g.min_p);
  optional("repetition_penalty", g.repetition_penalty);
  optional("top_k", g.top_k);
  optional("do_sample", g.do_sample);
  return g;
}

}  // namespace mere

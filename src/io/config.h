// config.json (or any JSON object file) with typed, strict accessors whose
// errors name the file and field: "config.json: missing required field
// 'num_hidden_layers'", "config.json: field 'hidden_size' is a string, expected
// an integer". Also generation_config.json, read into GenerationConfig.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mere {

class ConfigJson {
 public:
  // Errors: missing file, malformed JSON (with line and column), not an object.
  static ConfigJson load(const std::filesystem::path& path);
  // For JSON already in hand (tests, embedded configs); `path` is used in messages.
  static ConfigJson from_json(nlohmann::json json, const std::filesystem::path& path);

  // Supported T: int, int64_t, double, float, bool, std::string, std::vector<int>.
  // Integers written as 4.0 are accepted; 4.5 is not. Null counts as absent.
  template <class T> T require(const std::string& key) const {
    T out;
    read(required(key), key, out);
    return out;
  }
  // `fallback` when absent or null; a present value of the wrong type is an error.
  template <class T> T get(const std::string& key, T fallback) const {
    if (!has(key)) return fallback;
    T out;
    read(json_.at(key), key, out);
    return out;
  }
  // Present and not null.
  bool has(const std::string& key) const;
  // A nested object such as rope_scaling; its errors name the field as
  // 'rope_scaling.factor'. Missing or not an object is an error.
  ConfigJson child(const std::string& key) const;
  // Accepts an absent field; a present one must equal `expected_value`, else an
  // error naming the field, its value and the one mere supports.
  void refuse_unless(const std::string& key, const std::string& expected_value) const;

  const nlohmann::json& raw() const { return json_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  const nlohmann::json& required(const std::string& key) const;
  std::string field(const std::string& key) const;  // "'rope_scaling.factor'"
  void read(const nlohmann::json& v, const std::string& key, int& out) const;
  void read(const nlohmann::json& v, const std::string& key, int64_t& out) const;
  void read(const nlohmann::json& v, const std::string& key, double& out) const;
  void read(const nlohmann::json& v, const std::string& key, float& out) const;
  void read(const nlohmann::json& v, const std::string& key, bool& out) const;
  void read(const nlohmann::json& v, const std::string& key, std::string& out) const;
  void read(const nlohmann::json& v, const std::string& key, std::vector<int>& out) const;

  nlohmann::json json_;
  std::filesystem::path path_;
  std::string prefix_;  // "rope_scaling." inside child("rope_scaling")
};

// Sampling defaults a model ships in generation_config.json; every field is
// optional, and an absent file gives an empty config.
struct GenerationConfig {
  std::vector<int32_t> eos_token_ids;  // eos_token_id: an int or a list
  std::optional<int32_t> bos_token_id;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::optional<bool> do_sample;

  static GenerationConfig load(const std::filesystem::path& model_dir);
};

}  // namespace mere

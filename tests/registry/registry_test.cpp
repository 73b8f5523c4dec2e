// The model registry file (strict reading, atomic writing), runtime settings and
// the header-only model summary behind `mere model show`.
#include "registry/registry.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>

#include "io/safetensors_writer.h"
#include "registry/model_summary.h"
#include "test_util.h"

namespace mere {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

fs::path demo_dir() { return test::source_dir() / "models" / "demo"; }

// Writes `text` as a registry file and loads it.
Registry load_text(const std::string& text) {
  auto file = test::temp_dir("reg") / "models.json";
  test::write_file(file, text);
  return Registry::load(file);
}

TEST(RegistryFile, MissingFileIsAnEmptyRegistry) {
  Registry r = Registry::load(test::temp_dir("reg") / "models.json");
  EXPECT_TRUE(r.entries().empty());
  EXPECT_EQ(r.find("demo"), nullptr);
  expect_error([&] { r.get("demo"); }, {"no model named 'demo'", "models.json", "registered: none"});
}

TEST(RegistryFile, AddSaveLoadRoundTrip) {
  auto dir = test::temp_dir("reg");
  auto file = dir / "sub" / "models.json";  // save creates the directory
  Registry r = Registry::load(file);
  r.add({"demo", demo_dir(), {}});
  r.add({"q3", test::fixtures_dir() / "qwen3", {KvCacheMode::affine8}});
  r.save();
  EXPECT_EQ(std::distance(fs::directory_iterator(dir / "sub"), fs::directory_iterator()), 1)
      << "the temp file was left behind";
  auto j = nlohmann::json::parse(test::read_file(file));
  EXPECT_EQ(j["models"]["q3"]["runtime"]["kv_cache_mode"], "affine8");
  EXPECT_EQ(j["models"]["demo"]["path"], demo_dir().string());

  Registry back = Registry::load(file);
  ASSERT_EQ(back.entries().size(), 2u);
  EXPECT_EQ(back.entries()[0].name, "demo");  // file order is kept
  EXPECT_EQ(back.get("q3").runtime.kv_cache_mode, KvCacheMode::affine8);
  back.set_runtime("demo", {KvCacheMode::bf16});
  back.remove("q3");
  back.save();
  Registry again = Registry::load(file);
  ASSERT_EQ(again.entries().size(), 1u);
  EXPECT_EQ(again.get("demo").runtime.kv_cache_mode, KvCacheMode::bf16);
}

TEST(RegistryFile, ASymlinkedFileKeepsItsLink) {
  auto dir = test::temp_dir("reg");
  fs::create_directories(dir / "dotfiles");
  test::write_file(dir / "dotfiles" / "models.json", R"({"models": {}})");
  fs::create_symlink(dir / "dotfiles" / "models.json", dir / "models.json");
  Registry r = Registry::load(dir / "models.json");
  r.add({"demo", demo_dir(), {}});
  r.save();
  EXPECT_TRUE(fs::is_symlink(dir / "models.json"));
  EXPECT_EQ(Registry::load(dir / "dotfiles" / "models.json").entries().size(), 1u);
}

TEST(RegistryFile, AddRefusesDuplicatesAndBadNames) {
  Registry r = Registry::load(test::temp_dir("reg") / "models.json");
  r.add({"demo", demo_dir(), {}});
  expect_error([&] { r.add({"demo", demo_dir(), {}}); }, {"'demo' is already registered", "remove it first"});
  expect_error([&] { r.add({"my model", demo_dir(), {}}); }, {"'my model' is not a valid model name"});
  expect_error([&] { r.remove("nope"); }, {"no model named 'nope'", "registered: demo"});
  expect_error([&] { r.set_runtime("nope", {}); }, {"no model named 'nope'"});
}

TEST(RegistryFile, ModelNames) {
  for (const char* ok : {"demo", "Qwen3-8B", "llama_3.1", "a", "x.y-z_0"}) EXPECT_TRUE(is_valid_model_name(ok)) << ok;
  for (const char* bad : {"", ".", "..", "a/b", "a b", "../x", "é", "a:b", "~x"})
    EXPECT_FALSE(is_valid_model_name(bad)) << bad;
}

TEST(RegistryFile, MalformedFilesNameTheFileAndEntry) {
  expect_error([] { load_text("{\"models\": {"); }, {"models.json", "malformed JSON", "line 1", "does not rewrite"});
  expect_error([] { load_text("[]"); }, {"models.json", "top level is a list, expected an object"});
  expect_error([] { load_text("{}"); }, {"models.json", "missing field 'models'"});
  expect_error([] { load_text(R"({"models": []})"); }, {"field 'models' is a list, expected an object"});
  expect_error([] { load_text(R"({"models": {}, "extra": 1})"); }, {"unknown top-level field 'extra'"});
  expect_error([] { load_text(R"({"models": {"x": 3}})"); }, {"models.json: model 'x'", "is an integer, expected an object"});
  expect_error([] { load_text(R"({"models": {"x": {}}})"); }, {"model 'x'", "missing field 'path'"});
  expect_error([] { load_text(R"({"models": {"x": {"path": 5}}})"); },
               {"models.json: model 'x'", "field 'path' is an integer, expected a string"});
  expect_error([] { load_text(R"({"models": {"x": {"path": "rel/dir"}}})"); },
               {"model 'x'", "'rel/dir', expected an absolute path"});
  expect_error([] { load_text(R"({"models": {"x": {"path": "/m", "colour": "red"}}})"); },
               {"model 'x'", "unknown field 'colour'"});
  expect_error([] { load_text(R"({"models": {"x": {"path": "/m", "runtime": []}}})"); },
               {"model 'x'", "field 'runtime' is a list, expected an object"});
  expect_error([] { load_text(R"({"models": {"x": {"path": "/m", "runtime": {"kv_cache_mode": 8}}}})"); },
               {"model 'x'", "'runtime.kv_cache_mode' is an integer, expected a string"});
  expect_error([] { load_text(R"({"models": {"x": {"path": "/m", "runtime": {"kv_cache_mode": "fp8"}}}})"); },
               {"models.json: model 'x'", "runtime.kv_cache_mode is 'fp8', expected default, bf16, affine8 or affine4"});
  expect_error([] { load_text(R"({"models": {"x": {"path": "/m", "runtime": {"speed": "max"}}}})"); },
               {"model 'x'", "unknown runtime setting 'speed'"});
  expect_error([] { load_text(R"({"models": {"a b": {"path": "/m"}}})"); }, {"model 'a b'", "not a valid name"});
  expect_error([] { load_text(R"({"models": {"x": {"path": "/m"}, "x": {"path": "/n"}}})"); },
               {"models.json", "'x' appears twice"});
  auto dir = test::temp_dir("reg");
  fs::create_directories(dir / "models.json");
  expect_error([&] { Registry::load(dir / "models.json"); }, {"models.json: is a directory"});
}

TEST(RegistryFile, ConfigDirFollowsTheEnvironment) {
  struct Saved {
    const char* name;
    std::optional<std::string> value;
  };
  std::vector<Saved> saved;
  for (const char* n : {"MERE_CONFIG_DIR", "XDG_CONFIG_HOME", "HOME"}) {
    const char* v = std::getenv(n);
    saved.push_back({n, v ? std::optional<std::string>(v) : std::nullopt});
  }
  setenv("MERE_CONFIG_DIR", "/tmp/a", 1);
  setenv("XDG_CONFIG_HOME", "/tmp/xdg", 1);
  setenv("HOME", "/tmp/home", 1);
  EXPECT_EQ(config_dir(), fs::path("/tmp/a"));
  unsetenv("MERE_CONFIG_DIR");
  EXPECT_EQ(config_dir(), fs::path("/tmp/xdg/mere"));
  EXPECT_EQ(Registry::default_file(), fs::path("/tmp/xdg/mere/models.json"));
  setenv("XDG_CONFIG_HOME", "relative", 1);  // XDG: a relative value is ignored
  EXPECT_EQ(config_dir(), fs::path("/tmp/home/.config/mere"));
  unsetenv("XDG_CONFIG_HOME");
  EXPECT_EQ(config_dir(), fs::path("/tmp/home/.config/mere"));
  unsetenv("HOME");
  expect_error([] { config_dir(); }, {"set MERE_CONFIG_DIR"});
  for (const auto& s : saved)
    if (s.value) setenv(s.name, s.value->c_str(), 1);
    else unsetenv(s.name);
}

TEST(RegistryModelDir, AcceptsModelsAndNamesWhatIsMissing) {
  check_model_dir(demo_dir());
  check_model_dir(test::fixtures_dir() / "llama");
  auto dir = test::temp_dir("notmodel");
  expect_error([&] { check_model_dir(dir / "nope"); }, {"nope: no such directory"});
  test::write_file(dir / "file", "x");
  expect_error([&] { check_model_dir(dir / "file"); }, {"file: not a directory"});
  expect_error([&] { check_model_dir(dir); }, {"not a model directory: no config.json"});
  test::write_file(dir / "config.json", "{\"hidden_size\": 4}");
  expect_error([&] { check_model_dir(dir); }, {"config.json", "'model_type'"});
  test::write_file(dir / "config.json", "{\"model_type\": \"qwen3\"}");
  expect_error([&] { check_model_dir(dir); }, {"no model.safetensors or model.safetensors.index.json"});
}

TEST(RegistryRuntime, ModesParseAndRefuseWhatCannotEngage) {
  for (KvCacheMode m : {KvCacheMode::native, KvCacheMode::bf16, KvCacheMode::affine8, KvCacheMode::affine4})
    EXPECT_EQ(parse_kv_cache_mode(kv_cache_mode_name(m)), m);
  EXPECT_FALSE(parse_kv_cache_mode("fp8"));
  EXPECT_FALSE(parse_kv_cache_mode("BF16"));
  EXPECT_EQ(describe({KvCacheMode::bf16}), "kv_cache_mode=bf16");
  check_engageable({}, Device::cpu);
  check_engageable({}, Device::cuda);
  check_engageable({KvCacheMode::bf16}, Device::cuda);
  check_engageable({KvCacheMode::bf16}, Device::cpu);
  for (KvCacheMode m : {KvCacheMode::affine8, KvCacheMode::affine4}) {  // CUDA reads the codes since issue 7
    check_engageable({m}, Device::cpu);
    check_engageable({m}, Device::cuda);
  }
}

TEST(RegistrySummary, ReadsHeadersAndConfig) {
  ModelSummary s = summarize_model(demo_dir());
  EXPECT_EQ(s.model_type, "qwen3");
  EXPECT_TRUE(s.supported);
  EXPECT_EQ(s.architectures, std::vector<std::string>{"Qwen3ForCausalLM"});
  EXPECT_EQ(s.n_params, 12588672);  // models/demo/README.md
  EXPECT_EQ(s.weight_bytes, 2u * 12588672u);
  EXPECT_EQ(s.tensors_per_dtype.size(), 1u);
  EXPECT_GT(s.tensors_per_dtype["bf16"], 0);
  EXPECT_EQ(s.quantization, "none");
  uint64_t files = 0;
  for (const auto& e : fs::directory_iterator(demo_dir()))
    if (e.is_regular_file()) files += e.file_size();
  EXPECT_EQ(s.size_on_disk_bytes, files);
  EXPECT_GT(s.size_on_disk_bytes, fs::file_size(demo_dir() / "model.safetensors"));

  auto dir = test::temp_dir("quant");  // quantization_config is reported; an unknown type is flagged
  for (const auto& e : fs::directory_iterator(test::fixtures_dir() / "qwen3")) fs::copy(e.path(), dir / e.path().filename());
  auto config = nlohmann::json::parse(test::read_file(dir / "config.json"));
  config["quantization_config"] = {{"quant_method", "fp8"}};
  config["model_type"] = "mystery";
  test::write_file(dir / "config.json", config.dump());
  s = summarize_model(dir);
  EXPECT_EQ(s.quantization, R"({"quant_method":"fp8"})");
  EXPECT_FALSE(s.supported);

  EXPECT_EQ(human_count(12588672), "12.6M");
  EXPECT_EQ(human_count(7.6e9), "7.60B");
  EXPECT_EQ(human_bytes(25312345), "25.3 MB");
  EXPECT_EQ(human_bytes(512), "512 bytes");
}

}  // namespace
}  // namespace mere

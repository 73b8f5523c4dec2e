// mere model add | list | show | remove | runtime, end to end against a registry in a
// temporary MERE_CONFIG_DIR: every success, and every failure leaving the file as it was.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>

#include "test_util.h"

namespace mere {
namespace {

namespace fs = std::filesystem;

std::string demo() { return (test::source_dir() / "models" / "demo").string(); }
std::string fixture(const std::string& family) { return (test::fixtures_dir() / family).string(); }

// Each test gets its own empty config directory; the mere it runs inherits it.
class ModelCmd : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* old = std::getenv("MERE_CONFIG_DIR")) saved_ = old;
    config_ = test::temp_dir("config");
    setenv("MERE_CONFIG_DIR", config_.c_str(), 1);
  }
  void TearDown() override {
    if (saved_) setenv("MERE_CONFIG_DIR", saved_->c_str(), 1);
    else unsetenv("MERE_CONFIG_DIR");
  }
  fs::path file() const { return config_ / "models.json"; }

  // Runs a command that must fail; checks the message and that the registry file is byte-identical.
  void expect_refused(const std::string& args, const std::vector<std::string>& parts) {
    std::string before = fs::exists(file()) ? test::read_file(file()) : "<absent>";
    auto r = test::run_mere(args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.err;
    for (const auto& p : parts) EXPECT_NE(r.err.find(p), std::string::npos) << args << "\nerr: " << r.err << "\nlacks: " << p;
    EXPECT_EQ(fs::exists(file()) ? test::read_file(file()) : "<absent>", before) << args << " changed the file";
  }

  fs::path config_;
  std::optional<std::string> saved_;
};

TEST_F(ModelCmd, AddListShowRemove) {
  auto r = test::run_mere("model list");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("no models registered"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(file())) << "list must not create the file";

  r = test::run_mere("model add demo " + demo());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("added demo"), std::string::npos) << r.out;
  // A relative path is stored absolute.
  r = test::run_mere("model add q3 " + fs::relative(fixture("qwen3")).string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(test::read_file(file()));
  EXPECT_EQ(j["models"]["q3"]["path"], fs::canonical(fixture("qwen3")).string());
  EXPECT_EQ(j["models"]["demo"]["runtime"]["kv_cache_mode"], "default");

  r = test::run_mere("model list");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"NAME", "demo", "q3", "kv_cache_mode=default", "models/demo", "fixtures/qwen3"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;

  r = test::run_mere("model show demo");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"name:          demo", "model_type:    qwen3", "Qwen3ForCausalLM", "12.6M (12588672)",
                        "dtypes:        bf16: ", "quantization:  none", "size on disk:", "runtime:       kv_cache_mode=default"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;

  r = test::run_mere("model remove q3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("removed q3"), std::string::npos);
  EXPECT_TRUE(fs::exists(fixture("qwen3") + "/model.safetensors")) << "remove must not touch the model's files";
  j = nlohmann::json::parse(test::read_file(file()));
  EXPECT_FALSE(j["models"].contains("q3"));
  EXPECT_TRUE(j["models"].contains("demo"));
}

TEST_F(ModelCmd, ShowTakesAPathToo) {
  auto r = test::run_mere("model show " + fixture("llama"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("(not registered)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model_type:    llama"), std::string::npos) << r.out;
}

TEST_F(ModelCmd, AddFailures) {
  ASSERT_EQ(test::run_mere("model add demo " + demo()).exit_code, 0);
  expect_refused("model add demo " + fixture("qwen3"), {"'demo' is already registered", "remove it first"});
  expect_refused("model add 'my model' " + demo(), {"'my model' is not a valid model name"});
  expect_refused("model add x /nonexistent/dir", {"/nonexistent/dir: no such directory"});
  expect_refused("model add x " + (test::source_dir() / "src").string(), {"not a model directory: no config.json"});
  expect_refused("model add x " + demo() + "/config.json", {"not a directory"});
}

TEST_F(ModelCmd, UnknownNames) {
  ASSERT_EQ(test::run_mere("model add demo " + demo()).exit_code, 0);
  for (const char* cmd : {"model remove nope", "model runtime set nope --kv-cache-mode bf16", "model runtime show nope"})
    expect_refused(cmd, {"no model named 'nope'", "registered: demo"});
  expect_refused("model show nope", {"nope: no such file or directory", "no model of that name", "registered: demo"});
  expect_refused("text generate -m nope -p hi", {"nope", "registered: demo"});
}

TEST_F(ModelCmd, AModelDirectoryThatWentAway) {
  test::write_file(file(), R"({"models": {"gone": {"path": "/nonexistent/gone"}}})");
  auto r = test::run_mere("model list");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("/nonexistent/gone  (missing)"), std::string::npos) << r.out;
  expect_refused("model show gone", {"model 'gone'", "points to /nonexistent/gone, which does not exist"});
  expect_refused("text chat -m gone -p hi", {"model 'gone'", "points to /nonexistent/gone, which does not exist"});
  r = test::run_mere("model remove gone");  // forgetting it still works
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(ModelCmd, HelpListsEverySubcommand) {
  auto r = test::run_mere("--help-all");
  ASSERT_EQ(r.exit_code, 0);
  for (const char* s : {"model", "add", "list", "show", "remove", "runtime", "chat"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  r = test::run_mere("model runtime set --help");
  EXPECT_NE(r.out.find("--kv-cache-mode"), std::string::npos) << r.out;
  r = test::run_mere("text chat --help");
  for (const char* s : {"--prompt", "--system", "--reasoning", "--kv-cache-mode", "--stop", "--temperature"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
}

TEST_F(ModelCmd, RuntimeSetShowAndOverride) {
  ASSERT_EQ(test::run_mere("model add q3 " + fixture("qwen3")).exit_code, 0);
  auto r = test::run_mere("model runtime show q3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "kv_cache_mode=default\n");
  r = test::run_mere("model runtime set q3 --kv-cache-mode bf16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run_mere("model runtime show q3");
  EXPECT_EQ(r.out, "kv_cache_mode=bf16\n");
  EXPECT_NE(test::run_mere("model show q3").out.find("kv_cache_mode=bf16"), std::string::npos);

  // The stored setting engages on the CPU too (a bf16 cache), and a flag overrides it.
  r = test::run_mere("text generate -m q3 -p hi -n 2 --device cpu");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("runtime: kv_cache_mode=bf16 (registry entry 'q3')"), std::string::npos) << r.err;
  r = test::run_mere("text generate -m q3 -p hi -n 2 --device cpu --kv-cache-mode default");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("runtime: kv_cache_mode=default (--kv-cache-mode)"), std::string::npos) << r.err;
  // The override is for that run only.
  EXPECT_EQ(test::run_mere("model runtime show q3").out, "kv_cache_mode=bf16\n");
}

// affine8 engages on the CPU, from the registry or the flag; on CUDA it is refused
// with the reason (its kernels are not written yet), never downgraded.
TEST_F(ModelCmd, Affine8RunsOnTheCpuFromTheRegistryOrTheFlag) {
  ASSERT_EQ(test::run_mere("model add demo " + demo()).exit_code, 0);
  auto r = test::run_mere("model runtime set demo --kv-cache-mode affine8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* cmd : {"text generate -m demo -p hi -n 2 --device cpu",
                          "text chat -m demo -p hi -n 2 --device cpu --temperature 0"}) {
    r = test::run_mere(cmd);
    EXPECT_EQ(r.exit_code, 0) << cmd << r.err;
    EXPECT_NE(r.err.find("runtime: kv_cache_mode=affine8 (registry entry 'demo')"), std::string::npos) << r.err;
  }
  r = test::run_mere("text generate -p hi -n 2 --device cpu --kv-cache-mode affine4");  // the flag alone
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("runtime: kv_cache_mode=affine4 (--kv-cache-mode)"), std::string::npos) << r.err;
  r = test::run_mere("eval ppl -f " + (test::source_dir() / "models" / "demo" / "heldout_test.txt").string() +
                     " --ctx 64 --stride 64 --device cpu --kv-cache-mode affine8 --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"ppl\""), std::string::npos) << r.out;
}

TEST_F(ModelCmd, RuntimeSetFailures) {
  ASSERT_EQ(test::run_mere("model add demo " + demo()).exit_code, 0);
  expect_refused("model runtime set demo --kv-cache-mode fp8", {"--kv-cache-mode fp8: expected default, bf16, affine8 or affine4"});
  expect_refused("model runtime set demo", {"give a setting to change"});
  expect_refused("text generate -p hi --kv-cache-mode fp8", {"--kv-cache-mode fp8: expected default, bf16, affine8 or affine4"});
}

// A file someone edited by hand: every command that reads it names the file and the
// entry, and none of them rewrites it.
TEST_F(ModelCmd, BrokenRegistryFilesAreNeverRewritten) {
  const std::string every_command[] = {"model list", "model add other " + demo(), "model remove x",
                                       "model runtime set x --kv-cache-mode bf16", "model runtime show x",
                                       "model show x", "text generate -m x -p hi"};
  struct Case {
    std::string text;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {"{\"models\": {\"x\": ", {"models.json: malformed JSON"}},
      {R"({"models": {"x": {"path": 42}}})", {"models.json: model 'x': field 'path' is an integer, expected a string"}},
      {R"({"models": {"x": {"path": ")" + demo() + R"(", "runtime": {"kv_cache_mode": "fp8"}}}})",
       {"models.json: model 'x': runtime.kv_cache_mode is 'fp8', expected default, bf16, affine8 or affine4"}},
  };
  for (const Case& c : cases) {
    test::write_file(file(), c.text);
    for (const std::string& cmd : every_command) expect_refused(cmd, c.parts);
  }
  // A path that exists never needs the registry, broken or not.
  auto r = test::run_mere("model show " + demo());
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(ModelCmd, RegisteredNameWorksWithEveryDashM) {
  ASSERT_EQ(test::run_mere("model add q3 " + fixture("qwen3")).exit_code, 0);
  auto out = test::temp_dir("out") / "logits.npy";
  auto r = test::run_mere("eval logits -m q3 --ids 1,2,3 --out " + out.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = test::run_mere("text generate -m q3 -p hi -n 2 --temperature 0");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("runtime: kv_cache_mode=default (registry entry 'q3')"), std::string::npos) << r.err;
  // A directory of that name in the working directory wins over the registry.
  auto cwd = test::temp_dir("cwd");
  fs::create_directory_symlink(fixture("llama"), cwd / "q3");
  r = test::run_mere("model show q3");
  EXPECT_NE(r.out.find("qwen3"), std::string::npos);
  auto command = "cd " + cwd.string() + " && " + std::string(MERE_BINARY) + " model show q3 > " +
                 (cwd / "out.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0);
  EXPECT_NE(test::read_file(cwd / "out.txt").find("model_type:    llama"), std::string::npos)
      << test::read_file(cwd / "out.txt");
}

}  // namespace
}  // namespace mere

#include "test_util.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

namespace mere::test {

std::filesystem::path source_dir() { return MERE_SOURCE_DIR; }
std::filesystem::path fixtures_dir() { return source_dir() / "tests" / "fixtures"; }

std::filesystem::path model_dir(const std::string& name) {
  return name == "demo" ? source_dir() / "models" / "demo" : fixtures_dir() / name;
}

std::filesystem::path temp_dir(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string id = info ? std::string(info->test_suite_name()) + "." + info->name() : "mere";
  auto dir = std::filesystem::temp_directory_path() / ("mere_test_" + id + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

CommandResult run_mere(const std::string& args) {
  auto dir = temp_dir("run");
  auto out = dir / "stdout", err = dir / "stderr";
  std::string command = std::string(MERE_BINARY) + " " + args + " >" + out.string() + " 2>" + err.string();
  int status = std::system(command.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<float> normal_values(int64_t n, uint32_t seed, float mean, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(mean, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

MaxDiff max_abs_diff(const Tensor& a, const Tensor& b) {
  MaxDiff m;
  EXPECT_EQ(a.shape(), b.shape());
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) {
    float d = std::fabs(a.at(i) - b.at(i));
    if (!(d <= m.diff)) {  // NaN counts as worst
      m.diff = std::isnan(d) ? INFINITY : d;
      m.index = i;
    }
  }
  return m;
}

}  // namespace mere::test

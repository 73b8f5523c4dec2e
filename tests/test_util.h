// Shared test helpers: paths, temporary files, running the mere binary, .npy reading.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mere::test {

std::filesystem::path source_dir();
std::filesystem::path fixtures_dir();
// The directory of a test model by name: "demo" (models/demo) or a fixture.
std::filesystem::path model_dir(const std::string& name);
// A fresh empty directory under the system temp dir, unique to this test.
std::filesystem::path temp_dir(const std::string& name);

struct CommandResult {
  int exit_code;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs the built `mere` binary with `args` (a shell-quoted string).
CommandResult run_mere(const std::string& args);

void write_file(const std::filesystem::path& path, const std::string& bytes);
std::string read_file(const std::filesystem::path& path);

// Largest |a - b| over the elements, and its index.
struct MaxDiff {
  float diff = 0;
  int64_t index = -1;
};
MaxDiff max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace mere::test

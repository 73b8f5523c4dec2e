// Shared test helpers: paths, temporary files, running the mere binary, .npy reading.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "engine/levers.h"

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
// A JSON file (a fixture's reference.json); a missing file is an error naming it.
nlohmann::json read_json(const std::filesystem::path& path);

// Largest |a - b| over the elements, and its index.
struct MaxDiff {
  float diff = 0;
  int64_t index = -1;
};
MaxDiff max_abs_diff(const Tensor& a, const Tensor& b);
// Largest |value| of t (0 for an empty tensor): the scale relative errors divide by.
float max_abs(const Tensor& t);

// n values drawn from N(mean, sd), the same for the same seed.
std::vector<float> normal_values(int64_t n, uint32_t seed, float mean, float sd);
// An f32 tensor of N(0, sd) values.
Tensor normal_tensor(Shape shape, uint32_t seed, float sd);

// Causal attention in double: q [T, heads, D] against k, v [pos0 + T, kv_heads,
// D], token t seeing keys [0, pos0 + t]; the output [T, heads, D] flattened.
std::vector<double> reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale);
// Largest |got - want| over the elements.
double worst_error(const Tensor& got, const std::vector<double>& want);
// A prefill or decode attention of T query rows after pos0 cached keys.
struct AttentionCase {
  int64_t T, heads, kv_heads, head_dim, pos0;
};
// Its inputs of N(0, 1) values (seeded by the case), k and v stored as kv_dtype,
// the scale 1/sqrt(head_dim), reference_attention's answer, and a label naming
// the case.
struct AttentionProblem {
  Tensor q, k, v;
  float scale;
  std::vector<double> want;
  std::string label;
};
AttentionProblem random_attention_problem(const AttentionCase& c, DType kv_dtype = DType::f32);

// The demo model's prefill on the CPU with a CPU lever off, then on (`set`
// switches it in a Levers): each run's last logits and whether `counter` (the
// lever's kernel counter) moved. The CPU kernels' settings are put back after,
// for the tests after in this process.
struct LeverPrefill {
  std::vector<float> logits;
  bool counted = false;
};
std::array<LeverPrefill, 2> demo_prefill_off_on(void (*set)(Levers&, bool), const std::vector<int32_t>& prompt,
                                                int64_t (*counter)());
// A CPU tiled product (out [T, n_out], NaN where it writes nothing) against the
// product in double, for every T, row count and width given: each result within
// `tolerance` of the sum of its products' magnitudes, a bias on every other
// case, the columns past the block untouched, and `counter` moved by one a
// call. `checked` counts the cases that passed.
using RowsProduct = std::function<std::vector<float>(const std::vector<float>& x, int64_t T, int64_t in,
                                                     const std::vector<float>& rows, int64_t n_rows,
                                                     const float* bias, int64_t n_out)>;
void check_rows_product_against_double(const RowsProduct& product, const std::vector<int64_t>& tokens,
                                       const std::vector<int64_t>& row_counts, const std::vector<int64_t>& widths,
                                       double tolerance, int64_t (*counter)(), int& checked);

// Largest |a - b| over two equal-length vectors (EXPECTs their lengths equal).
float worst_difference(const std::vector<float>& a, const std::vector<float>& b);

// One of the CPU's lever switches (ops::cpu::set_*) set for a scope, off after
// (their state between tests).
class CpuLever {
 public:
  CpuLever(void (*set)(bool), bool on) : set_(set) { set_(on); }
  ~CpuLever() { set_(false); }
  CpuLever(const CpuLever&) = delete;
  CpuLever& operator=(const CpuLever&) = delete;

 private:
  void (*set_)(bool);
};

}  // namespace mere::test

#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "models/model.h"
#include "ops/ops.h"

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

nlohmann::json read_json(const std::filesystem::path& path) {
  MERE_CHECK(std::filesystem::exists(path), "{} is missing", path.string());
  return nlohmann::json::parse(read_file(path));
}

std::vector<float> normal_values(int64_t n, uint32_t seed, float mean, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(mean, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

Tensor normal_tensor(Shape shape, uint32_t seed, float sd) {
  return Tensor::from_floats(normal_values(shape_numel(shape), seed, 0.0f, sd), shape);
}

std::vector<double> reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale) {
  const int64_t T = q.dim(0), H = q.dim(1), D = q.dim(2), KV = k.dim(1), group = H / KV;
  std::vector<double> out(size_t(T * H * D), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t n = pos0 + t + 1, g = h / group;
      std::vector<double> p(static_cast<size_t>(n));
      double top = -INFINITY, sum = 0;
      for (int64_t s = 0; s < n; ++s) {
        double d = 0;
        for (int64_t i = 0; i < D; ++i) d += double(q.at((t * H + h) * D + i)) * double(k.at((s * KV + g) * D + i));
        p[size_t(s)] = d * scale;
        top = std::max(top, p[size_t(s)]);
      }
      for (double& x : p) sum += (x = std::exp(x - top));
      for (int64_t s = 0; s < n; ++s)
        for (int64_t i = 0; i < D; ++i)
          out[size_t((t * H + h) * D + i)] += p[size_t(s)] / sum * double(v.at((s * KV + g) * D + i));
    }
  return out;
}

double worst_error(const Tensor& got, const std::vector<double>& want) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(double(got.at(int64_t(i))) - want[i]));
  return worst;
}

AttentionProblem random_attention_problem(const AttentionCase& c, DType kv_dtype) {
  const uint32_t seed = uint32_t(c.T * 100 + c.heads + c.pos0);
  AttentionProblem p{.q = normal_tensor({c.T, c.heads, c.head_dim}, seed, 1.0f),
                     .k = normal_tensor({c.pos0 + c.T, c.kv_heads, c.head_dim}, seed + 1, 1.0f).to(kv_dtype),
                     .v = normal_tensor({c.pos0 + c.T, c.kv_heads, c.head_dim}, seed + 2, 1.0f).to(kv_dtype),
                     .scale = 1.0f / std::sqrt(float(c.head_dim)),
                     .want = {},
                     .label = {}};
  p.want = reference_attention(p.q, p.k, p.v, c.pos0, p.scale);
  p.label = "T " + std::to_string(c.T) + " heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) +
            " dim " + std::to_string(c.head_dim) + " pos0 " + std::to_string(c.pos0);
  return p;
}

std::array<LeverPrefill, 2> demo_prefill_off_on(void (*set)(Levers&, bool), const std::vector<int32_t>& prompt,
                                                int64_t (*counter)()) {
  std::array<LeverPrefill, 2> runs;
  for (bool on : {false, true}) {
    Levers levers;
    set(levers, on);
    const std::unique_ptr<Model> model = load_model(model_dir("demo"), Device::cpu, levers.load_options(Device::cpu));
    auto state = model->make_state(int64_t(prompt.size()) + 8);
    const int64_t before = counter();
    const Tensor out = model->forward(prompt, *state, /*all_logits=*/false);
    runs[on] = {out.to_floats(), counter() > before};
  }
  ops::set_cpu_settings({});
  return runs;
}

void check_rows_product_against_double(const RowsProduct& product, const std::vector<int64_t>& tokens,
                                       const std::vector<int64_t>& row_counts, const std::vector<int64_t>& widths,
                                       double tolerance, int64_t (*counter)(), int& checked) {
  for (int64_t T : tokens)
    for (int64_t n_rows : row_counts)
      for (int64_t in : widths) {
        const uint32_t seed = uint32_t(T * 1000 + n_rows * 10 + in);
        const std::vector<float> rows = normal_values(n_rows * in, seed, 0.0f, 0.05f);
        const std::vector<float> x = normal_values(T * in, seed + 1, 0.3f, 1.0f);
        const std::vector<float> bias = normal_values(n_rows, seed + 2, 0.0f, 1.0f);
        const int64_t n_out = n_rows + 3;
        const bool with_bias = (T + n_rows) % 2 == 0;
        const int64_t before = counter();
        const std::vector<float> got = product(x, T, in, rows, n_rows, with_bias ? bias.data() : nullptr, n_out);
        EXPECT_EQ(counter(), before + 1);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t r = 0; r < n_rows; ++r) {
            double want = with_bias ? bias[size_t(r)] : 0.0, magnitude = std::fabs(want);
            for (int64_t i = 0; i < in; ++i) {
              const double p = double(rows[size_t(r * in + i)]) * double(x[size_t(t * in + i)]);
              want += p;
              magnitude += std::fabs(p);
            }
            ASSERT_NEAR(got[size_t(t * n_out + r)], want, tolerance * magnitude)
                << "T " << T << " rows " << n_rows << " in " << in << " at token " << t << " row " << r;
          }
        for (int64_t t = 0; t < T; ++t)  // columns past the block untouched
          for (int64_t r = n_rows; r < n_out; ++r) ASSERT_TRUE(std::isnan(got[size_t(t * n_out + r)]));
        ++checked;
      }
}

float worst_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

float max_abs(const Tensor& t) {
  float m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.at(i)));  // NaN: passed over
  return m;
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

// Lever cpu_vnni_matvec (ops/cpu/vnni_matvec.cpp): the CPU's affine decode
// matvecs as integer dot products of the codes and x rounded per group to 23
// bits. Against a double-precision reference on x rounded the same way here
// (so the kernel adds nothing but f32 sums), and against the f32 product on x
// itself (the rounding's whole cost). Skipped where the CPU has no AVX-512 VNNI.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "engine/levers.h"
#include "models/model.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"
#include "quant/affine_quantize.h"
#include "test_util.h"

namespace mere {
namespace {

Tensor linear_with(bool vnni, const Tensor& x, const Weight& w, const Tensor& bias) {
  const test::CpuLever lever(ops::cpu::set_vnni_matvec, vnni);
  return ops::linear(x, w, bias);
}

// x rounded as the kernel rounds it: per token and group, to the integer
// multiples of 2^-k, where 2^k puts the group's largest |x| in [2^21, 2^22).
std::vector<double> rounded_to_23_bits(const std::vector<float>& x, int64_t group) {
  std::vector<double> out(x.size());
  for (size_t g0 = 0; g0 < x.size(); g0 += size_t(group)) {
    double largest = 0;
    for (int64_t i = 0; i < group; ++i) largest = std::max(largest, std::fabs(double(x[g0 + size_t(i)])));
    int e = 0;
    std::frexp(largest, &e);
    for (int64_t i = 0; i < group; ++i)
      out[g0 + size_t(i)] = largest == 0 ? 0.0 : std::ldexp(std::nearbyint(std::ldexp(double(x[g0 + size_t(i)]), 22 - e)), e - 22);
  }
  return out;
}

// out[t, r] = sum_i dense[r, i] * x[t, i] + bias[r], in double.
std::vector<double> reference_product(const Tensor& dense, const std::vector<double>& x, int64_t T,
                                      const Tensor& bias) {
  const int64_t rows = dense.dim(0), in = dense.dim(1);
  std::vector<double> out(size_t(T * rows));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double y = bias.defined() ? double(bias.at(r)) : 0.0;
      for (int64_t i = 0; i < in; ++i) y += double(dense.at(r * in + i)) * x[size_t(t * in + i)];
      out[size_t(t * rows + r)] = y;
    }
  return out;
}

// The largest |got - want| as a fraction of the largest |want|.
double relative_error(const Tensor& got, const std::vector<double>& want) {
  double worst = 0, largest = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::fabs(double(got.at(int64_t(i))) - want[i]));
    largest = std::max(largest, std::fabs(want[i]));
  }
  return worst / largest;
}

struct Case {
  int bits;
  int64_t group, in, T;
};

// The kernel against the rounded reference (f32 sums, within 2e-6 of the
// largest output as the f32 kernels' own tests allow) and against the product on x itself (the rounding, 2^-23 of a
// group's largest value per term). 37 rows: blocks of 4 and 2 rows and a rest;
// 1, 2 and 4 groups a step and groups of two steps; passes of 1-4 tokens and two passes.
void expect_matches_the_references(const Case& c, const std::vector<float>& xv, const std::string& what) {
  const int64_t rows = 37;
  const Tensor w = Tensor::from_floats(test::normal_values(rows * c.in, uint32_t(c.bits * c.group + c.T), 0.0f, 0.05f),
                                       {rows, c.in})
                       .to(DType::bf16);
  const Weight q(quantize_affine(w, c.bits, int(c.group), DType::bf16), c.in);
  const Tensor dense = q.dequantize(DType::f32);
  const Tensor bias = Tensor::from_floats(test::normal_values(rows, 3, 0.0f, 1.0f), {rows});
  const Tensor x = Tensor::from_floats(xv, {c.T, c.in});
  for (const Tensor& b : {Tensor(), bias}) {
    const int64_t runs = ops::cpu::vnni_matvec_runs();
    const Tensor got = linear_with(true, x, q, b);
    ASSERT_EQ(ops::cpu::vnni_matvec_runs(), runs + 1) << what << ": the integer kernel did not run";
    const std::string label = what + (b.defined() ? " bias" : "");
    EXPECT_LE(relative_error(got, reference_product(dense, rounded_to_23_bits(xv, c.group), c.T, b)), 2e-6)
        << label << " against x rounded to 23 bits";
    const std::vector<double> exact(xv.begin(), xv.end());
    EXPECT_LE(relative_error(got, reference_product(dense, exact, c.T, b)), 1e-5) << label << " against x itself";
  }
}

TEST(CpuVnniMatvec, MatchesTheProductOnXRoundedTo23Bits) {
  if (!ops::cpu::vnni_available()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  int checked = 0;
  for (int bits : {4, 8})
    for (int64_t group : {32, 64, 128})
      for (int64_t T : {1, 2, 3, 4, 5, 8}) {
        const Case c{bits, group, 512, T};
        // A mean, so the biases' bias * sum(x) term matters.
        expect_matches_the_references(c, test::normal_values(T * c.in, uint32_t(T * 7 + bits), 0.3f, 1.0f),
                                      "int" + std::to_string(bits) + " g" + std::to_string(group) + " T " +
                                          std::to_string(T));
        ++checked;
      }
  EXPECT_EQ(checked, 36);
}

// Rows whose last step holds fewer groups (int4 rows of 160 and 192 codes, int8
// of 96): x's digits past the row are zeros, so that step's empty lanes sum 0.
TEST(CpuVnniMatvec, RowsEndingInAPartStep) {
  if (!ops::cpu::vnni_available()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  for (const Case& c : {Case{4, 32, 160, 1}, Case{4, 32, 160, 3}, Case{4, 64, 192, 1}, Case{4, 64, 192, 2},
                        Case{8, 32, 96, 1}, Case{8, 32, 96, 4}})
    expect_matches_the_references(c, test::normal_values(c.T * c.in, uint32_t(c.in + c.T), 0.3f, 1.0f),
                                  "int" + std::to_string(c.bits) + " g" + std::to_string(c.group) + " in " +
                                      std::to_string(c.in) + " T " + std::to_string(c.T));
}

// Groups of very different sizes in one row keep their own powers of two; a
// group of zeros; an outlier leaves the rest of its group fewer bits, as on the GPU.
TEST(CpuVnniMatvec, KeepsHugeTinyAndZeroGroups) {
  if (!ops::cpu::vnni_available()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  for (int bits : {4, 8}) {
    const Case c{bits, 64, 512, 2};
    std::vector<float> x = test::normal_values(c.T * c.in, 11, 0.0f, 1.0f);
    for (int64_t i = 0; i < 64; ++i) {
      x[size_t(i)] *= 3e5f;         // group 0: huge
      x[size_t(128 + i)] *= 1e-7f;  // group 2: tiny
      x[size_t(256 + i)] = 0.0f;    // group 4: zeros
    }
    x[size_t(c.in + 70)] = 40.0f;  // token 1, group 1: an outlier
    expect_matches_the_references(c, x, "int" + std::to_string(bits) + " mixed groups");
  }
}

// Where it does not apply, the f32 kernels run and give their own result.
TEST(CpuVnniMatvec, RunsOnlyWhereItApplies) {
  const Tensor w = Tensor::from_floats(test::normal_values(16 * 512, 1, 0.0f, 0.05f), {16, 512}).to(DType::bf16);
  const Weight q4(quantize_affine(w, 4, 64, DType::bf16), 512), q8(quantize_affine(w, 8, 64, DType::bf16), 512);
  const Tensor one = Tensor::from_floats(test::normal_values(512, 2, 0.0f, 1.0f), {1, 512});
  const Tensor nine = Tensor::from_floats(test::normal_values(9 * 512, 3, 0.0f, 1.0f), {9, 512});
  const int64_t runs = ops::cpu::vnni_matvec_runs();
  linear_with(false, one, q4, Tensor());  // the lever off
  linear_with(true, nine, q4, Tensor());  // 9 tokens: prefill's form
  linear_with(true, one, w, Tensor());    // not affine
  // x with a NaN or an infinity: the f32 kernels carry them as they are.
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> xv = test::normal_values(512, 6, 0.0f, 1.0f);
    xv[100] = bad;
    const Tensor x = Tensor::from_floats(xv, {1, 512});
    const Tensor got = linear_with(true, x, q8, Tensor());
    const Tensor want = linear_with(false, x, q8, Tensor());
    for (int64_t r = 0; r < 16; ++r) EXPECT_EQ(std::isnan(got.at(r)), std::isnan(want.at(r))) << r;
  }
  EXPECT_EQ(ops::cpu::vnni_matvec_runs(), runs);
  if (!ops::cpu::vnni_available()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU: it never applies";
  linear_with(true, one, q4, Tensor());
  linear_with(true, one, q8, Tensor());
  EXPECT_EQ(ops::cpu::vnni_matvec_runs(), runs + 2);
}

// A CPU model sets the lever from its load options: a quantized fixture whose
// rows are whole steps (llama-mlx8: int8 g32, 64 columns) decodes through it
// with the default levers and not with the lever off.
TEST(CpuVnniMatvec, ACpuModelRunsWithTheLever) {
  if (!ops::cpu::vnni_available()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  for (bool on : {true, false}) {
    Levers levers;
    levers.cpu_vnni_matvec = on;
    const std::unique_ptr<Model> model =
        load_model(test::fixtures_dir() / "llama-mlx8", Device::cpu, levers.load_options(Device::cpu));
    auto state = model->make_state(16);
    model->forward({1, 2, 3}, *state, /*all_logits=*/false);
    const int64_t runs = ops::cpu::vnni_matvec_runs();
    model->forward({4}, *state, /*all_logits=*/false);
    EXPECT_EQ(ops::cpu::vnni_matvec_runs() > runs, on) << "lever " << (on ? "on" : "off");
  }
}

}  // namespace
}  // namespace mere

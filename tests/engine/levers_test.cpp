#include <gtest/gtest.h>

#include <cstdlib>

#include "core/error.h"
#include "engine/levers.h"

namespace mere {
namespace {

// Sets an environment variable for one scope.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* value) : name(n) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name); }
};

// fused_norm_matvec is the one three-way lever: its default leaves the choice
// to the model (on where every layer matrix's one-token matvec runs on the
// tensor cores), and MERERUN_FUSED_NORM_MATVEC=0/1/auto overrides it.
TEST(Levers, FusedNormMatvecIsAutomaticByDefaultAndTakesThreeValues) {
  EXPECT_EQ(Levers{}.fused_norm_matvec, LeverMode::automatic);
  EXPECT_EQ(Levers::all_off().fused_norm_matvec, LeverMode::off);
  EXPECT_EQ(Levers{}.load_options(Device::cuda).fuse_norm_matvec, LeverMode::automatic);
  EXPECT_EQ(Levers{}.load_options(Device::cpu).fuse_norm_matvec, LeverMode::off);
  EXPECT_NE(Levers{}.describe(Device::cuda).find("fused_norm_matvec=auto"), std::string::npos);
  for (auto [value, mode] : {std::pair{"0", LeverMode::off}, std::pair{"1", LeverMode::on},
                             std::pair{"auto", LeverMode::automatic}, std::pair{"off", LeverMode::off}}) {
    ScopedEnv env("MERERUN_FUSED_NORM_MATVEC", value);
    EXPECT_EQ(Levers::from_env().fused_norm_matvec, mode) << value;
  }
  ScopedEnv bad("MERERUN_FUSED_NORM_MATVEC", "sometimes");
  EXPECT_THROW(Levers::from_env(), Error);
}

// tensor_core_affine_gemm defaults to auto (where it measured faster), is a
// CUDA lever only, and MERERUN_TENSOR_CORE_AFFINE_GEMM=0/1/auto overrides it.
TEST(Levers, TensorCoreAffineGemmIsAutomaticByDefaultOnCuda) {
  EXPECT_EQ(Levers{}.tensor_core_affine_gemm, LeverMode::automatic);
  EXPECT_EQ(Levers::all_off().tensor_core_affine_gemm, LeverMode::off);
  EXPECT_EQ(Levers{}.load_options(Device::cuda).tensor_core_affine_gemm, LeverMode::automatic);
  EXPECT_EQ(Levers{}.load_options(Device::cpu).tensor_core_affine_gemm, LeverMode::off);
  EXPECT_NE(Levers{}.describe(Device::cuda).find("tensor_core_affine_gemm=auto"), std::string::npos);
  for (auto [value, mode] : {std::pair{"0", LeverMode::off}, std::pair{"1", LeverMode::on},
                             std::pair{"auto", LeverMode::automatic}}) {
    ScopedEnv env("MERERUN_TENSOR_CORE_AFFINE_GEMM", value);
    EXPECT_EQ(Levers::from_env().tensor_core_affine_gemm, mode) << value;
  }
}

}  // namespace
}  // namespace mere

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "audit/inputs.h"
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

// A three-way lever whose default leaves the choice to the model or the op
// (`auto`), off on the CPU, and overridden by its variable: 0/off, 1, auto.
void expect_automatic_three_way(LeverMode Levers::*lever, LeverMode LoadOptions::*option, const std::string& name,
                                const char* variable) {
  EXPECT_EQ(Levers{}.*lever, LeverMode::automatic) << name;
  EXPECT_EQ(Levers::all_off().*lever, LeverMode::off) << name;
  EXPECT_EQ(Levers{}.load_options(Device::cuda).*option, LeverMode::automatic) << name;
  EXPECT_EQ(Levers{}.load_options(Device::cpu).*option, LeverMode::off) << name;
  EXPECT_NE(Levers{}.describe(Device::cuda).find(name + "=auto"), std::string::npos) << name;
  for (auto [value, mode] : {std::pair{"0", LeverMode::off}, std::pair{"1", LeverMode::on},
                             std::pair{"auto", LeverMode::automatic}, std::pair{"off", LeverMode::off}}) {
    ScopedEnv env(variable, value);
    EXPECT_EQ(Levers::from_env().*lever, mode) << name << "=" << value;
  }
  ScopedEnv bad(variable, "sometimes");
  EXPECT_THROW(Levers::from_env(), Error) << name;
}

// kernel_token_slots: a decode loop lever, on by default (measured), off in
// all_off(), switched by its variable, named on the lever line and by `mere audit --lever`.
TEST(Levers, KernelTokenSlotsIsADecodeLoopLeverOnByDefault) {
  EXPECT_TRUE(Levers{}.kernel_token_slots);
  EXPECT_FALSE(Levers::all_off().kernel_token_slots);
  EXPECT_NE(Levers{}.describe(Device::cuda).find("kernel_token_slots=on"), std::string::npos);
  ScopedEnv off("MERERUN_KERNEL_TOKEN_SLOTS", "0");
  EXPECT_FALSE(Levers::from_env().kernel_token_slots);
  EXPECT_NE(Levers::from_env().describe(Device::cuda).find("kernel_token_slots=off"), std::string::npos);
  const std::vector<std::string> names = engine_lever_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "kernel_token_slots"), names.end());
  EXPECT_EQ(engine_lever_device("kernel_token_slots"), Device::cuda);
}

// fused_norm_matvec: auto folds a step where every layer matrix of its rows runs on the tensor cores.
TEST(Levers, FusedNormMatvecIsAutomaticByDefaultAndTakesThreeValues) {
  expect_automatic_three_way(&Levers::fused_norm_matvec, &LoadOptions::fuse_norm_matvec, "fused_norm_matvec",
                             "MERERUN_FUSED_NORM_MATVEC");
}

// tensor_core_affine_gemm: prompts up to 384 tokens of matrices of 2^24 weights, where it measured faster.
TEST(Levers, TensorCoreAffineGemmIsAutomaticByDefaultOnCuda) {
  expect_automatic_three_way(&Levers::tensor_core_affine_gemm, &LoadOptions::tensor_core_affine_gemm,
                             "tensor_core_affine_gemm", "MERERUN_TENSOR_CORE_AFFINE_GEMM");
}

// int16_activation_matvec: on by default, a CUDA lever, switched off by its variable.
TEST(Levers, Int16ActivationMatvecIsOnByDefaultAndCudaOnly) {
  EXPECT_TRUE(Levers{}.int16_activation_matvec);
  EXPECT_FALSE(Levers::all_off().int16_activation_matvec);
  EXPECT_NE(Levers{}.describe(Device::cuda).find("int16_activation_matvec=on"), std::string::npos);
  EXPECT_TRUE(Levers{}.load_options(Device::cuda).int16_activation_matvec);
  EXPECT_FALSE(Levers{}.load_options(Device::cpu).int16_activation_matvec);
  {
    ScopedEnv env("MERERUN_INT16_ACTIVATION_MATVEC", "0");
    EXPECT_FALSE(Levers::from_env().int16_activation_matvec);
    EXPECT_FALSE(Levers::from_env().load_options(Device::cuda).int16_activation_matvec);
  }
  ScopedEnv bad("MERERUN_INT16_ACTIVATION_MATVEC", "maybe");
  EXPECT_THROW(Levers::from_env(), Error);
}

// rope_in_attention: on by default, a CUDA lever that needs fused_rope_store
// (it folds that kernel), switched by its variable.
TEST(Levers, RopeInAttentionIsOnByDefaultAndFollowsFusedRopeStore) {
  EXPECT_TRUE(Levers{}.rope_in_attention);
  EXPECT_FALSE(Levers::all_off().rope_in_attention);
  EXPECT_TRUE(Levers{}.load_options(Device::cuda).rope_in_attention);
  EXPECT_FALSE(Levers{}.load_options(Device::cpu).rope_in_attention);
  EXPECT_NE(Levers{}.describe(Device::cuda).find("rope_in_attention=on"), std::string::npos);
  Levers unfused;
  unfused.fused_rope_store = false;
  EXPECT_FALSE(unfused.load_options(Device::cuda).rope_in_attention);
  {
    ScopedEnv env("MERERUN_ROPE_IN_ATTENTION", "0");
    EXPECT_FALSE(Levers::from_env().load_options(Device::cuda).rope_in_attention);
  }
  ScopedEnv bad("MERERUN_ROPE_IN_ATTENTION", "perhaps");
  EXPECT_THROW(Levers::from_env(), Error);
}

// wide_attention_blocks: on by default, a CUDA lever switched by its variable.
TEST(Levers, WideAttentionBlocksIsACudaLever) {
  EXPECT_TRUE(Levers{}.wide_attention_blocks);
  EXPECT_FALSE(Levers::all_off().wide_attention_blocks);
  EXPECT_TRUE(Levers{}.load_options(Device::cuda).wide_attention_blocks);
  EXPECT_FALSE(Levers{}.load_options(Device::cpu).wide_attention_blocks);
  EXPECT_NE(Levers{}.describe(Device::cuda).find("wide_attention_blocks=on"), std::string::npos);
  {
    ScopedEnv env("MERERUN_WIDE_ATTENTION_BLOCKS", "0");
    EXPECT_FALSE(Levers::from_env().load_options(Device::cuda).wide_attention_blocks);
  }
  ScopedEnv bad("MERERUN_WIDE_ATTENTION_BLOCKS", "sometimes");
  EXPECT_THROW(Levers::from_env(), Error);
}

// cluster_attention_merge: on by default, a CUDA lever that needs
// wide_attention_blocks (it merges those blocks' splits).
TEST(Levers, ClusterAttentionMergeIsOnAndFollowsWideAttentionBlocks) {
  EXPECT_TRUE(Levers{}.cluster_attention_merge);
  EXPECT_FALSE(Levers::all_off().cluster_attention_merge);
  Levers on;
  EXPECT_TRUE(on.load_options(Device::cuda).cluster_attention_merge);
  EXPECT_FALSE(on.load_options(Device::cpu).cluster_attention_merge);
  EXPECT_NE(on.describe(Device::cuda).find("cluster_attention_merge=on"), std::string::npos);
  on.wide_attention_blocks = false;
  EXPECT_FALSE(on.load_options(Device::cuda).cluster_attention_merge);
  {
    ScopedEnv env("MERERUN_CLUSTER_ATTENTION_MERGE", "0");
    EXPECT_FALSE(Levers::from_env().load_options(Device::cuda).cluster_attention_merge);
  }
  ScopedEnv bad("MERERUN_CLUSTER_ATTENTION_MERGE", "rarely");
  EXPECT_THROW(Levers::from_env(), Error);
}

// A lever on by default on its `home` device: off in all_off() and on the other
// device, switched by `variable` to either value, which the lever line shows.
// A CPU lever is also one `mere audit --lever` takes, and gates on the CPU.
void expect_default_lever(Device home, const char* variable, const std::string& name, bool Levers::*lever,
                          bool LoadOptions::*option) {
  const Device other = home == Device::cuda ? Device::cpu : Device::cuda;
  if (home == Device::cpu) {
    const std::vector<std::string> names = engine_lever_names();
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
    EXPECT_EQ(engine_lever_device(name), Device::cpu) << name;
  }
  EXPECT_TRUE(Levers{}.*lever) << name;
  EXPECT_TRUE(Levers{}.load_options(home).*option) << name;
  EXPECT_FALSE(Levers::all_off().*lever) << name;
  EXPECT_FALSE(Levers{}.load_options(other).*option) << name;
  for (const char* value : {"0", "1"}) {
    ScopedEnv env(variable, value);
    const bool on = value[0] == '1';
    EXPECT_EQ(Levers::from_env().*lever, on) << name;
    EXPECT_EQ(Levers::from_env().load_options(home).*option, on) << name;
    const std::string described = name + (on ? "=on" : "=off");
    EXPECT_NE(Levers::from_env().describe(home).find(described), std::string::npos) << name;
  }
}

void expect_default_cuda_lever(const char* variable, const std::string& name, bool Levers::*lever,
                               bool LoadOptions::*option) {
  expect_default_lever(Device::cuda, variable, name, lever, option);
}

// A lever that acts through another (`needed`) is off in the CUDA load
// options when that one is off, its own default left on.
void expect_off_without(bool Levers::*needed, bool LoadOptions::*option) {
  Levers levers;
  levers.*needed = false;
  EXPECT_FALSE(levers.load_options(Device::cuda).*option);
}

// tensor_core_fp8_matvec: on by default, a CUDA lever switched by its variable.
TEST(Levers, TensorCoreFp8MatvecIsACudaLever) {
  expect_default_cuda_lever("MERERUN_TENSOR_CORE_FP8_MATVEC", "tensor_core_fp8_matvec", &Levers::tensor_core_fp8_matvec,
                            &LoadOptions::tensor_core_fp8_matvec);
}

// tensor_core_moe_matvec: on by default, a CUDA lever switched by its variable.
TEST(Levers, TensorCoreMoeMatvecIsACudaLever) {
  expect_default_cuda_lever("MERERUN_TENSOR_CORE_MOE_MATVEC", "tensor_core_moe_matvec", &Levers::tensor_core_moe_matvec,
                            &LoadOptions::tensor_core_moe_matvec);
}

// sixteen_token_matvec: on by default, a CUDA lever switched by its variable,
// acting through the tensor-core matvec and its two-digit x.
TEST(Levers, SixteenTokenMatvecIsACudaLeverOfTheTwoDigitMatvec) {
  expect_default_cuda_lever("MERERUN_SIXTEEN_TOKEN_MATVEC", "sixteen_token_matvec", &Levers::sixteen_token_matvec,
                            &LoadOptions::sixteen_token_matvec);
  expect_off_without(&Levers::tensor_core_affine_matvec, &LoadOptions::sixteen_token_matvec);
  expect_off_without(&Levers::int16_activation_matvec, &LoadOptions::sixteen_token_matvec);
}

// sixteen_token_experts: on by default, a CUDA lever switched by its variable,
// in effect only with the tensor-core experts it extends.
TEST(Levers, SixteenTokenExpertsIsACudaLeverOfTheTensorCoreExperts) {
  expect_default_cuda_lever("MERERUN_SIXTEEN_TOKEN_EXPERTS", "sixteen_token_experts", &Levers::sixteen_token_experts,
                            &LoadOptions::sixteen_token_experts);
  expect_off_without(&Levers::tensor_core_moe_matvec, &LoadOptions::sixteen_token_experts);
}

// uneven_row_cuts: on by default, acting through the tensor-core affine matvec it cuts rows for.
TEST(Levers, UnevenRowCutsIsACudaLeverOfTheTensorCoreAffineMatvec) {
  expect_default_cuda_lever("MERERUN_UNEVEN_ROW_CUTS", "uneven_row_cuts", &Levers::uneven_row_cuts,
                            &LoadOptions::uneven_row_cuts);
  expect_off_without(&Levers::tensor_core_affine_matvec, &LoadOptions::uneven_row_cuts);
}

// tensor_core_affine_moe_gemm: on by default, a CUDA lever switched by its variable.
TEST(Levers, TensorCoreAffineMoeGemmIsACudaLever) {
  expect_default_cuda_lever("MERERUN_TENSOR_CORE_AFFINE_MOE_GEMM", "tensor_core_affine_moe_gemm",
                            &Levers::tensor_core_affine_moe_gemm, &LoadOptions::tensor_core_affine_moe_gemm);
}

// tensor_core_dense_moe_gemm: on by default, a CUDA lever switched by its variable.
TEST(Levers, TensorCoreDenseMoeGemmIsACudaLever) {
  expect_default_cuda_lever("MERERUN_TENSOR_CORE_DENSE_MOE_GEMM", "tensor_core_dense_moe_gemm",
                            &Levers::tensor_core_dense_moe_gemm, &LoadOptions::tensor_core_dense_moe_gemm);
}

// tensor_core_fp8_gemm: on by default, a CUDA lever switched by its variable.
TEST(Levers, TensorCoreFp8GemmIsACudaLever) {
  expect_default_cuda_lever("MERERUN_TENSOR_CORE_FP8_GEMM", "tensor_core_fp8_gemm", &Levers::tensor_core_fp8_gemm,
                            &LoadOptions::tensor_core_fp8_gemm);
}

// grouped_swiglu_epilogue: on by default, a CUDA lever switched by its variable.
TEST(Levers, GroupedSwigluEpilogueIsACudaLever) {
  expect_default_cuda_lever("MERERUN_GROUPED_SWIGLU_EPILOGUE", "grouped_swiglu_epilogue",
                            &Levers::grouped_swiglu_epilogue, &LoadOptions::grouped_swiglu_epilogue);
}

// formed_gemm_input: on by default, a CUDA lever switched by its variable.
TEST(Levers, FormedGemmInputIsACudaLever) {
  expect_default_cuda_lever("MERERUN_FORMED_GEMM_INPUT", "formed_gemm_input", &Levers::formed_gemm_input,
                            &LoadOptions::formed_gemm_input);
}

// split_sum_kernel: on by default, a CUDA lever switched by its variable.
TEST(Levers, SplitSumKernelIsACudaLever) {
  expect_default_cuda_lever("MERERUN_SPLIT_SUM_KERNEL", "split_sum_kernel", &Levers::split_sum_kernel,
                            &LoadOptions::split_sum_kernel);
}

// routing_in_experts: on by default, a CUDA lever switched by its variable, in
// effect only with the tensor-core experts it routes in.
TEST(Levers, RoutingInExpertsIsACudaLeverOfTheTensorCoreExperts) {
  expect_default_cuda_lever("MERERUN_ROUTING_IN_EXPERTS", "routing_in_experts", &Levers::routing_in_experts,
                            &LoadOptions::routing_in_experts);
  expect_off_without(&Levers::tensor_core_moe_matvec, &LoadOptions::routing_in_experts);
}

// deep_moe_ring: on by default, a CUDA lever switched by its variable, in
// effect only with the tensor-core experts whose ring it deepens.
TEST(Levers, DeepMoeRingIsACudaLeverOfTheTensorCoreExperts) {
  expect_default_cuda_lever("MERERUN_DEEP_MOE_RING", "deep_moe_ring", &Levers::deep_moe_ring,
                            &LoadOptions::deep_moe_ring);
  expect_off_without(&Levers::tensor_core_moe_matvec, &LoadOptions::deep_moe_ring);
}

// deep_dense_ring: on by default, a CUDA lever switched by its variable, in
// effect only with the tensor-core affine matvec whose ring it deepens.
TEST(Levers, DeepDenseRingIsACudaLeverOfTheTensorCoreAffineMatvec) {
  expect_default_cuda_lever("MERERUN_DEEP_DENSE_RING", "deep_dense_ring", &Levers::deep_dense_ring,
                            &LoadOptions::deep_dense_ring);
  expect_off_without(&Levers::tensor_core_affine_matvec, &LoadOptions::deep_dense_ring);
}

// wide_batch_stages: on by default, a CUDA lever switched by its variable, in
// effect only with the tensor-core affine matvec whose stages it widens.
TEST(Levers, WideBatchStagesIsACudaLeverOfTheTensorCoreAffineMatvec) {
  expect_default_cuda_lever("MERERUN_WIDE_BATCH_STAGES", "wide_batch_stages", &Levers::wide_batch_stages,
                            &LoadOptions::wide_batch_stages);
  expect_off_without(&Levers::tensor_core_affine_matvec, &LoadOptions::wide_batch_stages);
}

// int4_byte_codes: on by default, a CUDA lever switched by its variable, in
// effect only with the tensor-core experts whose codes it reads.
TEST(Levers, Int4ByteCodesIsACudaLeverOfTheTensorCoreExperts) {
  expect_default_cuda_lever("MERERUN_INT4_BYTE_CODES", "int4_byte_codes", &Levers::int4_byte_codes,
                            &LoadOptions::int4_byte_codes);
  expect_off_without(&Levers::tensor_core_moe_matvec, &LoadOptions::int4_byte_codes);
}

// streamed_weights: on by default, a CUDA lever switched by its variable; the
// engine's launch settings carry it to the kernels.
TEST(Levers, StreamedWeightsIsACudaLever) {
  expect_default_cuda_lever("MERERUN_STREAMED_WEIGHTS", "streamed_weights", &Levers::streamed_weights,
                            &LoadOptions::streamed_weights);
}

// The CPU's own levers.
TEST(Levers, CpuDirectMatvecIsOnByDefaultAndCpuOnly) {
  expect_default_lever(Device::cpu, "MERERUN_CPU_DIRECT_MATVEC", "cpu_direct_matvec", &Levers::cpu_direct_matvec,
                       &LoadOptions::cpu_direct_matvec);
}

TEST(Levers, CpuVnniMatvecIsOnByDefaultAndCpuOnly) {
  expect_default_lever(Device::cpu, "MERERUN_CPU_VNNI_MATVEC", "cpu_vnni_matvec", &Levers::cpu_vnni_matvec,
                       &LoadOptions::cpu_vnni_matvec);
}

TEST(Levers, CpuVectorAttentionIsOnByDefaultAndCpuOnly) {
  expect_default_lever(Device::cpu, "MERERUN_CPU_VECTOR_ATTENTION", "cpu_vector_attention",
                       &Levers::cpu_vector_attention, &LoadOptions::cpu_vector_attention);
}

TEST(Levers, CpuAvx512MatmulIsOnByDefaultAndCpuOnly) {
  expect_default_lever(Device::cpu, "MERERUN_CPU_AVX512_MATMUL", "cpu_avx512_matmul", &Levers::cpu_avx512_matmul,
                       &LoadOptions::cpu_avx512_matmul);
}

TEST(Levers, CpuPackedMatmulIsOnByDefaultAndCpuOnly) {
  expect_default_lever(Device::cpu, "MERERUN_CPU_PACKED_MATMUL", "cpu_packed_matmul", &Levers::cpu_packed_matmul,
                       &LoadOptions::cpu_packed_matmul);
}

TEST(Levers, CpuAvx512AttentionIsOnByDefaultAndCpuOnly) {
  expect_default_lever(Device::cpu, "MERERUN_CPU_AVX512_ATTENTION", "cpu_avx512_attention",
                       &Levers::cpu_avx512_attention, &LoadOptions::cpu_avx512_attention);
}

TEST(Levers, CpuTiledMatmulIsOnByDefaultAndCpuOnly) {
  expect_default_lever(Device::cpu, "MERERUN_CPU_TILED_MATMUL", "cpu_tiled_matmul", &Levers::cpu_tiled_matmul,
                       &LoadOptions::cpu_tiled_matmul);
}

}  // namespace
}  // namespace mere

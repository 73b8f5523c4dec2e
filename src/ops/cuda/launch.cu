// Launch settings the kernel launchers share (levers programmatic_launch,
// matvec_split_k, fp8_activation_gemm, int8_activation_matvec,
// tensor_core_kv_attention, tensor_core_attention, tensor_core_affine_matvec,
// int16_activation_matvec, sixteen_token_matvec, sixteen_token_experts, tensor_core_fp8_matvec,
// tensor_core_moe_matvec, routing_in_experts, tensor_core_affine_gemm, tensor_core_affine_moe_gemm,
// tensor_core_dense_moe_gemm, tensor_core_fp8_gemm, grouped_swiglu_epilogue, formed_gemm_input,
// split_sum_kernel,
// rope_in_attention and
// wide_attention_blocks), the decode step's key count and its promise that the cache rows before its
// position are final, and device queries.
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {
bool programmatic_launch = false;
bool matvec_split_k = false;
bool fp8_activation_gemm = false;
bool int8_activation_matvec = false;
bool tensor_core_kv_attention = false;
bool tensor_core_attention = false;
bool tensor_core_affine_matvec = false;
bool int16_activation_matvec = false;
bool sixteen_token_matvec = false;
bool sixteen_token_experts = false;
bool tensor_core_fp8_matvec = false;
bool tensor_core_moe_matvec = false;
bool routing_in_experts = false;
bool tensor_core_affine_gemm = false;
bool affine_gemm_every_size = false;
bool tensor_core_affine_moe_gemm = false;
bool tensor_core_dense_moe_gemm = false;
bool tensor_core_fp8_gemm = false;
bool grouped_swiglu_epilogue = false;
bool formed_gemm_input = false;
bool split_sum_kernel = false;
bool rope_in_attention = false;
bool wide_attention_blocks = false;
bool cluster_attention_merge = false;
bool rows_final = false;
int64_t step_keys = 0;
int64_t step_keys_lo = 1, step_keys_hi = INT64_MAX;
}

bool programmatic_launch_enabled() { return programmatic_launch; }
void set_programmatic_launch(bool on) { programmatic_launch = on; }
bool matvec_split_k_enabled() { return matvec_split_k; }
void set_matvec_split_k(bool on) { matvec_split_k = on; }
bool fp8_activation_gemm_enabled() { return fp8_activation_gemm; }
void set_fp8_activation_gemm(bool on) { fp8_activation_gemm = on; }
bool int8_activation_matvec_enabled() { return int8_activation_matvec; }
void set_int8_activation_matvec(bool on) { int8_activation_matvec = on; }
bool tensor_core_kv_attention_enabled() { return tensor_core_kv_attention; }
void set_tensor_core_kv_attention(bool on) { tensor_core_kv_attention = on; }
bool tensor_core_attention_enabled() { return tensor_core_attention; }
void set_tensor_core_attention(bool on) { tensor_core_attention = on; }
bool tensor_core_affine_matvec_enabled() { return tensor_core_affine_matvec; }
void set_tensor_core_affine_matvec(bool on) { tensor_core_affine_matvec = on; }
bool int16_activation_matvec_enabled() { return int16_activation_matvec; }
bool sixteen_token_matvec_enabled() { return sixteen_token_matvec; }
void set_sixteen_token_matvec(bool on) { sixteen_token_matvec = on; }
bool sixteen_token_experts_enabled() { return sixteen_token_experts; }
void set_sixteen_token_experts(bool on) { sixteen_token_experts = on; }
void set_int16_activation_matvec(bool on) { int16_activation_matvec = on; }
bool tensor_core_fp8_matvec_enabled() { return tensor_core_fp8_matvec; }
void set_tensor_core_fp8_matvec(bool on) { tensor_core_fp8_matvec = on; }
bool tensor_core_moe_matvec_enabled() { return tensor_core_moe_matvec; }
void set_tensor_core_moe_matvec(bool on) { tensor_core_moe_matvec = on; }
bool routing_in_experts_enabled() { return routing_in_experts; }
void set_routing_in_experts(bool on) { routing_in_experts = on; }
bool rope_in_attention_enabled() { return rope_in_attention; }
void set_rope_in_attention(bool on) { rope_in_attention = on; }
bool wide_attention_blocks_enabled() { return wide_attention_blocks; }
void set_wide_attention_blocks(bool on) { wide_attention_blocks = on; }
bool cluster_attention_merge_enabled() { return cluster_attention_merge; }
void set_cluster_attention_merge(bool on) { cluster_attention_merge = on; }

void set_decode_keys(int64_t keys) {
  step_keys = keys;
  step_keys_lo = 1, step_keys_hi = INT64_MAX;
}
int64_t decode_keys() { return step_keys; }
void set_cached_rows_final(bool final) { rows_final = final; }
bool cached_rows_final() { return rows_final; }
void narrow_decode_keys_range(int64_t lo, int64_t hi) {
  step_keys_lo = std::max(step_keys_lo, lo);
  step_keys_hi = std::min(step_keys_hi, hi);
}
void decode_keys_range(int64_t& lo, int64_t& hi) { lo = step_keys_lo, hi = step_keys_hi; }
bool tensor_core_affine_gemm_enabled() { return tensor_core_affine_gemm; }
bool affine_gemm_at_every_size() { return affine_gemm_every_size; }
void set_tensor_core_affine_gemm(bool on, bool every_size) {
  tensor_core_affine_gemm = on;
  affine_gemm_every_size = every_size;
}
bool tensor_core_affine_moe_gemm_enabled() { return tensor_core_affine_moe_gemm; }
void set_tensor_core_affine_moe_gemm(bool on) { tensor_core_affine_moe_gemm = on; }
bool tensor_core_dense_moe_gemm_enabled() { return tensor_core_dense_moe_gemm; }
void set_tensor_core_dense_moe_gemm(bool on) { tensor_core_dense_moe_gemm = on; }
bool tensor_core_fp8_gemm_enabled() { return tensor_core_fp8_gemm; }
void set_tensor_core_fp8_gemm(bool on) { tensor_core_fp8_gemm = on; }
bool grouped_swiglu_epilogue_enabled() { return grouped_swiglu_epilogue; }
void set_grouped_swiglu_epilogue(bool on) { grouped_swiglu_epilogue = on; }
bool formed_gemm_input_enabled() { return formed_gemm_input; }
void set_formed_gemm_input(bool on) { formed_gemm_input = on; }
bool split_sum_kernel_enabled() { return split_sum_kernel; }
void set_split_sum_kernel(bool on) { split_sum_kernel = on; }

int device_attribute(cudaDeviceAttr attribute) {
  int device = 0, value = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&value, attribute, device);
  return value;
}
int sm_count() {
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  return sms;
}

}  // namespace mere::cuda

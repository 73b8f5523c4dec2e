#include "engine/levers.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace mere {
namespace {

bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  if (!std::strcmp(v, "1") || !std::strcmp(v, "true") || !std::strcmp(v, "on")) return true;
  if (!std::strcmp(v, "0") || !std::strcmp(v, "false") || !std::strcmp(v, "off")) return false;
  fail("{}={}: expected 0 or 1", name, v);
}

LeverMode env_mode(const char* name, LeverMode fallback) {
  const char* v = std::getenv(name);
  if (v && (!std::strcmp(v, "auto") || !std::strcmp(v, "automatic"))) return LeverMode::automatic;
  if (!v || !*v) return fallback;
  return env_flag(name, false) ? LeverMode::on : LeverMode::off;
}

}  // namespace

Levers Levers::from_env() {
  Levers l;
  l.cuda_graphs = env_flag("MERERUN_CUDA_GRAPHS", l.cuda_graphs);
  l.pipelined_decode = env_flag("MERERUN_PIPELINED_DECODE", l.pipelined_decode);
  l.kernel_token_slots = env_flag("MERERUN_KERNEL_TOKEN_SLOTS", l.kernel_token_slots);
  l.fused_projections = env_flag("MERERUN_FUSED_PROJECTIONS", l.fused_projections);
  l.fused_rope_store = env_flag("MERERUN_FUSED_ROPE_STORE", l.fused_rope_store);
  l.rope_in_attention = env_flag("MERERUN_ROPE_IN_ATTENTION", l.rope_in_attention);
  l.wide_attention_blocks = env_flag("MERERUN_WIDE_ATTENTION_BLOCKS", l.wide_attention_blocks);
  l.cluster_attention_merge = env_flag("MERERUN_CLUSTER_ATTENTION_MERGE", l.cluster_attention_merge);
  l.fused_norm_matvec = env_mode("MERERUN_FUSED_NORM_MATVEC", l.fused_norm_matvec);
  l.programmatic_launch = env_flag("MERERUN_PROGRAMMATIC_LAUNCH", l.programmatic_launch);
  l.matvec_split_k = env_flag("MERERUN_MATVEC_SPLIT_K", l.matvec_split_k);
  l.fp8_activation_gemm = env_flag("MERERUN_FP8_ACTIVATION_GEMM", l.fp8_activation_gemm);
  l.int8_activation_matvec = env_flag("MERERUN_INT8_ACTIVATION_MATVEC", l.int8_activation_matvec);
  l.tensor_core_kv_attention = env_flag("MERERUN_TENSOR_CORE_KV_ATTENTION", l.tensor_core_kv_attention);
  l.tensor_core_attention = env_flag("MERERUN_TENSOR_CORE_ATTENTION", l.tensor_core_attention);
  l.tensor_core_affine_matvec = env_flag("MERERUN_TENSOR_CORE_AFFINE_MATVEC", l.tensor_core_affine_matvec);
  l.int16_activation_matvec = env_flag("MERERUN_INT16_ACTIVATION_MATVEC", l.int16_activation_matvec);
  l.sixteen_token_matvec = env_flag("MERERUN_SIXTEEN_TOKEN_MATVEC", l.sixteen_token_matvec);
  l.sixteen_token_experts = env_flag("MERERUN_SIXTEEN_TOKEN_EXPERTS", l.sixteen_token_experts);
  l.tensor_core_fp8_matvec = env_flag("MERERUN_TENSOR_CORE_FP8_MATVEC", l.tensor_core_fp8_matvec);
  l.tensor_core_moe_matvec = env_flag("MERERUN_TENSOR_CORE_MOE_MATVEC", l.tensor_core_moe_matvec);
  l.routing_in_experts = env_flag("MERERUN_ROUTING_IN_EXPERTS", l.routing_in_experts);
  l.deep_moe_ring = env_flag("MERERUN_DEEP_MOE_RING", l.deep_moe_ring);
  l.deep_dense_ring = env_flag("MERERUN_DEEP_DENSE_RING", l.deep_dense_ring);
  l.wide_batch_stages = env_flag("MERERUN_WIDE_BATCH_STAGES", l.wide_batch_stages);
  l.uneven_row_cuts = env_flag("MERERUN_UNEVEN_ROW_CUTS", l.uneven_row_cuts);
  l.int4_byte_codes = env_flag("MERERUN_INT4_BYTE_CODES", l.int4_byte_codes);
  l.streamed_weights = env_flag("MERERUN_STREAMED_WEIGHTS", l.streamed_weights);
  l.tensor_core_affine_gemm = env_mode("MERERUN_TENSOR_CORE_AFFINE_GEMM", l.tensor_core_affine_gemm);
  l.tensor_core_affine_moe_gemm = env_flag("MERERUN_TENSOR_CORE_AFFINE_MOE_GEMM", l.tensor_core_affine_moe_gemm);
  l.tensor_core_dense_moe_gemm = env_flag("MERERUN_TENSOR_CORE_DENSE_MOE_GEMM", l.tensor_core_dense_moe_gemm);
  l.tensor_core_fp8_gemm = env_flag("MERERUN_TENSOR_CORE_FP8_GEMM", l.tensor_core_fp8_gemm);
  l.grouped_swiglu_epilogue = env_flag("MERERUN_GROUPED_SWIGLU_EPILOGUE", l.grouped_swiglu_epilogue);
  l.formed_gemm_input = env_flag("MERERUN_FORMED_GEMM_INPUT", l.formed_gemm_input);
  l.split_sum_kernel = env_flag("MERERUN_SPLIT_SUM_KERNEL", l.split_sum_kernel);
  l.fused_moe_gate_up = env_flag("MERERUN_PSI_FUSED_MOE", l.fused_moe_gate_up);
  l.prefix_cache = env_flag("MERERUN_PREFIX_CACHE", l.prefix_cache);
  l.cpu_direct_matvec = env_flag("MERERUN_CPU_DIRECT_MATVEC", l.cpu_direct_matvec);
  l.cpu_tiled_matmul = env_flag("MERERUN_CPU_TILED_MATMUL", l.cpu_tiled_matmul);
  l.cpu_vnni_matvec = env_flag("MERERUN_CPU_VNNI_MATVEC", l.cpu_vnni_matvec);
  l.cpu_vector_attention = env_flag("MERERUN_CPU_VECTOR_ATTENTION", l.cpu_vector_attention);
  l.cpu_avx512_matmul = env_flag("MERERUN_CPU_AVX512_MATMUL", l.cpu_avx512_matmul);
  l.cpu_packed_matmul = env_flag("MERERUN_CPU_PACKED_MATMUL", l.cpu_packed_matmul);
  l.cpu_avx512_attention = env_flag("MERERUN_CPU_AVX512_ATTENTION", l.cpu_avx512_attention);
  return l;
}

std::string Levers::describe(Device device) const {
  auto on = [](bool b) { return b ? "on" : "off"; };
  if (device == Device::cpu)
    return std::string("levers: prefix_cache=") + on(prefix_cache) + " fused_moe_gate_up=" + on(fused_moe_gate_up) +
           " cpu_direct_matvec=" + on(cpu_direct_matvec) + " cpu_tiled_matmul=" + on(cpu_tiled_matmul) +
           " cpu_vnni_matvec=" + on(cpu_vnni_matvec) + " cpu_vector_attention=" + on(cpu_vector_attention) +
           " cpu_avx512_matmul=" + on(cpu_avx512_matmul) + " cpu_packed_matmul=" + on(cpu_packed_matmul) +
           " cpu_avx512_attention=" + on(cpu_avx512_attention) + " (the others are CUDA levers)";
  return std::string("levers: cuda_graphs=") + on(cuda_graphs) + " pipelined_decode=" + on(pipelined_decode) +
         " kernel_token_slots=" + on(kernel_token_slots) +
         " fused_projections=" + on(fused_projections) +
         " fused_rope_store=" + on(fused_rope_store) + " rope_in_attention=" + on(rope_in_attention) +
         " wide_attention_blocks=" + on(wide_attention_blocks) +
         " cluster_attention_merge=" + on(cluster_attention_merge) +
         " fused_norm_matvec=" + lever_mode_name(fused_norm_matvec) +
         " programmatic_launch=" + on(programmatic_launch) + " matvec_split_k=" + on(matvec_split_k) +
         " fp8_activation_gemm=" + on(fp8_activation_gemm) + " int8_activation_matvec=" + on(int8_activation_matvec) +
         " tensor_core_kv_attention=" + on(tensor_core_kv_attention) +
         " tensor_core_attention=" + on(tensor_core_attention) +
         " tensor_core_affine_matvec=" + on(tensor_core_affine_matvec) +
         " int16_activation_matvec=" + on(int16_activation_matvec) +
         " sixteen_token_matvec=" + on(sixteen_token_matvec) +
         " sixteen_token_experts=" + on(sixteen_token_experts) +
         " tensor_core_fp8_matvec=" + on(tensor_core_fp8_matvec) +
         " tensor_core_moe_matvec=" + on(tensor_core_moe_matvec) +
         " routing_in_experts=" + on(routing_in_experts) + " deep_moe_ring=" + on(deep_moe_ring) +
         " deep_dense_ring=" + on(deep_dense_ring) + " wide_batch_stages=" + on(wide_batch_stages) +
         " uneven_row_cuts=" + on(uneven_row_cuts) +
         " int4_byte_codes=" + on(int4_byte_codes) +
         " streamed_weights=" + on(streamed_weights) +
         " tensor_core_affine_gemm=" + lever_mode_name(tensor_core_affine_gemm) +
         " tensor_core_affine_moe_gemm=" + on(tensor_core_affine_moe_gemm) +
         " tensor_core_dense_moe_gemm=" + on(tensor_core_dense_moe_gemm) +
         " tensor_core_fp8_gemm=" + on(tensor_core_fp8_gemm) +
         " grouped_swiglu_epilogue=" + on(grouped_swiglu_epilogue) +
         " formed_gemm_input=" + on(formed_gemm_input) +
         " split_sum_kernel=" + on(split_sum_kernel) +
         " fused_moe_gate_up=" + on(fused_moe_gate_up) + " prefix_cache=" + on(prefix_cache);
}

LoadOptions Levers::load_options(Device device) const {
  const bool cuda = device == Device::cuda;
  return LoadOptions{.fuse_projections = fused_projections && cuda,
                     .fuse_rope_store = fused_rope_store && cuda,
                     .rope_in_attention = rope_in_attention && fused_rope_store && cuda,
                     .wide_attention_blocks = wide_attention_blocks && cuda,
                     .cluster_attention_merge = cluster_attention_merge && wide_attention_blocks && cuda,
                     .fuse_norm_matvec = cuda ? fused_norm_matvec : LeverMode::off,
                     .programmatic_launch = programmatic_launch && cuda,
                     .matvec_split_k = matvec_split_k && cuda,
                     .fp8_activation_gemm = fp8_activation_gemm && cuda,
                     .int8_activation_matvec = int8_activation_matvec && cuda,
                     .tensor_core_kv_attention = tensor_core_kv_attention && cuda,
                     .tensor_core_attention = tensor_core_attention && cuda,
                     .tensor_core_affine_matvec = tensor_core_affine_matvec && cuda,
                     .int16_activation_matvec = int16_activation_matvec && cuda,
                     .sixteen_token_matvec =
                         sixteen_token_matvec && tensor_core_affine_matvec && int16_activation_matvec && cuda,
                     .sixteen_token_experts = sixteen_token_experts && tensor_core_moe_matvec && cuda,
                     .tensor_core_fp8_matvec = tensor_core_fp8_matvec && cuda,
                     .tensor_core_moe_matvec = tensor_core_moe_matvec && cuda,
                     .routing_in_experts = routing_in_experts && tensor_core_moe_matvec && cuda,
                     .deep_moe_ring = deep_moe_ring && tensor_core_moe_matvec && cuda,
                     .deep_dense_ring = deep_dense_ring && tensor_core_affine_matvec && cuda,
                     .wide_batch_stages = wide_batch_stages && tensor_core_affine_matvec && cuda,
                     .uneven_row_cuts = uneven_row_cuts && tensor_core_affine_matvec && cuda,
                     .int4_byte_codes = int4_byte_codes && tensor_core_moe_matvec && cuda,
                     .streamed_weights = streamed_weights && cuda,
                     .tensor_core_affine_gemm = cuda ? tensor_core_affine_gemm : LeverMode::off,
                     .tensor_core_affine_moe_gemm = tensor_core_affine_moe_gemm && cuda,
                     .tensor_core_dense_moe_gemm = tensor_core_dense_moe_gemm && cuda,
                     .tensor_core_fp8_gemm = tensor_core_fp8_gemm && cuda,
                     .grouped_swiglu_epilogue = grouped_swiglu_epilogue && cuda,
                     .formed_gemm_input = formed_gemm_input && cuda,
                     .split_sum_kernel = split_sum_kernel && cuda,
                     .fuse_moe_gate_up = fused_moe_gate_up,
                     .cpu_direct_matvec = cpu_direct_matvec && !cuda,
                     .cpu_tiled_matmul = cpu_tiled_matmul && !cuda,
                     .cpu_vnni_matvec = cpu_vnni_matvec && !cuda,
                     .cpu_vector_attention = cpu_vector_attention && !cuda,
                     .cpu_avx512_matmul = cpu_avx512_matmul && !cuda,
                     .cpu_packed_matmul = cpu_packed_matmul && !cuda,
                     .cpu_avx512_attention = cpu_avx512_attention && !cuda};
}

}  // namespace mere

#include "models/model.h"

#include <algorithm>

#include "ops/ops.h"

namespace mere {

const char* lever_mode_name(LeverMode mode) {
  return mode == LeverMode::on ? "on" : mode == LeverMode::off ? "off" : "auto";
}

void apply_launch_settings(const LoadOptions& o, Device device) {
  if (device == Device::cpu) {
    ops::set_cpu_settings({.direct_matvec = o.cpu_direct_matvec,
                           .tiled_matmul = o.cpu_tiled_matmul,
                           .vnni_matvec = o.cpu_vnni_matvec,
                           .vector_attention = o.cpu_vector_attention,
                           .avx512_matmul = o.cpu_avx512_matmul,
                           .packed_matmul = o.cpu_packed_matmul,
                           .avx512_attention = o.cpu_avx512_attention});
    return;
  }
  ops::set_launch_settings({.programmatic = o.programmatic_launch,
                            .matvec_split_k = o.matvec_split_k,
                            .fp8_activation_gemm = o.fp8_activation_gemm,
                            .int8_activation_matvec = o.int8_activation_matvec,
                            .tensor_core_kv_attention = o.tensor_core_kv_attention,
                            .tensor_core_attention = o.tensor_core_attention,
                            .rope_in_attention = o.rope_in_attention,
                            .wide_attention_blocks = o.wide_attention_blocks,
                            .cluster_attention_merge = o.cluster_attention_merge,
                            .tensor_core_affine_matvec = o.tensor_core_affine_matvec,
                            .int16_activation_matvec = o.int16_activation_matvec,
                            .sixteen_token_matvec = o.sixteen_token_matvec,
                            .sixteen_token_experts = o.sixteen_token_experts,
                            .tensor_core_fp8_matvec = o.tensor_core_fp8_matvec,
                            .tensor_core_moe_matvec = o.tensor_core_moe_matvec,
                            .routing_in_experts = o.routing_in_experts,
                            .deep_moe_ring = o.deep_moe_ring,
                            .deep_dense_ring = o.deep_dense_ring,
                            .wide_batch_stages = o.wide_batch_stages,
                            .uneven_row_cuts = o.uneven_row_cuts,
                            .int4_byte_codes = o.int4_byte_codes,
                            .streamed_weights = o.streamed_weights,
                            .tensor_core_affine_gemm = o.tensor_core_affine_gemm != LeverMode::off,
                            .affine_gemm_at_every_size = o.tensor_core_affine_gemm == LeverMode::on,
                            .tensor_core_affine_moe_gemm = o.tensor_core_affine_moe_gemm,
                            .tensor_core_dense_moe_gemm = o.tensor_core_dense_moe_gemm,
                            .tensor_core_fp8_gemm = o.tensor_core_fp8_gemm,
                            .grouped_swiglu_epilogue = o.grouped_swiglu_epilogue,
                            .formed_gemm_input = o.formed_gemm_input,
                            .split_sum_kernel = o.split_sum_kernel});
}

// The longest step decide_folding looks at: past it every GEMM's choice is the
// same (the dequantizing GEMMs stop at 384 tokens), so longer steps fold too.
constexpr int64_t kMaxFoldedRows = 4096;

bool ModelInfo::folds_step(int64_t T) const {
  if (T == 1) return fold_one_row;
  if (T <= ops::kMaxFusedRows) return fold_batches;
  return T <= ops::kMaxWideFusedRows ? fold_wide_batches : fold_long_steps_from && T >= fold_long_steps_from;
}

void ModelInfo::decide_folding(LeverMode mode, const LoadOptions& o, std::span<const Weight* const> fused,
                               bool long_steps) {
  // What the CUDA kernels take depends on their levers' settings (uneven_row_cuts:
  // which rows fit): this model's, not those of the last model that ran.
  if (device == Device::cuda) apply_launch_settings(o, device);
  auto pays = [&](int64_t T) {
    return !fused.empty() &&
           std::all_of(fused.begin(), fused.end(), [&](const Weight* w) { return folding_pays(*w, o, T); });
  };
  auto pays_from_to = [&](int64_t first, int64_t last) {
    for (int64_t T = first; T <= last; ++T)
      if (!pays(T)) return false;
    return true;
  };
  const bool on = mode == LeverMode::on, automatic = mode == LeverMode::automatic;
  fold_one_row = on || (automatic && pays(1));
  fold_batches = on || (automatic && pays_from_to(2, ops::kMaxFusedRows));
  // 9-16 rows, even when on, only where the fused forms are single kernels (under
  // lever sixteen_token_matvec: folding_pays); else they would compose kernels
  // that add_rms_norm joins.
  fold_wide_batches = (on || automatic) && pays_from_to(ops::kMaxFusedRows + 1, ops::kMaxWideFusedRows);
  // From 17 rows: from where every fused form forms its input at every longer step.
  fold_long_steps_from = 0;
  if ((on || automatic) && long_steps && o.formed_gemm_input && !fused.empty()) {
    auto formed = [&](int64_t T) {
      return std::all_of(fused.begin(), fused.end(),
                         [&](const Weight* w) { return !w->defined() || ops::gemm_forms_input(*w, T); });
    };
    int64_t T = kMaxFoldedRows;
    while (T > ops::kMaxWideFusedRows && formed(T)) --T;
    fold_long_steps_from = T < kMaxFoldedRows ? T + 1 : 0;
  }
}

bool folding_pays(const Weight& w, const LoadOptions& o, int64_t T) {
  if (!w.defined()) return true;
  const bool fp8 = w.kind() == Weight::Kind::fp8;
  const bool lever = fp8 ? o.tensor_core_fp8_matvec
                         : o.tensor_core_affine_matvec && !o.int8_activation_matvec &&
                               (T <= ops::kMaxFusedRows || o.sixteen_token_matvec);
  return lever && ops::matvec_on_tensor_cores(w, T, true);
}

Tensor final_logits(const Tensor& h, const Tensor& norm_w, float eps, const Weight& lm_head) {
  if (lm_head.is_dense()) return ops::linear(ops::rms_norm(h, norm_w, eps), lm_head);
  return ops::rms_norm_linear(h, norm_w, eps, lm_head);
}

Tensor Model::forward(const std::vector<int32_t>& tokens, SeqState& state, bool all_logits) const {
  const int64_t T = int64_t(tokens.size()), pos0 = state.length();
  MERE_CHECK(T > 0, "forward: no tokens");
  MERE_CHECK(pos0 + T <= state.capacity(), "context is full: {} + {} tokens exceed the capacity of {}", pos0, T,
             state.capacity());
  state.reserve(pos0 + T);
  Tensor ids = Tensor::empty({T}, DType::i32), pos = Tensor::empty({1}, DType::i32);
  std::copy(tokens.begin(), tokens.end(), ids.data<int32_t>());
  pos.data<int32_t>()[0] = int32_t(pos0);
  Tensor logits = run(ids.to_device(info().device), pos.to_device(info().device), state, all_logits);
  state.advance(T);
  return logits;
}

Tensor Model::forward_batch(const std::vector<int32_t>& tokens, const std::vector<SeqState*>& states) const {
  MERE_CHECK(!states.empty() && tokens.size() == states.size(), "forward_batch: {} tokens for {} sequences",
             tokens.size(), states.size());
  const int64_t pos0 = states.front()->length();
  for (SeqState* s : states) {
    MERE_CHECK(s->length() == pos0, "forward_batch: sequences at {} and {} tokens; a batch shares one offset",
               pos0, s->length());
    MERE_CHECK(pos0 + 1 <= s->capacity(), "context is full: {} + 1 tokens exceed the capacity of {}", pos0,
               s->capacity());
    s->reserve(pos0 + 1);
  }
  const int64_t B = int64_t(tokens.size());
  Tensor ids = Tensor::empty({B}, DType::i32), pos = Tensor::empty({1}, DType::i32);
  std::copy(tokens.begin(), tokens.end(), ids.data<int32_t>());
  pos.data<int32_t>()[0] = int32_t(pos0);
  Tensor logits = run(ids.to_device(info().device), pos.to_device(info().device),
                      std::span<SeqState* const>(states.data(), states.size()), true);
  for (SeqState* s : states) s->advance(1);
  return logits;
}

}  // namespace mere

// The interface every model family implements, and the registry that picks the
// family from config.json.
#pragma once

#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/weight.h"
#include "state/seq_state.h"

namespace mere {

// A lever that can be off, on, or left to the model to decide from its weights.
enum class LeverMode { off, on, automatic };
const char* lever_mode_name(LeverMode mode);  // "off", "on", "auto"

// How a model is laid out and runs on its device; set by the engine from its levers.
struct LoadOptions {
  // Q/K/V and gate/up weights concatenated, so each is one matmul (lever fused_projections).
  bool fuse_projections = false;
  // q/k norm, RoPE and the K/V write as one kernel (lever fused_rope_store).
  bool fuse_rope_store = false;
  // That kernel folded into decode attention over a dense cache (lever rope_in_attention).
  bool rope_in_attention = false;
  // Short-context decode attention in 8-warp blocks of fewer heads (lever wide_attention_blocks).
  bool wide_attention_blocks = false;
  // Those blocks' few splits merged in clusters, no merge kernel (lever cluster_attention_merge).
  bool cluster_attention_merge = false;
  // RMSNorm, SwiGLU and the residual add inside the matmuls (lever fused_norm_matvec);
  // automatic: where every layer matrix's one-token matvec runs on the tensor cores.
  LeverMode fuse_norm_matvec = LeverMode::off;
  // CUDA kernels launched to overlap the previous one's tail (lever programmatic_launch).
  bool programmatic_launch = false;
  // Several warps per row in decode matvecs with few rows (lever matvec_split_k).
  bool matvec_split_k = false;
  // FP8 weights' prefill with E4M3 activations on FP8 tensor cores (lever fp8_activation_gemm).
  bool fp8_activation_gemm = false;
  // MLX affine weights' decode matvecs on int8-quantized activations (lever int8_activation_matvec).
  bool int8_activation_matvec = false;
  // Decode attention over affine KV caches on the tensor cores (lever tensor_core_kv_attention).
  bool tensor_core_kv_attention = false;
  // Long contexts' decode attention over bf16/f16 caches on the tensor cores (lever tensor_core_attention).
  bool tensor_core_attention = false;
  // MLX affine decode matvecs on the tensor cores (lever tensor_core_affine_matvec).
  bool tensor_core_affine_matvec = false;
  // Those matvecs on x rounded to 15 bits per group (lever int16_activation_matvec).
  bool int16_activation_matvec = false;
  // Those matvecs take steps of 9-16 rows too (lever sixteen_token_matvec).
  bool sixteen_token_matvec = false;
  // The tensor-core affine MoE experts take steps of 9-16 tokens too (lever sixteen_token_experts).
  bool sixteen_token_experts = false;
  // FP8 weights' decode matvecs on the tensor cores (lever tensor_core_fp8_matvec).
  bool tensor_core_fp8_matvec = false;
  // MoE experts' affine decode on the tensor cores (lever tensor_core_moe_matvec).
  bool tensor_core_moe_matvec = false;
  // Those experts' gate/up blocks route each token themselves (lever routing_in_experts).
  bool routing_in_experts = false;
  // Those experts' one-token int8 matvecs with a deeper ring (lever deep_moe_ring).
  bool deep_moe_ring = false;
  // The one-token int8 dense matvecs on the tensor cores with a deeper ring (lever deep_dense_ring).
  bool deep_dense_ring = false;
  // Those matvecs at 5-8 tokens read 256-byte stages (lever wide_batch_stages).
  bool wide_batch_stages = false;
  // Those matvecs cut a row no equal cut fits into launches the last of which is shorter (lever uneven_row_cuts).
  bool uneven_row_cuts = false;
  // Those experts' int4 g64/g128 stacks take the stored bytes (lever int4_byte_codes).
  bool int4_byte_codes = false;
  // The decode matvecs' weight reads evict first from L2 (lever streamed_weights).
  bool streamed_weights = false;
  // MLX affine prefill GEMMs that dequantize their tiles (lever tensor_core_affine_gemm);
  // automatic: where they measured faster (prompts up to 384 tokens, matrices of 2^24 weights).
  LeverMode tensor_core_affine_gemm = LeverMode::off;
  // MLX affine MoE experts' prefill on the dequantizing GEMM grouped by expert
  // (lever tensor_core_affine_moe_gemm).
  bool tensor_core_affine_moe_gemm = false;
  // bf16 and FP8 MoE experts' prefill on that grouped GEMM (lever tensor_core_dense_moe_gemm).
  bool tensor_core_dense_moe_gemm = false;
  // FP8 prefill up to 256 tokens on the dequantizing GEMM (lever tensor_core_fp8_gemm).
  bool tensor_core_fp8_gemm = false;
  // Those grouped GEMMs' gate and up in one launch (lever grouped_swiglu_epilogue).
  bool grouped_swiglu_epilogue = false;
  // Long steps on cuBLAS fold their norms into its formed input (lever formed_gemm_input).
  bool formed_gemm_input = false;
  // The dequantizing GEMM's split sums added by a kernel of their own (lever split_sum_kernel).
  bool split_sum_kernel = false;
  // MoE experts' gate and up stacked into one matrix per expert (lever fused_moe_gate_up).
  bool fuse_moe_gate_up = false;
  // CPU decode matvecs on the stored weights in registers (lever cpu_direct_matvec).
  bool cpu_direct_matvec = false;
  // CPU prefill matmuls in register tiles (lever cpu_tiled_matmul).
  bool cpu_tiled_matmul = false;
  // CPU affine decode matvecs as integer dot products (lever cpu_vnni_matvec).
  bool cpu_vnni_matvec = false;
  // CPU attention in registers, a task per tile (lever cpu_vector_attention).
  bool cpu_vector_attention = false;
  // The tiled prefill product in 512-bit registers (lever cpu_avx512_matmul).
  bool cpu_avx512_matmul = false;
  // The tiled prefill product as an outer product of packed tokens (lever cpu_packed_matmul).
  bool cpu_packed_matmul = false;
  // Prefill attention tiles as outer products in 512-bit registers (lever cpu_avx512_attention).
  bool cpu_avx512_attention = false;
};

// Sets how kernels run on `device` from a model's options (ops::set_launch_settings
// on CUDA, ops::set_cpu_settings on the CPU); each family calls it before it runs.
void apply_launch_settings(const LoadOptions& o, Device device);

// Whether lever fused_norm_matvec's forms of w pay under o's levers in a step of
// T rows: where w's decode matvec of T rows, in its fused form (a formed input:
// ops::matvec_on_tensor_cores), is on the tensor cores (tensor_core_affine_matvec
// without int8_activation_matvec for MLX affine weights, tensor_core_fp8_matvec
// for FP8 ones; Llama-3-8B folded, H100: int4 +9.2% / +8.1% at batches of 4 / 8,
// fp8 +3.3% at 1 and 8; Qwen3-4B int4 +26% at one row: docs/levers.md), and for
// an absent weight.
bool folding_pays(const Weight& w, const LoadOptions& o, int64_t T);

// A folded step's final RMSNorm and lm_head: one fused op where lm_head is
// quantized (its prepare kernel forms the input); a dense lm_head, as FP8
// checkpoints keep it, composes them, since the dense fused form re-reads h in
// every block (Llama-3-8B's bf16 lm_head: 3% slower at one token, 70% at eight).
Tensor final_logits(const Tensor& h, const Tensor& norm_w, float eps, const Weight& lm_head);

struct ModelInfo {
  std::string model_type;   // config.json's model_type, e.g. "qwen3"
  std::string family;       // the file that implements it, e.g. "llama"
  Device device = Device::cpu;
  LoadOptions options;  // how the model was laid out and runs
  // The fused decode forms run (lever fused_norm_matvec, `auto` decided at load)
  // for steps of one row, and of 2 to ops::kMaxFusedRows rows (a batch's decode
  // step): a matrix too small for the tensor cores at one row takes them from 2.
  bool fold_one_row = false;
  bool fold_batches = false;
  bool fold_wide_batches = false;  // 9 to ops::kMaxWideFusedRows rows (lever sixteen_token_matvec)
  // Steps of this many rows or more (a prefill, a batch past 16; from 17), where
  // every fused form forms its input on its way into cuBLAS (lever
  // formed_gemm_input); 0: none.
  int64_t fold_long_steps_from = 0;
  bool folds_step(int64_t T) const;  // a step of T rows
  // Sets them from the lever's mode (after `device` is set: on CUDA it applies
  // `o`'s launch settings); auto folds a step of T rows where
  // folding_pays(w, o, T) for every matrix a folded step runs in its fused form
  // (`fused`; none: no fold). Longer steps fold only for a model whose folded
  // step is all fused forms (long_steps: no kernel that the composed step
  // would have joined with another), from where ops::gemm_forms_input holds
  // for every one at every longer step.
  void decide_folding(LeverMode mode, const LoadOptions& o, std::span<const Weight* const> fused,
                      bool long_steps = false);
  int64_t vocab = 0;
  int64_t max_positions = 0;
  int64_t n_params = 0;
  uint64_t weight_bytes = 0;
  std::string weights;  // the layers' weight format: "bf16", "affine int4 g64", "fp8 e4m3 128x128"
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelInfo& info() const = 0;
  // A fresh sequence state holding up to `capacity` tokens (0: max_positions),
  // its K/V stored as `kv_mode` says (refused where the device cannot read it):
  // paged on a pool of its own on the CPU, contiguous on CUDA.
  virtual std::unique_ptr<SeqState> make_state(int64_t capacity = 0,
                                               KvCacheMode kv_mode = KvCacheMode::native) const = 0;
  // How one position of this model's K/V is stored in `kv_mode` on its device
  // (for a BlockPool shared by several sequences).
  virtual KvLayout kv_layout(KvCacheMode kv_mode = KvCacheMode::native) const = 0;
  // The step every backend runs: T tokens whose ids are `ids` (i32 [T]) at
  // positions *pos .. *pos + T - 1 (pos: i32 [1]), both on the model's device,
  // with the state's rows already reserved. Does not advance the state; a CUDA
  // graph captures exactly this call and replays it with new ids and pos.
  // Returns f32 logits [T, vocab] if all_logits, else [1, vocab] for the last token.
  //
  // Same-offset batching: with several states, ids holds one new token of each
  // (row b for states[b]), every sequence at position *pos, and the logits are
  // [B, vocab], one row per sequence; decoding the batch gives each sequence the
  // tokens it would get alone.
  virtual Tensor run(const Tensor& ids, const Tensor& pos, std::span<SeqState* const> states,
                     bool all_logits) const = 0;
  Tensor run(const Tensor& ids, const Tensor& pos, SeqState& state, bool all_logits) const {
    SeqState* one = &state;
    return run(ids, pos, std::span<SeqState* const>(&one, 1), all_logits);
  }

  // Runs `tokens` at positions state.length() .. +T-1 and advances the state.
  Tensor forward(const std::vector<int32_t>& tokens, SeqState& state, bool all_logits) const;
  // One token for each of `states`, all of one length (same-offset batching), and
  // advances them: logits [B, vocab].
  Tensor forward_batch(const std::vector<int32_t>& tokens, const std::vector<SeqState*>& states) const;

  // The performance model: bytes one decoded token reads at `context` cached
  // tokens (weights once, one embedding row, the K/V of every cached position in
  // `kv_mode`'s storage),
  // and the matmul FLOPs of a prefill of T tokens after `context` cached ones.
  virtual uint64_t decode_bytes(int64_t context, KvCacheMode kv_mode = KvCacheMode::native) const = 0;
  virtual double prefill_flops(int64_t T, int64_t context) const = 0;
};


// Loads the checkpoint in `dir`, picking the family from config.json's model_type.
// Unknown types are an error that lists the supported ones.
// Weights go to `device` as stored (bf16 stays bf16); activations are f32.
std::unique_ptr<Model> load_model(const std::filesystem::path& dir, Device device = Device::cpu,
                                  const LoadOptions& options = {});
std::vector<std::string> supported_model_types();

}  // namespace mere

// The decode byte model behind `mere bytes`: the bytes one decoded token reads,
// bucket by bucket, computed from config.json alone (and its quantization
// metadata), so it works on checkpoints we cannot download. Batch-1 decode is
// memory bound, so bandwidth / total bytes is the roofline tok/s.
//
// What is counted, per token: one embedding row; every weight of every layer
// once (for MoE layers only the routed experts the router picks, plus shared
// experts and the router); the norms; the whole lm_head; and the cache of
// `context` earlier positions (K and V rows, or MLA's latent). Weights are
// counted as mere holds them: dense matrices and norms in the checkpoint's
// dtype, biases as f32 (mere adds them to f32 activations), MLX affine weights
// as packed codes + a scale and bias per group, FP8 as one byte per weight + an
// f32 scale per block. Activations and attention scores are not counted.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "io/config.h"
#include "state/kv_cache.h"

namespace mere {

// The measured device-to-device copy bandwidth of the H200 (docs/benchmarks.md).
inline constexpr double kH200CopyBytesPerS = 4.287e12;

struct ByteModelOptions {
  int64_t context = 0;                         // cached positions the token attends to
  KvCacheMode kv_mode = KvCacheMode::native;   // native: f32 on the CPU, bf16 on CUDA
  Device device = Device::cuda;                // whose native cache and storage is counted
  std::string weights;                         // "", "bf16", "int8", "int4" or "fp8": overrides config.json
  int group_size = 64;                         // for weights int8/int4
};

struct ByteBucket {
  std::string name;   // "embedding_row", "attention", ...
  uint64_t bytes = 0;
};

struct ByteModel {
  std::string model_type;
  std::string weights;  // the weight format counted: "bf16", "affine int4 g64", "fp8 e4m3 128x128", ...
  std::string cache;    // "kv" or "latent"
  std::string kv_mode;
  int64_t context = 0;
  int n_layers = 0, n_sparse_layers = 0;
  // Always the same names in the same order: embedding_row, attention, dense_mlp,
  // routed_experts, shared_experts, routers, norms, lm_head, cache.
  std::vector<ByteBucket> buckets;
  std::vector<std::string> notes;  // what the model assumed, in words

  uint64_t total_bytes() const;
  uint64_t bucket(const std::string& name) const;  // 0 when absent
  double roofline_tok_s(double bytes_per_s) const;
};

// The families it knows: llama, qwen2, qwen3 (dense), qwen3_moe, deepseek_v3 (MLA
// + MoE). Another model_type is an error listing these. Bad options (unknown
// --weights, a group size MLX does not use) are errors naming the option.
ByteModel byte_model(const ConfigJson& config, const ByteModelOptions& options);
std::vector<std::string> byte_model_families();

}  // namespace mere

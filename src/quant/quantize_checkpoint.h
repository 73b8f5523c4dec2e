// A dense checkpoint to an MLX affine-quantized one, laid out as mlx-lm's convert
// writes it (mlx_lm/utils.py, quantize_model + save), so MLX loads what we write.
// Every 2-D `<module>.weight` (Linear and Embedding; embed_tokens and lm_head
// included) whose input dimension divides by the group size becomes
// `<module>.weight` (u32, packed), `<module>.scales` and `<module>.biases` (the
// weight's dtype); everything else is copied unchanged. config.json gains
// "quantization" = {"group_size", "bits", "<module>": false for each module left
// dense}, repeated as "quantization_config". Tensors are read, quantized and
// written one at a time, so memory stays near one weight matrix. Used by
// `mere quantize` and by `mere audit` (lever weights=int8|int4|fp8).
// With `fp8`, the layout of DeepSeek-V3 and Qwen3-FP8 releases instead: every
// 2-D `<module>.weight` but the embeddings becomes E4M3 values with
// `<module>.weight_scale_inv` (f32, one per 128x128 block; quant/fp8_quantize.h),
// and config.json gains "quantization_config" = {"quant_method": "fp8", "fmt":
// "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace mere {

struct QuantizeCheckpointOptions {
  int bits = 4, group_size = 64;  // affine
  bool fp8 = false;               // FP8 E4M3 with 128x128 block scales instead (bits and group_size unused)
  std::vector<std::string> keep;  // regular expressions searched in module names: those stay dense
};

struct QuantizeCheckpointResult {
  int n_tensors = 0, n_quantized = 0, n_kept = 0, n_copied = 0;
  size_t n_files = 0;
  uint64_t bytes_in = 0, bytes_out = 0;
};

// Reads the dense checkpoint in `in` and writes the quantized one to `out` (a new or
// empty directory) with the other files of `in` (tokenizer, generation config, ...).
// Errors name the argument or tensor; on an error nothing half-written is left in `out`.
QuantizeCheckpointResult quantize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                                             const QuantizeCheckpointOptions& options);

}  // namespace mere

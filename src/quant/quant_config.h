// How a checkpoint's weights are quantized, from config.json: MLX's
// "quantization" (or "quantization_config") {group_size, bits} with per-module
// overrides, or a "quantization_config" of quant_method "fp8" with block scales.
// Anything else that claims quantization is an error naming the field, as is an
// MLX "quantization_config" that disagrees with the "quantization" beside it.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "io/config.h"

namespace mere {

struct AffineSpec {
  int bits = 0, group_size = 0;
};

struct QuantizationConfig {
  std::optional<AffineSpec> affine;                                // the default for every quantized module
  std::map<std::string, std::optional<AffineSpec>> affine_modules;  // per module path; nullopt: left dense
  int fp8_block = 0;                                               // > 0: FP8 E4M3 with this block size

  static QuantizationConfig parse(const ConfigJson& config);
  // The spec for a module such as "model.layers.0.mlp.gate_proj" (its override, else the default).
  std::optional<AffineSpec> affine_for(const std::string& module) const;
  bool quantized() const { return affine.has_value() || !affine_modules.empty() || fp8_block > 0; }
};

}  // namespace mere

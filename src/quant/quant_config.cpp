#include "quant/quant_config.h"

#include "core/error.h"

namespace mere {
namespace {

AffineSpec parse_affine(const ConfigJson& c, const std::string& where) {
  AffineSpec s{c.require<int>("bits"), c.require<int>("group_size")};
  MERE_CHECK(s.bits == 4 || s.bits == 8, "{}: {}.bits is {}; mere runs 4- and 8-bit affine weights",
             c.path().string(), where, s.bits);
  MERE_CHECK(s.group_size == 32 || s.group_size == 64 || s.group_size == 128,
             "{}: {}.group_size is {}; mere runs groups of 32, 64 or 128", c.path().string(), where, s.group_size);
  return s;
}

}  // namespace

QuantizationConfig QuantizationConfig::parse(const ConfigJson& config) {
  QuantizationConfig q;
  const char* key = config.has("quantization") ? "quantization"
                    : config.has("quantization_config") ? "quantization_config"
                                                         : nullptr;
  if (!key) return q;
  ConfigJson c = config.child(key);
  if (c.has("quant_method")) {
    const std::string method = c.require<std::string>("quant_method");
    MERE_CHECK(method == "fp8", "{}: {}.quant_method is '{}'; mere runs MLX affine and fp8 checkpoints",
               config.path().string(), key, method);
    const std::string fmt = c.get<std::string>("fmt", "e4m3");
    MERE_CHECK(fmt == "e4m3", "{}: {}.fmt is '{}'; mere runs e4m3", config.path().string(), key, fmt);
    std::vector<int> block = c.require<std::vector<int>>("weight_block_size");
    MERE_CHECK(block.size() == 2 && block[0] == block[1] && block[0] > 0,
               "{}: {}.weight_block_size must be square, got {} entries", config.path().string(), key, block.size());
    q.fp8_block = block[0];
    return q;
  }
  q.affine = parse_affine(c, key);
  for (auto it = c.raw().begin(); it != c.raw().end(); ++it) {
    if (it.key() == "bits" || it.key() == "group_size" || it.key() == "mode") continue;
    const std::string where = std::string(key) + "." + it.key();
    if (it.value().is_boolean()) {
      // true: the default spec; false: the module stays dense.
      q.affine_modules[it.key()] = it.value().get<bool>() ? q.affine : std::nullopt;
    } else {
      MERE_CHECK(it.value().is_object(), "{}: {} must be an object or a boolean", config.path().string(), where);
      q.affine_modules[it.key()] = parse_affine(c.child(it.key()), where);
    }
  }
  if (c.has("mode"))
    MERE_CHECK(c.require<std::string>("mode") == "affine", "{}: {}.mode is '{}'; mere runs MLX affine quantization",
               config.path().string(), key, c.require<std::string>("mode"));
  return q;
}

std::optional<AffineSpec> QuantizationConfig::affine_for(const std::string& module) const {
  auto it = affine_modules.find(module);
  return it != affine_modules.end() ? it->second : affine;
}

}  // namespace mere

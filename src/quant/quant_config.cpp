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

// The spec config[key] describes: an fp8 quant_method, or MLX affine with per-module overrides.
QuantizationConfig parse_entry(const ConfigJson& config, const char* key) {
  QuantizationConfig q;
  ConfigJson c = config.child(key);
  if (c.has("quant_method")) {
    const std::string method = c.require<std::string>("quant_method");
    MERE_CHECK(method == "fp8", "{}: {}.quant_method is '{}'; mere runs MLX affine and fp8 checkpoints",
               config.path().string(), key, method);
    const std::string fmt = c.get<std::string>("fmt", "e4m3");
    MERE_CHECK(fmt == "e4m3", "{}: {}.fmt is '{}'; mere runs e4m3", config.path().string(), key, fmt);
    // A static scheme ships per-tensor input scales that mere would ignore; it quantizes activations itself.
    const std::string scheme = c.get<std::string>("activation_scheme", "dynamic");
    MERE_CHECK(scheme == "dynamic", "{}: {}.activation_scheme is '{}'; mere runs fp8 checkpoints of the dynamic scheme",
               config.path().string(), key, scheme);
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

std::string describe(const std::optional<AffineSpec>& s) {
  return s ? fmt::format("{}-bit in groups of {}", s->bits, s->group_size) : std::string("left dense");
}

// MLX writes its spec twice, as "quantization" and as "quantization_config" (the same
// object). Two that disagree are inconsistent metadata, not a choice: which one the
// tensors follow cannot be known from the config, so neither is taken.
void expect_same_affine_specs(const QuantizationConfig& mlx, const QuantizationConfig& twin,
                              const std::filesystem::path& path) {
  auto disagree = [&](const std::string& what, const std::optional<AffineSpec>& a,
                      const std::optional<AffineSpec>& b) {
    const bool same = a.has_value() == b.has_value() && (!a || (a->bits == b->bits && a->group_size == b->group_size));
    MERE_CHECK(same, "{}: quantization and quantization_config disagree on {}: {} against {}", path.string(), what,
               describe(a), describe(b));
  };
  disagree("the default", mlx.affine, twin.affine);
  for (const auto* q : {&mlx, &twin})
    for (const auto& listed : q->affine_modules)
      disagree("module " + listed.first, mlx.affine_for(listed.first), twin.affine_for(listed.first));
}

}  // namespace

QuantizationConfig QuantizationConfig::parse(const ConfigJson& config) {
  const bool mlx = config.has("quantization");
  if (!mlx && !config.has("quantization_config")) return {};
  QuantizationConfig q = parse_entry(config, mlx ? "quantization" : "quantization_config");
  // A quantization_config of another quant_method beside MLX's own key is left to
  // "quantization", as mlx-lm reads it.
  if (mlx && q.affine && config.has("quantization_config") &&
      !config.child("quantization_config").has("quant_method"))
    expect_same_affine_specs(q, parse_entry(config, "quantization_config"), config.path());
  return q;
}

std::optional<AffineSpec> QuantizationConfig::affine_for(const std::string& module) const {
  auto it = affine_modules.find(module);
  return it != affine_modules.end() ? it->second : affine;
}

}  // namespace mere

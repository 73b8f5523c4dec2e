#include "models/blocks/mlp_weights.h"

#include "quant/load_weight.h"

namespace mere {

GatedMlp load_gated_mlp(const Checkpoint& checkpoint, const std::string& prefix, const MlpShape& s,
                        const QuantizationConfig& quant, Device device, bool fuse_gate_up) {
  auto bias = [&](const std::string& name, int64_t n, const char* why) {
    return load_bias(checkpoint, prefix + name, n, why);
  };
  auto weight = [&](const std::string& module, Shape shape, const char* why) {
    return load_weight(checkpoint, prefix + module, shape, why, quant);
  };
  GatedMlp m;
  m.gate = weight("gate_proj", {s.d_ff, s.d_model}, "intermediate_size, hidden_size");
  m.up = weight("up_proj", {s.d_ff, s.d_model}, "intermediate_size, hidden_size");
  m.down = weight("down_proj", {s.d_model, s.d_ff}, "hidden_size, intermediate_size");
  if (s.bias) {
    m.gate_bias = bias("gate_proj.bias", s.d_ff, "intermediate_size");
    m.up_bias = bias("up_proj.bias", s.d_ff, "intermediate_size");
    m.down_bias = bias("down_proj.bias", s.d_model, "hidden_size");
  }
  if (fuse_gate_up) m.fuse();
  m.to_device(device);
  return m;
}

std::vector<std::pair<std::string, Shape>> gated_mlp_tensor_shapes(const std::string& prefix, const MlpShape& s) {
  std::vector<std::pair<std::string, Shape>> out = {{prefix + "gate_proj.weight", {s.d_ff, s.d_model}},
                                                    {prefix + "up_proj.weight", {s.d_ff, s.d_model}},
                                                    {prefix + "down_proj.weight", {s.d_model, s.d_ff}}};
  if (s.bias) {
    out.push_back({prefix + "gate_proj.bias", {s.d_ff}});
    out.push_back({prefix + "up_proj.bias", {s.d_ff}});
    out.push_back({prefix + "down_proj.bias", {s.d_model}});
  }
  return out;
}

}  // namespace mere

#include "models/blocks/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mere {
namespace {

// A value RoPE divides by or takes the logarithm of; zero or less would make NaN
// frequencies, which decode quietly into garbage.
double positive(const ConfigJson& c, const char* key, double value) {
  MERE_CHECK(value > 0, "{}: RoPE's {} {} must be positive", c.path().string(), key, value);
  return value;
}
double required_positive(const ConfigJson& c, const char* key) { return positive(c, key, c.require<double>(key)); }

// Mirrors torch's float32 evaluation: 1 / base ** (i / dim) with the exponent in f32.
std::vector<float> default_inv_freq(double base, int dim) {
  std::vector<float> inv_freq(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    float exponent = float(2 * i) / float(dim);
    inv_freq[size_t(i)] = 1.0f / float(std::pow(base, double(exponent)));
  }
  return inv_freq;
}

// Llama 3.1: low frequencies are divided by `factor`, high ones kept, the band between smoothed.
void apply_llama3(std::vector<float>& inv_freq, const ConfigJson& s) {
  double factor = required_positive(s, "factor");
  double low_freq_factor = required_positive(s, "low_freq_factor");
  double high_freq_factor = required_positive(s, "high_freq_factor");
  double old_context = required_positive(s, "original_max_position_embeddings");
  MERE_CHECK(high_freq_factor != low_freq_factor, "{}: RoPE's high_freq_factor and low_freq_factor are both {}; "
             "llama3 scaling divides by their difference", s.path().string(), low_freq_factor);
  double low_freq_wavelen = old_context / low_freq_factor;
  double high_freq_wavelen = old_context / high_freq_factor;
  for (float& f : inv_freq) {
    double wavelen = 2 * std::numbers::pi / f;
    if (wavelen > low_freq_wavelen) {
      f = float(f / factor);
    } else if (wavelen >= high_freq_wavelen) {
      double smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      f = float((1 - smooth) * f / factor + smooth * f);
    }
  }
}

double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// YaRN (arXiv 2309.00071): blend interpolated and extrapolated frequencies with a
// linear ramp over the dims between the beta_fast and beta_slow rotation counts.
float apply_yarn(std::vector<float>& inv_freq, const ConfigJson& config, const ConfigJson& s, double base,
                 int dim) {
  int64_t max_positions = config.get<int64_t>("max_position_embeddings", 0);
  // A top-level original_max_position_embeddings (Phi-3 style) wins over the nested one.
  int64_t original_max = config.get<int64_t>("original_max_position_embeddings",
                                             s.get<int64_t>("original_max_position_embeddings", max_positions));
  MERE_CHECK(original_max > 0, "{}: yarn needs original_max_position_embeddings or max_position_embeddings",
             config.path().string());
  // Without a factor, the context extension the checkpoint declares is the factor.
  double factor = positive(s, "factor", s.get<double>("factor", double(max_positions) / double(original_max)));
  MERE_CHECK(base > 1, "{}: yarn takes the logarithm of rope_theta, which must be above 1, got {}",
             config.path().string(), base);
  double attention_factor;
  if (s.has("attention_factor")) {
    attention_factor = s.require<double>("attention_factor");
  } else {
    double mscale = s.get<double>("mscale", 0), mscale_all_dim = s.get<double>("mscale_all_dim", 0);
    attention_factor = (mscale != 0 && mscale_all_dim != 0)
                           ? yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
                           : yarn_mscale(factor, 1.0);
  }
  double beta_fast = s.get<double>("beta_fast", 0), beta_slow = s.get<double>("beta_slow", 0);
  if (beta_fast == 0) beta_fast = 32;
  if (beta_slow == 0) beta_slow = 1;
  bool truncate = s.get<bool>("truncate", true);
  auto correction_dim = [&](double rotations) {
    return dim * std::log(double(original_max) / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  for (int i = 0; i < dim / 2; ++i) {
    float extrapolated = inv_freq[size_t(i)];
    float interpolated = float(extrapolated / factor);
    float ramp = std::clamp(float((float(i) - low) / (high - low)), 0.0f, 1.0f);
    float extrapolation_weight = 1.0f - ramp;
    inv_freq[size_t(i)] = interpolated * (1 - extrapolation_weight) + extrapolated * extrapolation_weight;
  }
  return float(attention_factor);
}

}  // namespace

ops::RopeTable rope_table_from_config(const ConfigJson& config, int head_dim) {
  // transformers 5 nests everything under rope_parameters; older files split it.
  const bool nested = config.has("rope_parameters");
  ConfigJson scaling = nested ? config.child("rope_parameters")
                              : config.has("rope_scaling") ? config.child("rope_scaling")
                                                           : ConfigJson::from_json(nlohmann::json::object(), config.path());
  double base = nested ? scaling.get<double>("rope_theta", config.get<double>("rope_theta", 10000.0))
                       : config.get<double>("rope_theta", 10000.0);
  positive(config, "rope_theta", base);
  std::string type = scaling.get<std::string>("rope_type", scaling.get<std::string>("type", "default"));
  double partial = scaling.get<double>("partial_rotary_factor",
                                       config.get<double>("partial_rotary_factor", 1.0));
  int dim = int(head_dim * partial);
  MERE_CHECK(dim > 0 && dim % 2 == 0 && dim <= head_dim,
             "{}: partial_rotary_factor {} gives an odd or empty rotary dim for head_dim {}",
             config.path().string(), partial, head_dim);

  ops::RopeTable table;
  table.inv_freq = default_inv_freq(base, dim);
  if (type == "default") {
  } else if (type == "linear") {
    float factor = float(required_positive(scaling, "factor"));
    for (float& f : table.inv_freq) f /= factor;
  } else if (type == "llama3") {
    apply_llama3(table.inv_freq, scaling);
  } else if (type == "yarn") {
    table.attention_factor = apply_yarn(table.inv_freq, config, scaling, base, dim);
  } else {
    fail("{}: rope type '{}' is not supported (supported: default, linear, llama3, yarn)",
         config.path().string(), type);
  }
  return table;
}

}  // namespace mere

#include "registry/model_summary.h"

#include <algorithm>

#include <fmt/format.h>

#include "io/checkpoint.h"
#include "io/config.h"
#include "models/model.h"

namespace mere {

namespace fs = std::filesystem;

ModelSummary summarize_model(const fs::path& dir) {
  ModelSummary s;
  ConfigJson config = ConfigJson::load(dir / "config.json");
  s.model_type = config.require<std::string>("model_type");
  if (config.has("architectures") && config.raw()["architectures"].is_array())
    for (const auto& a : config.raw()["architectures"])
      if (a.is_string()) s.architectures.push_back(a.get<std::string>());
  auto types = supported_model_types();
  s.supported = std::find(types.begin(), types.end(), s.model_type) != types.end();
  for (const char* key : {"quantization", "quantization_config"})
    if (config.has(key)) s.quantization = config.raw()[key].dump();

  // Packed quantized tensors count stored elements, not logical parameters; the
  // quantization line says when that applies.
  Checkpoint checkpoint = Checkpoint::open(dir);
  for (const std::string& name : checkpoint.names()) {
    const TensorInfo& info = checkpoint.info(name);
    s.n_params += shape_numel(info.shape);
    ++s.tensors_per_dtype[std::string(dtype_name(info.dtype))];
  }
  s.weight_bytes = checkpoint.size_bytes();

  // Only the directory's own files: a subdirectory (say a draft model) is another model.
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) s.size_on_disk_bytes += e.file_size();
  return s;
}

std::string human_count(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.1f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}K", n / 1e3);
  return fmt::format("{}", int64_t(n));
}

std::string human_bytes(uint64_t bytes) {
  double b = double(bytes);
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  if (b >= 1e3) return fmt::format("{:.1f} kB", b / 1e3);
  return fmt::format("{} bytes", bytes);
}

}  // namespace mere

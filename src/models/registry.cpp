#include <fmt/ranges.h>

#include "io/checkpoint.h"
#include "io/config.h"
#include "models/llama.h"
#include "models/model.h"
#include "models/qwen3_moe.h"

namespace mere {

std::vector<std::string> supported_model_types() { return {"llama", "qwen2", "qwen3", "qwen3_moe"}; }

std::unique_ptr<Model> load_model(const std::filesystem::path& dir, Device device, const LoadOptions& options) {
  MERE_CHECK(std::filesystem::is_directory(dir), "{}: not a model directory", dir.string());
  ConfigJson config = ConfigJson::load(dir / "config.json");
  std::string type = config.require<std::string>("model_type");
  auto supported = supported_model_types();
  MERE_CHECK(std::find(supported.begin(), supported.end(), type) != supported.end(),
             "{}: model_type '{}' is not supported (supported: {})", config.path().string(), type,
             fmt::join(supported, ", "));
  Checkpoint checkpoint = Checkpoint::open(dir);
  if (type == "qwen3_moe") return std::make_unique<Qwen3Moe>(config, checkpoint, device, options);
  return std::make_unique<Llama>(config, checkpoint, device, options);
}

}  // namespace mere

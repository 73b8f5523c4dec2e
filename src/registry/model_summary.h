// What `mere model show` says about a model directory, read from config.json and the
// safetensors headers only: no weights are loaded.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace mere {

struct ModelSummary {
  std::string model_type;                  // config.json model_type
  std::vector<std::string> architectures;  // config.json architectures, when present
  bool supported = false;                  // model_type is one mere implements
  int64_t n_params = 0;                    // elements of every stored tensor
  uint64_t weight_bytes = 0;               // bytes of every stored tensor
  std::map<std::string, int> tensors_per_dtype;  // "bf16" -> 57
  std::string quantization = "none";       // config.json quantization(_config), compact JSON
  uint64_t size_on_disk_bytes = 0;         // regular files directly in the directory
};

ModelSummary summarize_model(const std::filesystem::path& dir);

// 12582912 -> "12.6M"; 25312345 bytes -> "25.3 MB".
std::string human_count(double n);
std::string human_bytes(uint64_t bytes);

}  // namespace mere

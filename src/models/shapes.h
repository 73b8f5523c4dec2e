// Published model configurations, built in memory with random weights so real
// sizes can be measured without downloads (`mere bench --shape NAME`).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model.h"

namespace mere {

std::vector<std::string> known_shapes();
// The config.json of a published model, e.g. "llama3-8b". Unknown names list the known ones.
nlohmann::json shape_config(const std::string& name);
// Random bf16 weights (never zeros) of that shape, made directly on `device`.
std::unique_ptr<Model> random_model(const std::string& name, Device device, const LoadOptions& options = {},
                                    uint64_t seed = 1);

}  // namespace mere

// NumPy .npy files (format 1.0, little-endian f32, C order): written by
// `mere eval logits`, read by the fixture tests.
#pragma once

#include <filesystem>

#include "core/tensor.h"

namespace mere {

void write_npy(const std::filesystem::path& path, const Tensor& t);  // t: f32, CPU
Tensor read_npy(const std::filesystem::path& path);                  // '<f4' only

}  // namespace mere

// A model checkpoint: one model.safetensors, shards listed by
// model.safetensors.index.json, or a single .safetensors file given directly.
// Every file is mapped and validated on open; tensors are zero-copy views.
// Copies share one state (including which tensors were used); const methods
// may be called from several threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mere {

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  std::filesystem::path file;  // the .safetensors file holding it
};

class Checkpoint {
 public:
  // A directory (model.safetensors, else model.safetensors.index.json) or a .safetensors file.
  static Checkpoint open(const std::filesystem::path& dir_or_file);
  // Tensors already in memory (CPU or GPU), e.g. random weights of a published
  // shape for `mere bench --shape`; `name` stands for the file in messages.
  static Checkpoint from_tensors(const std::string& name, std::map<std::string, Tensor> tensors);

  bool has(const std::string& name) const;
  // Error naming the checkpoint if absent.
  const TensorInfo& info(const std::string& name) const;
  // Sorted.
  std::vector<std::string> names() const;
  // The tensor, marked used. Errors: "<dir>: missing tensor <name>"; with a
  // non-empty `expected` that differs, "<file>: <name> has shape [a, b], expected
  // [c, d] (<why>)", where `why` names the config fields the shape comes from.
  Tensor get(const std::string& name, const Shape& expected = {}, const std::string& why = "") const;
  // Names never fetched with get(), sorted: strict loading makes these an error.
  std::vector<std::string> unused() const;
  // Sum of all tensors' bytes.
  uint64_t size_bytes() const;
  // As given to open().
  const std::filesystem::path& path() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace mere

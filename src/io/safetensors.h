// One .safetensors file: memory-mapped read-only, its whole header validated on
// open, tensors handed out as zero-copy views into the mapping.
// Format: u64 LE header length, a JSON header {name: {dtype, shape, data_offsets}},
// then the data section; offsets are relative to the start of the data section.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mere {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data section, [begin, end)
  uint64_t end = 0;
  uint64_t size_bytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  // Maps and validates `path`; every problem is a mere::Error naming the file,
  // the tensor and the expected and actual values.
  static SafetensorsFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const;
  // Sorted by name.
  const std::vector<SafetensorsEntry>& entries() const;
  // nullptr if absent.
  const SafetensorsEntry* find(const std::string& name) const;
  bool has(const std::string& name) const { return find(name) != nullptr; }
  // A view into the mapping, which stays alive while the tensor does. The
  // mapping is read-only: writing through the view faults, so clone() first.
  // Data not aligned to its element size (only in malformed files) is copied.
  Tensor tensor(const std::string& name) const;
  // The optional "__metadata__" string map.
  const std::map<std::string, std::string>& metadata() const;
  uint64_t data_size_bytes() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace mere

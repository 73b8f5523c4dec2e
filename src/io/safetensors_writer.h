// Writing safetensors: one file from tensors in hand, or a whole checkpoint
// streamed one tensor at a time (model.safetensors, or past a size limit
// model-00001-of-0000N.safetensors shards and model.safetensors.index.json, as
// transformers and mlx-lm write them). The format is the one io/safetensors.h
// reads: u64 LE header length, the JSON header (space-padded to 8 bytes), the data.
// Within a file tensors go by element size, largest first, then by name, so every
// tensor starts at a multiple of its element size and maps without a copy.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mere {

struct NamedTensor {
  std::string name;
  Tensor tensor;  // on the CPU
};

// The safetensors spelling of a dtype: "F32", "BF16", "U32", ...
std::string_view safetensors_dtype_name(DType dtype);

// The bytes of one .safetensors file holding `tensors`.
std::string safetensors_bytes(const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});
// Writes them to `path`; an error names the file.
void write_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

struct TensorSpec {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t size_bytes() const { return uint64_t(shape_numel(shape)) * dtype_size(dtype); }
};

// A checkpoint whose tensors are declared up front and then written one at a
// time, in any order, so a quantizer never holds more than one in memory.
// Declared tensors fill a shard in order until the next would pass
// `max_shard_bytes` (a tensor larger than the limit gets a shard of its own).
class CheckpointWriter {
 public:
  static constexpr uint64_t kDefaultShardBytes = 5'000'000'000;

  CheckpointWriter(const std::filesystem::path& dir, std::vector<TensorSpec> specs,
                   uint64_t max_shard_bytes = kDefaultShardBytes,
                   std::map<std::string, std::string> metadata = {});
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // The tensor declared as `name`, whose dtype and shape must match the declaration.
  void write(const std::string& name, const Tensor& tensor);
  // Checks that every declared tensor was written, closes the files and, when
  // there are several, writes the index. Returns the files written.
  std::vector<std::filesystem::path> finish();
  // Number of files the declared tensors take.
  int shard_count() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mere

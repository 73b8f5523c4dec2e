#include "io/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace mere {
namespace {

using nlohmann::json;

// One file's layout: its header bytes (length prefix included) and where each
// member's data starts, counted from the start of the file.
struct FilePlan {
  std::filesystem::path path;
  std::string head;
  std::map<std::string, uint64_t> offset;
  uint64_t size_bytes = 0;
};

FilePlan plan_file(const std::vector<const TensorSpec*>& members, const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorSpec*> order = members;
  std::stable_sort(order.begin(), order.end(), [](const TensorSpec* a, const TensorSpec* b) {
    if (dtype_size(a->dtype) != dtype_size(b->dtype)) return dtype_size(a->dtype) > dtype_size(b->dtype);
    return a->name < b->name;
  });
  json header = json::object();
  uint64_t at = 0;
  std::map<std::string, uint64_t> data_offset;
  for (const TensorSpec* s : order) {
    MERE_CHECK(!header.contains(s->name), "safetensors writer: tensor {} is declared twice", s->name);
    header[s->name] = {{"dtype", std::string(safetensors_dtype_name(s->dtype))}, {"shape", s->shape}, {"data_offsets", {at, at + s->size_bytes()}}};
    data_offset[s->name] = at;
    at += s->size_bytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  FilePlan plan;
  plan.head.resize(8);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) plan.head[size_t(i)] = char((n >> (8 * i)) & 0xff);
  plan.head += text;
  for (const auto& [name, off] : data_offset) plan.offset[name] = plan.head.size() + off;
  plan.size_bytes = plan.head.size() + at;
  return plan;
}

std::vector<TensorSpec> specs_of(const std::vector<NamedTensor>& tensors) {
  std::vector<TensorSpec> specs;
  for (const NamedTensor& t : tensors) specs.push_back({t.name, t.tensor.dtype(), t.tensor.shape()});
  return specs;
}

[[noreturn]] void fail_io(const std::filesystem::path& path, const char* what) {
  fail("{}: cannot {}: {}", path.string(), what, std::strerror(errno));
}

void check_matches(const TensorSpec& spec, const Tensor& t) {
  MERE_CHECK(t.dtype() == spec.dtype && t.shape() == spec.shape,
             "safetensors writer: tensor {} is {} {}, declared as {} {}", spec.name, dtype_name(t.dtype()),
             shape_str(t.shape()), dtype_name(spec.dtype), shape_str(spec.shape));
}

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::u32: return "U32";
    case DType::u8: return "U8";
    case DType::f8_e4m3: return "F8_E4M3";
  }
  fail("safetensors writer: dtype {} has no safetensors name", int(dtype));
}

std::string safetensors_bytes(const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs = specs_of(tensors);
  std::vector<const TensorSpec*> members;
  for (const TensorSpec& s : specs) members.push_back(&s);
  FilePlan plan = plan_file(members, metadata);
  std::string bytes = plan.head;
  bytes.resize(plan.size_bytes);
  for (const NamedTensor& t : tensors) {
    Tensor host = t.tensor.to_device(Device::cpu);
    if (host.size_bytes() > 0) std::memcpy(bytes.data() + plan.offset.at(t.name), host.raw(), host.size_bytes());
  }
  return bytes;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::string bytes = safetensors_bytes(tensors, metadata);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail_io(path, "create");
  f.write(bytes.data(), std::streamsize(bytes.size()));
  if (!f.flush()) fail_io(path, "write");
}

struct CheckpointWriter::Impl {
  std::filesystem::path dir;
  std::vector<TensorSpec> specs;
  std::vector<FilePlan> files;
  std::vector<int> fds;
  std::map<std::string, std::pair<size_t, size_t>> where;  // name -> (spec index, file index)
  std::vector<bool> written;
  bool finished = false;

  ~Impl() { close_all(); }
  void close_all() {
    for (int& fd : fds)
      if (fd >= 0) {
        ::close(fd);
        fd = -1;
      }
  }
};

CheckpointWriter::CheckpointWriter(const std::filesystem::path& dir, std::vector<TensorSpec> specs,
                                   uint64_t max_shard_bytes, std::map<std::string, std::string> metadata)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.dir = dir;
  m.specs = std::move(specs);
  m.written.assign(m.specs.size(), false);
  std::vector<std::vector<const TensorSpec*>> shards(1);
  uint64_t shard_bytes = 0;
  for (size_t i = 0; i < m.specs.size(); ++i) {
    const TensorSpec& s = m.specs[i];
    MERE_CHECK(!m.where.contains(s.name), "safetensors writer: tensor {} is declared twice", s.name);
    if (!shards.back().empty() && shard_bytes + s.size_bytes() > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&s);
    shard_bytes += s.size_bytes();
    m.where[s.name] = {i, shards.size() - 1};
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MERE_CHECK(!ec, "{}: cannot create the directory: {}", dir.string(), ec.message());
  for (size_t k = 0; k < shards.size(); ++k) {
    FilePlan plan = plan_file(shards[k], metadata);
    plan.path = dir / (shards.size() == 1 ? std::string("model.safetensors")
                                          : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards.size()));
    const int fd = ::open(plan.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail_io(plan.path, "create");
    m.fds.push_back(fd);
    if (::pwrite(fd, plan.head.data(), plan.head.size(), 0) != ssize_t(plan.head.size()) ||
        ::ftruncate(fd, off_t(plan.size_bytes)) != 0)
      fail_io(plan.path, "write");
    m.files.push_back(std::move(plan));
  }
}

CheckpointWriter::~CheckpointWriter() = default;

int CheckpointWriter::shard_count() const { return int(impl_->files.size()); }

void CheckpointWriter::write(const std::string& name, const Tensor& tensor) {
  Impl& m = *impl_;
  MERE_CHECK(!m.finished, "safetensors writer: {} written after finish()", name);
  auto it = m.where.find(name);
  MERE_CHECK(it != m.where.end(), "safetensors writer: tensor {} was not declared", name);
  const auto [spec_index, file_index] = it->second;
  check_matches(m.specs[spec_index], tensor);
  const FilePlan& file = m.files[file_index];
  Tensor host = tensor.to_device(Device::cpu);
  const char* p = static_cast<const char*>(host.raw());
  uint64_t done = 0, offset = file.offset.at(name);
  while (done < host.size_bytes()) {
    const ssize_t n = ::pwrite(m.fds[file_index], p + done, host.size_bytes() - done, off_t(offset + done));
    if (n <= 0) fail_io(file.path, "write");
    done += uint64_t(n);
  }
  m.written[spec_index] = true;
}

std::vector<std::filesystem::path> CheckpointWriter::finish() {
  Impl& m = *impl_;
  for (size_t i = 0; i < m.specs.size(); ++i)
    MERE_CHECK(m.written[i], "safetensors writer: tensor {} was declared but never written", m.specs[i].name);
  for (size_t k = 0; k < m.fds.size(); ++k)
    if (::close(m.fds[k]) != 0) fail_io(m.files[k].path, "close");
  m.fds.clear();
  m.finished = true;
  std::vector<std::filesystem::path> paths;
  for (const FilePlan& f : m.files) paths.push_back(f.path);
  if (m.files.size() > 1) {
    uint64_t total = 0;
    json weight_map = json::object();
    for (const auto& [name, loc] : m.where) {
      total += m.specs[loc.first].size_bytes();
      weight_map[name] = m.files[loc.second].path.filename().string();
    }
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    const std::filesystem::path path = m.dir / "model.safetensors.index.json";
    std::ofstream f(path, std::ios::trunc);
    if (!f) fail_io(path, "create");
    f << index.dump(2) << "\n";
    if (!f.flush()) fail_io(path, "write");
    paths.push_back(path);
  }
  return paths;
}

}  // namespace mere

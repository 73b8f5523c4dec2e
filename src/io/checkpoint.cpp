#include "io/checkpoint.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_set>

#include "io/config.h"
#include "io/json_util.h"
#include "io/safetensors.h"

namespace mere {

namespace fs = std::filesystem;

struct Checkpoint::Impl {
  fs::path path;
  std::vector<SafetensorsFile> files;
  struct Entry {
    TensorInfo info;
    size_t file;    // index into `files`; unused for in-memory tensors
    Tensor memory;  // set for checkpoints made by from_tensors()
  };
  std::map<std::string, Entry> tensors;
  uint64_t size_bytes = 0;

  mutable std::mutex mu;
  std::unordered_set<std::string> used;  // guarded by mu

  void add_file(const fs::path& file);
  void load_index(const fs::path& index_path);
  const Entry& find(const std::string& name) const;
};

void Checkpoint::Impl::add_file(const fs::path& file) {
  SafetensorsFile f = SafetensorsFile::open(file);
  for (const SafetensorsEntry& e : f.entries()) {
    auto [it, inserted] = tensors.try_emplace(e.name, Entry{{e.name, e.dtype, e.shape, file}, files.size(), Tensor()});
    MERE_CHECK(inserted, "{}: tensor {} is in both {} and {}", path.string(), e.name,
               it->second.info.file.string(), file.string());
    size_bytes += e.size_bytes();
  }
  files.push_back(std::move(f));
}

// The index and the shards must agree exactly: every listed tensor in its
// listed shard, and no shard tensor the index does not list.
void Checkpoint::Impl::load_index(const fs::path& index_path) {
  const std::string index = index_path.string();
  const ConfigJson weight_map = ConfigJson::load(index_path).child("weight_map");
  std::map<std::string, std::string> shard_of;      // tensor -> shard file name
  std::map<std::string, std::vector<std::string>> listed;  // shard file name -> tensors
  for (const auto& [name, shard] : weight_map.raw().items()) {
    MERE_CHECK(shard.is_string(), "{}: weight_map entry for {} is {}, expected a shard file name", index, name,
               io_detail::json_kind(shard));
    shard_of[name] = shard.get<std::string>();
    listed[shard.get<std::string>()].push_back(name);
  }
  MERE_CHECK(!listed.empty(), "{}: weight_map is empty", index);

  const fs::path dir = index_path.parent_path();
  for (const auto& [shard, names] : listed) {
    std::error_code ec;
    MERE_CHECK(fs::is_regular_file(dir / shard, ec), "{}: weight_map puts {} in {}, which does not exist{}", index,
               names.front(), (dir / shard).string(),
               names.size() > 1 ? fmt::format(" (nor do {} other tensors listed there)", names.size() - 1) : "");
  }
  for (const auto& [shard, names] : listed) add_file(dir / shard);

  for (const auto& [name, shard] : shard_of) {
    auto it = tensors.find(name);
    MERE_CHECK(it != tensors.end(), "{}: weight_map puts {} in {}, but that shard has no such tensor", index, name,
               (dir / shard).string());
    MERE_CHECK(it->second.info.file == dir / shard, "{}: weight_map puts {} in {}, but it is in {}", index, name,
               (dir / shard).string(), it->second.info.file.string());
  }
  for (const auto& [name, entry] : tensors)
    MERE_CHECK(shard_of.count(name), "{}: tensor {} is not listed in the weight_map of {}",
               entry.info.file.string(), name, index);
}

const Checkpoint::Impl::Entry& Checkpoint::Impl::find(const std::string& name) const {
  auto it = tensors.find(name);
  if (it != tensors.end()) return it->second;
  // A prefix mismatch ("model." or "language_model.") is the usual cause; say so.
  for (const auto& [other, entry] : tensors)
    if (other.ends_with("." + name) || name.ends_with("." + other))
      fail("{}: missing tensor {} (the checkpoint has {})", path.string(), name, other);
  fail("{}: missing tensor {}", path.string(), name);
}

Checkpoint Checkpoint::from_tensors(const std::string& name, std::map<std::string, Tensor> tensors) {
  auto impl = std::make_shared<Impl>();
  impl->path = name;
  for (auto& [tensor_name, t] : tensors) {
    impl->size_bytes += t.size_bytes();
    impl->tensors.emplace(tensor_name, Impl::Entry{{tensor_name, t.dtype(), t.shape(), name}, 0, t});
  }
  Checkpoint c;
  c.impl_ = std::move(impl);
  return c;
}

Checkpoint Checkpoint::open(const fs::path& dir_or_file) {
  auto impl = std::make_shared<Impl>();
  impl->path = dir_or_file;
  const std::string where = dir_or_file.string();
  std::error_code ec;
  MERE_CHECK(fs::exists(dir_or_file, ec), "{}: no such file or directory", where);

  if (!fs::is_directory(dir_or_file, ec)) {
    if (where.ends_with(".index.json"))
      impl->load_index(dir_or_file);
    else
      impl->add_file(dir_or_file);
  } else if (fs::exists(dir_or_file / "model.safetensors", ec)) {  // transformers' order
    impl->add_file(dir_or_file / "model.safetensors");
  } else if (fs::exists(dir_or_file / "model.safetensors.index.json", ec)) {
    impl->load_index(dir_or_file / "model.safetensors.index.json");
  } else {
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(dir_or_file, ec))
      if (e.path().extension() == ".safetensors") found.push_back(e.path().filename().string());
    std::sort(found.begin(), found.end());
    fail("{}: no model.safetensors or model.safetensors.index.json{}", where,
         found.empty() ? std::string() : fmt::format(" (found {})", fmt::join(found, ", ")));
  }

  Checkpoint c;
  c.impl_ = std::move(impl);
  return c;
}

bool Checkpoint::has(const std::string& name) const { return impl_->tensors.count(name) > 0; }

const TensorInfo& Checkpoint::info(const std::string& name) const { return impl_->find(name).info; }

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(impl_->tensors.size());
  for (const auto& [name, entry] : impl_->tensors) out.push_back(name);
  return out;
}

Tensor Checkpoint::get(const std::string& name, const Shape& expected, const std::string& why) const {
  const Impl::Entry& e = impl_->find(name);
  if (!expected.empty() && expected != e.info.shape)
    fail("{}: {} has shape {}, expected {}{}", e.info.file.string(), name, shape_str(e.info.shape),
         shape_str(expected), why.empty() ? std::string() : " (" + why + ")");
  Tensor t = e.memory.defined() ? e.memory : impl_->files[e.file].tensor(name);
  std::lock_guard lock(impl_->mu);
  impl_->used.insert(name);
  return t;
}

std::vector<std::string> Checkpoint::unused() const {
  std::lock_guard lock(impl_->mu);
  std::vector<std::string> out;
  for (const auto& [name, entry] : impl_->tensors)
    if (!impl_->used.count(name)) out.push_back(name);
  return out;
}

uint64_t Checkpoint::size_bytes() const { return impl_->size_bytes; }
const fs::path& Checkpoint::path() const { return impl_->path; }

}  // namespace mere

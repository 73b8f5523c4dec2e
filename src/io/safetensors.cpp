#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "io/json_util.h"

namespace mere {
namespace {

using nlohmann::json;
using io_detail::json_kind;

// A read-only private mapping of a whole file; unmapped when the last tensor
// borrowing from it goes away.
struct Mapping {
  const uint8_t* data = nullptr;
  size_t size = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (data) munmap(const_cast<uint8_t*>(data), size);
  }
};

std::shared_ptr<Mapping> map_file(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path.string(), std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path.string());
  }
  auto m = std::make_shared<Mapping>();
  m->size = size_t(st.st_size);
  if (m->size > 0) {
    void* p = mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) fail("{}: cannot mmap {} bytes: {}", path.string(), m->size, std::strerror(err));
    m->data = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  return m;
}

struct DtypeName {
  const char* name;
  std::optional<DType> dtype;  // nullopt: a real safetensors dtype mere cannot hold
};

// Every dtype the safetensors format defines, so a real-but-unsupported one is
// told apart from a corrupt header.
constexpr DtypeName kDtypes[] = {
    {"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16}, {"I32", DType::i32},
    {"U32", DType::u32}, {"U8", DType::u8},   {"F64", {}},           {"I64", {}},
    {"U64", {}},         {"I16", {}},         {"U16", {}},           {"I8", {}},
    {"BOOL", {}},        {"F8_E4M3", DType::f8_e4m3},     {"F8_E5M2", {}},       {"F8_E8M0", {}},
    {"F6_E2M3", {}},     {"F6_E3M2", {}},     {"F4", {}},            {"C64", {}},
};

// A JSON value that is a non-negative integer (not 4.0, not "4").
std::optional<uint64_t> as_u64(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return uint64_t(v.get<int64_t>());
  return std::nullopt;
}

std::string offsets_str(uint64_t begin, uint64_t end) { return fmt::format("[{}, {}]", begin, end); }

// A JSON list written like shape_str ("[2, -1]"), whatever its elements are.
std::string list_str(const json& list) {
  std::vector<std::string> items;
  for (const json& v : list) items.push_back(v.dump());
  return fmt::format("[{}]", fmt::join(items, ", "));
}

}  // namespace

struct SafetensorsFile::Impl {
  std::filesystem::path path;
  std::shared_ptr<Mapping> mapping;
  size_t data_start = 0;  // 8 + header length
  uint64_t data_size = 0;
  std::vector<SafetensorsEntry> entries;  // sorted by name
  std::unordered_map<std::string, size_t> index;
  std::map<std::string, std::string> metadata;
};

namespace {

// Validates one header entry; `where` is "<file>: tensor <name>".
SafetensorsEntry parse_entry(const std::string& where, const std::string& name, const json& e,
                             uint64_t data_size) {
  MERE_CHECK(e.is_object(), "{}: entry is {}, expected an object with dtype, shape and data_offsets",
             where, json_kind(e));
  for (const char* field : {"dtype", "shape", "data_offsets"})
    MERE_CHECK(e.contains(field), "{}: missing field '{}' (has {})", where, field, e.dump());

  SafetensorsEntry t;
  t.name = name;

  const json& dt = e.at("dtype");
  MERE_CHECK(dt.is_string(), "{}: dtype is {}, expected a string like \"BF16\"", where, json_kind(dt));
  const std::string dt_name = dt.get<std::string>();
  auto known = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                            [&](const DtypeName& d) { return dt_name == d.name; });
  MERE_CHECK(known != std::end(kDtypes), "{}: unknown dtype '{}'", where, dt_name);
  MERE_CHECK(known->dtype.has_value(),
             "{}: dtype {} is not supported (mere reads F32, F16, BF16, I32, U32, U8, F8_E4M3)", where, dt_name);
  t.dtype = *known->dtype;

  const json& shape = e.at("shape");
  MERE_CHECK(shape.is_array(), "{}: shape is {}, expected a list of integers", where, json_kind(shape));
  // Count bytes in 128 bits so a hostile shape cannot wrap around to a small size.
  unsigned __int128 bytes = dtype_size(t.dtype);
  for (size_t i = 0; i < shape.size(); ++i) {
    std::optional<uint64_t> d = as_u64(shape[i]);
    MERE_CHECK(d && *d <= uint64_t(INT64_MAX), "{}: shape {} has entry {} = {}, expected a non-negative integer",
               where, list_str(shape), i, shape[i].dump());
    t.shape.push_back(int64_t(*d));
    bytes *= *d;
    MERE_CHECK(bytes <= (unsigned __int128)(INT64_MAX), "{}: {} {} is too large (over 2^63 bytes)", where, dt_name,
               list_str(shape));
  }

  const json& off = e.at("data_offsets");
  MERE_CHECK(off.is_array() && off.size() == 2 && as_u64(off[0]) && as_u64(off[1]),
             "{}: data_offsets is {}, expected [begin, end] with non-negative integers", where, off.dump());
  t.begin = *as_u64(off[0]);
  t.end = *as_u64(off[1]);
  MERE_CHECK(t.begin <= t.end, "{}: data_offsets {} end before they begin", where, offsets_str(t.begin, t.end));
  MERE_CHECK(t.end <= data_size, "{}: data_offsets {} run past the end of the data section ({} bytes)", where,
             offsets_str(t.begin, t.end), data_size);
  MERE_CHECK(t.size_bytes() == bytes, "{}: data_offsets {} hold {} bytes, but {} {} needs {}", where,
             offsets_str(t.begin, t.end), t.size_bytes(), dt_name, shape_str(t.shape), uint64_t(bytes));
  return t;
}

std::map<std::string, std::string> parse_metadata(const std::string& file, const json& m) {
  MERE_CHECK(m.is_object(), "{}: __metadata__ is {}, expected an object of strings", file, json_kind(m));
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : m.items()) {
    MERE_CHECK(v.is_string(), "{}: __metadata__ field '{}' is {}, expected a string", file, k, json_kind(v));
    out[k] = v.get<std::string>();
  }
  return out;
}

// Tensors may not share bytes: a writer bug (or a crafted file) would make two
// weights alias. Empty tensors own no bytes and are skipped.
void check_no_overlap(const std::string& file, const std::vector<SafetensorsEntry>& entries) {
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : entries)
    if (e.size_bytes() > 0) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->begin != b->begin ? a->begin < b->begin : a->name < b->name; });
  const SafetensorsEntry* reach = nullptr;  // the entry reaching furthest so far
  for (const SafetensorsEntry* e : by_offset) {
    if (reach && e->begin < reach->end)
      fail("{}: tensor {}: data_offsets {} overlap tensor {} at {}", file, e->name, offsets_str(e->begin, e->end),
           reach->name, offsets_str(reach->begin, reach->end));
    if (!reach || e->end > reach->end) reach = e;
  }
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  const std::string file = path.string();
  impl->mapping = map_file(path);
  const Mapping& m = *impl->mapping;

  MERE_CHECK(m.size >= 8, "{}: file is {} bytes, too short for a safetensors header (at least 8)", file, m.size);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | m.data[i];  // little-endian
  MERE_CHECK(header_len <= m.size - 8,
             "{}: header length {} runs past the end of the file ({} bytes after the 8-byte length)", file,
             header_len, m.size - 8);
  impl->data_start = 8 + size_t(header_len);
  impl->data_size = m.size - impl->data_start;

  json header;
  try {
    header = json::parse(m.data + 8, m.data + impl->data_start);
  } catch (const json::exception& e) {  // parse errors, and numbers past a double
    fail("{}: header is not valid JSON: {}", file, io_detail::parse_error_text(e));
  }
  MERE_CHECK(header.is_object(), "{}: header is {}, expected a JSON object", file, json_kind(header));

  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      impl->metadata = parse_metadata(file, value);
      continue;
    }
    impl->entries.push_back(parse_entry(fmt::format("{}: tensor {}", file, name), name, value, impl->data_size));
  }
  std::sort(impl->entries.begin(), impl->entries.end(), [](auto& a, auto& b) { return a.name < b.name; });
  check_no_overlap(file, impl->entries);
  for (size_t i = 0; i < impl->entries.size(); ++i) impl->index[impl->entries[i].name] = i;

  SafetensorsFile f;
  f.impl_ = std::move(impl);
  return f;
}

const std::filesystem::path& SafetensorsFile::path() const { return impl_->path; }
const std::vector<SafetensorsEntry>& SafetensorsFile::entries() const { return impl_->entries; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return impl_->metadata; }
uint64_t SafetensorsFile::data_size_bytes() const { return impl_->data_size; }

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? nullptr : &impl_->entries[it->second];
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  MERE_CHECK(e != nullptr, "{}: no tensor {}", impl_->path.string(), name);
  const uint8_t* p = impl_->mapping->data + impl_->data_start + e->begin;
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(e->dtype) != 0) {
    // Only a malformed writer misaligns data; typed loads from it would be UB.
    Tensor t = Tensor::empty(e->shape, e->dtype);
    std::memcpy(t.raw(), p, e->size_bytes());
    return t;
  }
  // The mapping is the owner. Tensor::borrow wants a mutable pointer, but the
  // pages are PROT_READ.
  return Tensor::borrow(const_cast<uint8_t*>(p), e->shape, e->dtype, impl_->mapping);
}

}  // namespace mere

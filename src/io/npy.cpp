#include "io/npy.h"

#include <fstream>
#include <cstring>
#include <regex>

namespace mere {

void write_npy(const std::filesystem::path& path, const Tensor& t) {
  MERE_CHECK(t.dtype() == DType::f32 && t.device() == Device::cpu, "write_npy: need a CPU f32 tensor");
  std::string shape;
  for (int64_t d : t.shape()) shape += std::to_string(d) + ", ";
  if (t.rank() > 1) shape.resize(shape.size() - 1);  // "(3, 4)" but "(3,)"
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + shape + "), }";
  // Magic, version, header length, header padded with spaces to 64 bytes, ending in '\n'.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  MERE_CHECK(f.good(), "{}: cannot open for writing", path.string());
  uint16_t len = uint16_t(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&len), 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(static_cast<const char*>(t.raw()), std::streamsize(t.size_bytes()));
  MERE_CHECK(f.good(), "{}: write failed", path.string());
}

Tensor read_npy(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  MERE_CHECK(f.good(), "{}: cannot open", path.string());
  char magic[10];
  f.read(magic, 10);
  MERE_CHECK(f.good() && std::string(magic, 6) == "\x93NUMPY" && magic[6] == 1,
             "{}: not a version 1 .npy file", path.string());
  uint16_t len;
  std::memcpy(&len, magic + 8, 2);
  std::string header(len, '\0');
  f.read(header.data(), len);
  MERE_CHECK(header.find("'<f4'") != std::string::npos && header.find("False") != std::string::npos,
             "{}: only little-endian float32 C-order arrays are supported: {}", path.string(), header);
  std::smatch m;
  MERE_CHECK(std::regex_search(header, m, std::regex(R"('shape': \(([0-9, ]*)\))")), "{}: no shape in header",
             path.string());
  Shape shape;
  std::string dims = m[1];
  const std::regex number("[0-9]+");
  for (std::sregex_iterator it(dims.begin(), dims.end(), number), end; it != end; ++it)
    shape.push_back(std::stoll(it->str()));
  Tensor t = Tensor::empty(shape, DType::f32);
  f.read(static_cast<char*>(t.raw()), std::streamsize(t.size_bytes()));
  MERE_CHECK(f.gcount() == std::streamsize(t.size_bytes()), "{}: truncated data", path.string());
  return t;
}

}  // namespace mere

// Test helpers for io/: valid files come from the real writer
// (src/io/safetensors_writer.h, included below by its path, since this header's
// include name shadows it for the tests); st_raw and st_header build the exact
// bytes of corrupt ones. Also an expect-error check on messages.
#pragma once

#include "../../src/io/safetensors_writer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace mere::test {

struct StTensor {
  std::string name;
  std::string dtype;  // safetensors spelling: "F32", "BF16", ...
  Shape shape;
  std::string bytes;
};

inline StTensor st_f32(const std::string& name, Shape shape, const std::vector<float>& values) {
  std::string bytes(values.size() * 4, '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return {name, "F32", std::move(shape), bytes};
}

inline StTensor st_half(const std::string& name, const char* dtype, Shape shape, const std::vector<float>& values) {
  std::string bytes;
  for (float v : values) {
    uint16_t h = std::string(dtype) == "BF16" ? f32_to_bf16(v) : f32_to_f16(v);
    bytes.append(reinterpret_cast<const char*>(&h), 2);  // little-endian host
  }
  return {name, dtype, std::move(shape), bytes};
}

// 8-byte little-endian length, the header, the data section.
inline std::string st_raw(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = char((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// The header a writer would produce for `tensors`, packed back to back in order.
inline nlohmann::json st_header(const std::vector<StTensor>& tensors, std::string* data = nullptr) {
  nlohmann::json h = nlohmann::json::object();
  std::string bytes;
  for (const StTensor& t : tensors) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {bytes.size(), bytes.size() + t.bytes.size()}}};
    bytes += t.bytes;
  }
  if (data) *data = bytes;
  return h;
}

// A valid file written by the real writer (tensors ordered by element size, then name).
inline std::string st_file(const std::vector<StTensor>& tensors, const nlohmann::json& metadata = nullptr) {
  std::vector<NamedTensor> named;
  for (const StTensor& t : tensors) {
    DType dt = t.dtype == "F32" ? DType::f32 : t.dtype == "F16" ? DType::f16 : DType::bf16;
    EXPECT_TRUE(t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16") << t.dtype;
    Tensor v = Tensor::empty(t.shape, dt);
    EXPECT_EQ(v.size_bytes(), t.bytes.size()) << t.name;
    if (!t.bytes.empty()) std::memcpy(v.raw(), t.bytes.data(), std::min(v.size_bytes(), t.bytes.size()));
    named.push_back({t.name, v});
  }
  std::map<std::string, std::string> meta;
  if (!metadata.is_null())
    for (auto it = metadata.begin(); it != metadata.end(); ++it) meta[it.key()] = it.value().get<std::string>();
  return safetensors_bytes(named, meta);
}

// Expects `f` to throw mere::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const mere::Error& e) {
    const std::string message = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(message.find(p), std::string::npos) << "message: " << message << "\nlacks: " << p;
    return;
  }
  ADD_FAILURE() << "expected a mere::Error";
}

}  // namespace mere::test

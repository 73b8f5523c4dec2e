#include "io/safetensors.h"

#include <gtest/gtest.h>

#include "io/safetensors_writer.h"
#include "test_util.h"

namespace mere {
namespace {

using nlohmann::json;
using test::expect_error;
using test::st_f32;
using test::st_file;
using test::st_half;
using test::st_header;
using test::st_raw;

// Writes `bytes` as <temp>/model.safetensors and returns the path.
std::filesystem::path write_st(const std::string& bytes) {
  auto path = test::temp_dir("st") / "model.safetensors";
  test::write_file(path, bytes);
  return path;
}

// A header holding one tensor "w" with the given entry, plus `data_size` zero bytes.
std::filesystem::path write_entry(const json& entry, size_t data_size = 64) {
  return write_st(st_raw(json{{"w", entry}}.dump(), std::string(data_size, '\0')));
}

void expect_open_error(const std::filesystem::path& path, std::vector<std::string> parts) {
  parts.push_back("model.safetensors");
  expect_error([&] { SafetensorsFile::open(path); }, parts);
}

TEST(Safetensors, RoundTripF32F16Bf16) {
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 7.0f};
  std::vector<float> b = {0.5f, -1.0f, 2.0f, 65504.0f};
  std::vector<float> c = {1.0f, -3.0f, 0.15625f, 256.0f, -0.5f, 2.5f};
  auto path = write_st(st_file({st_f32("a", {2, 3}, a), st_half("b", "F16", {4}, b),
                                st_half("c", "BF16", {3, 1, 2}, c)},
                               json{{"format", "pt"}}));
  Tensor ta, tb, tc;
  {
    SafetensorsFile f = SafetensorsFile::open(path);
    ASSERT_EQ(f.entries().size(), 3u);
    EXPECT_EQ(f.metadata().at("format"), "pt");
    ta = f.tensor("a");
    tb = f.tensor("b");
    tc = f.tensor("c");
    EXPECT_EQ(ta.raw(), f.tensor("a").raw());  // a view into the mapping, not a copy
    EXPECT_FALSE(f.has("d"));
  }
  // The tensors keep the mapping alive after the file object is gone.
  EXPECT_EQ(ta.dtype(), DType::f32);
  EXPECT_EQ(ta.shape(), (Shape{2, 3}));
  EXPECT_EQ(ta.to_floats(), a);
  EXPECT_EQ(tb.dtype(), DType::f16);
  EXPECT_EQ(tb.to_floats(), b);
  EXPECT_EQ(tc.dtype(), DType::bf16);
  EXPECT_EQ(tc.shape(), (Shape{3, 1, 2}));
  EXPECT_EQ(tc.to_floats(), c);
}

TEST(Safetensors, EmptyTensorAndEmptyHeader) {
  auto path = write_st(st_file({st_f32("empty", {0, 4}, {}), st_f32("x", {1}, {2.0f})}));
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.tensor("empty").numel(), 0);
  EXPECT_EQ(f.tensor("x").at(0), 2.0f);
  EXPECT_TRUE(SafetensorsFile::open(write_st(st_raw("{}", ""))).entries().empty());
}

TEST(Safetensors, MisalignedDataIsCopied) {
  // An odd-length header puts the data section at an odd offset: the f32 is misaligned.
  std::string header = json{{"w", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}}}.dump();
  if (header.size() % 2 == 0) header += ' ';
  std::string data = st_f32("w", {2}, {3.0f, -4.0f}).bytes;
  SafetensorsFile f = SafetensorsFile::open(write_st(st_raw(header, data)));
  Tensor t = f.tensor("w");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 4, 0u);
  EXPECT_EQ(t.to_floats(), (std::vector<float>{3.0f, -4.0f}));
}

TEST(Safetensors, TruncatedFile) { expect_open_error(write_st("abc"), {"3 bytes", "at least 8"}); }

TEST(Safetensors, HeaderLengthPastEnd) {
  std::string bytes = st_raw("{}", "");
  bytes[0] = char(200);  // claims a 200-byte header in a 10-byte file
  expect_open_error(write_st(bytes), {"header length 200", "2 bytes after"});
}

TEST(Safetensors, MalformedJson) {
  expect_open_error(write_st(st_raw("{\"w\": {\"dtype\": \"F32\",", "")), {"not valid JSON", "line 1"});
}

TEST(Safetensors, HeaderNotObject) { expect_open_error(write_st(st_raw("[1, 2]", "")), {"a list", "JSON object"}); }

TEST(Safetensors, MissingField) {
  const json full = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}};
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    json entry = full;
    entry.erase(field);
    expect_open_error(write_entry(entry), {"tensor w", fmt::format("missing field '{}'", field)});
  }
}

TEST(Safetensors, UnknownDtype) {
  expect_open_error(write_entry({{"dtype", "F33"}, {"shape", {2}}, {"data_offsets", {0, 8}}}),
                    {"tensor w", "unknown dtype 'F33'"});
}

TEST(Safetensors, UnsupportedKnownDtype) {
  for (const char* dt : {"F64", "I64", "I16", "I8", "BOOL", "F8_E5M2"})
    expect_open_error(write_entry({{"dtype", dt}, {"shape", {1}}, {"data_offsets", {0, 1}}}),
                      {"tensor w", fmt::format("dtype {} is not supported", dt)});
}

TEST(Safetensors, NegativeOrNonIntegerShape) {
  expect_open_error(write_entry({{"dtype", "F32"}, {"shape", {2, -1}}, {"data_offsets", {0, 8}}}),
                    {"tensor w", "shape [2, -1] has entry 1 = -1", "non-negative integer"});
  expect_open_error(write_entry({{"dtype", "F32"}, {"shape", {2.5}}, {"data_offsets", {0, 8}}}),
                    {"tensor w", "entry 0 = 2.5"});
  expect_open_error(write_entry({{"dtype", "F32"}, {"shape", "2"}, {"data_offsets", {0, 8}}}),
                    {"tensor w", "shape is a string"});
}

TEST(Safetensors, ByteLengthMismatch) {
  expect_open_error(write_entry({{"dtype", "BF16"}, {"shape", {8, 16}}, {"data_offsets", {0, 100}}}, 300),
                    {"tensor w", "data_offsets [0, 100] hold 100 bytes, but BF16 [8, 16] needs 256"});
}

TEST(Safetensors, HugeShapeDoesNotWrap) {
  // 2^62 * 4 elements * 4 bytes wraps a u64 to 0; the check must not be fooled.
  expect_open_error(write_entry({{"dtype", "F32"}, {"shape", {uint64_t(1) << 62, 4}}, {"data_offsets", {0, 0}}}),
                    {"tensor w", "is too large"});
}

TEST(Safetensors, OffsetsPastDataSection) {
  expect_open_error(write_entry({{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {60, 76}}}, 64),
                    {"tensor w", "data_offsets [60, 76] run past the end of the data section (64 bytes)"});
  expect_open_error(write_entry({{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {8, 4}}}),
                    {"tensor w", "[8, 4] end before they begin"});
  expect_open_error(write_entry({{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {0}}}),
                    {"tensor w", "data_offsets is [0]"});
}

TEST(Safetensors, OverlappingTensors) {
  json h = {{"first", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}}},
            {"second", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {8, 24}}}}};
  expect_open_error(write_st(st_raw(h.dump(), std::string(24, '\0'))),
                    {"tensor second", "[8, 24] overlap tensor first at [0, 16]"});
}

TEST(Safetensors, BadMetadata) {
  std::string data;
  json h = st_header({st_f32("w", {1}, {1.0f})}, &data);
  h["__metadata__"] = {{"format", 3}};
  expect_open_error(write_st(st_raw(h.dump(), data)), {"__metadata__ field 'format' is an integer"});
}

TEST(Safetensors, MissingFileAndMissingTensor) {
  auto dir = test::temp_dir("st");
  expect_error([&] { SafetensorsFile::open(dir / "model.safetensors"); }, {"model.safetensors", "cannot open"});
  auto path = write_st(st_file({st_f32("w", {1}, {1.0f})}));
  expect_error([&] { SafetensorsFile::open(path).tensor("v"); }, {"model.safetensors", "no tensor v"});
}

}  // namespace
}  // namespace mere

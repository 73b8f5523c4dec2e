// io/safetensors_writer.h: what it writes reads back through io/safetensors.h and
// io/checkpoint.h, every tensor aligned for a zero-copy view, shards and the index
// laid out as transformers writes them.
#include "io/safetensors_writer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <map>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace mere {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

Tensor filled(Shape shape, DType dt, int seed) {
  Tensor t = Tensor::empty(shape, dt);
  auto* bytes = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.size_bytes(); ++i) bytes[i] = uint8_t(i * 7 + size_t(seed) * 13);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.size_bytes()) == 0;
}

TEST(SafetensorsWriter, EveryDtypeRoundTripsAligned) {
  std::vector<NamedTensor> tensors = {
      {"u8", filled({3}, DType::u8, 1)},          {"bf16", filled({5}, DType::bf16, 2)},
      {"f32", filled({2, 3}, DType::f32, 3)},     {"u32", filled({4, 1}, DType::u32, 4)},
      {"f16", filled({1, 1, 3}, DType::f16, 5)},  {"i32", filled({2}, DType::i32, 6)},
      {"empty", filled({0, 4}, DType::f32, 7)},
  };
  const fs::path path = test::temp_dir("w") / "model.safetensors";
  write_safetensors(path, tensors, {{"format", "mlx"}});
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata().at("format"), "mlx");
  ASSERT_EQ(f.entries().size(), tensors.size());
  uint64_t header = 0;
  std::string bytes = test::read_file(path);
  std::memcpy(&header, bytes.data(), 8);
  EXPECT_EQ(header % 8, 0u);
  for (const NamedTensor& t : tensors) {
    const SafetensorsEntry* e = f.find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(e->begin % dtype_size(t.tensor.dtype()), 0u) << t.name;  // maps without a copy
    Tensor back = f.tensor(t.name);
    EXPECT_TRUE(same_bytes(back, t.tensor)) << t.name;
  }
  EXPECT_EQ(safetensors_bytes(tensors, {{"format", "mlx"}}), bytes);
}

TEST(SafetensorsWriter, ShardsPastTheLimitWithAnIndex) {
  const fs::path dir = test::temp_dir("shards");
  std::vector<TensorSpec> specs = {{"model.a", DType::f32, {10, 10}},   // 400 bytes
                                   {"model.b", DType::bf16, {100}},     // 200
                                   {"model.c", DType::u32, {50}},       // 200: shard 2 (400 + 200 + 200 > 700)
                                   {"model.d", DType::f32, {300}}};     // 1200, over the limit alone: shard 3
  CheckpointWriter w(dir, specs, 700, {{"format", "pt"}});
  EXPECT_EQ(w.shard_count(), 3);
  std::map<std::string, Tensor> values;
  for (size_t i = 0; i < specs.size(); ++i) values[specs[i].name] = filled(specs[i].shape, specs[i].dtype, int(i));
  for (auto it = values.rbegin(); it != values.rend(); ++it) w.write(it->first, it->second);  // any order
  std::vector<fs::path> files = w.finish();
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(files[0].filename(), "model-00001-of-00003.safetensors");
  EXPECT_EQ(files[2].filename(), "model-00003-of-00003.safetensors");
  EXPECT_EQ(files[3].filename(), "model.safetensors.index.json");
  auto index = nlohmann::json::parse(test::read_file(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 2000);
  EXPECT_EQ(index["weight_map"]["model.a"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["model.b"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["model.c"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["model.d"], "model-00003-of-00003.safetensors");
  Checkpoint c = Checkpoint::open(dir);
  EXPECT_EQ(c.names().size(), 4u);
  for (const auto& [name, t] : values) EXPECT_TRUE(same_bytes(c.get(name), t)) << name;
}

TEST(SafetensorsWriter, OneFileUnderTheLimit) {
  const fs::path dir = test::temp_dir("one");
  CheckpointWriter w(dir, {{"x", DType::f16, {4}}});
  w.write("x", filled({4}, DType::f16, 1));
  EXPECT_EQ(w.finish(), std::vector<fs::path>{dir / "model.safetensors"});
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
}

TEST(SafetensorsWriter, MisuseIsAnError) {
  const fs::path dir = test::temp_dir("misuse");
  CheckpointWriter w(dir, {{"x", DType::f32, {2, 2}}, {"y", DType::u32, {3}}});
  expect_error([&] { w.write("z", filled({1}, DType::f32, 0)); }, {"tensor z was not declared"});
  expect_error([&] { w.write("x", filled({4}, DType::f32, 0)); }, {"tensor x is f32 [4], declared as f32 [2, 2]"});
  expect_error([&] { w.write("y", filled({3}, DType::i32, 0)); }, {"tensor y is i32 [3], declared as u32 [3]"});
  w.write("x", filled({2, 2}, DType::f32, 0));
  expect_error([&] { w.finish(); }, {"tensor y was declared but never written"});
  expect_error([&] { CheckpointWriter(dir, {{"a", DType::f32, {1}}, {"a", DType::f32, {1}}}); },
               {"tensor a is declared twice"});
}

}  // namespace
}  // namespace mere

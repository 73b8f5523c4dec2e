#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <thread>

#include "io/safetensors_writer.h"
#include "test_util.h"

namespace mere {
namespace {

using nlohmann::json;
using test::expect_error;
using test::st_f32;
using test::st_file;
using test::st_half;

const std::vector<float> kA = {1, 2, 3, 4, 5, 6};
const std::vector<float> kB = {-1, 0.5f};
const std::vector<float> kC = {7, 8, 9};

// A two-shard checkpoint: a, b in shard 1; c in shard 2; index as written by transformers.
std::filesystem::path write_sharded(const std::string& name = "ckpt") {
  auto dir = test::temp_dir(name);
  test::write_file(dir / "model-00001-of-00002.safetensors",
                   st_file({st_f32("model.a", {2, 3}, kA), st_half("model.b", "BF16", {2}, kB)}));
  test::write_file(dir / "model-00002-of-00002.safetensors", st_file({st_f32("model.c", {3}, kC)}));
  json index = {{"metadata", {{"total_size", 40}}},
                {"weight_map",
                 {{"model.a", "model-00001-of-00002.safetensors"},
                  {"model.b", "model-00001-of-00002.safetensors"},
                  {"model.c", "model-00002-of-00002.safetensors"}}}};
  test::write_file(dir / "model.safetensors.index.json", index.dump(2));
  return dir;
}

void write_index(const std::filesystem::path& dir, const json& weight_map) {
  test::write_file(dir / "model.safetensors.index.json", json{{"weight_map", weight_map}}.dump());
}

TEST(Checkpoint, SingleFileDirectoryAndDirectFile) {
  auto dir = test::temp_dir("single");
  test::write_file(dir / "model.safetensors", st_file({st_f32("w", {2, 3}, kA), st_f32("v", {2}, kB)}));
  for (const auto& path : {dir, dir / "model.safetensors"}) {
    Checkpoint c = Checkpoint::open(path);
    EXPECT_EQ(c.path(), path);
    EXPECT_EQ(c.names(), (std::vector<std::string>{"v", "w"}));
    EXPECT_EQ(c.size_bytes(), 32u);
    EXPECT_EQ(c.info("w").file, dir / "model.safetensors");
    EXPECT_EQ(c.get("w", {2, 3}).to_floats(), kA);
  }
}

TEST(Checkpoint, ShardedIndex) {
  auto dir = write_sharded();
  Tensor a;
  {
    Checkpoint c = Checkpoint::open(dir);
    EXPECT_EQ(c.names(), (std::vector<std::string>{"model.a", "model.b", "model.c"}));
    EXPECT_EQ(c.size_bytes(), 24u + 4u + 12u);
    EXPECT_EQ(c.info("model.c").file, dir / "model-00002-of-00002.safetensors");
    EXPECT_EQ(c.info("model.b").dtype, DType::bf16);
    a = c.get("model.a");
    EXPECT_EQ(c.get("model.b", {2}).to_floats(), kB);
    EXPECT_EQ(c.get("model.c", {3}).to_floats(), kC);
    EXPECT_TRUE(c.has("model.c"));
    EXPECT_FALSE(c.has("model.d"));
  }
  EXPECT_EQ(a.to_floats(), kA);  // the mapping outlives the Checkpoint
  EXPECT_EQ(Checkpoint::open(dir / "model.safetensors.index.json").names().size(), 3u);
}

TEST(Checkpoint, NoCheckpointInDirectory) {
  auto dir = test::temp_dir("empty");
  test::write_file(dir / "weights.safetensors", st_file({st_f32("w", {1}, {1})}));
  expect_error([&] { Checkpoint::open(dir); },
               {dir.string(), "no model.safetensors or model.safetensors.index.json", "found weights.safetensors"});
  expect_error([&] { Checkpoint::open(dir / "nope"); }, {"nope", "no such file"});
}

TEST(Checkpoint, IndexPointsToMissingShard) {
  auto dir = write_sharded();
  std::filesystem::remove(dir / "model-00002-of-00002.safetensors");
  expect_error([&] { Checkpoint::open(dir); },
               {"model.safetensors.index.json", "model.c", "model-00002-of-00002.safetensors", "does not exist"});
}

TEST(Checkpoint, IndexPointsToTensorNotInShard) {
  auto dir = write_sharded();
  write_index(dir, {{"model.a", "model-00001-of-00002.safetensors"},
                    {"model.b", "model-00001-of-00002.safetensors"},
                    {"model.c", "model-00002-of-00002.safetensors"},
                    {"model.d", "model-00002-of-00002.safetensors"}});
  expect_error([&] { Checkpoint::open(dir); },
               {"model.safetensors.index.json", "model.d", "model-00002-of-00002.safetensors", "no such tensor"});
}

TEST(Checkpoint, IndexPointsToWrongShard) {
  auto dir = write_sharded();
  write_index(dir, {{"model.a", "model-00002-of-00002.safetensors"},
                    {"model.b", "model-00001-of-00002.safetensors"},
                    {"model.c", "model-00002-of-00002.safetensors"}});
  expect_error([&] { Checkpoint::open(dir); },
               {"model.safetensors.index.json", "weight_map puts model.a in", "but it is in",
                "model-00001-of-00002.safetensors"});
}

TEST(Checkpoint, TensorInTwoShards) {
  auto dir = write_sharded();
  test::write_file(dir / "model-00002-of-00002.safetensors",
                   st_file({st_f32("model.c", {3}, kC), st_f32("model.a", {2, 3}, kA)}));
  expect_error([&] { Checkpoint::open(dir); }, {"tensor model.a is in both", "model-00001-of-00002.safetensors",
                                                "model-00002-of-00002.safetensors"});
}

TEST(Checkpoint, ShardTensorMissingFromIndex) {
  auto dir = write_sharded();
  test::write_file(dir / "model-00002-of-00002.safetensors",
                   st_file({st_f32("model.c", {3}, kC), st_f32("model.extra", {1}, {0})}));
  expect_error([&] { Checkpoint::open(dir); },
               {"model-00002-of-00002.safetensors", "tensor model.extra is not listed", "index.json"});
}

TEST(Checkpoint, MalformedIndex) {
  auto dir = write_sharded();
  test::write_file(dir / "model.safetensors.index.json", R"({"weight_map": {"model.a": 3}})");
  expect_error([&] { Checkpoint::open(dir); }, {"model.safetensors.index.json", "model.a", "is an integer"});
  test::write_file(dir / "model.safetensors.index.json", R"({"metadata": {}})");
  expect_error([&] { Checkpoint::open(dir); }, {"model.safetensors.index.json", "missing required field 'weight_map'"});
}

TEST(Checkpoint, MissingTensorOnGet) {
  auto dir = write_sharded();
  Checkpoint c = Checkpoint::open(dir);
  expect_error([&] { c.get("model.layers.0.mlp.up_proj.weight"); },
               {dir.string() + ": missing tensor model.layers.0.mlp.up_proj.weight"});
  expect_error([&] { c.info("model.z"); }, {dir.string(), "missing tensor model.z"});
  // A wrong prefix is pointed out.
  expect_error([&] { c.get("c"); }, {"missing tensor c (the checkpoint has model.c)"});
}

TEST(Checkpoint, WrongShapeOnGet) {
  auto dir = write_sharded();
  Checkpoint c = Checkpoint::open(dir);
  expect_error([&] { c.get("model.a", {3, 2}, "hidden_size, intermediate_size in config.json"); },
               {"model-00001-of-00002.safetensors: model.a has shape [2, 3], expected [3, 2] "
                "(hidden_size, intermediate_size in config.json)"});
  expect_error([&] { c.get("model.c", {4}); }, {"model.c has shape [3], expected [4]"});
  EXPECT_EQ(c.unused().size(), 3u);  // a failed get does not count as a use
}

TEST(Checkpoint, UnusedListsTensorsNeverFetched) {
  Checkpoint c = Checkpoint::open(write_sharded());
  EXPECT_EQ(c.unused(), (std::vector<std::string>{"model.a", "model.b", "model.c"}));
  c.get("model.b");
  Checkpoint copy = c;  // copies share the record of what was used
  copy.get("model.c");
  EXPECT_EQ(c.unused(), (std::vector<std::string>{"model.a"}));
  c.info("model.a");  // looking is not using
  EXPECT_EQ(c.unused(), (std::vector<std::string>{"model.a"}));
}

TEST(Checkpoint, ConcurrentGets) {
  Checkpoint c = Checkpoint::open(write_sharded());
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&] {
      for (int k = 0; k < 100; ++k)
        for (const auto& name : c.names()) c.get(name);
    });
  for (auto& t : threads) t.join();
  EXPECT_TRUE(c.unused().empty());
}

}  // namespace
}  // namespace mere

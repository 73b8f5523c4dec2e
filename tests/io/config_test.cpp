#include "io/config.h"

#include <gtest/gtest.h>

#include "io/safetensors_writer.h"
#include "test_util.h"

namespace mere {
namespace {

using test::expect_error;

// Writes `text` as <temp>/config.json and loads it.
ConfigJson load_text(const std::string& text) {
  auto path = test::temp_dir("cfg") / "config.json";
  test::write_file(path, text);
  return ConfigJson::load(path);
}

const char* kConfig = R"({
  "num_hidden_layers": 28,
  "hidden_size": 4096.0,
  "vocab_size": 151936,
  "max_position_embeddings": 40960,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000,
  "tie_word_embeddings": false,
  "hidden_act": "silu",
  "layer_types": [0, 1, 1],
  "sliding_window": null,
  "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
  "big": 10000000000
})";

TEST(Config, TypedAccess) {
  ConfigJson c = load_text(kConfig);
  EXPECT_EQ(c.require<int>("num_hidden_layers"), 28);
  EXPECT_EQ(c.require<int>("hidden_size"), 4096);  // 4096.0 is an integer
  EXPECT_EQ(c.require<int64_t>("big"), 10000000000);
  EXPECT_DOUBLE_EQ(c.require<double>("rms_norm_eps"), 1e-6);
  EXPECT_FLOAT_EQ(c.require<float>("rope_theta"), 1e6f);  // an integer is a number
  EXPECT_FALSE(c.require<bool>("tie_word_embeddings"));
  EXPECT_EQ(c.require<std::string>("hidden_act"), "silu");
  EXPECT_EQ(c.require<std::vector<int>>("layer_types"), (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(c.get<int>("head_dim", 128), 128);
  EXPECT_EQ(c.get<int>("sliding_window", 7), 7);  // null counts as absent
  EXPECT_EQ(c.get<std::string>("hidden_act", "gelu"), "silu");
  EXPECT_TRUE(c.has("vocab_size"));
  EXPECT_FALSE(c.has("sliding_window"));
  EXPECT_EQ(c.raw().at("vocab_size"), 151936);
  EXPECT_EQ(c.path().filename(), "config.json");
}

TEST(Config, MissingRequiredField) {
  ConfigJson c = load_text(kConfig);
  expect_error([&] { c.require<int>("num_attention_heads"); },
               {"config.json: missing required field 'num_attention_heads'"});
  expect_error([&] { c.require<int>("sliding_window"); }, {"config.json: required field 'sliding_window' is null"});
}

TEST(Config, WrongType) {
  ConfigJson c = load_text(R"({"hidden_size": "4096", "eps": 1.5, "flag": 1, "big": 10000000000, "ids": [1, "x"]})");
  expect_error([&] { c.require<int>("hidden_size"); },
               {"config.json: field 'hidden_size' is a string, expected an integer", "\"4096\""});
  expect_error([&] { c.require<int>("eps"); }, {"config.json: field 'eps' is 1.5, expected an integer"});
  expect_error([&] { c.get<bool>("flag", false); }, {"config.json: field 'flag' is an integer, expected a boolean"});
  expect_error([&] { c.require<int>("big"); }, {"config.json: field 'big'", "too large for a 32-bit integer"});
  expect_error([&] { c.require<double>("hidden_size"); }, {"field 'hidden_size' is a string, expected a number"});
  expect_error([&] { c.require<std::vector<int>>("ids"); }, {"field 'ids[1]' is a string, expected an integer"});
  expect_error([&] { c.require<std::string>("eps"); }, {"field 'eps' is a number, expected a string"});
}

TEST(Config, MalformedJson) {
  expect_error([&] { load_text("{\n  \"a\": 1,\n  \"b\": ]\n}"); },
               {"config.json: malformed JSON", "line 3, column"});
  expect_error([&] { load_text("[1, 2]"); }, {"config.json: top level is a list, expected a JSON object"});
  // Past a double: nlohmann's out_of_range, which escaped without the file's name.
  expect_error([&] { load_text(R"({"rope_theta": 1e400})"); }, {"config.json: malformed JSON", "1e400"});
  expect_error([&] { ConfigJson::load(test::temp_dir("cfg") / "config.json"); }, {"config.json: file not found"});
}

TEST(Config, RopeScalingChild) {
  ConfigJson c = load_text(kConfig);
  ConfigJson rope = c.child("rope_scaling");
  EXPECT_EQ(rope.require<std::string>("rope_type"), "yarn");
  EXPECT_FLOAT_EQ(rope.require<float>("factor"), 4.0f);
  EXPECT_EQ(rope.require<int>("original_max_position_embeddings"), 32768);
  // Errors inside the child name the full field path.
  expect_error([&] { rope.require<double>("beta_fast"); },
               {"config.json: missing required field 'rope_scaling.beta_fast'"});
  expect_error([&] { rope.require<int>("rope_type"); }, {"field 'rope_scaling.rope_type' is a string"});
  expect_error([&] { c.child("hidden_act"); }, {"config.json: field 'hidden_act' is a string, expected an object"});
  expect_error([&] { c.child("quantization"); }, {"config.json: missing required field 'quantization'"});
}

TEST(Config, RefuseUnless) {
  ConfigJson c = load_text(kConfig);
  c.refuse_unless("hidden_act", "silu");
  c.refuse_unless("absent_field", "anything");
  expect_error([&] { c.refuse_unless("hidden_act", "gelu"); },
               {"config.json: field 'hidden_act' is \"silu\", but mere supports only \"gelu\""});
  expect_error([&] { c.child("rope_scaling").refuse_unless("rope_type", "linear"); },
               {"field 'rope_scaling.rope_type' is \"yarn\""});
}

TEST(Config, GenerationEosIntOrList) {
  auto dir = test::temp_dir("gen");
  test::write_file(dir / "generation_config.json",
                   R"({"bos_token_id": 1, "eos_token_id": [151645, 151643], "temperature": 0.6,
                       "top_k": 20, "top_p": 0.95, "do_sample": true, "pad_token_id": 0})");
  GenerationConfig g = GenerationConfig::load(dir);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int32_t>{151645, 151643}));
  EXPECT_EQ(g.bos_token_id, 1);
  EXPECT_FLOAT_EQ(*g.temperature, 0.6f);
  EXPECT_EQ(g.top_k, 20);
  EXPECT_FLOAT_EQ(*g.top_p, 0.95f);
  EXPECT_EQ(g.do_sample, true);
  EXPECT_FALSE(g.min_p.has_value());
  EXPECT_FALSE(g.repetition_penalty.has_value());

  test::write_file(dir / "generation_config.json", R"({"eos_token_id": 2, "bos_token_id": null})");
  g = GenerationConfig::load(dir);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int32_t>{2}));
  EXPECT_FALSE(g.bos_token_id.has_value());

  test::write_file(dir / "generation_config.json", R"({"eos_token_id": "</s>"})");
  expect_error([&] { GenerationConfig::load(dir); },
               {"generation_config.json: field 'eos_token_id' is a string, expected an integer or a list"});
}

TEST(Config, GenerationAbsentOrMalformed) {
  auto dir = test::temp_dir("gen");
  GenerationConfig g = GenerationConfig::load(dir);
  EXPECT_TRUE(g.eos_token_ids.empty());
  EXPECT_FALSE(g.temperature.has_value());
  test::write_file(dir / "generation_config.json", "{\"temperature\": 0.7,");
  expect_error([&] { GenerationConfig::load(dir); }, {"generation_config.json: malformed JSON"});
  test::write_file(dir / "generation_config.json", R"({"top_k": "50"})");
  expect_error([&] { GenerationConfig::load(dir); }, {"field 'top_k' is a string, expected an integer"});
}

}  // namespace
}  // namespace mere

// `mere tokenize` end to end: --json, --decode, --jsonl, errors.
#include <gtest/gtest.h>

#include <sstream>

#include "tokenizer_cache.h"

namespace mere {
namespace {

using nlohmann::json;

std::string qwen3_flag() { return "--tokenizer " + test::tokenizer_dir("qwen3").string(); }

TEST(TokenizerCli, EncodeJsonAndPlain) {
  const Tokenizer& tok = test::cached_tokenizer("qwen3");  // fails with a hint when not fetched
  auto r = test::run_mere("tokenize " + qwen3_flag() + " --text 'Hello world, 世界!' --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out).get<std::vector<int32_t>>(), tok.encode("Hello world, 世界!"));

  r = test::run_mere("tokenize " + qwen3_flag() + " --text 'Hello world'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "9707 1879\n");
}

TEST(TokenizerCli, SpecialAddsBos) {
  auto r = test::run_mere("tokenize --tokenizer " + test::tokenizer_dir("llama2").string() +
                          " --text 'hi' --special --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<int32_t> ids = json::parse(r.out).get<std::vector<int32_t>>();
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);  // <s>
}

TEST(TokenizerCli, Decode) {
  const Tokenizer& tok = test::cached_tokenizer("qwen3");
  std::vector<int32_t> ids = tok.encode("Hi 😀 there");
  std::string list;
  for (int32_t id : ids) list += std::to_string(id) + ",";
  auto r = test::run_mere("tokenize " + qwen3_flag() + " --decode --text '" + list + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Hi 😀 there\n");

  r = test::run_mere("tokenize " + qwen3_flag() + " --decode --json --text '9707 1879'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "\"Hello world\"\n");
}

TEST(TokenizerCli, Jsonl) {
  const Tokenizer& tok = test::cached_tokenizer("qwen3");
  auto dir = test::temp_dir("jsonl");
  std::vector<std::string> texts = {"first line", "", "second\nwith newline <|im_end|>", "数据"};
  std::string input;
  for (const auto& t : texts) input += json(t).dump() + "\n";
  test::write_file(dir / "in.jsonl", input);

  auto r = test::run_mere("tokenize " + qwen3_flag() + " --jsonl --file " + (dir / "in.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line, back;
  for (const auto& t : texts) {
    ASSERT_TRUE(std::getline(lines, line));
    EXPECT_EQ(json::parse(line).get<std::vector<int32_t>>(), tok.encode(t));
    back += line + "\n";
  }
  EXPECT_FALSE(std::getline(lines, line));

  // From stdin, and back with --decode.
  test::write_file(dir / "ids.jsonl", back);
  r = test::run_mere("tokenize " + qwen3_flag() + " --jsonl --decode < " + (dir / "ids.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, input);
}

TEST(TokenizerCli, Errors) {
  auto r = test::run_mere("tokenize " + qwen3_flag());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(test::contains(r.err, "--text or --file"));

  r = test::run_mere("tokenize " + qwen3_flag() + " --text a --file b");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(test::contains(r.err, "excludes"));

  r = test::run_mere("tokenize --tokenizer /nonexistent --text a");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(test::contains(r.err, "/nonexistent"));

  r = test::run_mere("tokenize " + qwen3_flag() + " --decode --text 'x y'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(test::contains(r.err, "not a token id"));

  r = test::run_mere("tokenize --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--tokenizer", "--text", "--file", "--json", "--special", "--decode", "--jsonl"})
    EXPECT_TRUE(test::contains(r.out, flag));
}

}  // namespace
}  // namespace mere

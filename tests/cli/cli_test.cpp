// The mere binary end to end: help, bad flags, generate, eval logits and ppl.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/npy.h"
#include "test_util.h"

namespace mere {
namespace {

std::string fixture(const std::string& family) { return (test::fixtures_dir() / family).string(); }

TEST(Cli, HelpExplainsEverySubcommand) {
  auto r = test::run_mere("--help-all");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* s : {"text", "generate", "eval", "logits", "ppl", "tokenize"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  r = test::run_mere("text generate --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* s : {"--temperature", "--top-p", "--top-k", "--min-p", "--seed", "--repetition-penalty", "-n,"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
}

TEST(Cli, BadFlagsGetAClearMessage) {
  auto r = test::run_mere("text generate -m " + fixture("qwen3") + " -p hi --temperature banana");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--temperature"), std::string::npos) << r.err;
  r = test::run_mere("text generate -p hi --no-such-flag");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no-such-flag"), std::string::npos) << r.err;
  // NaN passes CLI11's range checks; it ran without end in top-p's walk.
  for (const char* flag : {"--temperature nan", "--top-p nan", "--repetition-penalty nan"}) {
    r = test::run_mere("text generate -m " + fixture("qwen3") + " -p hi -n 4 --top-k 5 " + flag);
    EXPECT_EQ(r.exit_code, 1) << flag;
    EXPECT_NE(r.err.find("is nan; it must be a finite number"), std::string::npos) << r.err;
  }
}

TEST(Cli, MissingModelIsAnErrorNotACrash) {
  auto r = test::run_mere("text generate -m /nonexistent/model -p hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/nonexistent/model"), std::string::npos) << r.err;
}

TEST(Cli, CorruptCheckpointExitsWithTheFileName) {
  auto dir = test::temp_dir("corrupt");
  for (const auto& e : std::filesystem::directory_iterator(test::fixtures_dir() / "qwen3"))
    std::filesystem::copy(e.path(), dir / e.path().filename());
  std::string bytes = test::read_file(dir / "model.safetensors");
  test::write_file(dir / "model.safetensors", bytes.substr(0, bytes.size() / 2));  // cut the data section
  auto r = test::run_mere("eval logits -m " + dir.string() + " --ids 1,2 --out " + (dir / "x.npy").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
  test::write_file(dir / "config.json", "{\"model_type\": \"qwen3\",");  // malformed JSON
  r = test::run_mere("text generate -m " + dir.string() + " -p hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("config.json"), std::string::npos) << r.err;
}

TEST(Cli, GenerateStreamsTextAndReportsSpeed) {
  auto r = test::run_mere("text generate -m " + fixture("qwen3") + " -p 'def forward' -n 12 --temperature 0 --no-echo");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  for (const char* s : {"prefill:", "decode:", "tok/s", "time to first token"})
    EXPECT_NE(r.err.find(s), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("decode: 12 tokens, "), std::string::npos) << r.err;
  // The rate counts from the third token: two give none, and say so rather than "0.0 tok/s".
  r = test::run_mere("text generate -m " + fixture("qwen3") + " -p 'def forward' -n 2 --temperature 0 --no-echo");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("decode: 2 tokens (too few for a rate)"), std::string::npos) << r.err;
  // A pool of 100,000 threads took minutes to start.
  r = test::run_mere("text generate -m " + fixture("qwen3") + " -p hi -n 2 --threads 100000");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--threads: Value 100000 not in range 0 to 1024"), std::string::npos) << r.err;
  // Same seed, same sampled text.
  std::string cmd = "text generate -m " + fixture("qwen3") + " -p 'the' -n 16 --temperature 1 --seed 5 --no-echo";
  EXPECT_EQ(test::run_mere(cmd).out, test::run_mere(cmd).out);
}

TEST(Cli, EvalLogitsWritesNpyMatchingTheReference) {
  auto ref = nlohmann::json::parse(test::read_file(test::fixtures_dir() / "llama" / "reference.json"));
  std::string ids;
  for (int id : ref["ids"]) ids += std::to_string(id) + ",";
  ids.pop_back();
  auto out = test::temp_dir("npy") / "logits.npy";
  auto r = test::run_mere("eval logits -m " + fixture("llama") + " --ids " + ids + " --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Tensor got = read_npy(out), want = read_npy(test::fixtures_dir() / "llama" / "logits.npy");
  EXPECT_LE(test::max_abs_diff(got, want).diff, 1e-3f);
  // A lossy KV cache mode: close, not equal (the CPU quality test bounds it).
  r = test::run_mere("eval logits -m " + fixture("llama") + " --kv-cache-mode affine8 --ids " + ids + " --out " +
                     out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("kv_cache_mode=affine8"), std::string::npos) << r.err;
  const float lossy = test::max_abs_diff(read_npy(out), want).diff;
  EXPECT_GT(lossy, 0.0f);
  EXPECT_LE(lossy, 0.2f);
  r = test::run_mere("eval logits -m " + fixture("llama") + " --ids 1,x,3 --out " + out.string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("'x' is not a token id"), std::string::npos) << r.err;
  r = test::run_mere("eval logits -m " + fixture("llama") + " --ids 1,99999 --out " + out.string());
  EXPECT_NE(r.err.find("outside the vocabulary"), std::string::npos) << r.err;
}

TEST(Cli, EvalPplPrintsPerplexity) {
  auto text = test::temp_dir("ppl") / "text.txt";
  test::write_file(text, "def forward(self, hidden_states):\n    return self.mlp(hidden_states)\n");
  auto r = test::run_mere("eval ppl -m " + fixture("qwen2") + " -f " + text.string() + " --ctx 16 --stride 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["ppl"].get<double>(), 1.0);
  EXPECT_EQ(j["ctx"], 16);
  EXPECT_NE(r.err.find("perplexity ["), std::string::npos);  // the progress bar

  // Bad input is an error before any progress shows.
  auto empty = text.parent_path() / "empty.txt";
  test::write_file(empty, "");
  r = test::run_mere("eval ppl -m " + fixture("qwen2") + " -f " + empty.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("the text has 0 token(s)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("perplexity ["), std::string::npos) << r.err;
  r = test::run_mere("eval ppl -m " + fixture("qwen2") + " -f " + text.string() + " --ctx 16 --stride 17");
  EXPECT_NE(r.err.find("--stride must be in [1, ctx=16]"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("perplexity ["), std::string::npos) << r.err;
}

// llama-bench style lists: one row per KV cache mode, each labelled; a bad entry
// is an error naming the flag.
TEST(Cli, BenchMakesOneRowPerKvCacheMode) {
  auto r = test::run_mere("bench --device cpu -p 8 -n 0 -r 1 --kv-cache-mode default,affine8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 2u) << r.out;
  EXPECT_EQ(j["weights"], "bf16");
  EXPECT_NE(j["rows"][0]["levers"].get<std::string>().find("kv_cache_mode=default"), std::string::npos);
  EXPECT_NE(j["rows"][1]["levers"].get<std::string>().find("kv_cache_mode=affine8"), std::string::npos);
  r = test::run_mere("bench --device cpu -p 8 -n 0 -r 1 --kv-cache-mode bf16,fp4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--kv-cache-mode fp4: expected default, bf16, affine8 or affine4"), std::string::npos) << r.err;
}

// --batch adds same-offset batched decode rows, one per size; every row reports
// the memory it held and its K/V; a bad entry is an error naming the flag.
TEST(Cli, BenchBatchRowsAndResidentMemory) {
  auto r = test::run_mere("bench --device cpu -p 0 -n 3 -r 1 --batch 1,3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 3u) << r.out;  // tg3, tg3 x1, tg3 x3
  EXPECT_EQ(j["rows"][1]["test"], "tg3 x1");
  EXPECT_EQ(j["rows"][2]["test"], "tg3 x3");
  // The row names the loop that ran: on the CPU the batched loop is eager.
  EXPECT_NE(j["rows"][2]["levers"].get<std::string>().find("same-offset batch cuda_graphs=off pipelined_decode=off"),
            std::string::npos)
      << j["rows"][2]["levers"];
  for (const auto& row : j["rows"]) {
    EXPECT_GT(row["tok_s"][0].get<double>(), 0.0);
    EXPECT_GT(row["resident_bytes"].get<double>(), row["kv_bytes"].get<double>());
  }
  // Three sequences hold three times one sequence's K/V.
  EXPECT_EQ(j["rows"][2]["kv_bytes"].get<uint64_t>(), 3 * j["rows"][1]["kv_bytes"].get<uint64_t>());
  r = test::run_mere("bench --device cpu -p 0 -n 3 -r 1 --batch 2,x");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--batch"), std::string::npos) << r.err;
}

// -c gives decode rows' sequences a cache of that many tokens, named in the row;
// a negative count is an error naming the flag.
TEST(Cli, BenchContextSizesTheDecodeRowsCache) {
  auto r = test::run_mere("bench --device cpu -p 0 -n 3 -r 1 -c 200 --batch 1,2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 3u) << r.out;
  EXPECT_EQ(j["rows"][0]["test"], "tg3 c200");
  EXPECT_EQ(j["rows"][2]["test"], "tg3 c200 x2");
  r = test::run_mere("bench --device cpu -p 0 -n 3 -r 1 -c -5");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--context"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace mere

// The audit's comparisons on hand-made tokens and logits, and its input parsing.
#include <gtest/gtest.h>

#include <cmath>

#include "audit/inputs.h"
#include "audit/metrics.h"
#include "core/error.h"
#include "test_util.h"

namespace mere {
namespace {

namespace fs = std::filesystem;

TEST(AuditMetrics, TokenParity) {
  TokenParity p = compare_tokens({1, 2, 3, 4, 5}, {1, 2, 9, 4, 5});
  EXPECT_EQ(p.matched, 2);
  EXPECT_EQ(p.total, 5);
  EXPECT_EQ(p.first_divergence, 2);
  EXPECT_EQ(p.positionwise, 4);
  p = compare_tokens({1, 2, 3}, {1, 2, 3});
  EXPECT_EQ(p.matched, 3);
  EXPECT_EQ(p.first_divergence, -1);
  p = compare_tokens({1, 2, 3}, {1, 2});  // stopped early: diverges where it stops
  EXPECT_EQ(p.first_divergence, 2);
  EXPECT_EQ(p.matched, 2);
  // Over prompts: matched over total, not the mean of the rates.
  EXPECT_DOUBLE_EQ(match_rate({compare_tokens({1, 2, 3, 4}, {1, 2, 3, 4}), compare_tokens({1, 2}, {7, 2})}),
                   4.0 / 6.0);
}

TEST(AuditMetrics, KlAndNllByHand) {
  // p = softmax(0, log 3) = (1/4, 3/4), q = (1/2, 1/2).
  const float p[2] = {0.0f, float(std::log(3.0))}, q[2] = {5.0f, 5.0f};
  const PositionCompare c = compare_logits(p, q, 2, /*target=*/1);
  EXPECT_NEAR(c.kl, 0.25 * std::log(0.25 / 0.5) + 0.75 * std::log(0.75 / 0.5), 1e-7);
  EXPECT_NEAR(c.nll_baseline, -std::log(0.75), 1e-7);
  EXPECT_NEAR(c.nll_lever, std::log(2.0), 1e-7);
  EXPECT_EQ(compare_logits(p, p, 2, 0).kl, 0.0);
}

TEST(AuditMetrics, KlStatsAndSpread) {
  std::vector<double> v(100, 0.0);
  for (int i = 0; i < 100; ++i) v[size_t(i)] = i * 1e-3;  // 0 .. 0.099
  const KlStats s = kl_stats(v);
  EXPECT_EQ(s.count, 100);
  EXPECT_NEAR(s.mean, 0.0495, 1e-12);
  EXPECT_DOUBLE_EQ(s.p99, 0.098);  // nearest rank: the 99th of 100
  EXPECT_DOUBLE_EQ(s.max, 0.099);
  int64_t total = 0;
  for (int64_t c : s.counts) total += c;
  EXPECT_EQ(total, 100);
  EXPECT_EQ(s.counts[0], 1);  // exactly 0 falls in [0, 1e-8)
  const Spread sp = spread_of({3, 1, 2, 10});
  EXPECT_DOUBLE_EQ(sp.median, 2.5);
  EXPECT_DOUBLE_EQ(sp.min, 1);
  EXPECT_DOUBLE_EQ(sp.max, 10);
}

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(AuditInputs, Levers) {
  LeverSpec s = parse_lever("kv=affine8");
  EXPECT_EQ(s.kind, LeverSpec::Kind::kv);
  EXPECT_EQ(s.kv_mode, KvCacheMode::affine8);
  s = parse_lever("weights=int4:g32");
  EXPECT_EQ(s.kind, LeverSpec::Kind::weights);
  EXPECT_EQ(s.weights, "int4");
  EXPECT_EQ(s.group_size, 32);
  s = parse_lever("fused_projections=off");
  EXPECT_EQ(s.kind, LeverSpec::Kind::engine);
  EXPECT_FALSE(s.engine_on);
  expect_error([] { parse_lever("kv"); }, "expected NAME=VALUE");
  expect_error([] { parse_lever("kv=affine6"); }, "KV cache mode 'affine6'");
  expect_error([] { parse_lever("weights=int3"); }, "weights 'int3'");
  expect_error([] { parse_lever("weights=int4:g48"); }, "'g48'");
  expect_error([] { parse_lever("turbo=on"); }, "unknown lever 'turbo'");
  expect_error([] { parse_lever("cuda_graphs=maybe"); }, "on or off");
}

TEST(AuditInputs, PromptsFile) {
  const fs::path dir = test::temp_dir("p");
  test::write_file(dir / "ok.jsonl",
                   "{\"prompt\": \"Hello\", \"name\": \"greeting\", \"kind\": \"prose\"}\n\n"
                   "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}]}\n");
  const auto prompts = load_prompts(dir / "ok.jsonl");
  ASSERT_EQ(prompts.size(), 2u);
  EXPECT_EQ(prompts[0].name, "greeting");
  EXPECT_EQ(*prompts[0].text, "Hello");
  EXPECT_EQ(prompts[1].name, "line 3");
  EXPECT_EQ(prompts[1].kind, "chat");
  EXPECT_TRUE(prompts[1].messages.has_value());

  auto bad = [&](const std::string& text, const std::string& part) {
    test::write_file(dir / "bad.jsonl", text);
    expect_error([&] { load_prompts(dir / "bad.jsonl"); }, part);
  };
  bad("{\"prompt\": \"a\"}\n{\"prompt\": \"b\"\n", "bad.jsonl:2: not valid JSON");
  bad("{\"text\": \"a\"}\n", "bad.jsonl:1: unknown field \"text\"");
  bad("{\"prompt\": \"a\", \"messages\": []}\n", "exactly one of");
  bad("{\"prompt\": 3}\n", "field \"prompt\" must be a non-empty string");
  bad("{\"messages\": [{\"role\": \"user\"}]}\n", "messages[0] must be an object");
  bad("[1, 2]\n", "expected a JSON object");
  bad("\n\n", "no prompts");
  expect_error([&] { load_prompts(dir / "missing.jsonl"); }, "missing.jsonl: no such file");
}

TEST(AuditInputs, TheShippedPromptSetHasProseCodeAndArithmetic) {
  const auto prompts = load_prompts(default_prompts_file());
  bool prose = false, code = false, arithmetic = false;
  for (const AuditPrompt& p : prompts) {
    prose |= p.kind == "prose";
    code |= p.kind == "code";
    arithmetic |= p.messages.has_value() && p.name.find("arithmetic") != std::string::npos;
  }
  EXPECT_TRUE(prose && code && arithmetic);
  EXPECT_GT(read_text_file(default_corpus_file(), "--corpus").size(), 4000u);
}

}  // namespace
}  // namespace mere

// mere audit end to end on the demo model, kept small (3 prompts, 8 tokens, one timed
// run, a 200-token corpus slice) so it takes seconds; and its errors for bad input.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "audit/verdict.h"
#include "test_util.h"

namespace mere {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

const json& lever(const json& report, const std::string& name) {
  for (const json& l : report["levers"])
    if (l["lever"] == name) return l;
  throw std::runtime_error("no lever " + name + " in the report");
}

// The audit runs once per process, from inside the first test that needs it, so run_mere's
// output files are named after that test (ctest runs each test in its own process, maybe
// at once: nothing here is shared between processes).
struct AuditRun {
  fs::path dir;
  test::CommandResult result;
};

const AuditRun& audit_run() {
  static const AuditRun run = [] {
    AuditRun r;
    r.dir = test::temp_dir("audit");
    test::write_file(r.dir / "prompts.jsonl",
                     "{\"name\": \"prose\", \"kind\": \"prose\", \"prompt\": \"And it came to pass in those days, "
                     "that\"}\n"
                     "{\"name\": \"code\", \"kind\": \"code\", \"prompt\": \"def mean(values):\\n    \"}\n"
                     "{\"name\": \"arithmetic\", \"kind\": \"reasoning\", \"messages\": [{\"role\": \"user\", "
                     "\"content\": \"I have 17 jars, sell 5, then buy 9. How many now? Step by step.\"}]}\n");
    r.result = test::run_mere(
        "audit --device cpu -t 2 --prompts " + (r.dir / "prompts.jsonl").string() +
        " --lever kv=bf16 --lever kv=affine4 --lever weights=int8 --lever weights=fp8 --lever fused_projections=on "
        "-n 8 --runs 1 "
        "--corpus-tokens 200 --window 100 --seed 3 --out " +
        (r.dir / "out").string());
    return r;
  }();
  return run;
}

TEST(AuditCmd, WritesTheThreeReportsWithCharts) {
  const fs::path& dir = audit_run().dir;
  const test::CommandResult& result = audit_run().result;
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("audit greedy runs"), std::string::npos) << result.err;  // progress
  const fs::path out = dir / "out";
  for (const char* f : {"report.json", "report.md", "report.html"}) EXPECT_TRUE(fs::exists(out / f)) << f;
  const json r = json::parse(test::read_file(out / "report.json"));
  EXPECT_EQ(r["speed_label"], "CPU");
  EXPECT_EQ(r["prompts"].size(), 3u);
  EXPECT_EQ(r["levers"].size(), 5u);

  const std::string md = test::read_file(out / "report.md");
  EXPECT_NE(md.find("**Speed figures are CPU figures**"), std::string::npos);
  EXPECT_NE(md.find("| `kv=bf16` | **"), std::string::npos) << md;

  const std::string html = test::read_file(out / "report.html");
  EXPECT_EQ(html.find("<script"), std::string::npos);  // self-contained, no scripts
  // Speed x3, memory, and per engaged lever a KL histogram and a parity chart.
  EXPECT_EQ(count_of(html, "<svg "), 3u + 1u + 2u * 4u);
  EXPECT_NE(html.find("Speed figures are CPU figures"), std::string::npos);
}

TEST(AuditCmd, FiguresAreMeasuredAndTheVerdictFollowsThePolicy) {
  const fs::path& dir = audit_run().dir;
  const test::CommandResult& result = audit_run().result;
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const json r = json::parse(test::read_file(dir / "out" / "report.json"));
  const json& base = r["baseline"];
  // kv=bf16 against the CPU's native f32 cache: high parity, but measured, not assumed.
  const json& bf16 = lever(r, "kv=bf16");
  EXPECT_GE(bf16["greedy"]["match_rate"].get<double>(), 0.5);
  EXPECT_GT(bf16["teacher_forced"]["kl_max"].get<double>(), 0.0);
  EXPECT_LT(bf16["teacher_forced"]["kl_mean"].get<double>(), 1e-3);
  EXPECT_EQ(bf16["teacher_forced"]["positions"].get<int64_t>(), 198);  // 2 windows of 100, 99 scored each
  // Its cache holds half the bytes; the weights are the baseline's.
  EXPECT_EQ(bf16["arm"]["memory"]["cache_at_capacity_bytes"].get<uint64_t>() * 2,
            base["memory"]["cache_at_capacity_bytes"].get<uint64_t>());
  EXPECT_EQ(bf16["arm"]["memory"]["weights_bytes"], base["memory"]["weights_bytes"]);
  // Workspace on the CPU: measured, and never below the baseline's for affine4 (paged attention
  // dequantizes one block at a time, so it need not be larger).
  const uint64_t base_ws = base["memory"]["workspace_bytes"].get<uint64_t>();
  EXPECT_GT(base_ws, 0u);
  EXPECT_GE(lever(r, "kv=affine4")["arm"]["memory"]["workspace_bytes"].get<uint64_t>(), base_ws);
  // int8 weights: a quantized copy, under --out/scratch.
  const json& int8 = lever(r, "weights=int8");
  EXPECT_EQ(int8["arm"]["weights"], "affine int8 g64");
  EXPECT_LT(int8["arm"]["memory"]["weights_bytes"].get<uint64_t>(),
            base["memory"]["weights_bytes"].get<uint64_t>() * 6 / 10);
  EXPECT_TRUE(fs::exists(dir / "out" / "scratch" / "weights-int8-g64" / "config.json"));
  // fp8 weights: converted with mere quantize --format fp8 (the embeddings stay dense, so more bytes than int8).
  const json& fp8 = lever(r, "weights=fp8");
  EXPECT_TRUE(fp8["arm"]["engaged"].get<bool>()) << fp8.dump();
  EXPECT_EQ(fp8["arm"]["weights"], "fp8 e4m3 128x128");
  EXPECT_LT(fp8["arm"]["memory"]["weights_bytes"].get<uint64_t>(), base["memory"]["weights_bytes"].get<uint64_t>());
  EXPECT_GT(fp8["arm"]["memory"]["weights_bytes"], int8["arm"]["memory"]["weights_bytes"]);
  EXPECT_TRUE(fs::exists(dir / "out" / "scratch" / "weights-fp8" / "config.json"));
  // affine4 moves the distribution more than bf16 does.
  EXPECT_GT(lever(r, "kv=affine4")["teacher_forced"]["kl_mean"].get<double>(),
            bf16["teacher_forced"]["kl_mean"].get<double>());
  // A CUDA lever on the CPU: said so, not faked.
  const json& fused = lever(r, "fused_projections=on");
  EXPECT_EQ(fused["verdict"]["verdict"], "not_applicable");
  EXPECT_FALSE(fused.contains("greedy"));

  // Every verdict is the policy applied to the report's own figures.
  for (const json& l : r["levers"]) {
    if (!l["arm"]["engaged"].get<bool>()) continue;
    const json& a = l["arm"];
    LeverFigures f;
    f.greedy_match_rate = l["greedy"]["match_rate"];
    f.kl_mean = l["teacher_forced"]["kl_mean"];
    f.kl_p99 = l["teacher_forced"]["kl_p99"];
    f.kl_max = l["teacher_forced"]["kl_max"];
    f.ppl_baseline = l["teacher_forced"]["ppl_baseline"];
    f.ppl_lever = l["teacher_forced"]["ppl_lever"];
    f.decode_baseline = base["speed"]["decode_tok_s"]["median"];
    f.decode_lever = a["speed"]["decode_tok_s"]["median"];
    f.decode_lever_min = a["speed"]["decode_tok_s"]["min"];
    f.decode_lever_max = a["speed"]["decode_tok_s"]["max"];
    f.prefill_baseline = base["speed"]["prefill_tok_s"]["median"];
    f.prefill_lever = a["speed"]["prefill_tok_s"]["median"];
    f.prefill_lever_min = a["speed"]["prefill_tok_s"]["min"];
    f.prefill_lever_max = a["speed"]["prefill_tok_s"]["max"];
    f.speed_runs = r["settings"]["runs"];
    f.resident_baseline = double(base["memory"]["weights_bytes"].get<uint64_t>() +
                                 base["memory"]["cache_at_capacity_bytes"].get<uint64_t>());
    f.resident_lever = double(a["memory"]["weights_bytes"].get<uint64_t>() +
                              a["memory"]["cache_at_capacity_bytes"].get<uint64_t>());
    const Verdict v = decide(f);
    EXPECT_EQ(l["verdict"]["verdict"], v.verdict) << l["lever"];
    EXPECT_EQ(l["verdict"]["reason"], v.reason) << l["lever"];
  }
  // Greedy runs are n tokens on every arm (EOS does not stop them), per prompt.
  for (const json& p : bf16["greedy"]["per_prompt"]) EXPECT_EQ(p["total"], 8);
}

// --decode-steps scores the corpus one decode step per token: on the CPU (f32)
// that gives the prefill's perplexity to rounding, and the report says which ran.
TEST(AuditCmd, DecodeStepsScoreLikeThePrefill) {
  const fs::path dir = test::temp_dir("audit_decode_steps");
  auto ppl = [&](bool decode_steps) {
    const fs::path out = dir / (decode_steps ? "steps" : "prefill");
    const test::CommandResult r = test::run_mere(
        "audit --device cpu -t 2 --lever kv=affine8 -n 4 --runs 1 --corpus-tokens 120 --window 60 --out " +
        out.string() + (decode_steps ? " --decode-steps" : ""));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(test::read_file(out / "report.json"));
    EXPECT_EQ(j["settings"]["teacher_forced_by"], decode_steps ? "decode steps" : "one prefill per window");
    return lever(j, "kv=affine8")["teacher_forced"];
  };
  const json steps = ppl(true), prefill = ppl(false);
  EXPECT_NEAR(double(steps["ppl_baseline"]), double(prefill["ppl_baseline"]), 1e-4 * double(prefill["ppl_baseline"]));
  EXPECT_NEAR(double(steps["ppl_lever"]), double(prefill["ppl_lever"]), 2e-3 * double(prefill["ppl_lever"]));
}

TEST(AuditCmdErrors, BadInputIsAClearError) {
  const fs::path dir = test::temp_dir("e");
  test::write_file(dir / "bad.jsonl", "{\"prompt\": \"a\"}\n{\"prompt\": }\n");
  auto r = test::run_mere("audit --lever kv=affine8 --prompts " + (dir / "bad.jsonl").string() + " --out " +
                          (dir / "o").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("bad.jsonl:2: not valid JSON"), std::string::npos) << r.err;

  r = test::run_mere("audit --lever kv=fast --out " + (dir / "o").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--lever kv=fast"), std::string::npos) << r.err;

  r = test::run_mere("audit --lever kv=bf16 --corpus " + (dir / "nope.txt").string() + " --out " +
                     (dir / "o").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--corpus " + (dir / "nope.txt").string() + ": no such file"), std::string::npos) << r.err;

  r = test::run_mere("audit --lever kv=bf16 -n 2 --out " + (dir / "o").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("-n 2"), std::string::npos) << r.err;

  // 0 or below repeated the greedy comparison as the "sampled" one; NaN would hang a sampler.
  for (const char* t : {"0", "-1", "nan"}) {
    r = test::run_mere(std::string("audit --lever kv=bf16 --temperature ") + t + " --out " + (dir / "o").string());
    EXPECT_EQ(r.exit_code, 1) << t;
    EXPECT_NE(r.err.find("the sampled comparison needs a finite temperature above 0"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace mere

// The GPU checkpoint gates: `mere audit` on real checkpoints on the GPU. They take
// minutes, so they run only with MERERUN_TEST_GUARDED_ACCELERATION_CHECKPOINTS=1 (and
// a GPU: without one this binary reports every test skipped). The checkpoints are
// MERERUN_TEST_CHECKPOINTS (directories separated by ':'), else the demo model.
#include <gtest/gtest.h>

#include <cstdlib>

#include "audit/audit.h"
#include "audit/report.h"
#include "test_util.h"

namespace mere {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> checkpoints() {
  const char* list = std::getenv("MERERUN_TEST_CHECKPOINTS");
  if (!list || !*list) return {test::source_dir() / "models" / "demo"};
  std::vector<fs::path> dirs;
  std::string s = list;
  for (size_t start = 0; start <= s.size();) {
    const size_t colon = std::min(s.find(':', start), s.size());
    if (colon > start) dirs.emplace_back(s.substr(start, colon - start));
    start = colon + 1;
  }
  return dirs;
}

// Levers whose switch cannot change a token: the decode loop's shape (graphs, pipelining),
// launch attributes, and kv=bf16, which is the CUDA cache's native storage. Their
// teacher-forced logits must be bit-identical and their greedy tokens equal; the
// report's speed and memory figures are the gate's record for docs/levers.md.
TEST(GuardedAccelerationCheckpoints, ExactLeversKeepParityOnRealCheckpoints) {
  const char* on = std::getenv("MERERUN_TEST_GUARDED_ACCELERATION_CHECKPOINTS");
  if (!on || std::string(on) != "1")
    GTEST_SKIP() << "checkpoint gates skipped: set MERERUN_TEST_GUARDED_ACCELERATION_CHECKPOINTS=1 to run them "
                    "(minutes per checkpoint; checkpoints from MERERUN_TEST_CHECKPOINTS, else the demo model)";
  for (const fs::path& dir : checkpoints()) {
    ASSERT_TRUE(fs::exists(dir / "config.json")) << dir << ": no config.json (MERERUN_TEST_CHECKPOINTS)";
    AuditOptions o;
    o.model_dir = dir;
    o.model_label = dir.filename().string();
    o.levers = {"cuda_graphs=off", "pipelined_decode=off", "kernel_token_slots=off", "programmatic_launch=off",
                "kv=bf16"};
    o.prompts_file = default_prompts_file();
    o.corpus_file = default_corpus_file();
    o.out_dir = fs::temp_directory_path() / ("mere_gate_" + dir.filename().string());
    o.max_new_tokens = 64;
    o.runs = 3;
    o.device = Device::cuda;
    const AuditReport r = run_audit(o);
    write_reports(r, o.out_dir);
    std::printf("%s: reports in %s\n", dir.c_str(), o.out_dir.c_str());
    for (size_t i = 0; i < r.comparisons.size(); ++i) {
      const LeverComparison& c = r.comparisons[i];
      std::printf("  %-26s %-9s %s\n", c.lever.c_str(), c.verdict.verdict.c_str(), c.verdict.reason.c_str());
      ASSERT_FALSE(r.arms[i].not_engaged) << c.lever << ": " << *r.arms[i].not_engaged;
      EXPECT_EQ(c.greedy_match_rate, 1.0) << dir << " " << c.lever;
      EXPECT_EQ(c.kl.max, 0.0) << dir << " " << c.lever;
      EXPECT_EQ(r.arms[i].ppl, r.baseline.ppl) << dir << " " << c.lever;
    }
  }
}

}  // namespace
}  // namespace mere

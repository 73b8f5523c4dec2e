// `mere bench` on CUDA: the fraction columns say whose ceilings they use.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

namespace mere {
namespace {

// The defaults are an H200's; a run that neither calibrates nor gives the
// ceilings says so, and one that gives them does not.
TEST(BenchCmdGpu, SaysWhenItsFractionsUseAnH200sCeilings) {
  const std::string note = "an H200's where not given";
  auto r = test::run_mere("bench --device cuda -p 0 -n 2 -r 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find(note), std::string::npos) << r.err;
  r = test::run_mere("bench --device cuda -p 0 -n 2 -r 1 --bandwidth 3.0e12 --matmul-rate 7.0e14");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find(note), std::string::npos) << r.err;
}

}  // namespace
}  // namespace mere

// mere text chat on CUDA (ctest label gpu): a conversation keeps its K/V in one
// block pool sized by the GPU's free memory, so the second turn prefills only
// what is new, and its answers are the tokens of a chat without the cache.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/device.h"
#include "test_util.h"

namespace mere {
namespace {

// Runs `mere text chat ARGS` with `input` on stdin, `env` before the command.
test::CommandResult chat(const std::string& env, const std::string& args, const std::string& input) {
  auto in = test::temp_dir("stdin") / "input.txt";
  test::write_file(in, input);
  auto dir = test::temp_dir("chat");
  const std::string command = env + " " + MERE_BINARY + " text chat " + args + " < " + in.string() + " >" +
                              (dir / "out").string() + " 2>" + (dir / "err").string();
  const int status = std::system(command.c_str());
  test::CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = test::read_file(dir / "out");
  r.err = test::read_file(dir / "err");
  return r;
}

// "(N reused)" of each turn's stats line, in order.
std::vector<long> reused(const std::string& err) {
  std::vector<long> out;
  for (size_t at = err.find(" reused)"); at != std::string::npos; at = err.find(" reused)", at + 1)) {
    const size_t open = err.rfind('(', at);
    out.push_back(std::stol(err.substr(open + 1, at - open - 1)));
  }
  return out;
}

TEST(ChatGpu, TheSecondTurnReusesTheFirstOnCuda) {
  if (!cuda_available()) FAIL() << "gpu tests need a GPU: " << cuda_device_description();
  const std::string args = "--device cuda --temperature 0 -n 8 --system 'Be brief.'";
  const std::string turns = "Hi\nWhat is the first book of the Bible?\n";
  auto cached = chat("", args, turns);
  ASSERT_EQ(cached.exit_code, 0) << cached.err;
  const std::vector<long> r = reused(cached.err);
  ASSERT_EQ(r.size(), 2u) << cached.err;
  EXPECT_EQ(r[0], 0);
  // The first turn's whole 16-position blocks (its prompt, 23 tokens, and answer: one block).
  EXPECT_GE(r[1], 16) << cached.err;
  auto plain = chat("MERERUN_PREFIX_CACHE=0", args, turns);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(reused(plain.err), (std::vector<long>{0, 0})) << plain.err;
  EXPECT_EQ(cached.out, plain.out);
}

}  // namespace
}  // namespace mere

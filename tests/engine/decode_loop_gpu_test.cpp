// The GPU generation loop (ctest label gpu): device sampling, graph replay and
// pipelining must give exactly the tokens of the plain loop (eager steps, each
// token read before the next step is queued), greedy and sampled at a fixed
// seed, on the fixtures and the demo model; stops found one step late must roll
// the extra position back. The same holds with the step's last kernel writing
// the tokens to the host's slots (lever kernel_token_slots), which then copies
// none after the first. What ran is read from the engine's counters.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/error.h"
#include "engine/decode_step.h"
#include "engine/generate.h"
#include "models/model.h"
#include "gpu_test_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mere {
namespace {

struct Run {
  std::vector<int32_t> tokens;
  GenerateStats stats;
  int64_t final_length = 0;  // the state's length afterwards
};

Run run(const Model& model, const std::vector<int32_t>& prompt, GenerateOptions options, bool graphs, bool pipelined,
        int stop_after = -1, bool kernel_slots = false) {
  options.levers.cuda_graphs = graphs;
  options.levers.pipelined_decode = pipelined;
  options.levers.kernel_token_slots = kernel_slots;
  auto state = model.make_state(int64_t(prompt.size()) + options.max_new_tokens + 1);
  Run r;
  r.stats = generate_from(model, *state, prompt, options, [&](int32_t id) {
    r.tokens.push_back(id);
    return stop_after < 0 || int(r.tokens.size()) < stop_after;
  });
  r.final_length = state->length();
  return r;
}

std::vector<SamplingParams> sampling_cases() {
  return {SamplingParams{.temperature = 0},
          SamplingParams{.temperature = 1.0f, .seed = 7},
          SamplingParams{.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .repetition_penalty = 1.2f, .seed = 3},
          SamplingParams{.temperature = 1.3f, .min_p = 0.05f, .presence_penalty = 0.5f, .seed = 11}};
}

void expect_loops_agree(const std::filesystem::path& dir, const std::vector<int32_t>& prompt) {
  auto model = load_model(dir, Device::cuda, Levers{}.load_options(Device::cuda));
  for (const SamplingParams& sampling : sampling_cases()) {
    GenerateOptions options;
    options.max_new_tokens = 24;
    options.sampling = sampling;
    const std::string label = fmt::format("{} T={} k={} p={}", dir.filename().string(), sampling.temperature,
                                          sampling.top_k, sampling.top_p);
    Run plain = run(*model, prompt, options, false, false);
    Run graph = run(*model, prompt, options, true, false);
    Run piped = run(*model, prompt, options, true, true);
    Run piped_eager = run(*model, prompt, options, false, true);
    Run slots = run(*model, prompt, options, true, true, -1, /*kernel_slots=*/true);
    Run slots_eager = run(*model, prompt, options, false, true, -1, /*kernel_slots=*/true);
    ASSERT_EQ(plain.tokens.size(), 24u) << label;
    EXPECT_EQ(graph.tokens, plain.tokens) << label;
    EXPECT_EQ(piped.tokens, plain.tokens) << label;
    EXPECT_EQ(piped_eager.tokens, plain.tokens) << label;
    EXPECT_EQ(slots.tokens, plain.tokens) << label;
    EXPECT_EQ(slots_eager.tokens, plain.tokens) << label;
    // One copy a token, or with kernel_token_slots only the prefill's sampled token.
    EXPECT_EQ(piped.stats.token_copies, 24);
    EXPECT_EQ(slots.stats.token_copies, 1);
    EXPECT_EQ(slots_eager.stats.token_copies, 1);
    EXPECT_EQ(slots.stats.graph_replays, 22);
    // The counters say what ran: 23 forwards after the prefill, all sampled on the GPU.
    EXPECT_EQ(plain.stats.eager_decode_steps, 23);
    EXPECT_EQ(plain.stats.pipelined_steps, 0);
    EXPECT_EQ(plain.stats.device_sampled_tokens, 24);
    EXPECT_EQ(graph.stats.graph_captures, 1);
    EXPECT_EQ(graph.stats.graph_replays, 22);
    EXPECT_EQ(graph.stats.eager_decode_steps, 0);
    EXPECT_EQ(piped.stats.graph_replays, 22);
    EXPECT_EQ(piped.stats.pipelined_steps, 22);  // every step but the first is queued ahead
    EXPECT_EQ(piped.stats.rolled_back_positions, 0);
    EXPECT_EQ(piped.final_length, plain.final_length);
    std::printf("[ gpu      ] %s: 24 tokens identical (plain, graph, pipelined, pipelined eager, kernel token slots)\n",
                label.c_str());
  }
}

void expect_stops_roll_back(const std::filesystem::path& dir, const std::vector<int32_t>& prompt) {
  auto model = load_model(dir, Device::cuda, Levers{}.load_options(Device::cuda));
  GenerateOptions options;
  options.max_new_tokens = 24;
  options.sampling.temperature = 0;
  Run reference = run(*model, prompt, options, false, false);
  // EOS at the 10th token: the pipelined loop forwarded it already and must undo that.
  GenerateOptions with_eos = options;
  with_eos.eos_ids = {reference.tokens[9]};
  size_t first = size_t(std::find(reference.tokens.begin(), reference.tokens.end(), reference.tokens[9]) -
                        reference.tokens.begin());
  Run plain = run(*model, prompt, with_eos, false, false), piped = run(*model, prompt, with_eos, true, true);
  EXPECT_EQ(plain.stats.stop_reason, "eos");
  EXPECT_EQ(piped.stats.stop_reason, "eos");
  EXPECT_EQ(piped.tokens, plain.tokens);
  EXPECT_EQ(plain.tokens.size(), first);  // EOS itself is not passed on
  EXPECT_EQ(piped.final_length, plain.final_length);
  EXPECT_EQ(piped.stats.rolled_back_positions, first > 0 ? 1 : 0);
  // A stop from the sink after 5 tokens.
  Run plain_stop = run(*model, prompt, options, false, false, 5), piped_stop = run(*model, prompt, options, true, true, 5);
  EXPECT_EQ(piped_stop.stats.stop_reason, "stop");
  EXPECT_EQ(piped_stop.tokens, plain_stop.tokens);
  EXPECT_EQ(piped_stop.tokens.size(), 5u);
  EXPECT_EQ(piped_stop.final_length, plain_stop.final_length);
  EXPECT_EQ(piped_stop.stats.rolled_back_positions, 1);
  for (int stop_after : {5, 11}) {  // the tokens' slots wrap around after a roll-back
    Run plain_at = run(*model, prompt, options, false, false, stop_after);
    Run slots_at = run(*model, prompt, options, true, true, stop_after, /*kernel_slots=*/true);
    EXPECT_EQ(slots_at.tokens, plain_at.tokens) << stop_after;
    EXPECT_EQ(slots_at.final_length, plain_at.final_length) << stop_after;
    EXPECT_EQ(slots_at.stats.rolled_back_positions, 1) << stop_after;
  }
  // An immediate EOS costs no forward at all.
  GenerateOptions immediate = options;
  immediate.eos_ids = {reference.tokens[0]};
  Run at_once = run(*model, prompt, immediate, true, true);
  EXPECT_TRUE(at_once.tokens.empty());
  EXPECT_EQ(at_once.stats.graph_captures + at_once.stats.graph_replays + at_once.stats.eager_decode_steps, 0);
  EXPECT_EQ(at_once.final_length, int64_t(prompt.size()));
  // The budget's last token is sampled without a forward after it.
  GenerateOptions three = options;
  three.max_new_tokens = 3;
  Run short_run = run(*model, prompt, three, true, true);
  EXPECT_EQ(short_run.tokens.size(), 3u);
  EXPECT_EQ(short_run.final_length, int64_t(prompt.size()) + 2);
  std::printf("[ gpu      ] %s: EOS after %zu tokens, stop after 5, immediate EOS and budget 3 roll back as the plain loop\n",
              dir.filename().c_str(), first);
}

class DecodeLoopGpu : public test::NeedsGpu<::testing::TestWithParam<std::string>> {
 protected:
  std::filesystem::path dir() const {
    return test::model_dir(GetParam());
  }
  std::vector<int32_t> prompt() const {
    if (GetParam() == "demo") return Tokenizer::load(dir()).encode("And God said unto Moses", false);
    return nlohmann::json::parse(test::read_file(dir() / "reference.json"))["ids"].get<std::vector<int32_t>>();
  }
};

TEST_P(DecodeLoopGpu, PipelinedAndGraphLoopsMatchThePlainLoop) { expect_loops_agree(dir(), prompt()); }
TEST_P(DecodeLoopGpu, StopsFoundOneStepLateRollBack) { expect_stops_roll_back(dir(), prompt()); }

// With kernel_token_slots a roll-back releases the tickets past it (their
// position's slot will hold another step's tokens): waiting for one is an
// error, while the tickets before it keep their tokens.
TEST_P(DecodeLoopGpu, ARolledBackTicketIsAnError) {
  auto model = load_model(dir(), Device::cuda, Levers{}.load_options(Device::cuda));
  const std::vector<int32_t> p = prompt();
  auto state = model->make_state(int64_t(p.size()) + 8);
  const Tensor logits = model->forward(p, *state, false);
  DeviceSampler sampler(SamplingParams{.temperature = 0}, model->info().vocab);
  DecodeStep step(*model, *state, sampler, /*use_graph=*/true, /*kernel_token_slots=*/true);
  const int first = step.begin(logits);
  const int32_t first_token = step.wait(first);
  const int next = step.queue(), ahead = step.queue();
  const int32_t next_token = step.wait(next);
  step.roll_back(1);
  EXPECT_THROW(step.wait(ahead), Error);
  EXPECT_EQ(step.wait(next), next_token);
  EXPECT_EQ(step.wait(first), first_token);
  EXPECT_EQ(step.length(), int64_t(p.size()) + 1);
}

INSTANTIATE_TEST_SUITE_P(Models, DecodeLoopGpu, ::testing::Values("llama", "qwen2", "qwen3", "demo"));

}  // namespace
}  // namespace mere

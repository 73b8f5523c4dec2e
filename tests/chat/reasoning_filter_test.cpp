// Hiding <think> blocks from a streamed answer, keeping them out of the history,
// and the tokens a chat answer stops at.
#include "chat/reasoning_filter.h"

#include <gtest/gtest.h>

#include "chat/turn_stops.h"
#include "test_util.h"
#include "tokenizer/tokenizer_cache.h"
#include "tokenizer/tokenizer.h"

namespace mere {
namespace {

// Feeds `pieces` one by one and returns everything shown.
std::string filtered(const std::vector<std::string>& pieces, bool starts_inside = false) {
  ReasoningFilter f(starts_inside);
  std::string out;
  for (const auto& p : pieces) out += f.push(p);
  return out + f.finish();
}

TEST(ChatReasoning, HidesThinkBlocksWhereverTheTagsSplit) {
  EXPECT_EQ(filtered({"<think>\nplan\n</think>\n\nAnswer."}), "Answer.");
  EXPECT_EQ(filtered({"<thi", "nk>pl", "an</th", "ink>", "\n", "\nAns", "wer."}), "Answer.");
  std::string text = "<think>a < b </thin k></think>\n\nIt is <b>bold</b>.";
  std::vector<std::string> chars;
  for (char c : text) chars.emplace_back(1, c);
  EXPECT_EQ(filtered(chars), "It is <b>bold</b>.");
  EXPECT_EQ(filtered({"no reasoning at all, < and <t are text"}), "no reasoning at all, < and <t are text");
  EXPECT_EQ(filtered({"ends with <thi"}), "ends with <thi");  // a partial tag at the end is text
  EXPECT_EQ(filtered({"<think>never closed"}), "");
  EXPECT_EQ(filtered({"Answer\n\nkept"}), "Answer\n\nkept");  // newlines only go after </think>
}

TEST(ChatReasoning, PromptThatOpenedTheBlock) {
  EXPECT_EQ(filtered({"still thinking</think>\n\nDone."}, /*starts_inside=*/true), "Done.");
  EXPECT_TRUE(ends_inside_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(ends_inside_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(ends_inside_reasoning("<|im_start|>assistant\n"));
  EXPECT_FALSE(ends_inside_reasoning(""));
}

TEST(ChatReasoning, HistoryKeepsTheAnswerOnly) {
  // As Qwen3's template: content.split('</think>')[-1].lstrip('\n').
  EXPECT_EQ(strip_reasoning("<think>\nplan\n</think>\n\nAnswer."), "Answer.");
  EXPECT_EQ(strip_reasoning("plan</think>Answer"), "Answer");
  EXPECT_EQ(strip_reasoning("Plain answer\n"), "Plain answer\n");
  EXPECT_EQ(strip_reasoning("<think>cut off"), "<think>cut off");
}

TEST(ChatStops, EosAndEndOfTurnTokens) {
  Tokenizer demo = Tokenizer::load(test::source_dir() / "models" / "demo");
  int32_t endoftext = *demo.token_to_id("<|endoftext|>"), im_end = *demo.token_to_id("<|im_end|>");
  EXPECT_EQ(chat_stop_ids(demo, {}), (std::vector<int32_t>{std::min(endoftext, im_end), std::max(endoftext, im_end)}));
  EXPECT_EQ(chat_stop_ids(demo, {im_end, endoftext, im_end}).size(), 2u);
  Tokenizer fixture = Tokenizer::load(test::fixtures_dir() / "qwen3");  // no end-of-turn token in its vocabulary
  EXPECT_EQ(chat_stop_ids(fixture, {0}), std::vector<int32_t>{0});
}

// The tokenizers come from the tokenizer tests' cache: loaded once per test binary.
// (Gemma's <end_of_turn> takes the same path as <|eot_id|>, and its tokenizer 1.4 s to load.)
TEST(ChatStops, RealTokenizers) {
  auto has = [](const std::vector<int32_t>& ids, const Tokenizer& t, const char* token) {
    return std::find(ids.begin(), ids.end(), *t.token_to_id(token)) != ids.end();
  };
  const Tokenizer& llama3 = test::cached_tokenizer("llama3");
  EXPECT_TRUE(has(chat_stop_ids(llama3, {}), llama3, "<|eot_id|>"));
  const Tokenizer& deepseek = test::cached_tokenizer("deepseek_v3");
  EXPECT_TRUE(has(chat_stop_ids(deepseek, {}), deepseek, "<｜end▁of▁sentence｜>"));
  const Tokenizer& gptoss = test::cached_tokenizer("gptoss");  // harmony: <|end|> closes the reasoning, not the answer
  auto ids = chat_stop_ids(gptoss, {});
  EXPECT_TRUE(has(ids, gptoss, "<|return|>"));
  EXPECT_FALSE(has(ids, gptoss, "<|end|>"));
}

}  // namespace
}  // namespace mere

// Lever experts_read_once's block rows (ops/cuda/expert_rows.h), host
// arithmetic: row n of a batch's gate/up takes the n-th smallest expert any
// token chose, so the rows in order are the chosen experts sorted, each once,
// and every (token, slot) pair is written by exactly one row; the grid's units
// are dealt for the experts random choices pick.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "ops/cuda/expert_rows.h"

namespace mere::cuda::tiles {
namespace {

// Each of T tokens picks k distinct experts of E at random, as a router's top k does.
std::vector<int32_t> random_choices(int T, int k, int E, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> all(static_cast<size_t>(E)), ids;
  std::iota(all.begin(), all.end(), 0);
  for (int t = 0; t < T; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    ids.insert(ids.end(), all.begin(), all.begin() + k);
  }
  return ids;
}

// The choices as the kernel marks them: bit e % 32 of word e / 32.
std::vector<uint32_t> chosen_words(const std::vector<int32_t>& ids, int E) {
  std::vector<uint32_t> words(size_t((E + 31) / 32), 0);
  for (int32_t e : ids) words[size_t(e / 32)] |= 1u << (e % 32);
  return words;
}

TEST(ExpertRows, EachRowTakesTheNextChosenExpertAndEveryPairOneRow) {
  struct Case {
    int E, k, T;
  };
  uint32_t seed = 1;
  for (const Case& c : {Case{128, 8, 2}, Case{128, 8, 8}, Case{128, 8, 16}, Case{12, 8, 5}, Case{8, 8, 16},
                        Case{1024, 8, 16}, Case{60, 4, 3}, Case{33, 2, 16}, Case{128, 8, 1}}) {
    const std::vector<int32_t> ids = random_choices(c.T, c.k, c.E, seed++);
    const std::vector<uint32_t> words = chosen_words(ids, c.E);
    const std::set<int32_t> distinct(ids.begin(), ids.end());
    const int rows = std::min(c.T * c.k, c.E), n_words = int(words.size());
    const std::string label = "E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) + " T=" + std::to_string(c.T);
    std::vector<int32_t> experts;
    for (int n = 0; n < rows; ++n) {
      const int e = nth_chosen_expert(words.data(), n_words, n);
      if (n < int(distinct.size())) {
        EXPECT_GE(e, 0) << label << " row " << n;
        experts.push_back(e);
      } else {
        EXPECT_EQ(e, -1) << label << " row " << n << ": past the chosen experts";
      }
    }
    EXPECT_EQ(experts, std::vector<int32_t>(distinct.begin(), distinct.end())) << label;
    // Each pair's product comes from the row of the expert it chose, once.
    std::vector<int> writes(ids.size(), 0);
    for (int32_t e : experts)
      for (int t = 0; t < c.T; ++t) {
        const int s = slot_of(ids.data(), c.k, t, e);
        if (s < 0) continue;
        ASSERT_EQ(ids[size_t(t * c.k + s)], e) << label;
        ++writes[size_t(t * c.k + s)];
      }
    for (size_t i = 0; i < writes.size(); ++i) EXPECT_EQ(writes[i], 1) << label << " pair " << i;
  }
}

TEST(ExpertRows, BitsAtTheWordsEdges) {
  const uint32_t words[] = {0, 0x80000001u, 0, 1u << 31};
  EXPECT_EQ(nth_chosen_expert(words, 4, 0), 32);
  EXPECT_EQ(nth_chosen_expert(words, 4, 1), 63);
  EXPECT_EQ(nth_chosen_expert(words, 4, 2), 127);
  EXPECT_EQ(nth_chosen_expert(words, 4, 3), -1);
  const uint32_t all[] = {0xffffffffu};
  for (int n = 0; n < 32; ++n) EXPECT_EQ(nth_chosen_expert(all, 1, n), n);
}

// 128 (1 - (120/128)^T) for Qwen3-30B-A3B's 8 of 128, rounded up and held to the grid's rows.
TEST(ExpertRows, UnitsAreDealtForTheExpertsRandomChoicesPick) {
  EXPECT_EQ(expected_chosen_experts(128, 8, 1), 8);
  EXPECT_EQ(expected_chosen_experts(128, 8, 2), 16);
  EXPECT_EQ(expected_chosen_experts(128, 8, 8), 52);
  EXPECT_EQ(expected_chosen_experts(128, 8, 16), 83);
  EXPECT_EQ(expected_chosen_experts(8, 8, 16), 8);  // all of them
  EXPECT_EQ(expected_chosen_experts(12, 8, 2), 11);
}

}  // namespace
}  // namespace mere::cuda::tiles

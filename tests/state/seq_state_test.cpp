// Paged sequence state on the CPU: the block pool's reference counts and
// eviction, paged K/V against contiguous K/V (bit-identical logits), forks that
// share blocks and copy the last partly filled one on write, truncation that
// releases blocks, recurrent state copied on fork and restored on rollback, and
// the prefix cache reusing blocks in generate (by its counters and prefill time).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <numeric>

#include "engine/generate.h"
#include "models/model.h"
#include "ops/ops.h"
#include "state/prefix_cache.h"
#include "state/seq_state.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mere {
namespace {

KvLayout tiny_layout(KvCacheMode mode = KvCacheMode::native) { return {2, 2, 16, mode, Device::cpu}; }

TEST(BlockPool, ReferenceCountsAndCapacity) {
  BlockPool pool(tiny_layout(), 3);
  EXPECT_EQ(pool.available_blocks(), 3);
  const int32_t a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(pool.available_blocks(), 0);
  EXPECT_THROW(pool.allocate(), Error);  // every block is held
  pool.retain(b);
  pool.release(b);
  EXPECT_EQ(pool.refs(b), 1);
  pool.release(b);
  EXPECT_EQ(pool.available_blocks(), 1);
  EXPECT_EQ(pool.allocate(), b);
  for (int32_t x : {a, b, c}) pool.release(x);
  EXPECT_EQ(pool.available_blocks(), 3);

  EXPECT_EQ(BlockPool::blocks_for_tokens(1), 1);
  EXPECT_EQ(BlockPool::blocks_for_tokens(33), 3);
  // A quarter of 1 MiB of blocks of 16 positions x 2 layers x K and V x 2 heads x 16 x f32 (8 KiB a block).
  EXPECT_EQ(BlockPool::blocks_for_memory(0.25, 1 << 20, tiny_layout()), 32);
  EXPECT_THROW(BlockPool::blocks_for_memory(1.5, 1 << 20, tiny_layout()), Error);
}

TEST(BlockPool, CachedBlocksAreEvictedLeastRecentlyUsedFirst) {
  BlockPool pool(tiny_layout(), 3);
  std::vector<int32_t> tokens(16);
  auto publish = [&](int32_t block, uint64_t hash) {
    std::iota(tokens.begin(), tokens.end(), int32_t(hash));
    pool.publish(block, hash, tokens);
  };
  const int32_t a = pool.allocate(), b = pool.allocate();
  publish(a, 100);
  publish(b, 200);
  pool.release(a);  // a cached first: least recently used
  pool.release(b);
  EXPECT_EQ(pool.cached_blocks(), 2);
  std::iota(tokens.begin(), tokens.end(), 100);
  EXPECT_EQ(pool.lookup(100, tokens), a);    // a in use again ...
  tokens[3] = -1;
  EXPECT_EQ(pool.lookup(100, tokens), -1);   // (a hash match with other tokens is no match)
  pool.release(a);                           // ... and now the most recently used
  const int32_t fresh = pool.allocate();     // the free block
  const int32_t evicted = pool.allocate();   // then the LRU cached one: b
  EXPECT_NE(fresh, a);
  EXPECT_EQ(evicted, b);
  EXPECT_EQ(pool.evictions(), 1);
  std::iota(tokens.begin(), tokens.end(), 200);
  EXPECT_EQ(pool.lookup(200, tokens), -1);   // gone with its block
  std::iota(tokens.begin(), tokens.end(), 100);
  EXPECT_EQ(pool.lookup(100, tokens), a);    // still cached
}

struct Fixture {
  std::unique_ptr<Model> model;
  std::vector<int32_t> prompt;
};

Fixture fixture(const char* name) {
  auto dir = test::fixtures_dir() / name;
  auto ref = nlohmann::json::parse(test::read_file(dir / "reference.json"));
  return {load_model(dir, Device::cpu), ref["ids"].get<std::vector<int32_t>>()};
}

// Logits of `tokens` fed one forward after another (first the whole prompt).
std::vector<Tensor> run(const Model& model, SeqState& state, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& steps) {
  std::vector<Tensor> out{model.forward(prompt, state, false)};
  for (int32_t id : steps) out.push_back(model.forward({id}, state, false));
  return out;
}

void expect_identical(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::string& label) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(test::max_abs_diff(a[i], b[i]).diff, 0.0f) << label << " step " << i;
}

std::vector<int32_t> steps(int n, int32_t seed) {
  std::vector<int32_t> s;
  for (int i = 0; i < n; ++i) s.push_back((seed * 37 + i * 101) % 200 + 1);
  return s;
}

TEST(SeqState, PagedKvGivesTheContiguousLogitsInEveryMode) {
  for (const char* name : {"llama", "qwen3"}) {
    Fixture f = fixture(name);
    for (KvCacheMode mode : {KvCacheMode::native, KvCacheMode::bf16, KvCacheMode::affine8, KvCacheMode::affine4}) {
      const KvLayout l = f.model->kv_layout(mode);
      SeqState contiguous(l.n_layers, l.n_kv_heads, l.head_dim, 200, Device::cpu, mode);
      auto paged = f.model->make_state(200, mode);
      ASSERT_TRUE(paged->is_paged());
      const std::vector<Tensor> want = run(*f.model, contiguous, f.prompt, steps(40, 1));
      // Alone on its pool, the sequence's blocks lie in order: the prompt and
      // every step read its rows in place, quantized ones too, and copy none.
      const int64_t gathered = ops::gathered_page_rows();
      const std::vector<Tensor> got = run(*f.model, *paged, f.prompt, steps(40, 1));
      const std::string label = std::string(name) + " " + std::string(kv_cache_mode_name(mode));
      EXPECT_EQ(ops::gathered_page_rows() - gathered, 0) << label;
      expect_identical(want, got, label);
      EXPECT_EQ(int64_t(paged->block_table().size()), (paged->length() + 15) / 16);
    }
  }
}

TEST(SeqState, ForksShareBlocksAndCopyTheLastOneOnWrite) {
  Fixture f = fixture("qwen3");
  auto pool = std::make_shared<BlockPool>(f.model->kv_layout(), 64);
  std::vector<int32_t> prompt = f.prompt;
  prompt.resize(21);  // one full block and 5 positions of the next
  SeqState base(pool, 200);
  f.model->forward(prompt, base, false);
  const int64_t held = pool->n_blocks() - pool->available_blocks();
  auto fork = base.fork();
  EXPECT_EQ(fork->length(), 21);
  EXPECT_EQ(fork->block_table(), base.block_table());
  EXPECT_EQ(pool->refs(base.block_table()[0]), 2);
  EXPECT_EQ(pool->n_blocks() - pool->available_blocks(), held);  // nothing copied yet

  // Each branch continues on its own; both equal a fresh sequence given the same tokens.
  const auto xs = steps(30, 2), ys = steps(30, 3);
  std::vector<Tensor> got_fork, got_base;
  for (size_t i = 0; i < xs.size(); ++i) {
    // The fork's copy of block 1 cannot follow the shared block 0 in storage
    // (base's block 1 does): its steps read through the table, gathering its
    // visible rows (K and V of each layer).
    const int64_t gathered = ops::gathered_page_rows();
    got_fork.push_back(f.model->forward({xs[i]}, *fork, false));
    EXPECT_EQ(ops::gathered_page_rows() - gathered, 2 * f.model->kv_layout().n_layers * fork->length()) << i;
    got_base.push_back(f.model->forward({ys[i]}, base, false));
    if (i == 0) {
      EXPECT_EQ(fork->block_table()[0], base.block_table()[0]);  // the full block stays shared
      EXPECT_NE(fork->block_table()[1], base.block_table()[1]);  // the partly filled one was copied
    }
  }
  auto want = [&](const std::vector<int32_t>& more) {
    SeqState fresh(pool, 200);
    std::vector<Tensor> all = run(*f.model, fresh, prompt, more);
    return std::vector<Tensor>(all.begin() + 1, all.end());
  };
  expect_identical(got_fork, want(xs), "fork");
  expect_identical(got_base, want(ys), "base");
}

TEST(SeqState, TruncateReleasesBlocksAndContinuesAsIfNeverWritten) {
  Fixture f = fixture("llama");
  auto pool = std::make_shared<BlockPool>(f.model->kv_layout(KvCacheMode::affine8), 16);
  SeqState s(pool, 200);
  std::vector<int32_t> prompt = f.prompt;
  f.model->forward(prompt, s, false);
  for (int32_t id : steps(40, 4)) f.model->forward({id}, s, false);
  const int64_t before = pool->available_blocks(), blocks = int64_t(s.block_table().size());
  const int64_t keep = int64_t(prompt.size()) + 3;
  s.truncate(keep);
  EXPECT_EQ(int64_t(s.block_table().size()), (keep + 15) / 16);
  EXPECT_EQ(pool->available_blocks() - before, blocks - (keep + 15) / 16);
  // Rolled back, then decoding other tokens: as a sequence that never saw the rejected ones.
  const auto more = steps(20, 5), first3 = steps(40, 4);
  std::vector<Tensor> got;
  for (int32_t id : more) got.push_back(f.model->forward({id}, s, false));
  SeqState fresh(pool, 200);
  f.model->forward(prompt, fresh, false);
  for (int i = 0; i < 3; ++i) f.model->forward({first3[size_t(i)]}, fresh, false);
  std::vector<Tensor> want;
  for (int32_t id : more) want.push_back(f.model->forward({id}, fresh, false));
  expect_identical(got, want, "after truncate");
}

// A stand-in for a hybrid family's per-layer state: a running token count.
struct CounterState : RecurrentState {
  int64_t count = 0;
  std::unique_ptr<RecurrentState> clone() const override { return std::make_unique<CounterState>(*this); }
  size_t size_bytes() const override { return sizeof(count); }
};

TEST(SeqState, RecurrentStateIsCopiedOnForkAndRestoredOnRollback) {
  for (bool paged : {true, false}) {
    auto pool = std::make_shared<BlockPool>(tiny_layout(), 8);
    std::unique_ptr<SeqState> s = paged ? std::make_unique<SeqState>(pool, 100)
                                        : std::make_unique<SeqState>(2, 2, 16, 100, Device::cpu);
    s->recurrent(1) = std::make_unique<CounterState>();
    auto counter = [](SeqState& st) { return static_cast<CounterState&>(*st.recurrent(1)).count; };
    s->reserve(10);
    s->advance(10);
    static_cast<CounterState&>(*s->recurrent(1)).count = 10;
    SeqSnapshot snap = s->snapshot();
    auto f = s->fork();
    static_cast<CounterState&>(*f->recurrent(1)).count = 99;
    EXPECT_EQ(counter(*s), 10);  // the fork has its own copy
    EXPECT_EQ(f->recurrent(0), nullptr);
    s->reserve(25);
    s->advance(15);
    static_cast<CounterState&>(*s->recurrent(1)).count = 25;
    s->restore(snap);
    EXPECT_EQ(s->length(), 10);
    EXPECT_EQ(counter(*s), 10);
    if (paged) {
      EXPECT_EQ(s->block_table().size(), 1u);
    }
  }
}

TEST(PrefixCache, BlockHashesDependOnEverythingBefore) {
  std::vector<int32_t> a(40), b(40);
  std::iota(a.begin(), a.end(), 0);
  b = a;
  b[3] = 1000;  // block 0 differs, so block 1's hash must too
  const auto ha = prefix_block_hashes(a, 16), hb = prefix_block_hashes(b, 16);
  ASSERT_EQ(ha.size(), 2u);
  EXPECT_NE(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);
  b = a;
  b[39] = 7;  // past the last whole block
  EXPECT_EQ(prefix_block_hashes(b, 16), ha);
}

// A second prompt sharing a long prefix with the first reuses its blocks: the
// counters say so, the prefill runs only the rest (and takes less time), and the
// greedy output is the one a fresh state gives.
TEST(PrefixCache, GenerateReusesASharedPrefix) {
  auto demo = test::source_dir() / "models" / "demo";
  auto model = load_model(demo, Device::cpu);
  Tokenizer tok = Tokenizer::load(demo);
  std::vector<int32_t> shared = tok.encode(test::read_file(demo / "heldout_test.txt"), false);
  shared.resize(300);
  std::vector<int32_t> p1 = shared, p2 = shared;
  for (int32_t id : tok.encode(" And the LORD spake unto Moses", false)) p1.push_back(id);
  for (int32_t id : tok.encode(" In the beginning", false)) p2.push_back(id);

  PrefixCache cache(std::make_shared<BlockPool>(model->kv_layout(), 256));
  GenerateOptions options;
  options.max_new_tokens = 16;
  options.sampling.temperature = 0;
  options.prefix_cache = &cache;
  GenerateOptions plain = options;
  plain.prefix_cache = nullptr;
  std::vector<int32_t> out1, out2, want2;
  GenerateStats s1 = generate(*model, p1, options, [&](int32_t id) { out1.push_back(id); return true; });
  GenerateStats s2 = generate(*model, p2, options, [&](int32_t id) { out2.push_back(id); return true; });
  generate(*model, p2, plain, [&](int32_t id) { want2.push_back(id); return true; });
  std::printf("[ prefix   ] miss: prefill %lld tokens in %.1f ms; hit: %lld reused, prefill %lld tokens in %.1f ms\n",
              (long long)s1.prompt_tokens, s1.prefill_ms, (long long)s2.reused_prefix_tokens,
              (long long)s2.prompt_tokens, s2.prefill_ms);
  EXPECT_EQ(s1.reused_prefix_tokens, 0);
  EXPECT_EQ(s2.reused_prefix_tokens, 288);  // 18 whole blocks of the 300 shared tokens
  EXPECT_EQ(s2.prompt_tokens, int64_t(p2.size()) - 288);
  EXPECT_EQ(cache.lookups(), 2);
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_LT(s2.prefill_ms, s1.prefill_ms);
  EXPECT_EQ(out2, want2);
  // The same prompt again reuses all but its last block's worth.
  GenerateStats s3 = generate(*model, p1, options, [](int32_t) { return true; });
  EXPECT_EQ(s3.reused_prefix_tokens, int64_t(p1.size() - 1) / 16 * 16);
}

// A pool smaller than the model's context (a CUDA chat's pool is allocated whole,
// within the GPU's memory) ends a generation where it ends, with stop reason
// "context", rather than failing mid-answer with "kv cache is full"; a prompt
// the pool cannot hold is refused up front, naming the pool.
TEST(PrefixCache, GenerationStopsWhereASmallPoolEnds) {
  auto demo = test::source_dir() / "models" / "demo";
  auto model = load_model(demo, Device::cpu);
  Tokenizer tok = Tokenizer::load(demo);
  std::vector<int32_t> text = tok.encode(test::read_file(demo / "heldout_test.txt"), false);
  PrefixCache cache(std::make_shared<BlockPool>(model->kv_layout(), 4));  // 64 positions
  ASSERT_LT(cache.pool()->capacity_tokens(), model->info().max_positions);
  GenerateOptions options;
  options.max_new_tokens = 100;
  options.sampling.temperature = 0;
  options.eos_ids = {};  // only the pool may stop it
  options.prefix_cache = &cache;
  const std::vector<int32_t> prompt(text.begin(), text.begin() + 40);
  int64_t generated = 0;
  GenerateStats stats;
  ASSERT_NO_THROW(stats = generate(*model, prompt, options, [&](int32_t) { return ++generated > 0; }));
  EXPECT_EQ(stats.stop_reason, "context");
  EXPECT_EQ(generated, stats.generated_tokens);
  EXPECT_GE(generated, 64 - 40);
  EXPECT_LE(generated, 64 - 40 + 1);  // the last token sampled needs no position
  // Again, reusing the published blocks.
  ASSERT_NO_THROW(stats = generate(*model, prompt, options, [](int32_t) { return true; }));
  EXPECT_EQ(stats.stop_reason, "context");

  const std::vector<int32_t> too_long(text.begin(), text.begin() + 70);
  try {
    generate(*model, too_long, options, [](int32_t) { return true; });
    ADD_FAILURE() << "a prompt longer than the pool was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("the K/V pool holds 64"), std::string::npos) << e.what();
  }
}

// Reused blocks hold exactly the K/V a fresh prefill computes (the CPU computes
// each row on its own), so the logits after a prefix hit are bit-identical.
TEST(PrefixCache, LogitsAfterAHitAreBitIdentical) {
  for (KvCacheMode mode : {KvCacheMode::native, KvCacheMode::affine8}) {
    Fixture f = fixture("qwen3");
    std::vector<int32_t> p1 = f.prompt, p2 = f.prompt;
    while (p1.size() < 40) p1.push_back(int32_t(p1.size() * 3 + 1)), p2.push_back(int32_t(p2.size() * 3 + 1));
    p2.resize(35);
    p2.push_back(77);
    PrefixCache cache(std::make_shared<BlockPool>(f.model->kv_layout(mode), 32));
    {
      auto s1 = cache.start(p1, 100);
      f.model->forward(p1, *s1, false);
      cache.publish(*s1, p1);
    }
    auto s2 = cache.start(p2, 100);
    ASSERT_EQ(s2->length(), 32);
    Tensor got = f.model->forward(std::vector<int32_t>(p2.begin() + 32, p2.end()), *s2, true);
    auto fresh = f.model->make_state(100, mode);
    Tensor all = f.model->forward(p2, *fresh, true);
    EXPECT_EQ(test::max_abs_diff(got, all.slice_rows(32, int64_t(p2.size()))).diff, 0.0f) << kv_cache_mode_name(mode);
  }
}

}  // namespace
}  // namespace mere

// Paged K/V on CUDA (ctest label gpu). Ops: rows written and read through a
// scrambled (non-identity) block table give what a contiguous CUDA cache gives,
// for bf16, affine8 and affine4, in decode (split-K through the table), short
// steps and prefill (visible rows gathered); the fused rope-store writes the
// same rows through the table; a batch's write and attention, one launch over
// every sequence (more than kMaxPagedSequences: in chunks), equal each sequence's
// own. Models: CUDA states are paged; forks share blocks and copy the partly
// filled last one on write; truncate releases blocks; a prefix-cache hit gives
// the cold run's logits and greedy tokens; B sequences on one pool decode their
// tokens alone, with as many kernel launches per step for 4 sequences as for 2, and
// for 8 as for 6.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>

#include "core/device.h"
#include "engine/generate.h"
#include "engine/levers.h"
#include "gpu_test_util.h"
#include "models/batch_decode_util.h"
#include "models/model.h"
#include "ops/ops.h"
#include "state/kv_cache.h"
#include "state/prefix_cache.h"
#include "test_util.h"

namespace mere {
namespace {

using test::gpu;
using test::random;
using test::relative_error;

constexpr KvCacheMode kModes[] = {KvCacheMode::bf16, KvCacheMode::affine8, KvCacheMode::affine4};

std::string mode_name(KvCacheMode m) { return std::string(kv_cache_mode_name(m)); }

Tensor position(int64_t p, Device device = Device::cuda) {
  Tensor t = Tensor::empty({1}, DType::i32);
  t.data<int32_t>()[0] = int32_t(p);
  return t.to_device(device);
}

Tensor table(const std::vector<int32_t>& blocks) {
  Tensor t = Tensor::empty({int64_t(blocks.size())}, DType::i32);
  std::copy(blocks.begin(), blocks.end(), t.data<int32_t>());
  return gpu(t);
}

// n blocks of `storage_blocks`, in a scrambled order (a stride coprime to the storage's size).
std::vector<int32_t> scrambled(int64_t n, int64_t storage_blocks, int64_t offset) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(int32_t((offset + i * 7) % storage_blocks));
  return out;
}

// Every storage tensor of a cache (dense: K, V; quantized: codes, scales, biases of each).
std::vector<Tensor> storage_tensors(KvCache& c) {
  if (!c.quantized()) return {c.keys_for_write(), c.values_for_write()};
  ops::AffineRows &k = c.quantized_keys_for_write(), &v = c.quantized_values_for_write();
  return {k.codes, k.scales, k.biases, v.codes, v.scales, v.biases};
}

// The sequence's rows [0, n) of a paged cache equal a contiguous cache's, byte for byte.
void expect_same_rows(KvCache& paged, const Tensor& tbl, KvCache& contiguous, int64_t n, const std::string& label) {
  const std::vector<Tensor> p = storage_tensors(paged), c = storage_tensors(contiguous);
  for (size_t i = 0; i < p.size(); ++i) {
    const Tensor got = ops::gather_pages(p[i], tbl, n).to_device(Device::cpu);
    const Tensor want = c[i].slice_rows(0, n).to_device(Device::cpu);
    EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.size_bytes()), 0) << label << " storage tensor " << i;
  }
}

struct Shape3 {
  int64_t heads, kv_heads, head_dim;
};

class PagedKvGpu : public test::NeedsGpu<> {};

// One sequence of S positions in 40 scrambled blocks of a 64-block storage,
// against a contiguous cache of the same 640 rows (so the graph form's split
// count is the same): K/V written in two pieces across a block edge, then
// attention for 1, 5 (split-K through the table) and 40 new tokens (gathered).
TEST_F(PagedKvGpu, ScrambledTableGivesTheContiguousResult) {
  for (Shape3 s : {Shape3{32, 8, 128}, Shape3{4, 2, 64}})
    for (KvCacheMode mode : kModes) {
      const int64_t S = 600, blocks = 40, storage_blocks = 64;
      const std::string label = fmt::format("paged {} {}/{}x{}", mode_name(mode), s.heads, s.kv_heads, s.head_dim);
      const Tensor k = gpu(random({S, s.kv_heads, s.head_dim}, DType::f32, 1));
      const Tensor v = gpu(random({S, s.kv_heads, s.head_dim}, DType::f32, 2));
      KvCache contiguous(s.kv_heads, s.head_dim, blocks * 16, Device::cuda, mode);
      contiguous.reserve(blocks * 16);
      contiguous.write(position(0), k, v);
      KvCache storage(s.kv_heads, s.head_dim, storage_blocks * 16, Device::cuda, mode);
      storage.reserve(storage_blocks * 16);
      const Tensor tbl = table(scrambled(blocks, storage_blocks, 3));
      const ops::KvPages pages{{tbl}};
      storage.write(position(0), k.slice_rows(0, 237), v.slice_rows(0, 237), pages);
      storage.write(position(237), k.slice_rows(237, S), v.slice_rows(237, S), pages);
      expect_same_rows(storage, tbl, contiguous, S, label);

      const float scale = 1.0f / std::sqrt(float(s.head_dim));
      for (int64_t T : {1, 5, 40}) {
        const int64_t p0 = S - T;
        const Tensor q = gpu(random({T, s.heads, s.head_dim}, DType::f32, 10 + uint64_t(T)));
        const Tensor want = contiguous.attend(q, position(p0), p0, scale).to_device(Device::cpu);
        const Tensor got = storage.attend(q, position(p0), p0, scale, pages);
        EXPECT_LE(relative_error(got, want, fmt::format("{} T={}", label, T)), 1e-5f);
      }
    }
}

// The fused norm + RoPE + K/V write through a table crossing a block edge, and
// a batch of sequences written in one launch: the rows and q equal the
// contiguous cache's.
TEST_F(PagedKvGpu, FusedRopeStoreWritesThroughTheTable) {
  const Shape3 s{16, 8, 128};
  ops::RopeTable rope;
  for (int i = 0; i < s.head_dim / 2; ++i) rope.inv_freq.push_back(std::pow(10000.0f, -2.0f * i / s.head_dim));
  const Tensor qn = gpu(random({s.head_dim}, DType::bf16, 4, 0.2f, 1.0f));
  const Tensor kn = gpu(random({s.head_dim}, DType::bf16, 5, 0.2f, 1.0f));
  for (KvCacheMode mode : kModes) {
    const int64_t T = 7, p0 = 13;  // positions 13..19: blocks 0 and 1
    const Tensor q = gpu(random({T, s.heads, s.head_dim}, DType::f32, 1));
    const Tensor k = gpu(random({T, s.kv_heads, s.head_dim}, DType::f32, 2));
    const Tensor v = gpu(random({T, s.kv_heads, s.head_dim}, DType::f32, 3));
    KvCache contiguous(s.kv_heads, s.head_dim, 32, Device::cuda, mode), storage(s.kv_heads, s.head_dim, 128,
                                                                                 Device::cuda, mode);
    contiguous.reserve(32);
    storage.reserve(128);
    const Tensor tbl = table({6, 1});
    auto store = [&](KvCache& c, Tensor& qq, const ops::KvPages& pages) {
      if (c.quantized())
        ops::qk_norm_rope_store(qq, k, v, qn, kn, 1e-6f, rope, position(p0), c.quantized_keys_for_write(),
                                c.quantized_values_for_write(), pages);
      else
        ops::qk_norm_rope_store(qq, k, v, qn, kn, 1e-6f, rope, position(p0), c.keys_for_write(), c.values_for_write(),
                                pages);
    };
    Tensor q_want = q.clone(), q_got = q.clone();
    store(contiguous, q_want, {});
    store(storage, q_got, ops::KvPages{{tbl}});
    EXPECT_EQ(test::max_abs_diff(q_got.to_device(Device::cpu), q_want.to_device(Device::cpu)).diff, 0.0f)
        << mode_name(mode);
    // The positions written, read back through the table, equal the contiguous rows (the rest was never written).
    const std::vector<Tensor> p = storage_tensors(storage), c = storage_tensors(contiguous);
    for (size_t i = 0; i < p.size(); ++i) {
      const Tensor got = ops::gather_pages(p[i], tbl, p0 + T).to_device(Device::cpu).slice_rows(p0, p0 + T);
      const Tensor want = c[i].to_device(Device::cpu).slice_rows(p0, p0 + T);
      EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.size_bytes()), 0) << mode_name(mode) << " tensor " << i;
    }
  }
}

// B sequences of L positions, each in its own scrambled blocks of one storage,
// get one new token each at position L: written and attended for the whole
// batch at once (rows are sequences) against one sequence at a time on a copy
// of the storage. B = 70 takes two launches (kMaxPagedSequences = 64).
TEST_F(PagedKvGpu, BatchedWriteAndAttentionEqualEachSequenceAlone) {
  const Shape3 s{8, 2, 64};
  ops::RopeTable rope;
  for (int i = 0; i < s.head_dim / 2; ++i) rope.inv_freq.push_back(std::pow(10000.0f, -2.0f * i / s.head_dim));
  for (KvCacheMode mode : kModes)
    for (int64_t B : {5, 70}) {
      const int64_t L = 100, per_seq = 7, storage_blocks = B * per_seq + 3;
      KvCache batched(s.kv_heads, s.head_dim, storage_blocks * 16, Device::cuda, mode);
      batched.reserve(storage_blocks * 16);
      // Sequence b owns blocks {b + B * j}: interleaved with the others' across the storage.
      ops::KvPages all;
      for (int64_t b = 0; b < B; ++b) {
        std::vector<int32_t> blocks;
        for (int64_t j = per_seq - 1; j >= 0; --j) blocks.push_back(int32_t(b + B * j));
        all.tables.push_back(table(blocks));
        batched.write(position(0), gpu(random({L, s.kv_heads, s.head_dim}, DType::f32, 100 + uint64_t(b))),
                      gpu(random({L, s.kv_heads, s.head_dim}, DType::f32, 300 + uint64_t(b))),
                      ops::KvPages{{all.tables.back()}});
      }
      KvCache alone(s.kv_heads, s.head_dim, storage_blocks * 16, Device::cuda, mode);
      alone.reserve(storage_blocks * 16);
      {
        std::vector<Tensor> from = storage_tensors(batched), to = storage_tensors(alone);
        for (size_t i = 0; i < from.size(); ++i)
          copy_bytes(to[i].raw(), Device::cuda, from[i].raw(), Device::cuda, from[i].size_bytes());
      }
      const Tensor q = gpu(random({B, s.heads, s.head_dim}, DType::f32, 7));
      const Tensor k = gpu(random({B, s.kv_heads, s.head_dim}, DType::f32, 8));
      const Tensor v = gpu(random({B, s.kv_heads, s.head_dim}, DType::f32, 9));
      auto store = [&](KvCache& c, Tensor& qq, const Tensor& kk, const Tensor& vv, const ops::KvPages& pages) {
        if (c.quantized())
          ops::qk_norm_rope_store(qq, kk, vv, Tensor(), Tensor(), 1e-6f, rope, position(L), c.quantized_keys_for_write(),
                                  c.quantized_values_for_write(), pages);
        else
          ops::qk_norm_rope_store(qq, kk, vv, Tensor(), Tensor(), 1e-6f, rope, position(L), c.keys_for_write(),
                                  c.values_for_write(), pages);
      };
      Tensor qb = q.clone();
      store(batched, qb, k, v, all);
      const Tensor got = batched.attend(qb, position(L), L, 0.125f, all).to_device(Device::cpu);
      Tensor want = Tensor::empty(got.shape(), DType::f32);
      for (int64_t b = 0; b < B; ++b) {
        const ops::KvPages one{{all.tables[size_t(b)]}};
        Tensor qa = q.slice_rows(b, b + 1).clone();
        store(alone, qa, k.slice_rows(b, b + 1), v.slice_rows(b, b + 1), one);
        const Tensor row = alone.attend(qa, position(L), L, 0.125f, one).to_device(Device::cpu);
        std::memcpy(static_cast<char*>(want.raw()) + size_t(b) * row.size_bytes(), row.raw(), row.size_bytes());
      }
      EXPECT_LE(relative_error(got, want, fmt::format("batch {} of {} one launch vs alone", B, mode_name(mode))), 1e-6f);
      const std::vector<Tensor> x = storage_tensors(batched), y = storage_tensors(alone);
      for (size_t i = 0; i < x.size(); ++i) {
        const Tensor a = x[i].to_device(Device::cpu), c = y[i].to_device(Device::cpu);
        EXPECT_EQ(std::memcmp(a.raw(), c.raw(), a.size_bytes()), 0) << "batch " << B << " storage tensor " << i;
      }
    }
}

// A CUDA pool holds its whole storage from the start (a graph bakes in its
// address), sized by tokens or by a fraction of a memory budget.
TEST_F(PagedKvGpu, PoolCapacityByTokensOrMemoryIsAllocatedUpFront) {
  for (KvCacheMode mode : kModes) {
    const KvLayout layout{4, 8, 128, mode, Device::cuda};
    const uint64_t block_bytes = layout.position_bytes() * 16;
    const int64_t by_tokens = BlockPool::blocks_for_tokens(1000);
    const int64_t by_memory = BlockPool::blocks_for_memory(0.25, 256u << 20, layout);
    EXPECT_EQ(by_tokens, 63);
    EXPECT_EQ(uint64_t(by_memory), (uint64_t(256) << 20) / 4 / block_bytes) << mode_name(mode);
    for (int64_t blocks : {by_tokens, by_memory}) {
      BlockPool pool(layout, blocks);
      EXPECT_EQ(pool.size_bytes(), size_t(blocks) * block_bytes) << mode_name(mode);  // before any block is taken
      SeqState s(std::make_shared<BlockPool>(layout, blocks), 16 * blocks);
      s.reserve(16 * blocks);  // every block, none beyond
      EXPECT_EQ(int64_t(s.block_table().size()), blocks);
      EXPECT_EQ(s.pool()->available_blocks(), 0);
    }
  }
}

std::filesystem::path fixture(const std::string& name) { return test::fixtures_dir() / name; }

float close(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to_device(Device::cpu), y = b.to_device(Device::cpu);
  const float max_ref = std::max(1e-30f, test::max_abs(y));
  return test::max_abs_diff(x, y).diff / max_ref;
}

std::vector<int32_t> long_prompt(size_t n, int64_t vocab, int32_t seed) {
  std::vector<int32_t> p;
  for (size_t i = 0; i < n; ++i) p.push_back(int32_t((uint64_t(i) * 7919 + uint64_t(seed) * 31) % uint64_t(vocab)));
  return p;
}

// A fork shares every block; its first write copies the partly filled last one
// (on the device) and leaves the full ones shared; both branches then equal a
// fresh sequence given the same tokens. Truncate releases the blocks past the
// new length, and decoding on continues as if the rolled-back tokens never ran.
TEST_F(PagedKvGpu, ForkCopiesOnWriteAndTruncateReleasesBlocks) {
  for (const char* name : {"llama", "qwen3"}) {
    auto model = load_model(fixture(name), Device::cuda, Levers::from_env().load_options(Device::cuda));
    std::vector<int32_t> prompt = long_prompt(21, model->info().vocab, 1);  // one full block and 5 positions
    for (KvCacheMode mode : kModes) {
      const std::string label = std::string(name) + " " + mode_name(mode);
      auto pool = std::make_shared<BlockPool>(model->kv_layout(mode), 32);
      SeqState base(pool, 200);
      model->forward(prompt, base, false);
      auto fork = base.fork();
      EXPECT_EQ(fork->block_table(), base.block_table()) << label;
      EXPECT_EQ(pool->refs(base.block_table()[1]), 2) << label;
      const Tensor a = model->forward({5}, *fork, false), b = model->forward({9}, base, false);
      EXPECT_EQ(fork->block_table()[0], base.block_table()[0]) << label;  // the full block stays shared
      EXPECT_NE(fork->block_table()[1], base.block_table()[1]) << label;  // the partly filled one was copied
      auto fresh = [&](int32_t next) {
        SeqState s(pool, 200);
        model->forward(prompt, s, false);
        return model->forward({next}, s, false);
      };
      EXPECT_LE(close(a, fresh(5)), 1e-5f) << label << " fork";
      EXPECT_LE(close(b, fresh(9)), 1e-5f) << label << " base";

      for (int32_t id : long_prompt(30, model->info().vocab, 2)) model->forward({id}, base, false);
      const int64_t before = pool->available_blocks(), held = int64_t(base.block_table().size());
      base.truncate(int64_t(prompt.size()));  // back to 21 positions: 2 blocks
      EXPECT_EQ(int64_t(base.block_table().size()), 2) << label;
      EXPECT_EQ(pool->available_blocks() - before, held - 2) << label;
      EXPECT_LE(close(model->forward({5}, base, false), fresh(5)), 1e-5f) << label << " after truncate";
    }
  }
}

// A prompt whose first 64 positions (4 blocks) an earlier sequence published
// starts from the prefix cache's blocks on the GPU and prefills only the rest.
// The cold run prefills the same 64 tokens, then the same rest, on a pool of its
// own (the same kernels on the same rows), so the logits and the greedy tokens
// after them are identical; generate with the cache (prefill of the rest, then
// the graph decode loop) gives the same tokens.
TEST_F(PagedKvGpu, PrefixCacheHitGivesTheColdRunsTokens) {
  for (const char* name : {"llama", "qwen3"}) {
    auto model = load_model(fixture(name), Device::cuda, Levers::from_env().load_options(Device::cuda));
    const std::vector<int32_t> prompt = long_prompt(68, model->info().vocab, 3);
    const std::vector<int32_t> shared(prompt.begin(), prompt.begin() + 64), rest(prompt.begin() + 64, prompt.end());
    for (KvCacheMode mode : kModes) {
      const std::string label = std::string(name) + " " + mode_name(mode);
      PrefixCache cache(std::make_shared<BlockPool>(model->kv_layout(mode), 64));
      {
        auto s = cache.start(shared, 100);
        ASSERT_EQ(s->length(), 0) << label;
        model->forward(shared, *s, false);
        cache.publish(*s, shared);
      }
      auto hit = cache.start(prompt, 100);
      ASSERT_EQ(hit->length(), 64) << label;
      auto cold = model->make_state(100, mode);
      model->forward(shared, *cold, false);
      Tensor got = model->forward(rest, *hit, false), want = model->forward(rest, *cold, false);
      EXPECT_LE(close(got, want), 1e-6f) << label << " logits after the hit";
      std::vector<int32_t> hit_tokens, cold_tokens;
      for (int i = 0; i < 12; ++i) {
        hit_tokens.push_back(test::argmax_row(got, 0));
        cold_tokens.push_back(test::argmax_row(want, 0));
        got = model->forward({hit_tokens.back()}, *hit, false);
        want = model->forward({cold_tokens.back()}, *cold, false);
      }
      EXPECT_EQ(hit_tokens, cold_tokens) << label;

      GenerateOptions options;
      options.max_new_tokens = 12;
      options.sampling.temperature = 0;
      options.kv_cache_mode = mode;
      options.prefix_cache = &cache;
      std::vector<int32_t> generated;
      const GenerateStats stats =
          generate(*model, prompt, options, [&](int32_t id) { generated.push_back(id); return true; });
      EXPECT_EQ(stats.reused_prefix_tokens, 64) << label;
      EXPECT_EQ(generated, cold_tokens) << label << " generate with the prefix cache";
    }
  }
}

// B sequences on one pool decode in one forward with one attention launch and
// one K/V write per layer for the batch; up to kMaxMatvecTokens rows the
// matmuls' sums are those of one row, so the greedy tokens are each alone's.
TEST_F(PagedKvGpu, OnePoolBatchGetsItsTokensAlone) {
  for (const char* family : {"llama", "qwen3", "qwen3_moe"})
    for (bool levers_on : {true, false}) {
      const Levers levers = levers_on ? Levers::from_env() : Levers::all_off();
      auto model = load_model(fixture(family), Device::cuda, levers.load_options(Device::cuda));
      for (KvCacheMode mode : kModes)
        for (int batch : {3, 8}) {
          const test::BatchComparison c = test::compare_batch_with_alone(*model, batch, 16, /*one_pool=*/true, mode);
          for (int b = 0; b < batch; ++b)
            EXPECT_EQ(c.batched[size_t(b)], c.alone[size_t(b)])
                << family << " levers " << (levers_on ? "on" : "off") << " " << mode_name(mode) << " batch " << batch
                << " sequence " << b;
        }
    }
}

// Kernels one batched decode step launches, counted in a capture of Model::run
// (after a warm-up run, so the allocator has every size the step needs).
size_t kernels_in_step(const Model& model, const std::vector<SeqState*>& states) {
  Tensor ids = Tensor::empty({int64_t(states.size())}, DType::i32);
  for (size_t b = 0; b < states.size(); ++b) ids.data<int32_t>()[b] = int32_t(b + 1);
  const Tensor ids_dev = gpu(ids), pos = position(states.front()->length());
  for (SeqState* s : states) s->reserve(s->length() + 1);
  const std::span<SeqState* const> span(states.data(), states.size());
  model.run(ids_dev, pos, span, true);
  device_synchronize();
  return test::kernels_launched_by([&] { model.run(ids_dev, pos, span, true); });
}

// The launches of a batched decode step on one pool do not grow with the batch
// (attention and the K/V write are one launch each per layer, whatever B); on
// separate pools each sequence adds its own.
TEST_F(PagedKvGpu, OnePoolBatchLaunchCountDoesNotGrowWithTheBatch) {
  auto model = load_model(fixture("qwen3"), Device::cuda, Levers::from_env().load_options(Device::cuda));
  const std::vector<int32_t> prompt = long_prompt(12, model->info().vocab, 4);
  auto count = [&](int batch, bool one_pool) {
    auto pool = std::make_shared<BlockPool>(model->kv_layout(), batch * BlockPool::blocks_for_tokens(64));
    std::vector<std::unique_ptr<SeqState>> owned;
    std::vector<SeqState*> states;
    for (int b = 0; b < batch; ++b) {
      owned.push_back(one_pool ? std::make_unique<SeqState>(pool, 64) : model->make_state(64));
      model->forward(prompt, *owned.back(), false);
      states.push_back(owned.back().get());
    }
    return kernels_in_step(*model, states);
  };
  // Up to 4 sequences the attention also ropes and stores (lever rope_in_attention): compared within each side.
  const size_t two = count(2, true), four = count(4, true), six = count(6, true), eight = count(8, true);
  const size_t six_apart = count(6, false);
  std::printf("[ gpu      ] qwen3 fixture decode step kernels: one pool B=2 %zu, B=4 %zu, B=6 %zu, B=8 %zu; "
              "separate pools B=6 %zu\n",
              two, four, six, eight, six_apart);
  EXPECT_EQ(two, four);
  EXPECT_EQ(six, eight);
  EXPECT_GT(six_apart, six);
}

}  // namespace
}  // namespace mere

// The paged K/V ops on the CPU (ops.h KvPages, the reference of the CUDA
// kernels): rows written and read through a scrambled block table give exactly
// what a contiguous cache gives, for one sequence's tokens and for a batch whose
// rows are sequences; bad tables are refused.
#include <gtest/gtest.h>

#include "ops/ops.h"
#include "state/kv_cache.h"
#include "test_util.h"

namespace mere {
namespace {

constexpr int64_t kHeads = 4, kKvHeads = 2, kHeadDim = 64;

Tensor random_rows(int64_t rows, int64_t heads, uint64_t seed) {
  Tensor t = Tensor::empty({rows, heads, kHeadDim}, DType::f32);
  ops::fill_random(t, seed, 1.0f);
  return t;
}

Tensor position(int64_t p) {
  Tensor t = Tensor::empty({1}, DType::i32);
  t.data<int32_t>()[0] = int32_t(p);
  return t;
}

Tensor table(const std::vector<int32_t>& blocks) {
  Tensor t = Tensor::empty({int64_t(blocks.size())}, DType::i32);
  std::copy(blocks.begin(), blocks.end(), t.data<int32_t>());
  return t;
}

float diff(const Tensor& a, const Tensor& b) { return test::max_abs_diff(a, b).diff; }

class PagedKv : public ::testing::TestWithParam<KvCacheMode> {};

TEST_P(PagedKv, ScrambledTableGivesTheContiguousResult) {
  const KvCacheMode mode = GetParam();
  const int64_t S = 70;
  const Tensor k = random_rows(S, kKvHeads, 1), v = random_rows(S, kKvHeads, 2);
  KvCache contiguous(kKvHeads, kHeadDim, S, Device::cpu, mode);
  contiguous.reserve(S);
  contiguous.write(position(0), k, v);
  // Storage of 8 blocks; the sequence's 5 blocks out of order, written in two pieces across a block edge.
  KvCache storage(kKvHeads, kHeadDim, 8 * 16, Device::cpu, mode);
  storage.reserve(8 * 16);
  const ops::KvPages pages{{table({5, 2, 7, 0, 3})}};
  storage.write(position(0), k.slice_rows(0, 37), v.slice_rows(0, 37), pages);
  storage.write(position(37), k.slice_rows(37, S), v.slice_rows(37, S), pages);

  const float scale = 0.125f;
  for (int64_t T : {1, 3, 20}) {  // decode, a short step, a prefill (gathered)
    const int64_t p0 = S - T;
    const Tensor q = random_rows(T, kHeads, 10 + uint64_t(T));
    EXPECT_EQ(diff(storage.attend(q, position(p0), p0, scale, pages), contiguous.attend(q, position(p0), p0, scale)),
              0.0f)
        << kv_cache_mode_name(mode) << " T=" << T;
  }
}

TEST_P(PagedKv, BatchRowsAreSequencesEachThroughItsTable) {
  const KvCacheMode mode = GetParam();
  const int64_t L = 21, B = 3;  // each sequence holds L positions, then gets one new token
  // `storage` takes the new tokens as one batch, `reference` one sequence at a time.
  KvCache storage(kKvHeads, kHeadDim, 9 * 16, Device::cpu, mode), reference(kKvHeads, kHeadDim, 9 * 16, Device::cpu, mode);
  storage.reserve(9 * 16);
  reference.reserve(9 * 16);
  const std::vector<std::vector<int32_t>> blocks{{4, 1}, {8, 0}, {2, 6}};
  ops::KvPages batch;
  for (int64_t b = 0; b < B; ++b) {
    batch.tables.push_back(table(blocks[size_t(b)]));
    const Tensor k = random_rows(L, kKvHeads, 20 + uint64_t(b)), v = random_rows(L, kKvHeads, 30 + uint64_t(b));
    for (KvCache* c : {&storage, &reference}) c->write(position(0), k, v, ops::KvPages{{batch.tables.back()}});
  }
  const Tensor k = random_rows(B, kKvHeads, 40), v = random_rows(B, kKvHeads, 41), q = random_rows(B, kHeads, 42);
  storage.write(position(L), k, v, batch);  // row b at position L of sequence b
  const Tensor got = storage.attend(q, position(L), L, 0.125f, batch);
  for (int64_t b = 0; b < B; ++b) {
    const ops::KvPages one{{batch.tables[size_t(b)]}};
    reference.write(position(L), k.slice_rows(b, b + 1), v.slice_rows(b, b + 1), one);
    const Tensor want = reference.attend(q.slice_rows(b, b + 1), position(L), L, 0.125f, one);
    EXPECT_EQ(diff(got.slice_rows(b, b + 1), want), 0.0f) << kv_cache_mode_name(mode) << " sequence " << b;
    for (int64_t p = 0; p <= L; ++p) {  // every row of the sequence, the new one included
      const int64_t row = int64_t(blocks[size_t(b)][size_t(p / 16)]) * 16 + p % 16;
      for (bool values : {false, true})
        ASSERT_EQ(diff(storage.rows_f32(values, row, 1), reference.rows_f32(values, row, 1)), 0.0f)
            << kv_cache_mode_name(mode) << " sequence " << b << " position " << p;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, PagedKv,
                         ::testing::Values(KvCacheMode::native, KvCacheMode::bf16, KvCacheMode::affine8,
                                           KvCacheMode::affine4),
                         [](const auto& info) { return std::string(kv_cache_mode_name(info.param)); });

TEST(PagedKvOps, BadTablesAreRefused) {
  KvCache storage(kKvHeads, kHeadDim, 32, Device::cpu);
  storage.reserve(32);
  const Tensor k = random_rows(2, kKvHeads, 1);
  // A table too short for the positions, a position past the storage, a batch with the wrong table count.
  EXPECT_THROW(storage.write(position(16), k, k, ops::KvPages{{table({0})}}), Error);
  EXPECT_THROW(storage.write(position(0), k, k, ops::KvPages{{table({5})}}), Error);
  EXPECT_THROW(storage.write(position(0), k, k, ops::KvPages{{table({0}), table({1}), table({0})}}), Error);
  Tensor f32_table = Tensor::empty({1}, DType::f32);
  EXPECT_THROW(storage.write(position(0), k, k, ops::KvPages{{f32_table}}), Error);
  EXPECT_THROW(ops::gather_pages(storage.keys(), table({0}), 17), Error);
}

}  // namespace
}  // namespace mere

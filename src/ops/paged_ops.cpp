#include "ops/paged_ops.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/cuda_ops.h"

namespace mere::ops {
namespace {

std::atomic<int64_t> g_gathered_rows{0};

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

void check_table(const char* op, const Tensor& table, Device device) {
  MERE_CHECK(table.defined() && table.dtype() == DType::i32 && table.rank() == 1 && table.numel() > 0,
             "{}: a block table must be a non-empty i32 [blocks] tensor", op);
  MERE_CHECK(table.device() == device, "{}: block table on {}, cache on {}", op, device_name(table.device()),
             device_name(device));
}

// Tables on the cache's device, and one per row for a batch.
void check_pages(const char* op, const KvPages& pages, int64_t rows, Device device) {
  for (const Tensor& t : pages.tables) check_table(op, t, device);
  MERE_CHECK(!pages.per_sequence_rows() || int64_t(pages.tables.size()) == rows,
             "{}: {} block tables for {} rows (a batch has one table per row)", op, pages.tables.size(), rows);
}

int64_t host_position(const Tensor& start_pos, const char* op) {
  MERE_CHECK(start_pos.dtype() == DType::i32 && start_pos.numel() >= 1 && start_pos.device() == Device::cpu,
             "{}: position must be an i32 tensor on the CPU", op);
  return start_pos.data<int32_t>()[0];
}

// CPU: the storage row of position p through a host table.
int64_t storage_row(const Tensor& table, int64_t p, int64_t storage_rows) {
  MERE_CHECK(p >= 0 && p / kKvPageRows < table.numel(), "paged K/V: position {} is past the block table of {} blocks",
             p, table.numel());
  const int64_t row = int64_t(table.data<int32_t>()[p / kKvPageRows]) * kKvPageRows + p % kKvPageRows;
  MERE_CHECK(row >= 0 && row < storage_rows, "paged K/V: position {} maps to row {} of a storage of {} rows", p, row,
             storage_rows);
  return row;
}

// CPU: the table and position of row r of q, k, v.
struct RowAt {
  const Tensor& table;
  int64_t pos;
};
RowAt row_at(const KvPages& pages, int64_t pos0, int64_t r) {
  return pages.per_sequence_rows() ? RowAt{pages.tables[size_t(r)], pos0} : RowAt{pages.tables[0], pos0 + r};
}

AffineRows gather_affine(const AffineRows& rows, const Tensor& table, int64_t n) {
  return {gather_pages(rows.codes, table, n), gather_pages(rows.scales, table, n), gather_pages(rows.biases, table, n),
          rows.bits};
}

// CPU attention reads f32 rows.
Tensor as_f32(const Tensor& t) { return t.dtype() == DType::f32 ? t : t.to(DType::f32); }

// The CPU reference of a paged attention at the device-form position: per
// sequence, its visible rows gathered, then the contiguous op.
template <typename Rows, typename Gather>
Tensor attention_gathered(const Tensor& q, const Rows& k, const Rows& v, int64_t pos0, float scale,
                          const KvPages& pages, Gather gather) {
  if (!pages.per_sequence_rows()) {
    const int64_t n = pos0 + q.dim(0);
    return attention(q, gather(k, pages.tables[0], n), gather(v, pages.tables[0], n), pos0, scale);
  }
  Tensor out = Tensor::empty(q.shape(), DType::f32, q.device());
  for (int64_t b = 0; b < q.dim(0); ++b) {
    const Tensor& table = pages.tables[size_t(b)];
    Tensor row = out.slice_rows(b, b + 1);
    convert_into(attention(q.slice_rows(b, b + 1), gather(k, table, pos0 + 1), gather(v, table, pos0 + 1), pos0,
                           scale),
                 row);
  }
  return out;
}

Tensor gather_dense_f32(const Tensor& storage, const Tensor& table, int64_t n) {
  return as_f32(gather_pages(storage, table, n));
}

// q (and k) of a batch rotated at one position for every row: viewed as one
// token whose heads are every row's heads.
void rope_rows(Tensor& x, const Tensor& start_pos, const RopeTable& table, bool per_sequence_rows) {
  if (!per_sequence_rows) return rope(x, start_pos, table);
  Tensor one = x.reshape({1, -1, x.dim(2)});
  rope(one, start_pos, table);
}

template <typename Cache>
void compose_qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                const Tensor& k_norm, float eps, const RopeTable& table, const Tensor& start_pos,
                                Cache& k_cache, Cache& v_cache, const KvPages& pages) {
  Tensor kk = k.clone();
  if (q_norm.defined()) {
    Tensor qn = rms_norm(q, q_norm, eps);
    copy_bytes(q.raw(), q.device(), qn.raw(), qn.device(), q.size_bytes());
    kk = rms_norm(k, k_norm, eps);
  }
  rope_rows(q, start_pos, table, pages.per_sequence_rows());
  rope_rows(kk, start_pos, table, pages.per_sequence_rows());
  store_rows(kk, k_cache, start_pos, pages);
  store_rows(v, v_cache, start_pos, pages);
}

}  // namespace

Tensor gather_pages(const Tensor& storage, const Tensor& table, int64_t n) {
  MERE_CHECK(storage.rank() >= 1 && storage.dim(0) > 0, "gather_pages: storage {} has no rows",
             shape_str(storage.shape()));
  check_table("gather_pages", table, storage.device());
  MERE_CHECK(n >= 0 && (n + kKvPageRows - 1) / kKvPageRows <= table.numel(),
             "gather_pages: {} positions need {} blocks, the table has {}", n, (n + kKvPageRows - 1) / kKvPageRows,
             table.numel());
  Shape shape = storage.shape();
  shape[0] = n;
  Tensor out = Tensor::empty(shape, storage.dtype(), storage.device());
  g_gathered_rows += n;
  const size_t row_bytes = storage.size_bytes() / size_t(storage.dim(0));
  switch (storage.device()) {
    case Device::cpu: {
      // The rows checked here (a bad table throws), copied across the threads.
      std::vector<int64_t> rows(static_cast<size_t>(n));
      for (int64_t p = 0; p < n; ++p) rows[size_t(p)] = storage_row(table, p, storage.dim(0));
      parallel_for(n, std::max<int64_t>(1, (int64_t(1) << 16) / int64_t(row_bytes)), [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p)
          std::memcpy(static_cast<char*>(out.raw()) + size_t(p) * row_bytes,
                      static_cast<const char*>(storage.raw()) + size_t(rows[size_t(p)]) * row_bytes, row_bytes);
      });
      break;
    }
    case Device::cuda: cuda::gather_pages(storage, table, n, out); break;
  }
  return out;
}

int64_t gathered_page_rows() { return g_gathered_rows.load(); }

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale, const KvPages& pages) {
  if (!pages.paged()) return attention(q, k, v, pos0, scale);
  MERE_CHECK(pages.tables.size() == 1, "attention: a host position takes one sequence's table, got {}",
             pages.tables.size());
  check_pages("attention", pages, q.dim(0), k.device());
  const int64_t n = pos0 + q.dim(0);
  const Tensor kg = gather_pages(k, pages.tables[0], n), vg = gather_pages(v, pages.tables[0], n);
  if (q.device() == Device::cpu) return attention(q, as_f32(kg), as_f32(vg), pos0, scale);
  return attention(q, kg, vg, pos0, scale);
}

Tensor attention(const Tensor& q, const AffineRows& k, const AffineRows& v, int64_t pos0, float scale,
                 const KvPages& pages) {
  if (!pages.paged()) return attention(q, k, v, pos0, scale);
  MERE_CHECK(pages.tables.size() == 1, "attention: a host position takes one sequence's table, got {}",
             pages.tables.size());
  check_pages("attention", pages, q.dim(0), k.device());
  const int64_t n = pos0 + q.dim(0);
  return attention(q, gather_affine(k, pages.tables[0], n), gather_affine(v, pages.tables[0], n), pos0, scale);
}

namespace paged {

void store_rows(const Tensor& src, Tensor& dst, const Tensor& start_pos, const KvPages& pages) {
  check_pages("store_rows", pages, src.dim(0), dst.device());
  if (src.device() == Device::cuda) return cuda::store_rows(src, dst, start_pos, pages);
  const int64_t p0 = host_position(start_pos, "store_rows");
  for (int64_t r = 0; r < src.dim(0); ++r) {
    const RowAt at = row_at(pages, p0, r);
    const int64_t row = storage_row(at.table, at.pos, dst.dim(0));
    Tensor d = dst.slice_rows(row, row + 1);
    cpu::convert(src.slice_rows(r, r + 1), d);
  }
}

void store_rows(const Tensor& x, AffineRows& dst, const Tensor& start_pos, const KvPages& pages) {
  check_pages("store_rows", pages, x.dim(0), dst.device());
  if (x.device() == Device::cuda) return cuda::store_rows(x, dst, start_pos, pages);
  const int64_t p0 = host_position(start_pos, "store_rows");
  for (int64_t r = 0; r < x.dim(0); ++r) {
    const RowAt at = row_at(pages, p0, r);
    cpu::store_rows(x.slice_rows(r, r + 1), dst, storage_row(at.table, at.pos, dst.rows()));
  }
}

namespace {

// Dense or affine caches alike: the fused kernel on CUDA, the composition on the CPU.
template <typename Cache>
void rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm, float eps,
                const RopeTable& rope, const Tensor& start_pos, Cache& k_cache, Cache& v_cache, const KvPages& pages) {
  check_pages("qk_norm_rope_store", pages, q.dim(0), k_cache.device());
  if (q.device() == Device::cuda)
    return cuda::qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, rope, start_pos, k_cache, v_cache, pages);
  compose_qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, rope, start_pos, k_cache, v_cache, pages);
}

}  // namespace

void qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                        float eps, const RopeTable& rope, const Tensor& start_pos, Tensor& k_cache, Tensor& v_cache,
                        const KvPages& pages) {
  rope_store(q, k, v, q_norm, k_norm, eps, rope, start_pos, k_cache, v_cache, pages);
}

void qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                        float eps, const RopeTable& rope, const Tensor& start_pos, AffineRows& k_cache,
                        AffineRows& v_cache, const KvPages& pages) {
  rope_store(q, k, v, q_norm, k_norm, eps, rope, start_pos, k_cache, v_cache, pages);
}

namespace {

// Dense or affine rows alike: the CPU gathers each sequence's rows (`gather`) for
// the contiguous reference, CUDA reads through the tables.
template <typename Rows, typename Gather>
Tensor attend(const Tensor& q, const Rows& k, const Rows& v, const Tensor& start_pos, float scale,
              const KvPages& pages, Gather gather) {
  check_pages("attention", pages, q.dim(0), k.device());
  if (q.device() == Device::cpu)
    return attention_gathered(q, k, v, host_position(start_pos, "attention"), scale, pages, gather);
  Tensor out = Tensor::empty(q.shape(), DType::f32, q.device());
  cuda::attention(q, k, v, start_pos, scale, out, pages);
  return out;
}

}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& start_pos, float scale,
                 const KvPages& pages) {
  return attend(q, k, v, start_pos, scale, pages, gather_dense_f32);
}

Tensor attention(const Tensor& q, const AffineRows& k, const AffineRows& v, const Tensor& start_pos, float scale,
                 const KvPages& pages) {
  return attend(q, k, v, start_pos, scale, pages, gather_affine);
}

bool attention_unmerged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& start_pos, float scale,
                        const KvPages& pages, AttentionSplits& out) {
  check_pages("attention", pages, q.dim(0), k.device());
  return cuda::attention_unmerged(q, k, v, start_pos, scale, pages, out);
}

bool attention_unmerged(const Tensor& q, const AffineRows& k, const AffineRows& v, const Tensor& start_pos,
                        float scale, const KvPages& pages, AttentionSplits& out) {
  check_pages("attention", pages, q.dim(0), k.device());
  return cuda::attention_unmerged(q, k, v, start_pos, scale, pages, out);
}

bool rope_in_attention_unmerged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                const Tensor& k_norm, float eps, const RopeTable& rope, const Tensor& start_pos,
                                Tensor& k_cache, Tensor& v_cache, float scale, const KvPages& pages,
                                AttentionSplits& out) {
  check_pages("rope_in_attention", pages, q.dim(0), k_cache.device());
  return cuda::rope_in_attention_unmerged(q, k, v, q_norm, k_norm, eps, rope, start_pos, k_cache, v_cache, scale,
                                          pages, out);
}

}  // namespace paged
}  // namespace mere::ops

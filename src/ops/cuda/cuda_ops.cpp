// The Tensor-level CUDA ops behind ops.h: unpack tensors, pick the kernel,
// check the launch. Prefill matmuls go through cuBLASLt here. A build without
// the CUDA backend gets stubs (no tensor can be on the GPU there).
#include "ops/cuda/cuda_ops.h"

#ifdef MERE_HAVE_CUDA


#include <algorithm>

#include "core/cuda_check.h"
#include "ops/cuda/affine_launchers.h"
#include "ops/cuda/cublaslt.h"
#include "ops/cuda/launchers.h"
#include "ops/cuda/moe_launchers.h"

namespace mere::ops::cuda {
namespace {

using namespace mere::cuda;

cudaStream_t stream() { return static_cast<cudaStream_t>(cuda_stream()); }

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

// Y[T, out] (row-major) = X[T, in] W[out, in]^T. Column-major, that is
// Y^T[out, T] = op_T(W as [in, out]) x X as [in, T]. f32 accumulation; f32
// weights use plain FP32 (no TF32) so they match the CPU reference.
// y [T, out] f32 = x [T, in] w^T (x in w's dtype), or with accumulate y += it
// (beta 1: the epilogue adds the f32 product into y, the values a separate add stores).
void gemm(const Tensor& x, const Tensor& w, float* y, bool accumulate = false) {
  const int64_t T = x.dim(0), in = x.dim(1), n_out = w.dim(0);
  cudaDataType_t ab = cuda_type(w.dtype());
  cublasLtMatmulDesc_t desc;
  MERE_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  MERE_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)));
  MERE_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans)));
  cublasLtMatrixLayout_t a, b, c;
  MERE_CUBLAS(cublasLtMatrixLayoutCreate(&a, ab, in, n_out, in));
  MERE_CUBLAS(cublasLtMatrixLayoutCreate(&b, ab, in, T, in));
  MERE_CUBLAS(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, n_out, T, n_out));
  cublasLtMatmulPreference_t pref;
  MERE_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspaceBytes;
  MERE_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t heuristic;
  int found = 0;
  MERE_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt_handle(), desc, a, b, c, c, pref, 1, &heuristic, &found));
  MERE_CHECK(found > 0, "cuBLASLt found no algorithm for [{}, {}] x [{}, {}]^T", T, in, n_out, in);
  float alpha = 1, beta = accumulate ? 1.0f : 0.0f;
  MERE_CUBLAS(cublasLtMatmul(lt_handle(), desc, &alpha, w.raw(), a, x.raw(), b, &beta, y, c, y, c,
                             &heuristic.algo, lt_workspace(), ws, stream()));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(c);
  cublasLtMatmulDescDestroy(desc);
}

Tensor upload_ints(const std::vector<int32_t>& values) {
  Tensor host = Tensor::empty({int64_t(values.size())}, DType::i32);
  std::copy(values.begin(), values.end(), host.data<int32_t>());
  return host.to_device(Device::cuda);
}

// The decode matvec applies: few rows, and 16-byte aligned rows of x and w.
bool matvec_applies(int64_t T, const Tensor& x, const Tensor& w) {
  const int64_t in = w.dim(1);
  return T <= kMaxMatvecTokens && (in * int64_t(dtype_size(w.dtype()))) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w.raw()) % 16 == 0 && reinterpret_cast<uintptr_t>(x.raw()) % 16 == 0;
}

MatvecArgs matvec_args(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  MERE_CHECK(!bias.defined() || bias.dtype() == DType::f32, "linear (CUDA): bias must be f32, got {}",
             dtype_name(bias.dtype()));
  MatvecArgs a;
  a.x = x.data<float>();
  a.w = w.raw();
  a.w_dtype = w.dtype();
  a.bias = bias.defined() ? bias.data<float>() : nullptr;
  a.y = out.data<float>();
  a.T = out.dim(0);
  a.in = w.dim(1);
  a.out = w.dim(0);
  return a;
}

}  // namespace

cublasLtHandle_t lt_handle() {
  static cublasLtHandle_t h = [] {
    cublasLtHandle_t created;
    MERE_CUBLAS(cublasLtCreate(&created));
    return created;
  }();
  return h;
}

void* lt_workspace() {
  static void* p = device_alloc(kWorkspaceBytes);
  return p;
}

void embed(const Tensor& table, const std::vector<int32_t>& ids, Tensor& out) {
  Tensor ids_dev = upload_ints(ids);
  embed(table, ids_dev, out);
}

void embed(const Tensor& table, const Tensor& ids, Tensor& out) {
  MERE_CUDA(launch_embed(table.raw(), table.dtype(), ids.data<int32_t>(), ids.numel(), table.dim(1),
                         out.data<float>(), stream()));
}

namespace {

// The block tables of rows [begin, end) of a batch, or the one sequence's table,
// as the kernels take them (none: a contiguous cache).
KvTables kv_tables(const KvPages& pages, int64_t begin, int64_t end) {
  KvTables t;
  t.rows_are_sequences = pages.per_sequence_rows();
  if (!pages.paged()) return t;
  if (!t.rows_are_sequences) {
    t.table[0] = pages.tables[0].data<int32_t>();
    return t;
  }
  MERE_ASSERT(end - begin <= kMaxPagedSequences);
  for (int64_t b = begin; b < end; ++b) t.table[b - begin] = pages.tables[size_t(b)].data<int32_t>();
  return t;
}

// fn(begin, end, tables) over the rows of a launch: all of them, or a batch's
// sequences in chunks of at most kMaxPagedSequences.
template <typename Fn>
void for_each_launch(const KvPages& pages, int64_t rows, Fn&& fn) {
  if (!pages.per_sequence_rows()) return fn(int64_t(0), rows, kv_tables(pages, 0, 1));
  for (int64_t b = 0; b < rows; b += kMaxPagedSequences) {
    const int64_t e = std::min<int64_t>(rows, b + kMaxPagedSequences);
    fn(b, e, kv_tables(pages, b, e));
  }
}

// Splits of a graph-captured attention over the longest a sequence can grow
// (its table, or the contiguous cache's rows).
int graph_splits(int64_t cache_rows, const KvPages& pages, int64_t kv_heads) {
  int64_t keys = cache_rows;
  if (pages.paged()) {
    keys = 0;
    for (const Tensor& t : pages.tables) keys = std::max(keys, t.numel() * kKvPageRows);
  }
  return attention_splits(keys, kv_heads);
}

}  // namespace

void store_rows(const Tensor& src, Tensor& dst, const Tensor& start_pos, const KvPages& pages) {
  const int64_t row = src.numel() / src.dim(0);
  for_each_launch(pages, src.dim(0), [&](int64_t b, int64_t e, const KvTables& tables) {
    MERE_CUDA(launch_store_rows(src.data<float>() + b * row, dst.raw(), dst.dtype(), start_pos.data<int32_t>(), e - b,
                                row, tables, stream()));
  });
}

void gather_pages(const Tensor& storage, const Tensor& table, int64_t n, Tensor& out) {
  MERE_CUDA(launch_gather_pages(storage.raw(), out.raw(), int64_t(storage.size_bytes() / size_t(storage.dim(0))),
                                table.data<int32_t>(), n, stream()));
}

void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  int64_t d = x.dim(-1);
  MERE_CUDA(launch_rms_norm(x.data<float>(), w.raw(), w.dtype(), out.data<float>(), x.numel() / d, d, eps, stream()));
}

bool dense_gemm_forms_input(const Tensor& w, int64_t T) {
  return formed_gemm_input_enabled() && T > kMaxMatvecTokens && (w.dtype() == DType::bf16 || w.dtype() == DType::f16);
}

bool formed_dense_linear(const MmaInput& input, int64_t T, const Tensor& w, const Tensor& bias, float* y,
                         bool accumulate) {
  const DType dt = w.dtype();
  if (!dense_gemm_forms_input(w, T) || (accumulate && bias.defined())) return false;
  const int64_t in = w.dim(1);
  Tensor x = Tensor::empty({T, in}, dt, Device::cuda);
  switch (input.kind) {
    case MmaInput::Kind::plain:
      MERE_CUDA(launch_convert(input.x, DType::f32, x.raw(), dt, T * in, stream()));
      break;
    case MmaInput::Kind::rms_normed:
      if (input.norm_dtype != DType::f32 && input.norm_dtype != DType::bf16 && input.norm_dtype != DType::f16)
        return false;
      MERE_CUDA(launch_rms_norm_as(input.x, input.norm_w, input.norm_dtype, x.raw(), dt, T, in, input.eps, stream()));
      break;
    case MmaInput::Kind::silu_gated:
      MERE_CUDA(launch_silu_mul_halves(input.x, x.raw(), dt, T, in, stream()));
      break;
    default: return false;  // attention's splits: merged first
  }
  gemm(x, w, y, accumulate);
  if (bias.defined()) MERE_CUDA(launch_add_bias(y, bias.data<float>(), T, w.dim(0), stream()));
  return true;
}

bool rms_norm_linear(const Tensor& h, const Tensor& norm_w, float eps, const Tensor& w, const Tensor& bias,
                     Tensor& out) {
  const MmaInput formed{.kind = MmaInput::Kind::rms_normed, .x = h.data<float>(), .norm_w = norm_w.raw(),
                        .norm_dtype = norm_w.dtype(), .eps = eps};
  if (formed_dense_linear(formed, h.dim(0), w, bias, out.data<float>(), false)) return true;
  if (!matvec_applies(h.dim(0), h, w) || norm_w.dtype() != w.dtype() || reinterpret_cast<uintptr_t>(norm_w.raw()) % 16)
    return false;
  MatvecArgs a = matvec_args(h, w, bias, out);
  a.input = MatvecInput::rms_normed;
  a.norm_w = norm_w.raw();
  a.eps = eps;
  MERE_CUDA(launch_matvec(a, stream()));
  return true;
}

bool linear_add(Tensor& h, const Tensor& x, const Tensor& w, const Tensor& bias) {
  if (formed_dense_linear(MmaInput{.x = x.data<float>()}, x.dim(0), w, bias, h.data<float>(), true)) return true;
  if (!matvec_applies(x.dim(0), x, w)) return false;
  MatvecArgs a = matvec_args(x, w, bias, h);
  a.accumulate = true;
  MERE_CUDA(launch_matvec(a, stream()));
  return true;
}

bool swiglu_linear_add(Tensor& h, const Tensor& gate_up, const Tensor& w, const Tensor& bias) {
  const MmaInput formed{.kind = MmaInput::Kind::silu_gated, .x = gate_up.data<float>()};
  if (formed_dense_linear(formed, gate_up.dim(0), w, bias, h.data<float>(), true)) return true;
  if (!matvec_applies(gate_up.dim(0), gate_up, w)) return false;
  MatvecArgs a = matvec_args(gate_up, w, bias, h);
  a.input = MatvecInput::silu_gated;
  a.accumulate = true;
  MERE_CUDA(launch_matvec(a, stream()));
  return true;
}

void linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  const int64_t T = x.dim(0), n_out = w.dim(0);
  MatvecArgs a = matvec_args(x, w, bias, out);
  if (matvec_applies(T, x, w)) {
    MERE_CUDA(launch_matvec(a, stream()));
    return;
  }
  const float* b = a.bias;
  Tensor xw = x;  // tensor cores take both operands in the weight's dtype
  if (w.dtype() != DType::f32) {
    xw = Tensor::empty(x.shape(), w.dtype(), Device::cuda);
    MERE_CUDA(launch_convert(x.raw(), DType::f32, xw.raw(), w.dtype(), x.numel(), stream()));
  }
  gemm(xw, w, out.data<float>());
  if (b) MERE_CUDA(launch_add_bias(out.data<float>(), b, T, n_out, stream()));
}

bool swiglu_linear(const Tensor& gate_up, const Tensor& w, const Tensor& bias, Tensor& out) {
  const int64_t T = gate_up.dim(0);
  if (w.dtype() != DType::bf16 && w.dtype() != DType::f16) return false;
  if (matvec_applies(T, gate_up, w)) return false;
  // The GEMM's input formed in the weight's dtype: what silu_mul_halves then
  // linear's conversion store, without the f32 activations between them.
  Tensor act = Tensor::empty({T, w.dim(1)}, w.dtype(), Device::cuda);
  silu_mul_halves(gate_up, act);
  gemm(act, w, out.data<float>());
  if (bias.defined()) MERE_CUDA(launch_add_bias(out.data<float>(), bias.data<float>(), T, w.dim(0), stream()));
  return true;
}

void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  MERE_CUDA(launch_silu_mul(gate.data<float>(), up.data<float>(), out.data<float>(), gate.numel(), stream()));
}

void add_inplace(Tensor& h, const Tensor& x) {
  MERE_CUDA(launch_add(h.data<float>(), x.data<float>(), h.numel(), stream()));
}

void silu_mul_halves(const Tensor& gate_up, Tensor& out) {
  MERE_CUDA(launch_silu_mul_halves(gate_up.data<float>(), out.raw(), out.dtype(), out.dim(0), out.dim(1), stream()));
}

void split_columns(const Tensor& x, std::vector<Tensor>& parts) {
  MERE_CHECK(x.dtype() == DType::f32, "split_columns (CUDA): f32 only, got {}", dtype_name(x.dtype()));
  MERE_CHECK(parts.size() <= size_t(ColumnParts::kMax), "split_columns (CUDA): {} parts, at most {}", parts.size(),
             ColumnParts::kMax);
  ColumnParts launch;
  int64_t end = 0;
  for (Tensor& part : parts) {
    launch.dst[launch.count] = part.data<float>();
    end += part.dim(1);
    launch.end[launch.count++] = end;
  }
  MERE_CUDA(launch_split_columns(x.data<float>(), x.dim(0), x.dim(1), launch, stream()));
}

void add_rms_norm(Tensor& h, const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  int64_t d = h.dim(-1);
  MERE_CUDA(launch_add_rms_norm(h.data<float>(), x.data<float>(), w.raw(), w.dtype(), out.data<float>(),
                                h.numel() / d, d, eps, stream()));
}

void convert(const Tensor& src, Tensor& dst) {
  MERE_CUDA(launch_convert(src.raw(), src.dtype(), dst.raw(), dst.dtype(), src.numel(), stream()));
}

void fill_random(Tensor& t, uint64_t seed, float scale, float offset) {
  MERE_CUDA(launch_fill_random(t.raw(), t.dtype(), t.numel(), seed, scale, offset, stream()));
}

namespace {

RopeParams rope_params(const RopeTable& table) {
  RopeParams p{};
  p.half = int(table.inv_freq.size());
  MERE_CHECK(p.half <= kMaxRopeHalf, "rope (CUDA): rotary dim {} exceeds {}", 2 * p.half, 2 * kMaxRopeHalf);
  std::copy(table.inv_freq.begin(), table.inv_freq.end(), p.inv_freq);
  p.attention_factor = table.attention_factor;
  p.interleaved = table.interleaved;
  return p;
}

}  // namespace

void rope(Tensor& x, const Tensor& start_pos, const RopeTable& table) {
  MERE_CUDA(launch_rope(x.data<float>(), nullptr, start_pos.data<int32_t>(), 0, x.dim(0), x.dim(1), x.dim(2),
                        rope_params(table), stream()));
}

void qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                        float eps, const RopeTable& rope, const Tensor& start_pos, Tensor& k_cache, Tensor& v_cache,
                        const KvPages& pages) {
  const RopeParams params = rope_params(rope);
  for_each_launch(pages, q.dim(0), [&](int64_t b, int64_t e, const KvTables& tables) {
    Tensor qb = q.slice_rows(b, e);
    MERE_CUDA(launch_qk_norm_rope_store(qb.data<float>(), k.slice_rows(b, e).data<float>(),
                                        v.slice_rows(b, e).data<float>(), q_norm.defined() ? q_norm.raw() : nullptr,
                                        k_norm.defined() ? k_norm.raw() : nullptr,
                                        q_norm.defined() ? q_norm.dtype() : DType::f32, eps, params,
                                        start_pos.data<int32_t>(), k_cache.raw(), v_cache.raw(), k_cache.dtype(),
                                        int(e - b), int(q.dim(1)), int(k.dim(1)), int(q.dim(2)), tables, stream()));
  });
}

void rope(Tensor& x, const std::vector<int32_t>& positions, const RopeTable& table) {
  RopeParams p = rope_params(table);
  // Consecutive positions (every forward today) need no upload.
  bool consecutive = true;
  for (size_t t = 1; t < positions.size(); ++t) consecutive &= positions[t] == positions[0] + int32_t(t);
  Tensor pos_dev = consecutive ? Tensor() : upload_ints(positions);
  MERE_CUDA(launch_rope(x.data<float>(), consecutive ? nullptr : pos_dev.data<int32_t>(), nullptr,
                        positions.empty() ? 0 : positions[0], x.dim(0), x.dim(1), x.dim(2), p, stream()));
}

namespace {

// Prefill over a bf16 cache goes to the tensor-core kernel; decode, other cache
// dtypes and other head_dims to split-K flash decoding.
bool flash_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v) {
  auto aligned = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0; };
  return q.dim(0) >= kFlashAttentionMinTokens && k.dtype() == DType::bf16 && v.dtype() == DType::bf16 &&
         flash_attention_supports(int(q.dim(2))) && aligned(q) && aligned(k) && aligned(v);
}

void check_head_dim(int64_t head_dim) {
  MERE_CHECK(head_dim <= kMaxAttentionHeadDim, "attention (CUDA): head_dim {} exceeds {}", head_dim,
             kMaxAttentionHeadDim);
}

// Split-K's partials for T rows of n_heads heads.
AttentionSplits empty_splits(int64_t T, int64_t n_heads, int splits, int64_t head_dim) {
  return {Tensor::empty({T, n_heads, splits}, DType::f32, Device::cuda),
          Tensor::empty({T, n_heads, splits}, DType::f32, Device::cuda),
          Tensor::empty({T, n_heads, splits, head_dim}, DType::f32, Device::cuda), Tensor()};
}

}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale, Tensor& out) {
  const int T = int(q.dim(0)), n_heads = int(q.dim(1)), head_dim = int(q.dim(2));
  check_head_dim(head_dim);
  if (flash_attention_applies(q, k, v)) {
    MERE_CUDA(launch_flash_attention(q.data<float>(), k.raw(), v.raw(), out.data<float>(), T, n_heads, int(k.dim(1)),
                                     head_dim, nullptr, pos0, scale, stream()));
    return;
  }
  AttentionSplits s = empty_splits(T, n_heads, attention_splits(pos0 + T, k.dim(1)), head_dim);
  MERE_CUDA(launch_attention(q.data<float>(), k.raw(), v.raw(), k.dtype(), s.max.data<float>(), s.sum.data<float>(),
                             s.out.data<float>(), out.data<float>(), T, n_heads, int(k.dim(1)), head_dim, nullptr,
                             pos0, int(s.max.dim(2)), scale, KvTables{}, stream()));
}

namespace {

// Whether decode attention of T rows over this cache merges its splits in
// clusters (lever cluster_attention_merge): one launch, the wide form's few splits.
bool merges_in_clusters(int64_t T, int64_t n_heads, const Tensor& k_cache, const Tensor& v_cache, int splits,
                        bool saves_merge_kernel) {
  return T <= kMaxPagedSequences &&
         attention_merges_in_clusters(int(T), int(n_heads), int(k_cache.dim(1)), int(k_cache.dim(2)),
                                      k_cache.dtype(), k_cache.raw(), v_cache.raw(), splits, saves_merge_kernel);
}

// Rows [b, e) of a partials or output tensor, or null where it is not there
// (merged in clusters: no partials; else no output).
float* rows_of(const Tensor& t, int64_t b, int64_t e) {
  return t.defined() ? t.slice_rows(b, e).data<float>() : nullptr;
}

// The most splits a launch over these rows writes (AttentionSplits::live).
int written_splits(const KvPages& pages, int64_t T, int64_t n_heads, const Tensor& k_cache, const Tensor& v_cache,
                   int splits) {
  int most = 0;
  for_each_launch(pages, T, [&](int64_t b, int64_t e, const KvTables&) {
    most = std::max(most, attention_written_splits(int(e - b), int(n_heads), int(k_cache.dim(1)),
                                                   int(k_cache.dim(2)), k_cache.dtype(), k_cache.raw(),
                                                   v_cache.raw(), splits));
  });
  return most;
}

// Allocates out's partials for a launch, or its output where the splits merge in
// clusters; the caller's merged_by_kernel stays as it said.
void allocate_splits(AttentionSplits& out, int64_t T, int64_t n_heads, int splits, int64_t head_dim, bool merged) {
  const bool by_kernel = out.merged_by_kernel;
  if (merged) {
    out = AttentionSplits{};
    out.merged = Tensor::empty({T, n_heads, head_dim}, DType::f32, Device::cuda);
  } else {
    out = empty_splits(T, n_heads, splits, head_dim);
  }
  out.merged_by_kernel = by_kernel;
}

// The split-K graph form over a dense cache (contiguous or through the tables):
// its partials into s, merged into out unless out is null; s.merged, where
// defined, takes the output of splits merged in clusters instead.
void split_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& start_pos, float scale,
                     const KvPages& pages, const AttentionSplits& s, float* out, int splits) {
  const int n_heads = int(q.dim(1)), head_dim = int(q.dim(2));
  const bool merged = s.merged.defined();
  for_each_launch(pages, q.dim(0), [&](int64_t b, int64_t e, const KvTables& tables) {
    MERE_CUDA(launch_attention(q.slice_rows(b, e).data<float>(), k.raw(), v.raw(), k.dtype(), rows_of(s.max, b, e),
                               rows_of(s.sum, b, e), rows_of(s.out, b, e),
                               out && !merged ? out + b * n_heads * head_dim : nullptr, int(e - b), n_heads,
                               int(k.dim(1)), head_dim, start_pos.data<int32_t>(), 0, splits, scale, tables, stream(),
                               rows_of(s.merged, b, e)));
  });
}

}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& start_pos, float scale, Tensor& out,
               const KvPages& pages) {
  const int T = int(q.dim(0)), n_heads = int(q.dim(1)), head_dim = int(q.dim(2));
  check_head_dim(head_dim);
  // Paged: split-K through the tables (a prefill gathers first: ops/paged_ops.cpp).
  if (!pages.paged() && flash_attention_applies(q, k, v)) {
    MERE_CUDA(launch_flash_attention(q.data<float>(), k.raw(), v.raw(), out.data<float>(), T, n_heads, int(k.dim(1)),
                                     head_dim, start_pos.data<int32_t>(), 0, scale, stream()));
    return;
  }
  // The split count is fixed at capture: enough shares of the whole cache to keep
  // every SM busy at long contexts, at most 64 so short ones waste few blocks.
  const int splits = graph_splits(k.dim(0), pages, k.dim(1));
  if (merges_in_clusters(T, n_heads, k, v, splits, /*saves_merge_kernel=*/true)) {
    AttentionSplits s;
    s.merged = out;
    split_attention(q, k, v, start_pos, scale, pages, s, nullptr, splits);
    return;
  }
  split_attention(q, k, v, start_pos, scale, pages, empty_splits(T, n_heads, splits, head_dim), out.data<float>(),
                  splits);
}

bool attention_unmerged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& start_pos, float scale,
                        const KvPages& pages, AttentionSplits& out) {
  check_head_dim(q.dim(2));
  if (!pages.paged() && flash_attention_applies(q, k, v)) return false;
  const int splits = graph_splits(k.dim(0), pages, k.dim(1));
  const bool merged = merges_in_clusters(q.dim(0), q.dim(1), k, v, splits, out.merged_by_kernel);
  allocate_splits(out, q.dim(0), q.dim(1), splits, q.dim(2), merged);
  if (!merged) out.live = written_splits(pages, q.dim(0), q.dim(1), k, v, splits);
  split_attention(q, k, v, start_pos, scale, pages, out, nullptr, splits);
  return true;
}

bool rope_in_attention_unmerged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                const Tensor& k_norm, float eps, const RopeTable& rope, const Tensor& start_pos,
                                Tensor& k_cache, Tensor& v_cache, float scale, const KvPages& pages,
                                AttentionSplits& out) {
  const int64_t T = q.dim(0), n_heads = q.dim(1), n_kv_heads = k.dim(1), head_dim = q.dim(2);
  const bool one_token_a_row = T == 1 || pages.per_sequence_rows();
  auto float_dtype = [](DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; };
  const bool norms_fit =
      !q_norm.defined() || (k_norm.defined() && k_norm.dtype() == q_norm.dtype() && float_dtype(q_norm.dtype()));
  const bool rotation_fits = 2 * int64_t(rope.inv_freq.size()) <= head_dim;  // the kernel's angle table
  const int splits = graph_splits(k_cache.dim(0), pages, n_kv_heads);
  if (!rope_in_attention_enabled() || !one_token_a_row || !norms_fit || !rotation_fits ||
      k_cache.dtype() != v_cache.dtype() ||
      !rope_in_attention_supports(int(head_dim), int(n_heads), int(n_kv_heads), k_cache.dtype(), k_cache.raw(),
                                  v_cache.raw()) ||
      !rope_in_attention_takes_rows(int(T), int(n_heads), int(n_kv_heads), splits))
    return false;
  const RopeParams params = rope_params(rope);
  const bool merged = merges_in_clusters(T, n_heads, k_cache, v_cache, splits, out.merged_by_kernel);
  allocate_splits(out, T, n_heads, splits, head_dim, merged);
  if (!merged) out.live = written_splits(pages, T, n_heads, k_cache, v_cache, splits);
  for_each_launch(pages, T, [&](int64_t b, int64_t e, const KvTables& tables) {
    const FreshRows fresh{q.slice_rows(b, e).data<float>(),
                          k.slice_rows(b, e).data<float>(),
                          v.slice_rows(b, e).data<float>(),
                          q_norm.defined() ? q_norm.raw() : nullptr,
                          k_norm.defined() ? k_norm.raw() : nullptr,
                          q_norm.defined() ? q_norm.dtype() : DType::f32,
                          eps,
                          k_cache.raw(),
                          v_cache.raw()};
    MERE_CUDA(launch_rope_in_attention(fresh, params, k_cache.dtype(), rows_of(out.max, b, e),
                                       rows_of(out.sum, b, e), rows_of(out.out, b, e), int(e - b), int(n_heads),
                                       int(n_kv_heads), int(head_dim), start_pos.data<int32_t>(), splits, scale,
                                       tables, stream(), rows_of(out.merged, b, e)));
  });
  return true;
}

void merge_attention(const AttentionSplits& s, Tensor& out) {
  MERE_CUDA(launch_attention_merge(s.max.data<float>(), s.sum.data<float>(), s.out.data<float>(), out.data<float>(),
                                   int(s.out.dim(0)), int(s.out.dim(1)), int(s.out.dim(3)), int(s.out.dim(2)),
                                   stream()));
}

static_assert(mere::cuda::kKvQuantGroup == ops::kKvQuantGroup);

namespace {

AffineKv affine_kv(const AffineRows& k, const AffineRows& v) {
  return {k.codes.raw(), v.codes.raw(), k.scales.raw(), k.biases.raw(), v.scales.raw(), v.biases.raw(), k.bits};
}

// Split-K over a quantized cache: the partials into s, merged into out unless
// out is null.
void attention_affine(const Tensor& q, const AffineRows& k, const AffineRows& v, const int32_t* pos_dev,
                      int64_t pos0, float scale, const AttentionSplits& s, float* out, const KvPages& pages = {}) {
  const int n_heads = int(q.dim(1)), head_dim = int(q.dim(2)), splits = int(s.max.dim(2));
  MERE_CHECK(attention_affine_supports(head_dim),
             "attention (CUDA) over a quantized cache: head_dim {} must be a multiple of 8, at most {}", head_dim,
             kMaxAttentionHeadDim);
  for_each_launch(pages, q.dim(0), [&](int64_t b, int64_t e, const KvTables& tables) {
    MERE_CUDA(launch_attention_affine(q.slice_rows(b, e).data<float>(), affine_kv(k, v),
                                      s.max.slice_rows(b, e).data<float>(), s.sum.slice_rows(b, e).data<float>(),
                                      s.out.slice_rows(b, e).data<float>(),
                                      out ? out + b * n_heads * head_dim : nullptr, int(e - b), n_heads,
                                      int(k.heads()), head_dim, pos_dev, pos0, splits, scale, tables, stream()));
  });
}

}  // namespace

void store_rows(const Tensor& x, AffineRows& dst, const Tensor& start_pos, const KvPages& pages) {
  for_each_launch(pages, x.dim(0), [&](int64_t b, int64_t e, const KvTables& tables) {
    MERE_CUDA(launch_store_rows_affine(x.slice_rows(b, e).data<float>(), dst.codes.raw(), dst.scales.raw(),
                                       dst.biases.raw(), dst.bits, start_pos.data<int32_t>(), int(e - b),
                                       int(x.dim(1)), int(x.dim(2)), tables, stream()));
  });
}

void dequantize_rows(const AffineRows& src, int64_t n, Tensor& dst) {
  MERE_CUDA(launch_dequantize_rows(src.codes.raw(), src.scales.raw(), src.biases.raw(), src.bits, dst.raw(), n,
                                   int(src.heads()), int(src.head_dim()), stream()));
}

void attention(const Tensor& q, const AffineRows& k, const AffineRows& v, const Tensor& start_pos, float scale,
               Tensor& out, const KvPages& pages) {
  // As the dense graph form: the split count fixed by the reserved rows (or the tables).
  const AttentionSplits s = empty_splits(q.dim(0), q.dim(1), graph_splits(k.rows(), pages, k.heads()), q.dim(2));
  attention_affine(q, k, v, start_pos.data<int32_t>(), 0, scale, s, out.data<float>(), pages);
}

bool attention_unmerged(const Tensor& q, const AffineRows& k, const AffineRows& v, const Tensor& start_pos,
                        float scale, const KvPages& pages, AttentionSplits& out) {
  out = empty_splits(q.dim(0), q.dim(1), graph_splits(k.rows(), pages, k.heads()), q.dim(2));
  attention_affine(q, k, v, start_pos.data<int32_t>(), 0, scale, out, nullptr, pages);
  return true;
}

void attention(const Tensor& q, const AffineRows& k, const AffineRows& v, int64_t pos0, float scale, Tensor& out) {
  const AttentionSplits s = empty_splits(q.dim(0), q.dim(1), attention_splits(pos0 + q.dim(0), k.heads()), q.dim(2));
  attention_affine(q, k, v, nullptr, pos0, scale, s, out.data<float>());
}

void qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                        float eps, const RopeTable& rope, const Tensor& start_pos, AffineRows& k_cache,
                        AffineRows& v_cache, const KvPages& pages) {
  const AffineKvOut cache{k_cache.codes.raw(),  v_cache.codes.raw(),  k_cache.scales.raw(), k_cache.biases.raw(),
                          v_cache.scales.raw(), v_cache.biases.raw(), k_cache.bits};
  const RopeParams params = rope_params(rope);
  for_each_launch(pages, q.dim(0), [&](int64_t b, int64_t e, const KvTables& tables) {
    Tensor qb = q.slice_rows(b, e);
    MERE_CUDA(launch_qk_norm_rope_store_affine(qb.data<float>(), k.slice_rows(b, e).data<float>(),
                                               v.slice_rows(b, e).data<float>(),
                                               q_norm.defined() ? q_norm.raw() : nullptr,
                                               k_norm.defined() ? k_norm.raw() : nullptr,
                                               q_norm.defined() ? q_norm.dtype() : DType::f32, eps, params,
                                               start_pos.data<int32_t>(), cache, int(e - b), int(q.dim(1)),
                                               int(k.dim(1)), int(q.dim(2)), tables, stream()));
  });
}

void set_launch_settings(const LaunchSettings& settings) {
  mere::cuda::set_programmatic_launch(settings.programmatic);
  mere::cuda::set_matvec_split_k(settings.matvec_split_k);
  mere::cuda::set_fp8_activation_gemm(settings.fp8_activation_gemm);
  mere::cuda::set_int8_activation_matvec(settings.int8_activation_matvec);
  mere::cuda::set_tensor_core_kv_attention(settings.tensor_core_kv_attention);
  mere::cuda::set_tensor_core_attention(settings.tensor_core_attention);
  mere::cuda::set_rope_in_attention(settings.rope_in_attention);
  mere::cuda::set_wide_attention_blocks(settings.wide_attention_blocks);
  mere::cuda::set_cluster_attention_merge(settings.cluster_attention_merge);
  mere::cuda::set_tensor_core_affine_matvec(settings.tensor_core_affine_matvec);
  mere::cuda::set_int16_activation_matvec(settings.int16_activation_matvec);
  mere::cuda::set_sixteen_token_matvec(settings.sixteen_token_matvec);
  mere::cuda::set_sixteen_token_experts(settings.sixteen_token_experts);
  mere::cuda::set_tensor_core_fp8_matvec(settings.tensor_core_fp8_matvec);
  mere::cuda::set_tensor_core_moe_matvec(settings.tensor_core_moe_matvec);
  mere::cuda::set_routing_in_experts(settings.routing_in_experts);
  mere::cuda::set_deep_moe_ring(settings.deep_moe_ring);
  mere::cuda::set_deep_dense_ring(settings.deep_dense_ring);
  mere::cuda::set_wide_batch_stages(settings.wide_batch_stages);
  mere::cuda::set_uneven_row_cuts(settings.uneven_row_cuts);
  mere::cuda::set_int4_byte_codes(settings.int4_byte_codes);
  mere::cuda::set_streamed_weights(settings.streamed_weights);
  mere::cuda::set_tensor_core_affine_gemm(settings.tensor_core_affine_gemm, settings.affine_gemm_at_every_size);
  mere::cuda::set_tensor_core_affine_moe_gemm(settings.tensor_core_affine_moe_gemm);
  mere::cuda::set_tensor_core_dense_moe_gemm(settings.tensor_core_dense_moe_gemm);
  mere::cuda::set_tensor_core_fp8_gemm(settings.tensor_core_fp8_gemm);
  mere::cuda::set_grouped_swiglu_epilogue(settings.grouped_swiglu_epilogue);
  mere::cuda::set_formed_gemm_input(settings.formed_gemm_input);
  mere::cuda::set_split_sum_kernel(settings.split_sum_kernel);
}

void set_decode_keys(int64_t keys) { mere::cuda::set_decode_keys(keys); }
void set_cached_rows_final(bool final) { mere::cuda::set_cached_rows_final(final); }

KeyCountRange decode_keys_range() {
  KeyCountRange range;
  mere::cuda::decode_keys_range(range.lo, range.hi);
  return range;
}

void fill_random_bytes(Tensor& t, uint64_t seed, uint8_t mask) {
  MERE_CUDA(launch_fill_random_bytes(t.raw(), int64_t(t.size_bytes()), seed, mask, stream()));
}

void advance_position(Tensor& pos, int32_t by) { MERE_CUDA(launch_advance_position(pos.data<int32_t>(), by, stream())); }
void advance_position(Tensor& pos, int32_t by, const Tensor& tokens, int32_t* host_ring, int64_t slots) {
  MERE_CUDA(launch_advance_position_and_publish(pos.data<int32_t>(), by, tokens.data<int32_t>(), host_ring,
                                                int32_t(tokens.numel()), int32_t(slots), stream()));
}

}  // namespace mere::ops::cuda

#else  // no CUDA backend: unreachable, since no tensor can live on the GPU

namespace mere::ops::cuda {
namespace {
[[noreturn]] void no_cuda() { fail("this binary was built without the CUDA backend"); }
}  // namespace

void embed(const Tensor&, const std::vector<int32_t>&, Tensor&) { no_cuda(); }
void rms_norm(const Tensor&, const Tensor&, float, Tensor&) { no_cuda(); }
void linear(const Tensor&, const Tensor&, const Tensor&, Tensor&) { no_cuda(); }
void silu_mul(const Tensor&, const Tensor&, Tensor&) { no_cuda(); }
void add_inplace(Tensor&, const Tensor&) { no_cuda(); }
void rope(Tensor&, const std::vector<int32_t>&, const RopeTable&) { no_cuda(); }
void attention(const Tensor&, const Tensor&, const Tensor&, int64_t, float, Tensor&) { no_cuda(); }
void convert(const Tensor&, Tensor&) { no_cuda(); }
void silu_mul_halves(const Tensor&, Tensor&) { no_cuda(); }
void split_columns(const Tensor&, std::vector<Tensor>&) { no_cuda(); }
void add_rms_norm(Tensor&, const Tensor&, const Tensor&, float, Tensor&) { no_cuda(); }
void embed(const Tensor&, const Tensor&, Tensor&) { no_cuda(); }
void rope(Tensor&, const Tensor&, const RopeTable&) { no_cuda(); }
void attention(const Tensor&, const Tensor&, const Tensor&, const Tensor&, float, Tensor&, const KvPages&) {
  no_cuda();
}
void store_rows(const Tensor&, Tensor&, const Tensor&, const KvPages&) { no_cuda(); }
void qk_norm_rope_store(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float, const RopeTable&,
                        const Tensor&, Tensor&, Tensor&, const KvPages&) {
  no_cuda();
}
void gather_pages(const Tensor&, const Tensor&, int64_t, Tensor&) { no_cuda(); }
void fill_random(Tensor&, uint64_t, float, float) { no_cuda(); }
void store_rows(const Tensor&, AffineRows&, const Tensor&, const KvPages&) { no_cuda(); }
void dequantize_rows(const AffineRows&, int64_t, Tensor&) { no_cuda(); }
void attention(const Tensor&, const AffineRows&, const AffineRows&, const Tensor&, float, Tensor&, const KvPages&) {
  no_cuda();
}
void attention(const Tensor&, const AffineRows&, const AffineRows&, int64_t, float, Tensor&) { no_cuda(); }
void qk_norm_rope_store(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float, const RopeTable&,
                        const Tensor&, AffineRows&, AffineRows&, const KvPages&) {
  no_cuda();
}
bool rms_norm_linear(const Tensor&, const Tensor&, float, const Tensor&, const Tensor&, Tensor&) { no_cuda(); }
bool linear_add(Tensor&, const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
bool swiglu_linear_add(Tensor&, const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
bool swiglu_linear(const Tensor&, const Tensor&, const Tensor&, Tensor&) { no_cuda(); }
bool dense_gemm_forms_input(const Tensor&, int64_t) { return false; }
bool formed_dense_linear(const mere::cuda::MmaInput&, int64_t, const Tensor&, const Tensor&, float*, bool) { no_cuda(); }
void set_launch_settings(const LaunchSettings&) {}  // nothing launches
void set_decode_keys(int64_t) {}
void set_cached_rows_final(bool) {}
KeyCountRange decode_keys_range() { return {}; }
void advance_position(Tensor&, int32_t) { no_cuda(); }
void advance_position(Tensor&, int32_t, const Tensor&, int32_t*, int64_t) { no_cuda(); }
void fill_random_bytes(Tensor&, uint64_t, uint8_t) { no_cuda(); }
bool attention_unmerged(const Tensor&, const Tensor&, const Tensor&, const Tensor&, float, const KvPages&,
                        AttentionSplits&) {
  no_cuda();
}
bool attention_unmerged(const Tensor&, const AffineRows&, const AffineRows&, const Tensor&, float, const KvPages&,
                        AttentionSplits&) {
  no_cuda();
}
void merge_attention(const AttentionSplits&, Tensor&) { no_cuda(); }
bool rope_in_attention_unmerged(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float,
                                const RopeTable&, const Tensor&, Tensor&, Tensor&, float, const KvPages&,
                                AttentionSplits&) {
  no_cuda();
}

}  // namespace mere::ops::cuda

#endif

// The sampling kernel: one cluster of 8 blocks x 1024 threads (a Hopper thread
// block cluster). Block r keeps logits [r * chunk, (r + 1) * chunk) in shared
// memory and thread t of it the contiguous ids [t * per, (t + 1) * per) of that
// chunk, so global memory is read once; each block's sums reach the others
// through distributed shared memory, one cluster barrier per exchange.
//   1. penalties and the first maximum (greedy stops here);
//   2. z = (logit - max) * (1 / T) in place, the same float operations as Sampler;
//   3. top-k: radix select of the k-th largest z (up to 8 rounds of 4 bits,
//      counting; per-thread digit histograms in shared memory), then the id at
//      which ties stop being kept;
//   4. top-p: the same select, summing exp(z) over the top-k set;
//   5. min-p and the draw: a prefix sum (double) of each thread's kept weight
//      finds the thread holding u * total, which walks its ids in order.
// Every block computes the cluster-wide results in the same order, so all agree bit for bit.
// A batch of rows is a grid of clusters: blockIdx.y picks the row (its logits,
// presence flags, draw counter and output), the clusters never talk to each other.
#include <cooperative_groups.h>

#include <climits>
#include <cmath>

#include "sampling/device_sampler.h"

namespace mere::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kBlocks = 8;
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kDigits = 16;  // radix 2^4
constexpr unsigned kAll = 0xffffffffu;

struct Shared {
  double warp_part[kWarps][kDigits];
  double slot[2][kDigits];  // this block's digit sums, read by the cluster (two, alternating by exchange)
  double warp_total[kWarps], warp_offset[kWarps];
  int warp_count[kWarps], warp_count_offset[kWarps];
  float warp_best[kWarps];
  int warp_best_id[kWarps];
  float block_best;  // read by the cluster
  int block_best_id;
  float max_logit;
  int max_id;
  uint32_t prefix;  // radix select: the key bits chosen so far,
  double above;     // the count or mass above them,
  double bucket;    // and within them;
  int done;         // set when the select may stop early
  int tie_count, tie_cut, tie_offset, cut;
  float u;  // this draw's uniform
  double block_total, block_offset, target;
};

// Float order as unsigned order.
__device__ __forceinline__ uint32_t order_key(float v) {
  uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ bool in_top_k(uint32_t key, int64_t id, uint32_t k_key, int tie_cut) {
  return key > k_key || (key == k_key && id < tie_cut);
}

__device__ __forceinline__ void keep_better(float& v, int& id, float other, int other_id) {
  if (other > v || (other == v && other_id < id)) {
    v = other;
    id = other_id;
  }
}

// Sampler's philox_uniform: Philox 4x32-10, counter {draw, draw >> 32, 0, 0}, key seed.
__device__ float device_uniform(uint64_t seed, uint64_t draw) {
  uint32_t c0 = uint32_t(draw), c1 = uint32_t(draw >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return float(c0 >> 8) * (1.0f / 16777216.0f);
}

// Sampler's penalised_logit, rounding step for rounding step.
__device__ float penalised(float logit, float repetition, float presence) {
  double l = logit;
  if (repetition != 1.0f) l = l > 0 ? __ddiv_rn(l, double(repetition)) : __dmul_rn(l, double(repetition));
  return __double2float_rn(__dsub_rn(l, double(presence)));
}

// Sums each lane's 16 digit values (load(q)) over the warp by halving: at each
// step a lane keeps the half that its partner gives away. The first step adds
// two per-thread sums in f32, the rest is f64. Lane L ends with digit L >> 1.
template <typename Load>
__device__ __forceinline__ double warp_sum_digits(Load load) {
  const int lane = threadIdx.x & 31;
  const bool upper = lane & 16;
  double v[kDigits / 2];
#pragma unroll
  for (int i = 0; i < kDigits / 2; ++i) {
    const float give = load(upper ? i : i + kDigits / 2), keep = load(upper ? i + kDigits / 2 : i);
    v[i] = double(keep + __shfl_xor_sync(kAll, give, 16));
  }
#pragma unroll
  for (int half = kDigits / 4, o = 8; half > 0; half >>= 1, o >>= 1) {
    const bool up = lane & o;
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const double give = up ? v[i] : v[i + half];
      const double keep = up ? v[i + half] : v[i];
      v[i] = keep + __shfl_xor_sync(kAll, give, o);
    }
  }
  return v[0] + __shfl_xor_sync(kAll, v[0], 1);
}

// Radix select over the cluster: the largest key t with F(key >= t) >= target,
// F counting tokens (kMass false; target = goal) or summing exp(z) over the
// top-k set (kMass true; target = goal * the set's total). Only digits where F
// is positive are taken, so t is a key present with positive F. Leaves t in
// s.prefix, F(key > t) in s.above and F(key == t) in s.bucket. Counting stops
// early once the chosen digit completes the count exactly (then t is the lowest
// key of that digit, perhaps absent, and keys >= t are exactly `target` tokens).
// hist: this block's per-thread digit sums, [kDigits][kThreads] (f32: at most `per` terms each).
template <bool kMass>
__device__ void radix_select(Shared& s, float* hist, const float* zt, int n, int64_t first, uint32_t k_key,
                             int tie_cut, double goal, int& exchanges) {
  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  uint32_t prefix = 0;
  double above = 0, target = goal;
  for (int round = 0; round < 8; ++round) {
    const int shift = 28 - 4 * round;
    const uint32_t high = round == 0 ? 0u : ~0u << (shift + 4);
#pragma unroll
    for (int q = 0; q < kDigits; ++q) hist[q * kThreads + tid] = 0.0f;
    for (int j = 0; j < n; ++j) {
      const float v = zt[j];
      const uint32_t key = order_key(v);
      if ((key & high) != prefix) continue;
      if (kMass && !in_top_k(key, first + j, k_key, tie_cut)) continue;
      hist[((key >> shift) & (kDigits - 1)) * kThreads + tid] += kMass ? expf(v) : 1.0f;
    }
    const double sum = warp_sum_digits([&](int q) { return hist[q * kThreads + tid]; });
    if ((lane & 1) == 0) s.warp_part[warp][lane >> 1] = sum;
    __syncthreads();
    // A slot is rewritten two exchanges later, after a cluster barrier that
    // every reader of its last contents has passed.
    double* slot = s.slot[exchanges++ & 1];
    if (warp == 0) {  // lane L: digit L >> 1 over half of the warps, then both halves
      double half = 0;
#pragma unroll
      for (int w = 0; w < kWarps / 2; ++w) half += s.warp_part[(lane & 1) * (kWarps / 2) + w][lane >> 1];
      const double block = half + __shfl_xor_sync(kAll, half, 1);
      if ((lane & 1) == 0) slot[lane >> 1] = block;
    }
    cluster.sync();
    if (warp == 0) {
      double g = 0;  // lane q: F of the bucket's tokens with digit q, over the cluster
      if (lane < kDigits) {
#pragma unroll
        for (int r = 0; r < kBlocks; ++r) g += cluster.map_shared_rank(slot, r)[lane];
      }
      const double digit = g;
      for (int o = 1; o < kDigits; o <<= 1) {  // g: F of digits >= lane
        const double y = __shfl_down_sync(kAll, g, o);
        if (lane + o < kDigits) g += y;
      }
      if (kMass && round == 0) target = goal * __shfl_sync(kAll, g, 0);
      // The highest non-empty digit that reaches the target; if rounding lets none
      // reach it, the lowest non-empty one (the whole bucket is kept).
      const unsigned filled = __ballot_sync(kAll, lane < kDigits && digit > 0);
      const unsigned ok = __ballot_sync(kAll, lane < kDigits && digit > 0 && above + g >= target);
      const int d = ok ? 31 - __clz(int(ok)) : filled ? __ffs(int(filled)) - 1 : 0;
      const double g_digit = __shfl_sync(kAll, digit, d), g_next = __shfl_sync(kAll, g, d + 1);
      if (lane == 0) {
        s.prefix = prefix | (uint32_t(d) << shift);
        s.above = above + (d + 1 < kDigits ? g_next : 0.0);
        s.bucket = g_digit;
        s.done = !kMass && s.above + g_digit == target;
      }
    }
    __syncthreads();
    if (s.done) break;
    prefix = s.prefix;
    above = s.above;
  }
}

// The id of tie number `need` (counting from 0 in id order) among the tokens
// whose key is k_key: the first tie that top-k drops.
__device__ int tie_cut_id(Shared& s, const float* zt, int n, int64_t first, uint32_t k_key, int need, int rank) {
  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int count = 0;
  for (int j = 0; j < n; ++j) count += order_key(zt[j]) == k_key;
  int incl = count;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kAll, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) s.warp_count[warp] = incl;
  __syncthreads();
  if (tid == 0) {
    int acc = 0;
    for (int w = 0; w < kWarps; ++w) {
      s.warp_count_offset[w] = acc;
      acc += s.warp_count[w];
    }
    s.tie_count = acc;
    s.tie_cut = INT_MAX;
  }
  cluster.sync();
  if (tid == 0) {
    int offset = 0;
    for (int r = 0; r < rank; ++r) offset += cluster.map_shared_rank(&s, r)->tie_count;
    s.tie_offset = offset;
  }
  __syncthreads();
  const int excl = s.tie_offset + s.warp_count_offset[warp] + incl - count;
  if (excl <= need && need < excl + count) {
    int seen = excl;
    for (int j = 0; j < n; ++j) {
      if (order_key(zt[j]) != k_key) continue;
      if (seen++ == need) {
        s.tie_cut = int(first + j);
        break;
      }
    }
  }
  cluster.sync();
  if (tid == 0) {
    int cut = INT_MAX;
    for (int r = 0; r < kBlocks; ++r) cut = min(cut, cluster.map_shared_rank(&s, r)->tie_cut);
    s.cut = cut;
  }
  __syncthreads();
  return s.cut;
}

__global__ void __cluster_dims__(kBlocks, 1, 1) __launch_bounds__(kThreads, 1) sample_kernel(SampleArgs a) {
  const int64_t row = blockIdx.y;
  a.logits += row * a.vocab;
  a.present += row * a.vocab;
  a.draws += row;
  a.out_id += row;
  extern __shared__ float z[];  // this block's logits, then its z; then the radix histograms
  __shared__ Shared s;
  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rank = int(cluster.block_rank());
  const SamplingParams& p = a.params;
  const int64_t chunk = int64_t(a.per_thread) * kThreads, base = rank * chunk;
  const int64_t first = base + int64_t(tid) * a.per_thread;  // this thread's first id
  const int n = first >= a.vocab ? 0 : a.vocab - first < a.per_thread ? int(a.vocab - first) : a.per_thread;
  float* zt = z + int64_t(tid) * a.per_thread;
  float* hist = z + chunk;

  // 1. Load (coalesced), penalise, find the first maximum.
  const bool penalize = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f;
  if (tid == 0) s.u = device_uniform(p.seed, *a.draws);  // early: the counter's latency hides behind the load
  float best = -INFINITY;
  int best_id = INT_MAX;
  for (int64_t e = tid; e < chunk; e += kThreads) {
    const int64_t id = base + e;
    float v = -INFINITY;
    if (id < a.vocab) {
      v = a.logits[id];
      if (penalize && a.present[id]) v = penalised(v, p.repetition_penalty, p.presence_penalty);
      if (v > best || best_id == INT_MAX) {
        best = v;
        best_id = int(id);
      }
    }
    z[e] = v;
  }
  for (int o = 16; o > 0; o >>= 1)
    keep_better(best, best_id, __shfl_xor_sync(kAll, best, o), __shfl_xor_sync(kAll, best_id, o));
  if (lane == 0) {
    s.warp_best[warp] = best;
    s.warp_best_id[warp] = best_id;
  }
  __syncthreads();
  if (warp == 0) {
    best = s.warp_best[lane];
    best_id = s.warp_best_id[lane];
    for (int o = 16; o > 0; o >>= 1)
      keep_better(best, best_id, __shfl_xor_sync(kAll, best, o), __shfl_xor_sync(kAll, best_id, o));
    if (lane == 0) {
      s.block_best = best;
      s.block_best_id = best_id;
    }
  }
  cluster.sync();
  if (warp == 0) {
    best = -INFINITY;
    best_id = INT_MAX;
    if (lane < kBlocks) {
      const Shared* other = cluster.map_shared_rank(&s, lane);
      best = other->block_best;
      best_id = other->block_best_id;
    }
    for (int o = 16; o > 0; o >>= 1)
      keep_better(best, best_id, __shfl_xor_sync(kAll, best, o), __shfl_xor_sync(kAll, best_id, o));
    if (lane == 0) {
      s.max_logit = best;
      s.max_id = best_id;
    }
  }
  __syncthreads();

  if (p.temperature <= 0.0f) {
    if (rank == 0 && tid == 0) {
      *a.out_id = s.max_id;
      a.present[s.max_id] = 1;
    }
    cluster.sync();  // no block leaves while another may still read its shared memory
    return;
  }

  // 2. z, in this thread's own ids from here on.
  const float max_logit = s.max_logit, inv_t = __fdiv_rn(1.0f, p.temperature);
  for (int j = 0; j < n; ++j) zt[j] = __fmul_rn(__fsub_rn(zt[j], max_logit), inv_t);

  // 3. top-k: keys above k_key, and ties at k_key below id tie_cut.
  uint32_t k_key = 0;
  int tie_cut = INT_MAX, exchanges = 0;
  if (p.top_k > 0 && p.top_k < a.vocab) {
    radix_select<false>(s, hist, zt, n, first, 0, INT_MAX, double(p.top_k), exchanges);
    k_key = s.prefix;
    const int need = p.top_k - int(s.above), ties = int(s.bucket);
    if (ties > need) tie_cut = tie_cut_id(s, zt, n, first, k_key, need, rank);
  }

  // 4. top-p: keys at or above p_key.
  uint32_t p_key = 0;
  if (p.top_p < 1.0f) {
    radix_select<true>(s, hist, zt, n, first, k_key, tie_cut, double(p.top_p), exchanges);
    p_key = s.prefix;
  }

  // 5. min-p, then the draw. Thread t holds [lo, hi) of the kept weight, with
  // the bounds computed so that one thread's hi is bit for bit the next one's lo.
  auto weight = [&](int j) {
    const float v = zt[j];
    const uint32_t key = order_key(v);
    if (!in_top_k(key, first + j, k_key, tie_cut) || key < p_key) return 0.0f;
    const float w = expf(v);
    return w >= p.min_p ? w : 0.0f;
  };
  double mass = 0;
  for (int j = 0; j < n; ++j) mass += weight(j);
  double incl = mass;
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(kAll, incl, o);
    if (lane >= o) incl += y;
  }
  double excl = __shfl_up_sync(kAll, incl, 1);
  if (lane == 0) excl = 0;
  if (lane == 31) s.warp_total[warp] = incl;
  __syncthreads();
  if (tid == 0) {
    double acc = 0;
    for (int w = 0; w < kWarps; ++w) {
      s.warp_offset[w] = acc;
      acc += s.warp_total[w];
    }
    s.block_total = acc;
  }
  cluster.sync();
  if (tid == 0) {
    double acc = 0, mine = 0;
    for (int r = 0; r < kBlocks; ++r) {
      if (r == rank) mine = acc;
      acc += cluster.map_shared_rank(&s, r)->block_total;
    }
    s.block_offset = mine;
    s.target = double(s.u) * acc;
  }
  __syncthreads();
  const double target = s.target;
  const double lo = s.block_offset + (s.warp_offset[warp] + excl);
  const double hi = s.block_offset + (s.warp_offset[warp] + incl);
  if (lo <= target && target < hi) {
    double acc = lo;
    int pick = -1;
    for (int j = 0; j < n; ++j) {
      const float w = weight(j);
      if (w == 0.0f) continue;
      acc += w;
      pick = int(first + j);
      if (acc > target) break;
    }
    *a.out_id = pick;
    a.present[pick] = 1;
  }
  cluster.sync();  // every block has read *draws and finished reading the others' shared memory
  if (rank == 0 && tid == 0) ++*a.draws;
}

// Dynamic shared memory: the block's logits and the radix histograms.
size_t shared_bytes(int per_thread) { return (size_t(per_thread) + kDigits) * kThreads * sizeof(float); }

int max_dynamic_shared_bytes() {
  int device = 0, optin = 0;
  cudaFuncAttributes attributes;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
      cudaFuncGetAttributes(&attributes, sample_kernel) != cudaSuccess)
    return -1;
  return optin - int(attributes.sharedSizeBytes);
}

}  // namespace

cudaError_t prepare_sample_kernel(int64_t vocab, int* per_thread) {
  *per_thread = 0;
  const int max_bytes = max_dynamic_shared_bytes();
  if (max_bytes < 0) return cudaGetLastError();
  // An odd count per thread keeps a warp's 32 strided reads in 32 different banks.
  const int64_t per = ((vocab + kBlocks * kThreads - 1) / (kBlocks * kThreads)) | 1;
  if (shared_bytes(int(per)) > size_t(max_bytes)) return cudaSuccess;
  // The limit goes to the largest any vocab may need, so samplers of other sizes keep working.
  cudaError_t err = cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_bytes);
  if (err == cudaSuccess) *per_thread = int(per);
  return err;
}

cudaError_t launch_sample(const SampleArgs& args, cudaStream_t stream) {
  sample_kernel<<<dim3(kBlocks, unsigned(args.rows)), kThreads, shared_bytes(args.per_thread), stream>>>(args);
  return cudaGetLastError();
}

}  // namespace mere::cuda

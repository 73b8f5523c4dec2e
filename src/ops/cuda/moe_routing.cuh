// How a router's logits choose one token's experts, by one block: the routing
// kernel's body (moe.cu), and under lever routing_in_experts the first thing
// each block of the tensor-core experts' gate/up does (affine_matvec_mma.cu,
// fp8_matvec_mma.cu: routed_block below),
// there by each warp alone where routes_in_a_warp (route_slot_in_warp), so
// that all give the same ids and weights bit for bit.
#pragma once

#include <climits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/matvec_tiles.cuh"
#include "ops/cuda/moe_launchers.h"
#include "ops/cuda/phase_probe.cuh"

namespace mere::cuda {

// (v, i) becomes (ov, oi) when that is better: larger, or equal with a lower index.
__device__ __forceinline__ void keep_better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// The warp's best (value, index); every lane ends with the same pair.
__device__ __forceinline__ void warp_best(float& v, int& i) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, offset);
    const int oi = __shfl_xor_sync(0xffffffffu, i, offset);
    keep_better(v, i, ov, oi);
  }
}

// Shared memory rank_experts needs for E experts: scores, picks and group
// scores (f32), the groups' kept flags (rounded to 16 bytes), then the k chosen
// experts' ids and scores, and the experts' partial ranks (two parts at most).
__host__ __device__ constexpr int routing_chosen_offset(int E) { return 3 * E * 4 + (E + 15) / 16 * 16; }
__host__ __device__ constexpr int routing_scratch_bytes(int E) { return routing_chosen_offset(E) + 2 * 32 * 4 + 2 * E * 4; }
struct RoutingScratch {
  float *score, *pick, *group_score;
  bool* kept;
  int* chosen;           // [32]: the k chosen experts, best first
  float* chosen_score;   // [32]: their scores
  int* partial_rank;     // [2][E]
  __device__ RoutingScratch(void* base, int E) {
    score = static_cast<float*>(base);
    pick = score + E;
    group_score = pick + E;
    kept = reinterpret_cast<bool*>(group_score + E);
    chosen = reinterpret_cast<int*>(static_cast<uint8_t*>(base) + routing_chosen_offset(E));
    chosen_score = reinterpret_cast<float*>(chosen + 32);
    partial_rank = reinterpret_cast<int*>(chosen_score + 32);
  }
};
constexpr int kRouteThreads = 256;  // the routing kernel's block

// Token t's k experts, best first (larger picks, ties to the lower index), into
// the scratch's `chosen` and `chosen_score`. Every thread of the block calls it
// (a multiple of 32 of them); `scratch` is routing_scratch_bytes(a.E) of shared
// memory, 16-byte aligned; it ends with a barrier. Warp 0 computes the scores in
// the same order whatever the block's size, so every caller gets the same bits;
// then each expert's rank among the picks is counted, by two threads each where
// the block has twice as many threads as experts (8 rounds of a warp's argmax
// took 2.4 us at k = 8).
__device__ __forceinline__ void rank_experts(const MoeRouteArgs& a, int64_t t, const RoutingScratch& s) {
  const int lane = threadIdx.x % 32, E = a.E;
  if (threadIdx.x < 32) {
    const float* logits = a.logits + t * E;
    if (a.sigmoid) {
      for (int e = lane; e < E; e += 32) s.score[e] = 1.0f / (1.0f + expf(-logits[e]));
    } else {
      float m = -INFINITY;
      for (int e = lane; e < E; e += 32) m = fmaxf(m, logits[e]);
      m = warp_max(m);
      float sum = 0;
      for (int e = lane; e < E; e += 32) sum += s.score[e] = expf(logits[e] - m);
      sum = warp_sum(sum);
      for (int e = lane; e < E; e += 32) s.score[e] /= sum;
    }
    // A NaN score is chosen last, so that the ids always name experts.
    for (int e = lane; e < E; e += 32) {
      const float p = s.score[e] + (a.correction ? a.correction[e] : 0.0f);
      s.pick[e] = isnan(p) ? -INFINITY : p;
    }
    __syncwarp();
    if (a.n_groups > 1) {  // a group scores the sum of its two best; experts outside the best groups drop out
      const int G = E / a.n_groups;
      for (int g = lane; g < a.n_groups; g += 32) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int e = g * G; e < (g + 1) * G; ++e) {
          if (s.pick[e] > b1) {
            b2 = b1;
            b1 = s.pick[e];
          } else if (s.pick[e] > b2) {
            b2 = s.pick[e];
          }
        }
        s.group_score[g] = G > 1 ? b1 + b2 : b1;
        s.kept[g] = false;
      }
      __syncwarp();
      for (int r = 0; r < a.top_groups; ++r) {
        float v = -INFINITY;
        int i = INT_MAX;
        for (int g = lane; g < a.n_groups; g += 32)
          if (!s.kept[g]) keep_better(v, i, s.group_score[g], g);
        warp_best(v, i);
        if (lane == 0) s.kept[i] = true;
        __syncwarp();
      }
      for (int e = lane; e < E; e += 32)
        if (!s.kept[e / G]) s.pick[e] = -INFINITY;
    }
  }
  __syncthreads();
  PHASE_MARK(1);  // scored
  // Expert e's rank: the experts that come before it; the k first are chosen.
  const int parts = int(blockDim.x) >= 2 * E && E % 8 == 0 ? 2 : 1, span = E / parts;
  for (int i = threadIdx.x; i < parts * E; i += blockDim.x) {
    const int e = i % E, part = i / E, begin = part * span, end = begin + span;
    const float v = s.pick[e];
    int rank = 0, o = begin;
    if (span % 4 == 0)
      for (; o < end; o += 4) {
        const float4 q = *reinterpret_cast<const float4*>(s.pick + o);
        rank += (q.x > v || (q.x == v && o < e)) + (q.y > v || (q.y == v && o + 1 < e)) +
                (q.z > v || (q.z == v && o + 2 < e)) + (q.w > v || (q.w == v && o + 3 < e));
      }
    for (; o < end; ++o) rank += s.pick[o] > v || (s.pick[o] == v && o < e);
    if (parts == 1) {
      if (rank < a.k) s.chosen[rank] = e, s.chosen_score[rank] = s.score[e];
    } else {
      s.partial_rank[i] = rank;
    }
  }
  __syncthreads();
  PHASE_MARK(2);  // counted
  if (parts == 1) return;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const int rank = s.partial_rank[e] + s.partial_rank[E + e];
    if (rank < a.k) s.chosen[rank] = e, s.chosen_score[rank] = s.score[e];
  }
  __syncthreads();
}

// Routing by one warp alone, where routes_in_a_warp (moe_launchers.h): each
// warp of a gate/up block computes its slot's expert with no barrier, so that
// it issues its first weight stages sooner (docs/benchmarks.md, forty-second
// session), the scores in registers with warp 0's arithmetic above (the same
// bits). Every chosen expert's pick is at least the k-th largest of the lanes'
// best picks (k lanes hold one that large), and an expert at or above that
// bound has the same rank among those experts as among all, since every expert
// before it is one of them; so only they are ranked (usually about k, all E
// at worst), in their index order. The warp's own shared memory it works in:
constexpr int kWarpRoutingBytes = (3 * kWarpRoutedExperts + 2 * 32) * 4;

// Slot `slot`'s expert of token t, and (with_weight) its routing weight as
// chosen_weight gives it.
__device__ __forceinline__ void route_slot_in_warp(const MoeRouteArgs& a, int64_t t, int slot, void* warp_scratch,
                                                   bool with_weight, int& expert, float& weight) {
  constexpr int kLanePicks = kWarpRoutedExperts / 32;
  const int lane = threadIdx.x % 32, picks = a.E / 32;
  const float* logits = a.logits + t * a.E;
  float score[kLanePicks], pick[kLanePicks];  // expert lane + 32 j
#pragma unroll
  for (int j = 0; j < kLanePicks; ++j) score[j] = j < picks ? logits[lane + 32 * j] : 0.0f;
  if (a.sigmoid) {
#pragma unroll
    for (int j = 0; j < kLanePicks; ++j)
      if (j < picks) score[j] = 1.0f / (1.0f + expf(-score[j]));
  } else {
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < kLanePicks; ++j)
      if (j < picks) m = fmaxf(m, score[j]);
    m = warp_max(m);
    PHASE_MARK(7);  // max
    float sum = 0;
#pragma unroll
    for (int j = 0; j < kLanePicks; ++j)
      if (j < picks) sum += score[j] = expf(score[j] - m);
    sum = warp_sum(sum);
#pragma unroll
    for (int j = 0; j < kLanePicks; ++j)
      if (j < picks) score[j] /= sum;
  }
  float best = -INFINITY;
#pragma unroll
  for (int j = 0; j < kLanePicks; ++j) {
    const float p = j < picks ? score[j] + (a.correction ? a.correction[lane + 32 * j] : 0.0f) : -INFINITY;
    pick[j] = isnan(p) ? -INFINITY : p;
    best = fmaxf(best, pick[j]);
  }
  PHASE_MARK(1);  // scored
  // The bound: the lanes' best picks in order (larger, ties to the lower lane), the k-th of them.
  int lane_rank = 0;
#pragma unroll
  for (int o = 0; o < 32; ++o) {
    const float ob = __shfl_sync(0xffffffffu, best, o);
    lane_rank += ob > best || (ob == best && o < lane);
  }
  const float bound = __shfl_sync(0xffffffffu, best, __ffs(__ballot_sync(0xffffffffu, lane_rank == a.k - 1)) - 1);
  PHASE_MARK(8);  // bound
  // The experts at or above it, in index order, into the warp's scratch.
  float* cand_pick = static_cast<float*>(warp_scratch);
  float* cand_score = cand_pick + kWarpRoutedExperts;
  int* cand_expert = reinterpret_cast<int*>(cand_score + kWarpRoutedExperts);
  float* chosen_score = reinterpret_cast<float*>(cand_expert + kWarpRoutedExperts);
  int* chosen_expert = reinterpret_cast<int*>(chosen_score + 32);
  int count = 0;
  const unsigned lanes_below = (1u << lane) - 1;
#pragma unroll
  for (int j = 0; j < kLanePicks; ++j) {
    const bool in = j < picks && pick[j] >= bound;
    const unsigned mask = __ballot_sync(0xffffffffu, in);
    const int at = count + __popc(mask & lanes_below);
    if (in) cand_pick[at] = pick[j], cand_score[at] = score[j], cand_expert[at] = lane + 32 * j;
    count += __popc(mask);
  }
  __syncwarp();
  PHASE_MARK(9);  // gathered
  // Each candidate's rank among them, its rank among all experts; the k first are chosen.
  for (int c = lane; c < count; c += 32) {
    const float v = cand_pick[c];
    int rank = 0;
    for (int o = 0; o < count; ++o) {
      const float ov = cand_pick[o];
      rank += ov > v || (ov == v && o < c);
    }
    if (rank < a.k) chosen_expert[rank] = cand_expert[c], chosen_score[rank] = cand_score[c];
  }
  __syncwarp();
  expert = chosen_expert[slot];
  if (with_weight) {
    float sum = 0;  // in slot order, as chosen_weight adds them
    for (int i = 0; i < a.k; ++i) sum += chosen_score[i];
    weight = (a.renormalize ? chosen_score[slot] / sum : chosen_score[slot]) * a.scale;
  }
  PHASE_MARK(2);  // counted
  __syncwarp();  // every lane has read the scratch
}

// The routing weight of chosen slot j (after rank_experts): its score, divided
// by the k chosen scores' sum (in slot order) when renormalizing, times the scale.
__device__ __forceinline__ float chosen_weight(const MoeRouteArgs& a, const RoutingScratch& s, int j) {
  float sum = 0;
  for (int i = 0; i < a.k; ++i) sum += s.chosen_score[i];
  return (a.renormalize ? s.chosen_score[j] / sum : s.chosen_score[j]) * a.scale;
}

// The tensor-core experts' gate/up (affine_matvec_mma.cu and fp8_matvec_mma.cu,
// whose Problem has route, k and expert_stride) under lever routing_in_experts:
// the block routes its token (the router's logits came from the kernel two
// back, final once the prepare kernel between let this one start): each warp
// alone in its own ring (kWarpRouted, a
// kernel of its own: docs/benchmarks.md, forty-second session), or the whole
// block in the space of x's image, which it fills only after its wait; the
// block then takes its slot's expert, and the blocks of column 0 write their
// pair's choice for the kernels after this one.
template <bool kWarpRouted, typename Problem>
__device__ __forceinline__ tiles::MoeBlock routed_block(const Problem& p, uint8_t* smem, uint8_t* warp_scratch) {
  const int pair = blockIdx.y, slot = pair % p.k;
  tiles::MoeBlock b;
  b.token = pair / p.k;
  if constexpr (kWarpRouted) {
    const bool writes = blockIdx.x == 0 && threadIdx.x < 32;  // warp 0 of column 0
    int expert = 0;
    float weight = 0;
    route_slot_in_warp(p.route, b.token, slot, warp_scratch, writes, expert, weight);
    if (writes && threadIdx.x == 0) {
      p.route.ids[pair] = expert;
      p.route.weights[pair] = weight;
    }
    b.expert_row0 = int64_t(expert) * p.expert_stride;
    return b;
  }
  const RoutingScratch s(smem, p.route.E);
  rank_experts(p.route, b.token, s);
  const int32_t expert = s.chosen[slot];
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    p.route.ids[pair] = expert;
    p.route.weights[pair] = chosen_weight(p.route, s, slot);
  }
  __syncthreads();  // before x's image overwrites the choice
  b.expert_row0 = int64_t(expert) * p.expert_stride;
  return b;
}

}  // namespace mere::cuda

// Lever experts_read_once: which chosen expert each block row of a batch's
// gate/up takes (tiles::expert_of_block in matvec_tiles.cuh marks the choices,
// these read them), and which (token, slot) pair a token's product goes to.
// Host and device arithmetic, so that CPU tests can check the rule.
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/random_hash.h"  // MERE_HOST_DEVICE

namespace mere::cuda::tiles {

// The bit index of the n-th (from 0) set bit of `chosen` (words of 32 bits, bit
// e of word w standing for expert 32 w + e), or -1 where fewer are set: block
// row n takes the n-th smallest expert id any token chose.
MERE_HOST_DEVICE int nth_chosen_expert(const uint32_t* chosen, int words, int n) {
  int before = 0;
  for (int w = 0; w < words; ++w) {
    uint32_t bits = chosen[w];
    int count = 0;
    for (uint32_t b = bits; b; b &= b - 1) ++count;
    if (n < before + count) {
      for (int skip = n - before; skip > 0; --skip) bits &= bits - 1;  // drop the lowest set bits
      int bit = 0;
      while (!(bits & 1u)) bits >>= 1, ++bit;
      return 32 * w + bit;
    }
    before += count;
  }
  return -1;
}

// The slot in which token t chose `expert` (ids [T, k]), or -1 where it did not.
MERE_HOST_DEVICE int slot_of(const int32_t* ids, int k, int t, int expert) {
  int slot = -1;
  for (int s = 0; s < k; ++s) slot = ids[t * k + s] == expert ? s : slot;
  return slot;
}

// The experts T tokens choose among E when each picks k at random: what the
// grid's units are dealt for (the rows past the chosen experts end at once).
// At least 1, at most min(T k, E).
inline int64_t expected_chosen_experts(int64_t E, int64_t k, int64_t T) {
  const int64_t rows = T * k < E ? T * k : E;
  const double unpicked = std::pow(1.0 - double(k) / double(E), double(T));
  const int64_t picked = int64_t(std::ceil(double(E) * (1.0 - unpicked)));
  return picked < 1 ? 1 : picked > rows ? rows : picked;
}

}  // namespace mere::cuda::tiles

// The counter-based hash behind ops::fill_random, shared by the CPU and CUDA
// implementations so both devices draw the same values (SplitMix64 finalizer).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MERE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MERE_HOST_DEVICE inline
#endif

namespace mere::ops {

MERE_HOST_DEVICE float random_uniform_pm1(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(z >> 40) * (2.0f / 16777216.0f) - 1.0f;  // 24 bits in [-1, 1)
}

}  // namespace mere::ops

// Per-phase clocks inside a kernel's blocks: where a decode kernel's time goes
// between its launch and its end, which a kernel timeline cannot see
// (docs/benchmarks.md, forty-first session). Built only with
// `cmake -DMERE_PHASE_PROBE=ON`; off (the default) every mark compiles to
// nothing.
//
// PHASE_MARK(i) records clock64() of thread 0 of each block at phase i (0: the
// block's start). A translation unit that marks names its phases from host code
// with PHASE_PROBE_REPORT("start", "name of 1", ...) before its first launch;
// at exit `mere` then prints, for the last launch that marked, each phase's
// mean cycles since phase 0 over its blocks. Each unit has its own record, and
// later launches overwrite earlier ones, so mark one kernel of a unit at a time
// (guard the marks with `if constexpr` on its mode). Now marked: the MoE
// experts' gate/up (affine_matvec_mma.cu, and the routing it runs).
#pragma once

#ifdef MERE_PHASE_PROBE

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace mere::cuda::phase_probe {

constexpr int kBlocks = 4096, kPhases = 16;
// One per translation unit (static): the report reads the one its unit marked.
static __device__ unsigned long long clocks[kBlocks][kPhases];

__device__ __forceinline__ void mark(int phase) {
  const unsigned block = blockIdx.z * gridDim.y * gridDim.x + blockIdx.y * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0 && block < unsigned(kBlocks)) clocks[block][phase] = clock64();
}

inline std::vector<std::string>& phase_names() {
  static std::vector<std::string> names;
  return names;
}

inline void print_report() {
  static unsigned long long host[kBlocks][kPhases];
  if (cudaMemcpyFromSymbol(host, clocks, sizeof(host)) != cudaSuccess) return;
  int blocks = 0;
  while (blocks < kBlocks && host[blocks][0] != 0) ++blocks;
  std::fprintf(stderr, "[phase probe] %d blocks of the last launch that marked; mean cycles since phase 0:\n", blocks);
  const std::vector<std::string>& names = phase_names();
  for (int phase = 1; phase < kPhases && phase < int(names.size()); ++phase) {
    double sum = 0;
    int count = 0;
    for (int b = 0; b < blocks; ++b)
      if (host[b][phase] >= host[b][0] && host[b][phase] - host[b][0] < (1ull << 32))
        sum += double(host[b][phase] - host[b][0]), ++count;
    std::fprintf(stderr, "[phase probe] %2d %-24s %8.0f (%d blocks)\n", phase, names[phase].c_str(),
                 count ? sum / count : 0.0, count);
  }
}

// Host: prints the report at exit (registered once, after CUDA's own exit
// handlers, so that the context is still alive when it runs).
inline void report(std::vector<std::string> names) {
  static const bool registered = [&] {
    phase_names() = std::move(names);
    return std::atexit(print_report) == 0;
  }();
  (void)registered;
}

}  // namespace mere::cuda::phase_probe

#define PHASE_MARK(i) ::mere::cuda::phase_probe::mark(i)
#define PHASE_PROBE_REPORT(...) ::mere::cuda::phase_probe::report({__VA_ARGS__})

#else

#define PHASE_MARK(i) ((void)0)
#define PHASE_PROBE_REPORT(...) ((void)0)

#endif

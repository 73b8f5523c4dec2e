#include <array>
#include <vector>

#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {

float* thread_scratch(int slot, size_t n) {
  // Grown, never shrunk: a prefill's matmuls reuse what the first one needed.
  thread_local std::array<std::vector<float>, kScratchSlots> buffers;
  std::vector<float>& b = buffers.at(size_t(slot));
  if (b.size() < n) b.resize(n);
  return b.data();
}

}  // namespace mere::ops::cpu

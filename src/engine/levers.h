// Every acceleration of the engine, with its switch; nothing else. Read once per
// run (flags, then MERERUN_* variables for A/B runs) and passed down.
#pragma once

#include <string>

#include "models/model.h"

namespace mere {

struct Levers {
  // One decode step is one CUDA graph replay (token id and position in device
  // memory). Default: its parity test (greedy and seeded sampling identical to
  // the plain loop) passes on the fixtures and the demo model.
  bool cuda_graphs = true;
  // Q/K/V and gate/up weights concatenated at load, one matmul each (CUDA only:
  // on the CPU it would copy every weight out of the memory-mapped checkpoint).
  bool fused_projections = true;
  // q/k norm, RoPE and the K/V cache write in one kernel instead of up to six.
  bool fused_rope_store = true;

  // MERERUN_CUDA_GRAPHS, MERERUN_FUSED_PROJECTIONS, MERERUN_FUSED_ROPE_STORE (0|1) override the defaults.
  static Levers from_env();
  static Levers all_off() { return Levers{.cuda_graphs = false, .fused_projections = false, .fused_rope_store = false}; }
  // The levers in effect on `device`, for the line a run prints.
  std::string describe(Device device) const;
  // How a model is laid out on `device` under these levers.
  LoadOptions load_options(Device device) const;
};

}  // namespace mere

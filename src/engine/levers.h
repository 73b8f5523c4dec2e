// Every acceleration of the engine, with its switch; nothing else. Read once per
// run (flags, then MERERUN_* variables for A/B runs) and passed down.
#pragma once

#include <string>

namespace mere {

struct Levers {
  // One decode step is one CUDA graph replay (token id and position in device
  // memory). Default: its parity test (greedy and seeded sampling identical to
  // the plain loop) passes on the fixtures and the demo model.
  bool cuda_graphs = true;

  // MERERUN_CUDA_GRAPHS=0|1 overrides the default.
  static Levers from_env();
  std::string describe() const;
};

}  // namespace mere

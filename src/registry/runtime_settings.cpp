#include "registry/runtime_settings.h"

#include <fmt/format.h>

#include "core/error.h"

namespace mere {

std::string describe(const RuntimeSettings& settings) {
  return fmt::format("kv_cache_mode={}", kv_cache_mode_name(settings.kv_cache_mode));
}

void check_engageable(const RuntimeSettings& settings, Device device) {
  // Every KV cache mode engages on both devices: the CUDA attention kernel reads
  // the quantized codes (head sizes it cannot take are refused when the cache is
  // made, state/kv_cache.cpp).
  (void)settings;
  (void)device;
}

}  // namespace mere

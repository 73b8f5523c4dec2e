#include "registry/runtime_settings.h"

#include <fmt/format.h>

#include "core/error.h"

namespace mere {

std::string describe(const RuntimeSettings& settings) {
  return fmt::format("kv_cache_mode={}", kv_cache_mode_name(settings.kv_cache_mode));
}

void check_engageable(const RuntimeSettings& settings, Device device) {
  switch (settings.kv_cache_mode) {
    case KvCacheMode::native:
    case KvCacheMode::bf16: return;
    case KvCacheMode::affine8:
    case KvCacheMode::affine4:
      MERE_CHECK(device == Device::cpu,
                 "kv cache mode {}: refused on cuda: the CUDA attention kernels do not read quantized caches yet "
                 "(issue 7); use --device cpu or --kv-cache-mode default",
                 kv_cache_mode_name(settings.kv_cache_mode));
      return;
  }
}

}  // namespace mere

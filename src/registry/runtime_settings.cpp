#include "registry/runtime_settings.h"

#include <fmt/format.h>

#include "core/error.h"

namespace mere {

std::string_view kv_cache_mode_name(KvCacheMode mode) {
  switch (mode) {
    case KvCacheMode::default_mode: return "default";
    case KvCacheMode::bf16: return "bf16";
    case KvCacheMode::affine8: return "affine8";
  }
  return "?";
}

std::optional<KvCacheMode> parse_kv_cache_mode(std::string_view text) {
  for (KvCacheMode m : {KvCacheMode::default_mode, KvCacheMode::bf16, KvCacheMode::affine8})
    if (text == kv_cache_mode_name(m)) return m;
  return std::nullopt;
}

std::string describe(const RuntimeSettings& settings) {
  return fmt::format("kv_cache_mode={}", kv_cache_mode_name(settings.kv_cache_mode));
}

void check_engageable(const RuntimeSettings& settings, Device device) {
  switch (settings.kv_cache_mode) {
    case KvCacheMode::default_mode: return;
    case KvCacheMode::bf16:
      // The CPU cache is the f32 reference; only the CUDA cache stores bf16.
      MERE_CHECK(device == Device::cuda,
                 "kv cache mode bf16: refused on cpu: the CPU KV cache is f32 (the reference); use "
                 "--device cuda or --kv-cache-mode default");
      return;
    case KvCacheMode::affine8: fail("kv cache mode affine8: refused: not implemented yet (issue 7)");
  }
}

}  // namespace mere

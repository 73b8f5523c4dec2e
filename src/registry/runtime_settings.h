// Per-model runtime settings (`mere model runtime set`): what a run of that model
// uses unless a command-line flag overrides it for that run. Each setting is
// validated where it is read (the registry file, a flag) and again where it would
// engage: a setting this build cannot honour is an error, never a quiet downgrade.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/device.h"
#include "state/kv_cache.h"

namespace mere {

struct RuntimeSettings {
  KvCacheMode kv_cache_mode = KvCacheMode::native;

  bool operator==(const RuntimeSettings&) const = default;
};

// "kv_cache_mode=bf16": one line for `runtime show` and a run's report.
std::string describe(const RuntimeSettings& settings);

// Throws when a setting cannot engage on `device` in this build, saying why.
void check_engageable(const RuntimeSettings& settings, Device device);

}  // namespace mere

#include "engine/levers.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace mere {
namespace {

bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  if (!std::strcmp(v, "1") || !std::strcmp(v, "true") || !std::strcmp(v, "on")) return true;
  if (!std::strcmp(v, "0") || !std::strcmp(v, "false") || !std::strcmp(v, "off")) return false;
  fail("{}={}: expected 0 or 1", name, v);
}

}  // namespace

Levers Levers::from_env() {
  Levers l;
  l.cuda_graphs = env_flag("MERERUN_CUDA_GRAPHS", l.cuda_graphs);
  l.fused_projections = env_flag("MERERUN_FUSED_PROJECTIONS", l.fused_projections);
  l.fused_rope_store = env_flag("MERERUN_FUSED_ROPE_STORE", l.fused_rope_store);
  return l;
}

std::string Levers::describe(Device device) const {
  if (device == Device::cpu)
    return "levers: none engage on the cpu (cuda_graphs, fused_projections, fused_rope_store are CUDA levers)";
  return std::string("levers: cuda_graphs=") + (cuda_graphs ? "on" : "off") +
         " fused_projections=" + (fused_projections ? "on" : "off") +
         " fused_rope_store=" + (fused_rope_store ? "on" : "off");
}

LoadOptions Levers::load_options(Device device) const {
  return LoadOptions{.fuse_projections = fused_projections && device == Device::cuda,
                     .fuse_rope_store = fused_rope_store && device == Device::cuda};
}

}  // namespace mere

// mere bytes: the bytes one decoded token reads, by bucket, and the roofline
// they imply, from config.json alone (src/audit/byte_model.h).
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "audit/byte_model.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"

namespace mere {
namespace {

namespace fs = std::filesystem;

struct BytesFlags {
  std::string model, kv_cache_mode = "default", weights, device = "cuda";
  int64_t context = 0;
  int group_size = 64;
  double bandwidth = kH200CopyBytesPerS;
  bool json = false;
};

void run_bytes(const BytesFlags& f) {
  const fs::path path = resolve_model_dir(f.model);
  const fs::path config_file = fs::is_directory(path) ? path / "config.json" : path;
  const ConfigJson config = ConfigJson::load(config_file);
  auto mode = parse_kv_cache_mode(f.kv_cache_mode);
  MERE_CHECK(mode, "--kv-cache-mode {}: expected {}", f.kv_cache_mode, kKvCacheModeNames);
  MERE_CHECK(f.bandwidth > 0, "--bandwidth {}: must be positive (bytes per second)", f.bandwidth);
  ByteModelOptions o;
  o.context = f.context;
  o.kv_mode = *mode;
  o.device = f.device == "cpu" ? Device::cpu : Device::cuda;
  o.weights = f.weights;
  o.group_size = f.group_size;
  const ByteModel m = byte_model(config, o);
  const uint64_t total = m.total_bytes();
  const double roofline = m.roofline_tok_s(f.bandwidth);

  if (f.json) {
    nlohmann::ordered_json j;
    j["config"] = config_file.string();
    j["model_type"] = m.model_type;
    j["weights"] = m.weights;
    j["context"] = m.context;
    j["kv_cache_mode"] = m.kv_mode;
    j["device"] = f.device;
    j["cache"] = m.cache;
    j["total_bytes"] = total;
    j["buckets"] = nlohmann::ordered_json::object();
    for (const ByteBucket& b : m.buckets) j["buckets"][b.name] = b.bytes;
    j["bandwidth_bytes_per_s"] = f.bandwidth;
    j["roofline_tok_s"] = roofline;
    j["notes"] = m.notes;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%s: %s, weights %s, context %lld, %s cache %s on %s\n\n", config_file.c_str(), m.model_type.c_str(),
              m.weights.c_str(), (long long)m.context, m.cache.c_str(), m.kv_mode.c_str(), f.device.c_str());
  std::printf("%-16s %16s %12s %7s\n", "bucket", "bytes", "MB", "share");
  for (const ByteBucket& b : m.buckets)
    std::printf("%-16s %16llu %12.3f %6.1f%%\n", b.name.c_str(), (unsigned long long)b.bytes, double(b.bytes) / 1e6,
                total > 0 ? 100.0 * double(b.bytes) / double(total) : 0.0);
  std::printf("%-16s %16llu %12.3f %6.1f%%\n\n", "total", (unsigned long long)total, double(total) / 1e6, 100.0);
  std::printf("roofline: %.1f tok/s at %.4g B/s%s\n", roofline, f.bandwidth,
              f.bandwidth == kH200CopyBytesPerS ? " (the H200's measured copy bandwidth)" : "");
  for (const std::string& n : m.notes) std::printf("note: %s\n", n.c_str());
}

}  // namespace

void add_bytes_command(CLI::App& app) {
  auto f = std::make_shared<BytesFlags>();
  CLI::App* cmd = app.add_subcommand(
      "bytes", "The bytes one decoded token reads, by bucket, and the roofline tok/s (needs only config.json)");
  cmd->add_option("-m,--model", f->model,
                  "Model directory, its config.json, or a registered name (default: the embedded demo model)");
  cmd->add_option("--context", f->context, "Cached positions the token attends to")->capture_default_str();
  cmd->add_option("--kv-cache-mode", f->kv_cache_mode, "KV cache: default, bf16, affine8 or affine4")
      ->capture_default_str();
  cmd->add_option("--weights", f->weights, "Count the weights as bf16, int8, int4 or fp8 (default: as config.json says)")
      ->check(CLI::IsMember({"bf16", "int8", "int4", "fp8"}));
  cmd->add_option("--group-size", f->group_size, "Group size of --weights int8/int4: 32, 64 or 128")
      ->capture_default_str();
  cmd->add_option("--bandwidth", f->bandwidth, "Memory bandwidth in bytes per second (default: the H200's measured "
                  "copy bandwidth, 4.287e12)");
  cmd->add_option("--device", f->device, "Whose default cache storage to count: cuda (bf16) or cpu (f32)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "Print one JSON object: total_bytes, buckets, roofline_tok_s, ...");
  cmd->callback([f] { run_bytes(*f); });
}

}  // namespace mere

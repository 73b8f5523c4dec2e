#include "cli/common.h"

#include "core/error.h"
#include "core/thread_pool.h"

namespace mere {

std::filesystem::path default_model_dir() { return std::filesystem::path(MERE_SOURCE_DIR) / "models" / "demo"; }

std::filesystem::path resolve_model_dir(const std::string& flag) {
  if (!flag.empty()) return flag;
  auto dir = default_model_dir();
  MERE_CHECK(std::filesystem::exists(dir / "config.json"),
             "no model given (-m DIR) and the embedded default model is missing at {}", dir.string());
  return dir;
}

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string item;
  auto flush = [&] {
    if (item.empty()) return;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MERE_CHECK(used == item.size() && v >= 0 && v <= INT32_MAX, "'{}' is not a token id", item);
    ids.push_back(int32_t(v));
    item.clear();
  };
  for (char c : text) {
    if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '[' || c == ']') flush();
    else item += c;
  }
  flush();
  return ids;
}

void add_device_option(CLI::App& cmd, std::string& device) {
  cmd.add_option("--device", device, "cpu, cuda, or auto: cuda when a GPU is present (default)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
}

Device resolve_device(const std::string& flag) {
  if (flag == "cpu") return Device::cpu;
  if (flag == "cuda") {
    MERE_CHECK(cuda_available(), "--device cuda: {}", cuda_device_description());
    return Device::cuda;
  }
  return cuda_available() ? Device::cuda : Device::cpu;
}

std::vector<int64_t> parse_int_list(const std::string& text, const char* flag) {
  std::vector<int64_t> out;
  for (int32_t v : parse_ids(text)) out.push_back(v);
  MERE_CHECK(!out.empty(), "{}: no values in '{}'", flag, text);
  return out;
}

void add_threads_option(CLI::App& cmd, int& threads) {
  cmd.add_option("-t,--threads", threads, "CPU threads (default: one per hardware thread)")
      ->check(CLI::NonNegativeNumber);
}

void apply_threads(int threads) { set_thread_count(threads); }

}  // namespace mere

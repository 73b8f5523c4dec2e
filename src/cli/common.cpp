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

void add_threads_option(CLI::App& cmd, int& threads) {
  cmd.add_option("-t,--threads", threads, "CPU threads (default: one per hardware thread)")
      ->check(CLI::NonNegativeNumber);
}

void apply_threads(int threads) { set_thread_count(threads); }

}  // namespace mere

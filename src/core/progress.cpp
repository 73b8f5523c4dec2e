#include "core/progress.h"

#include <cstdio>

namespace mere {

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(total), start_(std::chrono::steady_clock::now()), last_draw_(start_) {
  draw("");
}

Progress::~Progress() {
  if (!finished_) finish();
}

void Progress::update(int64_t done, const std::string& note) {
  done_ = done;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100) && done_ < total_) return;
  last_draw_ = now;
  draw(note);
}

void Progress::finish(const std::string& note) {
  if (finished_) return;
  done_ = total_;
  draw(note);
  std::fputc('\n', stderr);
  finished_ = true;
}

void Progress::draw(const std::string& note) {
  constexpr int kWidth = 30;
  double fraction = total_ > 0 ? double(done_) / double(total_) : 1.0;
  int filled = int(fraction * kWidth);
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double eta = fraction > 0 ? elapsed * (1 - fraction) / fraction : 0;
  std::fprintf(stderr, "\r%s [%s%s] %3.0f%% %lld/%lld %.1fs eta %.1fs %s\033[K", label_.c_str(),
               std::string(size_t(filled), '#').c_str(), std::string(size_t(kWidth - filled), ' ').c_str(),
               fraction * 100, (long long)done_, (long long)total_, elapsed, eta, note.c_str());
  std::fflush(stderr);
}

}  // namespace mere

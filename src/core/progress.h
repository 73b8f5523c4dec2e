// A progress bar on stderr for long work (loading, evaluating, quantizing).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace mere {

class Progress {
 public:
  Progress(std::string label, int64_t total);
  ~Progress();
  // Sets the amount done and redraws at most ten times a second.
  void update(int64_t done, const std::string& note = "");
  void finish(const std::string& note = "");

 private:
  void draw(const std::string& note);

  std::string label_;
  int64_t total_, done_ = 0;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace mere

// Small inline SVG charts for report.html: horizontal bars (with an optional
// min-max whisker), stacked bars, and a histogram. Plain strings, no scripts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mere {

struct BarValue {
  double value = 0;
  double lo = -1, hi = -1;  // the spread's whisker; lo < 0: none
};

// One bar per label; `axis_max` <= 0: the largest value (or whisker) sets the scale.
std::string svg_bar_chart(const std::string& title, const std::vector<std::string>& labels,
                          const std::vector<BarValue>& values, double axis_max = 0);
// values[row][series], stacked left to right, one colour per series with a legend.
std::string svg_stacked_bar_chart(const std::string& title, const std::vector<std::string>& labels,
                                  const std::vector<std::string>& series, const std::vector<std::vector<double>>& values);
// Vertical bars, one per bin.
std::string svg_histogram(const std::string& title, const std::vector<std::string>& bins,
                          const std::vector<int64_t>& counts);

}  // namespace mere

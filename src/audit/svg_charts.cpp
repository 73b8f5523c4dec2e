#include "audit/svg_charts.h"

#include <algorithm>

#include <fmt/format.h>

namespace mere {
namespace {

constexpr const char* kColours[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948"};

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string number(double v) {
  if (v >= 100) return fmt::format("{:.0f}", v);
  if (v >= 1) return fmt::format("{:.2f}", v);
  return fmt::format("{:.3g}", v);
}

std::string open_svg(int width, int height, const std::string& title) {
  return fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
                     "font-family=\"sans-serif\" font-size=\"11\" role=\"img\"><title>{2}</title>"
                     "<text x=\"4\" y=\"14\" font-size=\"12\" font-weight=\"bold\">{2}</text>\n",
                     width, height, escape(title));
}

constexpr int kLabelWidth = 250, kBarArea = 300, kRow = 22, kTop = 26;

}  // namespace

std::string svg_bar_chart(const std::string& title, const std::vector<std::string>& labels,
                          const std::vector<BarValue>& values, double axis_max) {
  double top = axis_max;
  if (top <= 0)
    for (const BarValue& v : values) top = std::max({top, v.value, v.hi});
  if (top <= 0) top = 1;
  const int width = kLabelWidth + kBarArea + 70, height = kTop + kRow * int(values.size()) + 8;
  std::string s = open_svg(width, height, title);
  for (size_t i = 0; i < values.size(); ++i) {
    const int y = kTop + kRow * int(i);
    const BarValue& v = values[i];
    const double w = kBarArea * std::clamp(v.value / top, 0.0, 1.0);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>", kLabelWidth - 6, y + 14,
                     escape(i < labels.size() ? labels[i] : ""));
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"/>", kLabelWidth, y + 3, w,
                     kRow - 6, kColours[i % 6]);
    double right = w;
    if (v.lo >= 0) {  // the whisker: min to max over the runs
      const double x0 = kLabelWidth + kBarArea * std::clamp(v.lo / top, 0.0, 1.0);
      const double x1 = kLabelWidth + kBarArea * std::clamp(v.hi / top, 0.0, 1.0);
      const int ym = y + kRow / 2;
      s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{2}\" x2=\"{1:.1f}\" y2=\"{2}\" stroke=\"#222\"/>"
                       "<line x1=\"{0:.1f}\" y1=\"{3}\" x2=\"{0:.1f}\" y2=\"{4}\" stroke=\"#222\"/>"
                       "<line x1=\"{1:.1f}\" y1=\"{3}\" x2=\"{1:.1f}\" y2=\"{4}\" stroke=\"#222\"/>",
                       x0, x1, ym, ym - 5, ym + 5);
      right = std::max(right, x1 - kLabelWidth);
    }
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\">{}</text>\n", kLabelWidth + right + 4, y + 14, number(v.value));
  }
  return s + "</svg>\n";
}

std::string svg_stacked_bar_chart(const std::string& title, const std::vector<std::string>& labels,
                                  const std::vector<std::string>& series,
                                  const std::vector<std::vector<double>>& values) {
  double top = 0;
  for (const auto& row : values) {
    double sum = 0;
    for (double v : row) sum += v;
    top = std::max(top, sum);
  }
  if (top <= 0) top = 1;
  const int width = kLabelWidth + kBarArea + 80, height = kTop + kRow * int(values.size()) + 30;
  std::string s = open_svg(width, height, title);
  for (size_t i = 0; i < values.size(); ++i) {
    const int y = kTop + kRow * int(i);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>", kLabelWidth - 6, y + 14,
                     escape(i < labels.size() ? labels[i] : ""));
    double x = kLabelWidth, sum = 0;
    for (size_t k = 0; k < values[i].size(); ++k) {
      const double w = kBarArea * values[i][k] / top;
      s += fmt::format("<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"><title>{}: {}</title>"
                       "</rect>",
                       x, y + 3, w, kRow - 6, kColours[k % 6], escape(series[k]), number(values[i][k]));
      x += w;
      sum += values[i][k];
    }
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\">{}</text>\n", x + 4, y + 14, number(sum));
  }
  const int ly = kTop + kRow * int(values.size()) + 10;
  for (size_t k = 0; k < series.size(); ++k)
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}"
                     "</text>",
                     kLabelWidth + 140 * int(k), ly, kColours[k % 6], kLabelWidth + 140 * int(k) + 14, ly + 9,
                     escape(series[k]));
  return s + "</svg>\n";
}

std::string svg_histogram(const std::string& title, const std::vector<std::string>& bins,
                          const std::vector<int64_t>& counts) {
  int64_t top = 1;
  for (int64_t c : counts) top = std::max(top, c);
  constexpr int kBin = 44, kPlot = 120, kLeft = 10;
  const int width = kLeft + kBin * int(counts.size()) + 10, height = kTop + kPlot + 34;
  std::string s = open_svg(std::max(width, 360), height, title);
  for (size_t i = 0; i < counts.size(); ++i) {
    const double h = double(kPlot) * double(counts[i]) / double(top);
    const int x = kLeft + kBin * int(i);
    s += fmt::format("<rect x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{:.1f}\" fill=\"#4e79a7\"/>", x + 2,
                     kTop + 12 + kPlot - h, kBin - 4, h);
    if (counts[i] > 0)
      s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"9\">{}</text>", x + kBin / 2,
                       kTop + 10 + kPlot - h, counts[i]);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"9\">{}</text>\n", x + kBin / 2,
                     kTop + kPlot + 26, escape(i < bins.size() ? bins[i] : ""));
  }
  return s + "</svg>\n";
}

}  // namespace mere

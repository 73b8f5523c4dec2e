// The audit's three reports: report.json (every figure), report.md (tables) and a
// self-contained report.html (the tables and inline SVG charts: speed bars with
// their spread, memory bars, KL histograms, per-prompt parity; no scripts, no
// external files).
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "audit/audit.h"

namespace mere {

nlohmann::ordered_json report_json(const AuditReport& r);
std::string report_markdown(const AuditReport& r);
std::string report_html(const AuditReport& r);
// Writes the three files into `dir`; returns their paths in that order.
std::vector<std::filesystem::path> write_reports(const AuditReport& r, const std::filesystem::path& dir);

}  // namespace mere

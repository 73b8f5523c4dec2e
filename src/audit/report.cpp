#include "audit/report.h"

#include <fstream>

#include "audit/svg_charts.h"
#include "core/error.h"

namespace mere {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

ordered_json spread_json(const Spread& s, const std::vector<double>& runs) {
  return {{"median", s.median}, {"min", s.min}, {"max", s.max}, {"runs", runs}};
}

ordered_json arm_json(const ArmResult& a) {
  ordered_json j = {{"label", a.label}, {"model_dir", a.model_dir}, {"kv_cache_mode", a.kv_mode}};
  if (a.not_engaged) {
    j["engaged"] = false;
    j["not_applicable"] = a.not_applicable;
    j["reason"] = *a.not_engaged;
    return j;
  }
  j["engaged"] = true;
  j["weights"] = a.weights;
  j["engine_levers"] = a.levers;
  j["memory"] = {{"weights_bytes", a.weight_bytes},
                 {"cache_at_capacity_bytes", a.cache_capacity_bytes},
                 {"cache_capacity_tokens", a.cache_capacity_tokens},
                 {"cache_measured_bytes", a.cache_measured_bytes},
                 {"cache_measured_tokens", a.cache_measured_tokens},
                 {"workspace_bytes", a.workspace_bytes ? ordered_json(*a.workspace_bytes) : ordered_json(nullptr)}};
  j["speed"] = {{"prefill_tok_s", spread_json(a.prefill, a.prefill_tok_s)},
                {"decode_tok_s", spread_json(a.decode, a.decode_tok_s)},
                {"ttft_ms", spread_json(a.ttft, a.ttft_ms)}};
  j["perplexity"] = a.ppl;
  j["greedy_tokens"] = a.greedy;
  j["sampled_tokens"] = a.sampled;
  return j;
}

ordered_json parity_json(const std::vector<TokenParity>& v, const std::vector<AuditPrompt>& prompts) {
  ordered_json a = ordered_json::array();
  for (size_t i = 0; i < v.size(); ++i)
    a.push_back({{"prompt", prompts[i].name},
                 {"matched", v[i].matched},
                 {"total", v[i].total},
                 {"first_divergence",
                  v[i].first_divergence < 0 ? ordered_json(nullptr) : ordered_json(v[i].first_divergence)},
                 {"positionwise", v[i].positionwise}});
  return a;
}

std::string pct(double x) { return fmt::format("{:.1f}%", 100 * x); }
std::string rel_pct(double lever, double base) {
  return base > 0 ? fmt::format("{:+.1f}%", 100 * (lever / base - 1)) : "n/a";
}
std::string mb(uint64_t b) { return fmt::format("{:.2f} MB", double(b) / 1e6); }
std::string mb(const std::optional<uint64_t>& b) { return b ? mb(*b) : "not measured"; }
std::string spread_str(const Spread& s, const char* fmt_one) {
  return fmt::format(fmt::runtime(fmt_one), s.median) + " (" + fmt::format(fmt::runtime(fmt_one), s.min) + "–" +
         fmt::format(fmt::runtime(fmt_one), s.max) + ")";
}

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

// Markdown table cells: no raw newlines or pipes.
std::string md_cell(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\n') o += "⏎";
    else if (c == '|') o += "\\|";
    else o += c;
  }
  return o;
}

std::vector<const ArmResult*> engaged_arms(const AuditReport& r) {
  std::vector<const ArmResult*> v = {&r.baseline};
  for (const ArmResult& a : r.arms)
    if (!a.not_engaged) v.push_back(&a);
  return v;
}

}  // namespace

ordered_json report_json(const AuditReport& r) {
  ordered_json j;
  j["mere_audit"] = 1;
  j["date"] = r.date;
  j["model"] = {{"name", r.model_label}, {"dir", r.model_dir}, {"model_type", r.model_type}, {"revision", r.revision}};
  j["device"] = r.device;
  j["speed_label"] = r.speed_label;
  const AuditOptions& o = r.options;
  j["settings"] = {{"levers", o.levers},
                   {"combine", o.combine},
                   {"prompts_file", o.prompts_file.string()},
                   {"corpus_file", o.corpus_file.string()},
                   {"max_new_tokens", o.max_new_tokens},
                   {"seed", o.seed},
                   {"runs", o.runs},
                   {"warmup_runs", 1},
                   {"sampled_temperature", o.temperature},
                   {"corpus_tokens_scored", r.corpus_tokens_scored},
                   {"window", o.window},
                   {"teacher_forced_by", o.decode_steps ? "decode steps" : "one prefill per window"},
                   {"windows", r.windows}};
  ordered_json prompts = ordered_json::array();
  for (size_t i = 0; i < r.prompts.size(); ++i)
    prompts.push_back({{"name", r.prompts[i].name},
                       {"kind", r.prompts[i].kind},
                       {"source", r.prompts[i].source},
                       {"tokens", r.prompt_tokens[i]}});
  j["prompts"] = prompts;
  j["baseline"] = arm_json(r.baseline);
  ordered_json levers = ordered_json::array();
  for (size_t i = 0; i < r.comparisons.size(); ++i) {
    const LeverComparison& c = r.comparisons[i];
    const ArmResult& a = r.arms[i];
    ordered_json l = {{"lever", c.lever}, {"arm", arm_json(a)}};
    l["verdict"] = {{"verdict", c.verdict.verdict}, {"reason", c.verdict.reason}};
    if (!a.not_engaged) {
      l["verdict"]["quality"] = c.verdict.quality;
      l["verdict"]["faster"] = c.verdict.faster;
      l["verdict"]["slower"] = c.verdict.slower;
      l["verdict"]["smaller"] = c.verdict.smaller;
      l["verdict"]["larger"] = c.verdict.larger;
      l["greedy"] = {{"match_rate", c.greedy_match_rate}, {"per_prompt", parity_json(c.greedy, r.prompts)}};
      ordered_json ex = ordered_json::array();
      for (const auto& e : c.excerpts)
        ex.push_back({{"prompt", e.prompt}, {"first_divergence", e.first_divergence}, {"baseline", e.baseline},
                      {"lever", e.lever}});
      l["greedy"]["excerpts"] = ex;
      l["sampled"] = {{"temperature", o.temperature}, {"seed", o.seed}, {"match_rate", c.sampled_match_rate},
                      {"per_prompt", parity_json(c.sampled, r.prompts)}};
      l["teacher_forced"] = {{"ppl_baseline", r.baseline.ppl},
                             {"ppl_lever", a.ppl},
                             {"kl_mean", c.kl.mean},
                             {"kl_p99", c.kl.p99},
                             {"kl_max", c.kl.max},
                             {"positions", c.kl.count},
                             {"kl_histogram", {{"edges", c.kl.edges}, {"counts", c.kl.counts}}}};
    }
    levers.push_back(l);
  }
  j["levers"] = levers;
  j["process_peak_rss_bytes"] = r.peak_rss_bytes;
  j["notes"] = r.notes;
  return j;
}

std::string report_markdown(const AuditReport& r) {
  std::string s;
  const AuditOptions& o = r.options;
  s += fmt::format("# mere audit: {}\n\n", r.model_label.empty() ? r.model_dir : r.model_label);
  s += fmt::format("{} · {} ({}) · revision `{}` · device {} · {} prompts, {} tokens each, seed {}, {} timed run(s) "
                   "after 1 warm-up · {} corpus tokens scored in {} window(s) of up to {}{}\n\n",
                   r.date, r.model_dir, r.model_type, r.revision, r.device, r.prompts.size(), o.max_new_tokens,
                   o.seed, o.runs, r.corpus_tokens_scored, r.windows, o.window,
                   o.decode_steps ? ", one decode step per token" : "");
  if (r.speed_label == "CPU")
    s += "**Speed figures are CPU figures** (this run had no GPU); they say nothing about the CUDA backend.\n\n";

  s += "## Verdicts\n\n| lever | verdict | reason |\n|---|---|---|\n";
  for (const LeverComparison& c : r.comparisons)
    s += fmt::format("| `{}` | **{}** | {} |\n", c.lever, c.verdict.verdict, md_cell(c.verdict.reason));

  s += fmt::format("\n## Quality\n\n| lever | greedy match | sampled match (T={}, seed {}) | ppl (baseline {:.4f}) | "
                   "KL mean | KL p99 | KL max |\n|---|---|---|---|---|---|---|\n",
                   o.temperature, o.seed, r.baseline.ppl);
  for (size_t i = 0; i < r.comparisons.size(); ++i) {
    const LeverComparison& c = r.comparisons[i];
    if (r.arms[i].not_engaged) continue;
    s += fmt::format("| `{}` | {} | {} | {:.4f} ({}) | {:.3g} | {:.3g} | {:.3g} |\n", c.lever, pct(c.greedy_match_rate),
                     pct(c.sampled_match_rate), r.arms[i].ppl, rel_pct(r.arms[i].ppl, r.baseline.ppl), c.kl.mean,
                     c.kl.p99, c.kl.max);
  }

  s += fmt::format("\n## Speed ({}; median (min–max) over {} run(s))\n\n"
                   "| arm | prefill tok/s | decode tok/s | time to first token ms |\n|---|---|---|---|\n",
                   r.speed_label, o.runs);
  for (const ArmResult* a : engaged_arms(r))
    s += fmt::format("| `{}` | {} | {} | {} |\n", a->label, spread_str(a->prefill, "{:.1f}"),
                     spread_str(a->decode, "{:.1f}"), spread_str(a->ttft, "{:.2f}"));

  s += "\n## Memory\n\n| arm | weights | cache at capacity | cache measured | workspace | weights format | KV mode |\n"
       "|---|---|---|---|---|---|---|\n";
  for (const ArmResult* a : engaged_arms(r))
    s += fmt::format("| `{}` | {} | {} ({} tokens) | {} ({} tokens) | {} | {} | {} |\n", a->label, mb(a->weight_bytes),
                     mb(a->cache_capacity_bytes), a->cache_capacity_tokens, mb(a->cache_measured_bytes),
                     a->cache_measured_tokens, mb(a->workspace_bytes), a->weights, a->kv_mode);
  s += fmt::format("\nWorkspace: see the notes for how it is measured; process peak RSS {}.\n", mb(r.peak_rss_bytes));

  s += "\n## Greedy parity per prompt (tokens before the first divergence / total)\n\n| prompt | kind | tokens |";
  for (size_t i = 0; i < r.comparisons.size(); ++i)
    if (!r.arms[i].not_engaged) s += fmt::format(" `{}` |", r.comparisons[i].lever);
  s += "\n|---|---|---|";
  for (size_t i = 0; i < r.comparisons.size(); ++i)
    if (!r.arms[i].not_engaged) s += "---|";
  s += "\n";
  for (size_t p = 0; p < r.prompts.size(); ++p) {
    s += fmt::format("| {} | {} | {} |", md_cell(r.prompts[p].name), r.prompts[p].kind, r.prompt_tokens[p]);
    for (size_t i = 0; i < r.comparisons.size(); ++i)
      if (!r.arms[i].not_engaged) {
        const TokenParity& t = r.comparisons[i].greedy[p];
        s += fmt::format(" {}/{} |", t.matched, t.total);
      }
    s += "\n";
  }
  for (const LeverComparison& c : r.comparisons)
    for (const auto& e : c.excerpts)
      s += fmt::format("\n`{}`, {}, first divergence at token {}:\n- baseline: `{}`\n- lever: `{}`\n", c.lever, e.prompt,
                       e.first_divergence, md_cell(e.baseline), md_cell(e.lever));
  if (!r.notes.empty()) {
    s += "\n## Notes\n\n";
    for (const std::string& n : r.notes) s += "- " + n + "\n";
  }
  return s;
}

std::string report_html(const AuditReport& r) {
  const AuditOptions& o = r.options;
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>mere audit: " +
       html_escape(r.model_label.empty() ? r.model_dir : r.model_label) + "</title>\n<style>\n" +
       "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
       "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;"
       "vertical-align:top}th{background:#f3f3f3}code,pre{background:#f6f6f6}pre{white-space:pre-wrap;padding:4px}"
       ".promote{color:#0a7a2f;font-weight:bold}.explicit{color:#a65f00;font-weight:bold}"
       ".refuse{color:#b00020;font-weight:bold}.not_applicable{color:#666;font-weight:bold}"
       ".charts{display:flex;flex-wrap:wrap;gap:16px}.cpu{background:#fff3cd;padding:6px 10px}\n</style></head><body>\n";
  h += "<h1>mere audit: " + html_escape(r.model_label.empty() ? r.model_dir : r.model_label) + "</h1>\n";
  h += fmt::format("<p>{} · <code>{}</code> ({}) · revision <code>{}</code> · device {} · {} prompts × {} tokens, seed "
                   "{}, {} timed run(s) after 1 warm-up · {} corpus tokens scored</p>\n",
                   html_escape(r.date), html_escape(r.model_dir), html_escape(r.model_type), r.revision,
                   html_escape(r.device), r.prompts.size(), o.max_new_tokens, o.seed, o.runs, r.corpus_tokens_scored);
  if (r.speed_label == "CPU")
    h += "<p class=\"cpu\"><b>Speed figures are CPU figures</b> (this run had no GPU); they say nothing about the "
         "CUDA backend.</p>\n";

  h += "<h2>Verdicts</h2>\n<table><tr><th>lever</th><th>verdict</th><th>reason</th></tr>\n";
  for (const LeverComparison& c : r.comparisons)
    h += fmt::format("<tr><td><code>{}</code></td><td class=\"{}\">{}</td><td>{}</td></tr>\n", html_escape(c.lever),
                     c.verdict.verdict, c.verdict.verdict, html_escape(c.verdict.reason));
  h += "</table>\n";

  const std::vector<const ArmResult*> arms = engaged_arms(r);
  std::vector<std::string> labels;
  std::vector<BarValue> prefill, decode, ttft;
  std::vector<std::vector<double>> memory;
  for (const ArmResult* a : arms) {
    labels.push_back(a->label);
    prefill.push_back({a->prefill.median, a->prefill.min, a->prefill.max});
    decode.push_back({a->decode.median, a->decode.min, a->decode.max});
    ttft.push_back({a->ttft.median, a->ttft.min, a->ttft.max});
    memory.push_back({double(a->weight_bytes) / 1e6, double(a->cache_capacity_bytes) / 1e6,
                      double(a->workspace_bytes.value_or(0)) / 1e6});
  }
  h += fmt::format("<h2>Speed ({}, median with min–max over {} run(s))</h2>\n<div class=\"charts\">\n", r.speed_label,
                   o.runs);
  h += svg_bar_chart("decode tok/s (" + r.speed_label + ")", labels, decode);
  h += svg_bar_chart("prefill tok/s (" + r.speed_label + ")", labels, prefill);
  h += svg_bar_chart("time to first token, ms (" + r.speed_label + ")", labels, ttft);
  h += "</div>\n<h2>Memory</h2>\n<div class=\"charts\">\n";
  h += svg_stacked_bar_chart("resident MB: weights + cache at the model's full context + workspace", labels,
                             {"weights", "cache at capacity", "workspace"}, memory);
  h += "</div>\n";
  h += "<table><tr><th>arm</th><th>weights</th><th>cache at capacity</th><th>cache measured</th><th>workspace</th>"
       "<th>weights format</th><th>KV mode</th><th>prefill tok/s</th><th>decode tok/s</th><th>TTFT ms</th></tr>\n";
  for (const ArmResult* a : arms)
    h += fmt::format("<tr><td><code>{}</code></td><td>{}</td><td>{} ({} tokens)</td><td>{} ({} tokens)</td><td>{}</td>"
                     "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                     html_escape(a->label), mb(a->weight_bytes), mb(a->cache_capacity_bytes), a->cache_capacity_tokens,
                     mb(a->cache_measured_bytes), a->cache_measured_tokens, mb(a->workspace_bytes),
                     html_escape(a->weights), a->kv_mode,
                     spread_str(a->prefill, "{:.1f}"), spread_str(a->decode, "{:.1f}"), spread_str(a->ttft, "{:.2f}"));
  h += fmt::format("</table>\n<p>Workspace: see the notes for how it is measured; process peak RSS {}.</p>\n",
                   mb(r.peak_rss_bytes));

  h += fmt::format("<h2>Quality</h2>\n<table><tr><th>lever</th><th>greedy match</th><th>sampled match (T={}, seed "
                   "{})</th><th>ppl (baseline {:.4f})</th><th>KL mean</th><th>KL p99</th><th>KL max</th></tr>\n",
                   o.temperature, o.seed, r.baseline.ppl);
  for (size_t i = 0; i < r.comparisons.size(); ++i) {
    const LeverComparison& c = r.comparisons[i];
    if (r.arms[i].not_engaged) continue;
    h += fmt::format("<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{:.4f} ({})</td><td>{:.3g}</td><td>{:.3g}"
                     "</td><td>{:.3g}</td></tr>\n",
                     html_escape(c.lever), pct(c.greedy_match_rate), pct(c.sampled_match_rate), r.arms[i].ppl,
                     rel_pct(r.arms[i].ppl, r.baseline.ppl), c.kl.mean, c.kl.p99, c.kl.max);
  }
  h += "</table>\n<div class=\"charts\">\n";
  std::vector<std::string> prompt_labels;
  for (const AuditPrompt& p : r.prompts) prompt_labels.push_back(p.name);
  for (size_t i = 0; i < r.comparisons.size(); ++i) {
    const LeverComparison& c = r.comparisons[i];
    if (r.arms[i].not_engaged) continue;
    std::vector<std::string> bins;
    for (size_t b = 0; b < c.kl.edges.size(); ++b)
      bins.push_back(b + 1 < c.kl.edges.size() ? fmt::format("<{:g}", c.kl.edges[b + 1])
                                                : fmt::format("≥{:g}", c.kl.edges[b]));
    h += svg_histogram("KL(baseline ‖ " + c.lever + ") per position, nats", bins, c.kl.counts);
    std::vector<BarValue> parity;
    for (const TokenParity& t : c.greedy)
      parity.push_back({t.total > 0 ? double(t.matched) / double(t.total) : 1, -1, -1});
    h += svg_bar_chart("greedy parity per prompt: " + c.lever + " (fraction before divergence)", prompt_labels, parity,
                       1.0);
  }
  h += "</div>\n";
  for (const LeverComparison& c : r.comparisons)
    for (const auto& e : c.excerpts)
      h += fmt::format("<h3><code>{}</code>, {}: first divergence at token {}</h3>\n<p>baseline:</p><pre>{}</pre>\n"
                       "<p>lever:</p><pre>{}</pre>\n",
                       html_escape(c.lever), html_escape(e.prompt), e.first_divergence, html_escape(e.baseline),
                       html_escape(e.lever));
  for (size_t i = 0; i < r.comparisons.size(); ++i)
    if (r.arms[i].not_engaged)
      h += fmt::format("<p><code>{}</code> did not run: {}</p>\n", html_escape(r.comparisons[i].lever),
                       html_escape(*r.arms[i].not_engaged));
  if (!r.notes.empty()) {
    h += "<h2>Notes</h2>\n<ul>\n";
    for (const std::string& n : r.notes) h += "<li>" + html_escape(n) + "</li>\n";
    h += "</ul>\n";
  }
  h += "<p>Made by <code>mere audit</code>; every figure is also in report.json.</p>\n</body></html>\n";
  return h;
}

std::vector<fs::path> write_reports(const AuditReport& r, const fs::path& dir) {
  fs::create_directories(dir);
  const std::vector<std::pair<fs::path, std::string>> files = {
      {dir / "report.json",
       // Excerpts cut between tokens may split a UTF-8 character: replace, do not throw.
       report_json(r).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"},
      {dir / "report.md", report_markdown(r)},
      {dir / "report.html", report_html(r)}};
  std::vector<fs::path> out;
  for (const auto& [path, text] : files) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << text;
    MERE_CHECK(f.flush(), "{}: cannot write", path.string());
    out.push_back(path);
  }
  return out;
}

}  // namespace mere

#include "runtime/obs/report.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/obs/phase_timer.h"

namespace ampdist {
namespace {

using json = nlohmann::json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
const char* color(size_t i) { return kColors[i % 6]; }

double num(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return kNaN;  // JSON null stands for inf or NaN
  return it->get<double>();
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

// Axis tick values: about n "nice" steps (1, 2, 5 x 10^k) over [lo, hi].
std::vector<double> ticks(double lo, double hi, int n) {
  std::vector<double> t;
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) t.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  return t;
}

std::string fmt_num(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "NaN" : (v > 0 ? "inf" : "-inf");
  return fmt::format("{:g}", v);
}

struct Series {
  std::string label;
  const char* color;
  std::vector<std::pair<double, double>> pts;
  std::vector<std::pair<double, std::string>> marks;  // x positions of event markers, with a tooltip
};

// A line chart on shared axes; log_y plots log2 of y (loss scales are powers of two).
std::string chart(const std::string& id, const std::string& title, const std::string& ylabel,
                  const std::vector<Series>& series, bool log_y = false) {
  const double W = 560, H = 310, L = 64, R = 16, T = 40, B = 44;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  auto ty = [&](double y) { return log_y ? std::log2(y) : y; };
  for (const Series& s : series)
    for (auto [x, y] : s.pts) {
      if (!std::isfinite(y) || (log_y && y <= 0)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, ty(y)), y1 = std::max(y1, ty(y));
    }
  std::string o = fmt::format("<figure class=\"chart\" id=\"{}\"><svg xmlns=\"http://www.w3.org/2000/svg\" "
                              "width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\">",
                              id, W, H, W, H);
  o += fmt::format("<text x=\"{}\" y=\"18\" class=\"title\">{}</text>", 8, esc(title));
  if (!std::isfinite(x0)) return o + fmt::format("<text x=\"{}\" y=\"{}\">no data</text></svg></figure>", L, H / 2);
  x0 = std::min(x0, 0.0);  // every step chart starts at step 0, so charts of one page share their x axis
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y0 -= 0.5, y1 += 0.5;
  // Room above and below, so that a flat curve (a constant loss scale) is not drawn on the frame.
  const double pad = log_y ? 0.5 : 0.05 * (y1 - y0);
  y0 -= pad, y1 += pad;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"plot\"/>", L, T, W - L - R, H - T - B);
  for (double t : ticks(x0, x1, 5))
    o += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" class=\"grid\"/><text x=\"{0:.1f}\" "
                     "y=\"{3}\" class=\"xt\">{4}</text>",
                     px(t), T, H - B, H - B + 16, fmt_num(t));
  for (double t : log_y ? ticks(std::floor(y0), std::ceil(y1), 5) : ticks(y0, y1, 5)) {
    if (t < y0 - 1e-9 || t > y1 + 1e-9) continue;
    o += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" class=\"grid\"/><text x=\"{3}\" "
                     "y=\"{4:.1f}\" class=\"yt\">{5}</text>",
                     L, W - R, py(t), L - 6, py(t) + 4, log_y ? fmt_num(std::exp2(t)) : fmt_num(t));
  }
  o += fmt::format("<text x=\"{}\" y=\"{}\" class=\"xl\">step</text>", (L + W - R) / 2, H - 8);
  o += fmt::format("<text transform=\"translate(14 {}) rotate(-90)\" class=\"yl\">{}</text>", (T + H - B) / 2,
                   esc(ylabel));
  for (const Series& s : series) {
    std::string pts;
    for (auto [x, y] : s.pts)
      if (std::isfinite(y) && !(log_y && y <= 0)) pts += fmt::format("{:.1f},{:.1f} ", px(x), py(ty(y)));
    o += fmt::format("<polyline class=\"curve\" data-run=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" "
                     "points=\"{}\"/>",
                     esc(s.label), s.color, pts);
    // Sparse series (evaluations) also get a dot per point, so that two points do not read as a measured line.
    if (s.pts.size() <= 30)
      for (auto [x, y] : s.pts)
        if (std::isfinite(y) && !(log_y && y <= 0))
          o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>", px(x), py(ty(y)), s.color);
    for (const auto& [x, tip] : s.marks)
      o += fmt::format("<path class=\"skip\" data-run=\"{}\" d=\"M{:.1f},{:.1f} l-5,-9 h10 z\" fill=\"{}\"><title>{}"
                       "</title></path>",
                       esc(s.label), px(x), static_cast<double>(T) + 10, s.color, esc(tip));
  }
  // Legend: one row under the title, outside the plot, right-aligned.
  for (size_t i = 0; i < series.size(); ++i) {
    const double x = W - R - 70.0 * static_cast<double>(series.size() - i);
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"3\" fill=\"{}\"/><text x=\"{}\" y=\"{}\" "
                     "class=\"lg\">{}</text>",
                     x, 27, series[i].color, x + 16, 32, esc(series[i].label));
  }
  return o + "</svg></figure>";
}

// Horizontal stacked bars of ms per step by phase, one bar per run, on a shared scale.
std::string phase_bars(const std::vector<RunData>& runs) {
  const double W = 1140, L = 170, R = 90, row = 30, T = 40;
  double max_ms = 0;
  for (const RunData& r : runs) {
    double t = 0;
    for (auto& [n, ms] : r.phase_ms) t += ms;
    max_ms = std::max(max_ms, t);
  }
  const double H = T + row * runs.size() + 20;
  std::string o = fmt::format("<figure class=\"chart wide\" id=\"phases\"><svg xmlns=\"http://www.w3.org/2000/svg\" "
                              "width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\">",
                              W, H, W, H);
  o += "<text x=\"10\" y=\"18\" class=\"title\">Step time by phase (ms per step, rank 0)</text>";
  const char* pcolors[] = {"#8c8c8c", "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#b07aa1"};
  for (int i = 0; i < static_cast<int>(Phase::kCount); ++i)
    o += fmt::format("<rect x=\"{}\" y=\"26\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"35\" "
                     "class=\"lg\">{}</text>",
                     L + 140 * i, pcolors[i], L + 140 * i + 14, phase_name(static_cast<Phase>(i)));
  for (size_t k = 0; k < runs.size(); ++k) {
    const double y = T + 8 + row * k;
    o += fmt::format("<text x=\"{}\" y=\"{}\" class=\"yt\">{}</text>", L - 8, y + 15, esc(runs[k].label));
    double x = L, total = 0;
    for (size_t i = 0; i < runs[k].phase_ms.size(); ++i) {
      const auto& [name, ms] = runs[k].phase_ms[i];
      const double w = max_ms > 0 ? ms / max_ms * (W - L - R) : 0;
      o += fmt::format("<rect class=\"phase\" data-run=\"{}\" data-phase=\"{}\" x=\"{:.1f}\" y=\"{}\" "
                       "width=\"{:.1f}\" height=\"20\" fill=\"{}\"><title>{} {}: {:.3f} ms</title></rect>",
                       esc(runs[k].label), name, x, y, w, pcolors[i % 7], esc(runs[k].label), name, ms);
      x += w;
      total += ms;
    }
    o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" class=\"lg\">{:.2f} ms</text>", x + 6, y + 15, total);
  }
  return o + "</svg></figure>";
}

// The fields of one record of metrics.jsonl (written by metrics_sink.cc) into `r`, one function per record type.
void read_train_record(const json& j, int64_t step, int64_t& prev_skipped, RunData& r) {
  r.loss.emplace_back(step, num(j, "loss"));
  r.lr.emplace_back(step, num(j, "lr"));
  r.scale.emplace_back(step, num(j, "scale"));
  r.grad_norm.emplace_back(step, num(j, "grad_norm"));
  r.samples_per_s.emplace_back(step, num(j, "samples_per_s"));
  r.rss_mb.emplace_back(step, num(j, "peak_rss_mb"));
  const int64_t sk = j.value("skipped_steps", int64_t{0});
  if (sk > prev_skipped) r.skips.emplace_back(step, sk - prev_skipped);
  prev_skipped = sk;
}

void read_summary_record(const json& j, RunData& r) {
  r.has_summary = true;
  r.steps = j.value("steps", int64_t{0});
  r.skipped_steps = j.value("skipped_steps", int64_t{0});
  r.test_accuracy = num(j, "test_accuracy");
  r.test_loss = num(j, "test_loss");
  r.samples_per_s_total = num(j, "samples_per_s");
  r.final_scale = num(j, "final_scale");
  r.peak_rss_mb = num(j, "peak_rss_mb");
  r.phase_ms.clear();
  if (j.contains("phase_ms") && j["phase_ms"].is_object())
    for (int i = 0; i < static_cast<int>(Phase::kCount); ++i) {
      const std::string n(phase_name(static_cast<Phase>(i)));
      r.phase_ms.emplace_back(n, num(j["phase_ms"], n.c_str()));
    }
}

NumericsSnapshot read_numerics_record(const json& j, int64_t step) {
  NumericsSnapshot s;
  s.step = step;
  for (const json& l : j.value("layers", json::array())) {
    NumericsLayerRow row;
    row.name = l.value("name", "");
    row.act_max = num(l, "act_max");
    row.grad_max = l.contains("grad_max") && l["grad_max"].is_null() && !l.value("grad_nonfinite", false)
                       ? -1.0
                       : num(l, "grad_max");
    row.act_nonfinite = l.value("act_nonfinite", false);
    row.grad_nonfinite = l.value("grad_nonfinite", false);
    row.underflow = num(l, "grad_underflow_fraction");
    row.headroom_bits = num(l, "headroom_bits");
    s.layers.push_back(row);
  }
  if (j.contains("first_nonfinite")) {
    s.first_layer = j["first_nonfinite"].value("layer", "");
    s.first_pass = j["first_nonfinite"].value("pass", "");
  }
  return s;
}

}  // namespace

RunData load_run(const std::string& dir) {
  const std::string path = dir + "/metrics.jsonl";
  std::ifstream in(path);
  if (!in) throw BadInput(path, "cannot be read (is " + dir + " a run directory of ampdist train?)");
  RunData r;
  r.dir = dir;
  r.label = std::filesystem::path(dir).lexically_normal().filename().string();
  if (r.label.empty()) r.label = std::filesystem::path(dir).lexically_normal().parent_path().filename().string();
  std::string line;
  int lineno = 0;
  bool started = false;
  int64_t prev_skipped = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw BadInput(path + ":" + std::to_string(lineno), "not a JSON object");
    const std::string type = j.value("type", "");
    if (type == "start") {
      RunData fresh;  // a new run in the same directory: only its own records count
      fresh.dir = r.dir;
      fresh.label = r.label;
      r = fresh;
      started = true;
      prev_skipped = 0;
      r.name = j.value("name", "");
      r.dtype = j.value("dtype", "");
      r.world_size = j.value("world_size", int64_t{0});
      r.global_batch_size = j.value("global_batch_size", int64_t{0});
      continue;
    }
    if (!started) continue;
    const int64_t step = j.value("step", int64_t{0});
    if (type == "train") {
      read_train_record(j, step, prev_skipped, r);
    } else if (type == "eval") {
      r.eval_accuracy.emplace_back(step, num(j, "test_accuracy"));
      r.eval_loss.emplace_back(step, num(j, "test_loss"));
    } else if (type == "summary") {
      read_summary_record(j, r);
    } else if (type == "numerics") {
      r.numerics.push_back(read_numerics_record(j, step));
    }
  }
  if (!started) throw BadInput(path, "no {\"type\":\"start\"} record: not a metrics file of ampdist train");
  return r;
}

namespace {

// The page's head, styles and the legend of the runs.
std::string page_head(const std::vector<RunData>& runs) {
  std::string o =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>ampdist report</title><style>\n"
      "body{font-family:sans-serif;margin:20px;color:#222;max-width:1180px}"
      "h1{font-size:22px}h2{font-size:17px;margin-top:28px}"
      "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
      "th{background:#f3f3f3}td.l,th.l{text-align:left}td.bad{background:#fdd;font-weight:bold}"
      ".charts{display:flex;flex-wrap:wrap;gap:8px}figure.chart{margin:0}"
      "svg text{font-size:11px;fill:#333}.title{font-size:13px;font-weight:bold}.xt{text-anchor:middle}"
      ".yt{text-anchor:end}.xl{text-anchor:middle}.yl{text-anchor:middle}.plot{fill:#fff;stroke:#999}"
      ".grid{stroke:#e6e6e6}.note{font-size:12px;color:#555}\n"
      "</style></head><body>\n<h1>ampdist report</h1>\n<p class=\"note\">";
  for (size_t i = 0; i < runs.size(); ++i)
    o += fmt::format("{}<span style=\"color:{}\">&#9632;</span> <b class=\"run\">{}</b> ({}, {}, {} ranks)",
                     i ? " &nbsp; " : "", color(i), esc(runs[i].label), esc(runs[i].dir), esc(runs[i].dtype),
                     runs[i].world_size);
  return o + "</p>\n";
}

// The final results, a row per run, with speed and memory against `base` (the first finished fp32 run, or null).
std::string results_table(const std::vector<RunData>& runs, const RunData* base) {
  std::string o =
      "<h2>Results</h2>\n<table id=\"results\"><tr><th class=\"l\">run</th><th>dtype</th><th>steps</th>"
      "<th>test accuracy</th><th>test loss</th><th>samples/s</th><th>speedup vs fp32</th><th>peak RSS (MiB)</th>"
      "<th>memory vs fp32</th><th>skipped steps</th><th>final loss scale</th></tr>\n";
  for (const RunData& r : runs) {
    if (!r.has_summary) {
      o += fmt::format("<tr data-run=\"{0}\"><td class=\"l\">{0}</td><td>{1}</td><td colspan=\"9\" class=\"l\">no "
                       "summary record (run unfinished)</td></tr>\n",
                       esc(r.label), esc(r.dtype));
      continue;
    }
    const std::string speed = base && base->samples_per_s_total > 0
                                  ? fmt::format("{:.2f}x", r.samples_per_s_total / base->samples_per_s_total)
                                  : "n/a";
    const std::string mem = base && base->peak_rss_mb > 0 && std::isfinite(r.peak_rss_mb)
                                ? fmt::format("{:.2f}x", r.peak_rss_mb / base->peak_rss_mb)
                                : "n/a";
    o += fmt::format("<tr data-run=\"{0}\"><td class=\"l\">{0}</td><td>{1}</td><td>{2}</td>"
                     "<td class=\"acc\">{3:.4f}</td><td>{4:.4f}</td><td class=\"sps\">{5:.1f}</td><td>{6}</td>"
                     "<td>{7:.1f}</td><td>{8}</td><td class=\"skipped\">{9}</td><td>{10:g}</td></tr>\n",
                     esc(r.label), esc(r.dtype), r.steps, r.test_accuracy, r.test_loss, r.samples_per_s_total, speed,
                     r.peak_rss_mb, mem, r.skipped_steps, r.final_scale);
  }
  o += "</table>\n";
  return o + (base ? "<p class=\"note\">Speedup and memory are against " + esc(base->label) +
                         " (fp32). Memory is rank 0's peak resident set size.</p>\n"
                   : "<p class=\"note\">No finished fp32 run among these: speedup and memory ratios are n/a.</p>\n");
}

// The curves of every run, one chart per metric.
std::string curves(const std::vector<RunData>& runs) {
  auto series = [&](auto member) {
    std::vector<Series> v;
    for (size_t i = 0; i < runs.size(); ++i) {
      Series s{runs[i].label, color(i), {}, {}};
      for (auto [x, y] : runs[i].*member) s.pts.emplace_back(static_cast<double>(x), y);
      v.push_back(std::move(s));
    }
    return v;
  };
  std::string o = "<h2>Curves</h2>\n<div class=\"charts\">\n";
  o += chart("loss", "Training loss (mean over each log window)", "loss", series(&RunData::loss));
  o += chart("eval", "Test accuracy", "accuracy", series(&RunData::eval_accuracy));
  std::vector<Series> sc = series(&RunData::scale);
  for (size_t i = 0; i < runs.size(); ++i)
    for (auto [step, n] : runs[i].skips)
      sc[i].marks.emplace_back(static_cast<double>(step),
                               fmt::format("{}: {} skipped step(s) by step {}", runs[i].label, n, step));
  o += chart("scale", "Loss scale (log2 axis; triangles: skipped steps)", "loss scale", sc, true);
  o += chart("gradnorm", "Gradient norm (unscaled, before clipping)", "L2 norm", series(&RunData::grad_norm));
  o += chart("throughput", "Throughput", "samples/s", series(&RunData::samples_per_s));
  o += chart("evalloss", "Test loss", "loss", series(&RunData::eval_loss));
  return o + "</div>\n";
}

// A run's numerics table: the first report naming a non-finite layer, else the last report.
std::string numerics_section(const RunData& r) {
  const NumericsSnapshot* s = &r.numerics.back();
  for (const NumericsSnapshot& n : r.numerics)
    if (!n.first_layer.empty()) {
      s = &n;
      break;
    }
  std::string o = fmt::format("<h2>Numerics: {} (step {}, {})</h2>\n", esc(r.label), s->step, esc(r.dtype));
  if (!s->first_layer.empty())
    o += fmt::format("<p class=\"first-nonfinite\" data-run=\"{}\">First non-finite value: layer <b>{}</b> "
                     "({} pass) at step {}</p>\n",
                     esc(r.label), esc(s->first_layer), esc(s->first_pass), s->step);
  o += fmt::format("<table class=\"numerics\" data-run=\"{}\"><tr><th class=\"l\">layer</th><th>max |activation|"
                   "</th><th>max |gradient| (scaled)</th><th>gradient underflow</th><th>headroom (bits)</th></tr>\n",
                   esc(r.label));
  for (const NumericsLayerRow& l : s->layers) {
    const bool first = l.name == s->first_layer;
    o += fmt::format("<tr><td class=\"l{}\">{}</td><td{}>{}</td><td{}>{}</td><td>{}</td><td>{}</td></tr>\n",
                     first ? " bad" : "", esc(l.name), l.act_nonfinite ? " class=\"bad\"" : "",
                     l.act_nonfinite ? "inf/NaN" : fmt::format("{:.4g}", l.act_max),
                     l.grad_nonfinite ? " class=\"bad\"" : "",
                     l.grad_nonfinite ? "inf/NaN" : l.grad_max < 0 ? "-" : fmt::format("{:.4g}", l.grad_max),
                     l.grad_max < 0 && !l.grad_nonfinite ? "-" : fmt::format("{:.3f}%", 100.0 * l.underflow),
                     std::isfinite(l.headroom_bits) ? fmt::format("{:.1f}", l.headroom_bits) : "-");
  }
  return o + "</table>\n";
}

}  // namespace

std::string render_report(const std::vector<RunData>& runs) {
  const RunData* base = nullptr;
  for (const RunData& r : runs)
    if (r.dtype == "fp32" && r.has_summary) {
      base = &r;
      break;
    }
  std::string o = page_head(runs) + results_table(runs, base) + curves(runs);
  bool any_phase = false;
  for (const RunData& r : runs) any_phase |= !r.phase_ms.empty();
  if (any_phase) o += "<h2>Where a step's time goes</h2>\n" + phase_bars(runs) + "\n";
  for (const RunData& r : runs)
    if (!r.numerics.empty()) o += numerics_section(r);
  o += "<p class=\"note\">Generated by ampdist report from each run's metrics.jsonl.</p>\n</body></html>\n";
  return o;
}

}  // namespace ampdist

// SPDX-License-Identifier: Apache-2.0
// solar report's reading and drawing (report.h): one SVG picture from measured statistics and
// benchmark results.
//
// Inputs (JSON, recognised by their shape):
//   stats      `solar run --stats-out`, `srun --solar-stats`: {"nodes":[{node, epochs:[...]}]}, or
//              one agent's `solar-agent --stats-out` file: {node, epochs:[...]}
//   benchmark  `bench/pytorch_io.py --json`: {"modes":{"baseline":{per_epoch_s}, "solar":{...,
//              limit}, ...}}
//   sweep      `bench/sweep`: {"points":[{label, speedup, limit, ...}]}
//   AU         `bench/au.py --json`: {"kind":"au", "accelerators":[N...], "threshold",
//              "loaders":{name:{"N":{au, ...}}}}
// Panels, one per kind present: per-epoch loading time of each loader with the storage's limit;
// hit rate (and ranks' stall) per epoch and node, with the plan's hit rate and the best the
// lower bound allows where the file has the plan's figures ("plan": solar run, srun); the
// sweep's speedup against its limit; the accelerator utilisation against the number of
// accelerators with MLPerf's threshold. Lines that overlap stay legible: each series has its
// own dashes and its own hollow marker shape, a size larger than the one before (equal values
// nest); references (limits, bounds, thresholds) are grey, dashed, without markers, and carry
// their values in data-values. Legends give totals; the default title summarises the inputs.
//
// SVG is written directly (no plotting library): the tool stays free of Python and of a
// display, the output is plain text a test can parse, and the picture needs only lines, bars,
// axes and labels.
#include "report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace solar::cli {
namespace {

using nlohmann::json;

struct Series {
  std::string name;  // data-series (what a script looks up)
  std::string colour;
  std::vector<double> y;  // NaN: no value
  bool reference = false;  // a limit, bound or threshold: grey, dashed, no markers
  std::string note;        // shown after the name in the legend (a total)
};

struct LinePanel {
  std::string title, y_label, x_label;
  std::vector<Series> series;
  double y_max_hint = 0;  // e.g. 100 for percentages
  std::vector<std::string> x_ticks;  // the x values' labels; none: 0, 1, 2...
};

struct BarPanel {
  std::string title, y_label;
  std::vector<std::string> groups;  // one per point
  std::vector<Series> series;       // y[i]: the value for group i
};

const char* kColours[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e",
                          "#8c564b", "#e377c2", "#17becf"};

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

// A round axis maximum and its tick step (1, 2 or 5 × 10^k). Kept where a double can count
// ticks: near its largest value the axis's end rounded up to infinity and near its smallest the
// step was 0, and either way the ticks never ended (fuzz.report).
std::pair<double, double> nice_axis(double max) {
  if (!(max > 0) || !std::isfinite(max)) max = 1;
  max = std::clamp(max, 1e-200, 1e300);
  const double raw = max / 5;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  return {std::ceil(max / step - 1e-9) * step, step};
}

std::string tick_text(double v, double step) {
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  return fmt::format("{:.{}f}", v, decimals);
}

constexpr double kWidth = 1040, kPanelH = 340, kLeft = 80, kRight = 280, kTop = 40, kBottom = 70;

// Frame, title, y axis with ticks; returns the y scale.
double frame(std::ostringstream& o, double y0, const std::string& title,
             const std::string& y_label, double y_max, double* step_out) {
  const auto [ymax, step] = nice_axis(y_max);
  *step_out = step;
  const double h = kPanelH - kTop - kBottom, x1 = kWidth - kRight;
  o << fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"16\" font-weight=\"bold\">{}</text>\n",
                   kLeft, y0 + 24, esc(title));
  o << fmt::format("<text transform=\"translate({},{}) rotate(-90)\" text-anchor=\"middle\" "
                   "font-size=\"12\">{}</text>\n",
                   20, y0 + kTop + h / 2, esc(y_label));
  for (double v = 0; v <= ymax + step / 2; v += step) {
    const double y = y0 + kTop + h - v / ymax * h;
    o << fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n",
                     kLeft, y, x1, y);
    o << fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"11\">{}</text>\n",
                     kLeft - 6, y + 4, tick_text(v, step));
  }
  o << fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#000\"/>\n", kLeft,
                   y0 + kTop, y0 + kTop + h);
  o << fmt::format("<line x1=\"{0}\" y1=\"{2}\" x2=\"{1}\" y2=\"{2}\" stroke=\"#000\"/>\n", kLeft,
                   x1, y0 + kTop + h);
  return ymax;
}

// How a series is told from the others where lines overlap (issue 41): its own dash pattern,
// and its own marker shape, hollow and a little larger than the previous series' so that equal
// values show as nested shapes, not one hidden under the other.
// References (limits, bounds, thresholds) have dashes of their own, k counting among them.
const char* kDashes[] = {"", "9,4", "3,3", "12,4,3,4"};
const char* kReferenceDashes[] = {"6,4", "2,3", "10,3,2,3"};

std::string dash_attr(const Series& s, std::size_t k) {
  const char* d = s.reference ? kReferenceDashes[k % 3] : kDashes[k % 4];
  return *d ? fmt::format(" stroke-dasharray=\"{}\"", d) : "";
}

// Series k's marker at (x, y); `value` (NaN: a legend's sample, no value) as data-value.
std::string marker(std::size_t k, double x, double y, const std::string& colour, double value) {
  const double r = 3.5 + 1.2 * static_cast<double>(k % 6);
  const std::string common = fmt::format(
      "class=\"marker\" fill=\"white\" stroke=\"{}\" stroke-width=\"1.5\"{}", colour,
      std::isfinite(value) ? fmt::format(" data-value=\"{:.6g}\"", value) : "");
  switch (k % 6) {
    case 0: return fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{:.1f}\" {}/>\n", x, y, r, common);
    case 1:
      return fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" {}/>\n",
                         x - r, y - r, 2 * r, 2 * r, common);
    case 2:
      return fmt::format("<polygon points=\"{:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}\" {}/>\n", x,
                         y - r, x + r, y + r, x - r, y + r, common);
    case 3:
      return fmt::format(
          "<polygon points=\"{:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}\" {}/>\n", x,
          y - r, x + r, y, x, y + r, x - r, y, common);
    case 4:
      return fmt::format("<polygon points=\"{:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}\" {}/>\n", x,
                         y + r, x + r, y - r, x - r, y - r, common);
    default:
      return fmt::format("<path d=\"M{:.1f},{:.1f}L{:.1f},{:.1f}M{:.1f},{:.1f}L{:.1f},{:.1f}\" {}/>\n",
                         x - r, y - r, x + r, y + r, x - r, y + r, x + r, y - r, common);
  }
}

void legend(std::ostringstream& o, double y0, const std::vector<Series>& series, bool markers) {
  double y = y0 + kTop + 8;
  std::size_t k = 0, refs = 0;
  for (const Series& s : series) {
    const double x0 = kWidth - kRight + 12, x1 = kWidth - kRight + 44;
    if (markers)  // lines: the line's own dashes; bars: a swatch of the colour
      o << fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" "
                       "stroke-width=\"2\"{4}/>\n",
                       x0, y, x1, s.reference ? "#777" : s.colour,
                       dash_attr(s, s.reference ? refs : k));
    else
      o << fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"10\" fill=\"{}\"/>\n", x0,
                       y - 5, x1 - x0, s.colour);
    if (markers && !s.reference) o << marker(k, (x0 + x1) / 2, y, s.colour, NAN);
    std::string text = s.name + (s.note.empty() ? "" : " " + s.note);
    o << fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\">{}</text>\n", x1 + 6, y + 4,
                     esc(text));
    y += 20;
    ++(s.reference ? refs : k);
  }
}

void draw_lines(std::ostringstream& o, double y0, const LinePanel& p) {
  std::size_t n = 0;
  double top = p.y_max_hint;
  for (const Series& s : p.series) {
    n = std::max(n, s.y.size());
    for (double v : s.y)
      if (std::isfinite(v)) top = std::max(top, v);
  }
  double step = 0;
  const double ymax = frame(o, y0, p.title, p.y_label, top * (p.y_max_hint > 0 ? 1 : 1.05),
                            &step);
  const double h = kPanelH - kTop - kBottom, w = kWidth - kRight - kLeft - 20;
  auto x_of = [&](std::size_t i) {
    return kLeft + 10 + (n > 1 ? w * static_cast<double>(i) / static_cast<double>(n - 1) : w / 2);
  };
  const std::size_t every = std::max<std::size_t>(1, n / 20);
  for (std::size_t i = 0; i < n; i += every)
    o << fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" font-size=\"11\">{}"
                     "</text>\n",
                     x_of(i), y0 + kTop + h + 16,
                     i < p.x_ticks.size() ? esc(p.x_ticks[i]) : std::to_string(i));
  o << fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\">{}</text>\n",
                   kLeft + w / 2, y0 + kTop + h + 36, esc(p.x_label));
  std::size_t k = 0, refs = 0;  // the series' place among the references or the others
  for (const Series& s : p.series) {
    const std::size_t at = s.reference ? refs++ : k++;
    o << fmt::format("<g class=\"series\" data-series=\"{}\">\n", esc(s.name));
    std::string pts, marks, values;
    for (std::size_t i = 0; i < s.y.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      const double x = x_of(i), y = y0 + kTop + h - s.y[i] / ymax * h;
      pts += fmt::format("{:.1f},{:.1f} ", x, y);
      values += fmt::format("{}{:.6g}", values.empty() ? "" : " ", s.y[i]);
      if (!s.reference) marks += marker(at, x, y, s.colour, s.y[i]);
    }
    // The line first, its markers over it; a reference's values (no markers) on its line.
    o << fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\"{}{}/>\n",
                     pts, s.reference ? "#777" : s.colour, s.reference ? 1.5 : 2, dash_attr(s, at),
                     s.reference ? fmt::format(" data-values=\"{}\"", values) : "");
    o << marks << "</g>\n";
  }
  legend(o, y0, p.series, true);
}

void draw_bars(std::ostringstream& o, double y0, const BarPanel& p) {
  double top = 0;
  for (const Series& s : p.series)
    for (double v : s.y)
      if (std::isfinite(v)) top = std::max(top, v);
  double step = 0;
  const double ymax = frame(o, y0, p.title, p.y_label, top * 1.05, &step);
  const double h = kPanelH - kTop - kBottom, w = kWidth - kRight - kLeft - 20;
  const std::size_t n = p.groups.size(), k = p.series.size();
  const double gw = n ? w / static_cast<double>(n) : w;
  const double bw = std::max(1.0, gw * 0.8 / static_cast<double>(std::max<std::size_t>(k, 1)));
  for (std::size_t i = 0; i < n; ++i) {
    const double x = kLeft + 10 + gw * static_cast<double>(i) + gw / 2;
    o << fmt::format("<text transform=\"translate({:.1f},{}) rotate(20)\" font-size=\"9\">{}"
                     "</text>\n",
                     x - 20, y0 + kTop + h + 12, esc(p.groups[i]));
  }
  for (std::size_t j = 0; j < k; ++j) {
    const Series& s = p.series[j];
    o << fmt::format("<g class=\"series\" data-series=\"{}\">\n", esc(s.name));
    for (std::size_t i = 0; i < s.y.size() && i < n; ++i) {
      if (!std::isfinite(s.y[i])) continue;
      const double x =
          kLeft + 10 + gw * static_cast<double>(i) + gw * 0.1 + bw * static_cast<double>(j);
      const double bh = s.y[i] / ymax * h;
      o << fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
                       "fill=\"{}\" data-value=\"{:.6g}\"><title>{}: {:.3g}</title></rect>\n",
                       x, y0 + kTop + h - bh, bw, bh, s.colour, s.y[i], esc(p.groups[i]),
                       s.y[i]);
    }
    o << "</g>\n";
  }
  legend(o, y0, p.series, false);
}

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw BadInput(fmt::format("{}: {}", path, why));
}

double num(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

std::vector<double> numbers(const json& a) {
  std::vector<double> v;
  if (a.is_array())
    for (const json& x : a) v.push_back(x.is_number() ? x.get<double>() : NAN);
  return v;
}

// An epoch's samples served from the buffer: its memory hits and, with a local tier, the
// samples read back from the local disk (the agents count them apart, as local_samples; the
// plan's hits are of both tiers). NAN where the epoch has no "hits".
double buffer_hits(const json& e) {
  const double local = num(e, "local_samples");
  return num(e, "hits") + (std::isfinite(local) ? local : 0);
}

// "(<the values' sum> in all)" where there is one: a line's total, in its legend.
std::string total_note(const std::vector<double>& y, const char* format) {
  double sum = 0;
  bool any = false;
  for (double v : y)
    if (std::isfinite(v)) sum += v, any = true;
  return any ? "(" + fmt::format(fmt::runtime(format), sum) + ")" : "";
}

std::string loader_name(const std::string& name) {
  return name == "baseline" ? "PyTorch DataLoader" : name == "solar" ? "solar.torch.Loader" : name;
}

// The loaders' per-epoch loading times (pytorch_io --json) with each one's limit.
LinePanel benchmark_panel(const json& j, const std::string& path) {
  const json& modes = j.at("modes");
  if (!modes.is_object() || !modes.contains("baseline"))
    bad(path, "a benchmark result needs modes.baseline (bench/pytorch_io.py --json)");
  LinePanel p{"Data-loading time per epoch (" + std::filesystem::path(path).filename().string() +
                  ")",
              "seconds (slowest rank)", "epoch", {}, 0, {}};
  std::size_t c = 0;
  const std::vector<double> base = numbers(modes["baseline"].value("per_epoch_s", json()));
  for (const auto& [name, m] : modes.items()) {
    std::string label = loader_name(name);
    if (name == "solar" || name == "transparent")
      if (const double s = num(m, "speedup"); std::isfinite(s))
        label += fmt::format(" ({:.2f}x)", s);
    Series s{label, kColours[c++ % 8], numbers(m.value("per_epoch_s", json())), false, {}};
    s.note = total_note(s.y, "{:.2f} s in all");
    p.series.push_back(std::move(s));
  }
  // What the storage allows solar: the baseline's time over the plan's byte ratio.
  if (modes.contains("solar"))
    if (const double limit = num(modes["solar"], "limit"); std::isfinite(limit) && limit > 0) {
      Series s{fmt::format("storage limit for solar ({:.2f}x)", limit), "#555", {}, true, {}};
      for (double b : base) s.y.push_back(b / limit);
      p.series.push_back(std::move(s));
    }
  return p;
}

// MLPerf Storage's accelerator utilisation against the number of emulated accelerators, one
// series per loader, the workload's threshold dashed (bench/au.py --json).
LinePanel au_panel(const json& j, const std::string& path) {
  const json& counts = j.at("accelerators");
  const json& loaders = j.at("loaders");
  if (!counts.is_array() || counts.empty() || !loaders.is_object())
    bad(path, "an AU result needs \"accelerators\" (a non-empty array) and \"loaders\" (an "
              "object) (bench/au.py --json)");
  LinePanel p{fmt::format("Accelerator utilisation, {} ({})", j.value("workload", std::string("?")),
                          std::filesystem::path(path).filename().string()),
              "AU % (mean over the accelerators)", "emulated accelerators (N)", {}, 100, {}};
  for (const json& n : counts) p.x_ticks.push_back(n.is_number() ? n.dump() : "?");
  std::size_t c = 0;
  for (const auto& [name, by_n] : loaders.items()) {
    Series s{loader_name(name), kColours[c++ % 8], {}, false, {}};
    if (const json* largest = j.contains("largest") && j["largest"].is_object()
                                  ? &j["largest"] : nullptr;
        largest && largest->contains(name) && (*largest)[name].is_number())
      s.name += fmt::format(" (sustains {})", (*largest)[name].dump());
    for (const json& n : counts) {
      const std::string key = n.is_number() ? n.dump() : "";
      s.y.push_back(by_n.is_object() && by_n.contains(key) && by_n[key].is_object()
                        ? 100 * num(by_n[key], "au") : NAN);
    }
    p.series.push_back(std::move(s));
  }
  if (const double t = num(j, "threshold"); std::isfinite(t))
    p.series.push_back({fmt::format("MLPerf threshold ({:.0f}%)", 100 * t), "#555",
                        std::vector<double>(counts.size(), 100 * t), true, {}});
  return p;
}

// Hit rate, the local tier's share (where a node read any back) and stall per epoch, one
// series per node.
std::vector<LinePanel> stats_panels(const json& j, const std::string& path) {
  std::vector<json> nodes;
  if (j.contains("nodes")) {
    if (!j["nodes"].is_array()) bad(path, "\"nodes\" is not an array");
    for (const json& n : j["nodes"]) nodes.push_back(n);
  } else {
    nodes.push_back(j);
  }
  const std::string file = std::filesystem::path(path).filename().string();
  LinePanel hit{"Hit rate per epoch (" + file + ")", "% of samples served from the buffer",
                "epoch", {}, 100, {}};
  LinePanel stall{"Ranks' wait for batches per epoch (" + file + ")",
                  "seconds (slowest rank, summed over its batches)", "epoch", {}, 0, {}};
  std::size_t c = 0, missing = 0, epochs = 0;
  double all_hits = 0, all_fetched = 0;
  LinePanel tier{"Local tier per epoch (" + file + ")",
                  "% of samples read back from the local disk", "epoch", {}, 100, {}};
  bool any_stall = false, any_local = false;
  for (const json& n : nodes) {
    if (n.contains("missing")) {
      ++missing;
      continue;
    }
    if (!n.contains("epochs") || !n["epochs"].is_array())
      bad(path, "a node's statistics need an \"epochs\" array (solar run --stats-out, "
                "srun --solar-stats or solar-agent --stats-out)");
    const std::string name = fmt::format("node {}", n.value("node", json(0)).dump());
    Series h{name, kColours[c % 8], {}, false, {}}, st{name, kColours[c % 8], {}, false, {}},
        lt{name, kColours[c % 8], {}, false, {}};
    ++c;
    double node_hits = 0, node_fetched = 0, node_local = 0;
    for (const json& e : n["epochs"]) {
      const double hits = buffer_hits(e), fetched = num(e, "fetched_samples");
      const double local = num(e, "local_samples");
      h.y.push_back(hits + fetched > 0 ? 100 * hits / (hits + fetched) : NAN);
      lt.y.push_back(hits + fetched > 0 && std::isfinite(local) ? 100 * local / (hits + fetched)
                                                                : NAN);
      if (std::isfinite(hits + fetched)) node_hits += hits, node_fetched += fetched;
      if (std::isfinite(local + hits + fetched)) node_local += local;
      any_local = any_local || (std::isfinite(local) && local > 0);
      const double s = num(e, "stall_max_rank_seconds");
      any_stall = any_stall || std::isfinite(s);
      st.y.push_back(s);
    }
    if (node_hits + node_fetched > 0)
      h.note = fmt::format("({:.1f}% in all)", 100 * node_hits / (node_hits + node_fetched));
    st.note = total_note(st.y, "{:.2f} s in all");
    all_hits += node_hits;
    all_fetched += node_fetched;
    epochs = std::max(epochs, h.y.size());
    if (node_hits + node_fetched > 0)
      lt.note = fmt::format("({:.1f}% in all)", 100 * node_local / (node_hits + node_fetched));
    hit.series.push_back(std::move(h));
    stall.series.push_back(std::move(st));
    tier.series.push_back(std::move(lt));
  }
  if (hit.series.size() > 1 && all_hits + all_fetched > 0)
    hit.title += fmt::format(": {:.1f}% over all nodes", 100 * all_hits / (all_hits + all_fetched));
  // The plan's own figures (solar run, srun --solar-stats): its hit rate per epoch over all
  // nodes, and the best any plan can do, from the lower bound on storage reads (core/order.h).
  if (const json* plan = j.contains("plan") && j["plan"].is_object() ? &j["plan"] : nullptr) {
    Series planned{"planned (all nodes)", "#777", {}, true, {}};
    if (plan->contains("per_epoch") && (*plan)["per_epoch"].is_array())
      for (const json& e : (*plan)["per_epoch"]) {
        const double a = num(e, "accesses"), hits = num(e, "hits");
        planned.y.push_back(a > 0 ? 100 * hits / a : NAN);
      }
    if (planned.y.size() > epochs) planned.y.resize(epochs);  // a resumed run's part
    const double a = num(*plan, "accesses"), lb = num(*plan, "lower_bound_fetches");
    if (!planned.y.empty()) {
      if (const double hr = num(*plan, "hit_rate"); std::isfinite(hr))
        planned.note = fmt::format("({:.1f}% in all)", 100 * hr);
      hit.series.push_back(std::move(planned));
    }
    if (a > 0 && std::isfinite(lb) && epochs > 0) {
      const double best = 100 * std::max(0.0, 1 - lb / a);
      hit.series.push_back({"lower bound's best", "#777", std::vector<double>(epochs, best), true,
                            fmt::format("({:.1f}% in all, at best)", best)});
    }
  }
  if (hit.series.empty())
    bad(path, fmt::format("no node has statistics ({} missing: the agents did not run or were "
                          "killed)", missing));
  std::vector<LinePanel> out{std::move(hit)};
  if (any_local) out.push_back(std::move(tier));
  if (any_stall) out.push_back(std::move(stall));
  return out;
}

BarPanel sweep_panel(const json& j, const std::string& path) {
  if (!j["points"].is_array() || j["points"].empty())
    bad(path, "a sweep needs a non-empty \"points\" array (bench/sweep)");
  BarPanel p{"Sweep: solar's speedup over the PyTorch DataLoader and the storage's limit",
             "x the DataLoader's loading time", {}, {}};
  Series speed{"solar speedup", kColours[1], {}, false, {}},
      limit{"limit (plain / planned bytes)", "#999", {}, false, {}};
  for (const json& pt : j["points"]) {
    p.groups.push_back(pt.value("label", std::string("?")));
    speed.y.push_back(num(pt, "speedup"));
    limit.y.push_back(num(pt, "limit"));
  }
  p.series = {std::move(speed), std::move(limit)};
  return p;
}

// One input's line of the default title: what ran and its headline figure.
std::string summary(const json& j) {
  if (j.value("kind", std::string()) == "au") {
    std::string out = "MLPerf Storage AU, " + j.value("workload", std::string("?"));
    if (j.contains("largest") && j["largest"].is_object()) {
      std::vector<std::string> parts;
      for (const auto& [name, n] : j["largest"].items())
        parts.push_back(fmt::format("{} sustains {}", loader_name(name), n.dump()));
      if (!parts.empty()) out += fmt::format(": {}", fmt::join(parts, ", "));
    }
    return out;
  }
  if (j.contains("modes")) {
    const json& solar = j["modes"].is_object() ? j["modes"].value("solar", json::object())
                                               : json::object();
    const double sp = num(solar, "speedup"), lim = num(solar, "limit");
    return std::isfinite(sp) ? fmt::format("solar {:.2f}x the PyTorch DataLoader{}", sp,
                                           std::isfinite(lim)
                                               ? fmt::format(" (the storage allows {:.2f}x)", lim)
                                               : "")
                             : "loaders compared";
  }
  if (j.contains("points")) return fmt::format("sweep of {} points", j["points"].size());
  if (j.contains("nodes") && j["nodes"].is_array()) {
    double hits = 0, fetched = 0;
    std::size_t epochs = 0;
    for (const json& n : j["nodes"]) {
      if (!n.is_object() || !n.contains("epochs") || !n["epochs"].is_array()) continue;
      epochs = std::max(epochs, n["epochs"].size());
      for (const json& e : n["epochs"]) {
        const double h = buffer_hits(e), f = num(e, "fetched_samples");
        if (std::isfinite(h + f)) hits += h, fetched += f;
      }
    }
    std::string out = fmt::format("{}: {} nodes, {} epochs", j.value("source", std::string("run")),
                                  j["nodes"].size(), epochs);
    if (j.contains("job") && j.contains("step"))
      out += fmt::format(" (job {}, step {})", j["job"].dump(), j["step"].dump());
    if (hits + fetched > 0) out += fmt::format(", hit rate {:.1f}%", 100 * hits / (hits + fetched));
    if (j.contains("plan") && j["plan"].is_object())
      if (const double r = num(j["plan"], "ratio_to_lower_bound"); std::isfinite(r) && r > 0)
        out += fmt::format(", plan {:.3f}x the lower bound", r);
    return out;
  }
  return fmt::format("node {}", j.value("node", json(0)).dump());
}

}  // namespace

Report report_svg(const std::vector<ReportInput>& inputs, const std::string& title) {
  std::vector<LinePanel> lines;
  std::vector<BarPanel> bars;
  std::vector<std::string> summaries;  // for the default title
  for (const ReportInput& in : inputs) {
    const std::string& path = in.name;
    json j;
    try {
      j = json::parse(in.text);
    } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
      bad(path, fmt::format("not JSON: {}", e.what()));
    }
    if (!j.is_object()) bad(path, "not a JSON object");
    try {
      if (j.value("kind", std::string()) == "au") {
        lines.push_back(au_panel(j, path));
      } else if (j.contains("modes")) {
        lines.push_back(benchmark_panel(j, path));
      } else if (j.contains("points")) {
        bars.push_back(sweep_panel(j, path));
      } else if (j.contains("nodes") || j.contains("epochs")) {
        for (LinePanel& p : stats_panels(j, path)) lines.push_back(std::move(p));
      } else {
        bad(path, "not a stats file (solar run --stats-out, srun --solar-stats), a benchmark "
                  "result (bench/pytorch_io.py --json), a sweep (bench/sweep) or an AU result "
                  "(bench/au.py --json)");
      }
      if (title.empty()) summaries.push_back(summary(j));
    } catch (const json::exception& e) {
      bad(path, fmt::format("unexpected content: {}", e.what()));
    }
  }
  std::string heading = title;
  if (heading.empty()) {  // from the inputs: the first two's summaries
    std::vector<std::string> parts(summaries.begin(),
                                   summaries.begin() + std::min<std::size_t>(2, summaries.size()));
    heading = fmt::format("{}", fmt::join(parts, "; "));
    if (inputs.size() > 2) heading += fmt::format("; {} more", inputs.size() - 2);
  }
  const double height = 50 + kPanelH * static_cast<double>(lines.size() + bars.size());
  std::ostringstream o;
  o << fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                   "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
                   "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\">\n"
                   "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
                   "<text x=\"{2}\" y=\"30\" font-size=\"20\">{3}</text>\n",
                   kWidth, height, kLeft, esc(heading));
  double y = 50;
  for (const LinePanel& p : lines) {
    o << "<g class=\"panel\" data-title=\"" << esc(p.title) << "\">\n";
    draw_lines(o, y, p);
    o << "</g>\n";
    y += kPanelH;
  }
  for (const BarPanel& p : bars) {
    o << "<g class=\"panel\" data-title=\"" << esc(p.title) << "\">\n";
    draw_bars(o, y, p);
    o << "</g>\n";
    y += kPanelH;
  }
  o << "</svg>\n";
  return {o.str(), lines.size() + bars.size()};
}

}  // namespace solar::cli

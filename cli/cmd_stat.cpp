// SPDX-License-Identifier: Apache-2.0
// solar stat: an agent's live metrics.
#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "solar/node_summary.h"
#include "commands.h"
#include "launcher.h"
#include "options.h"
#include "progress.h"

namespace solar::cli {

namespace {

// The agents `solar stat` asks: the sockets given, a solar run's folder of node*.sock, a Slurm
// step's sockets on this node (runtime_dir/solar-JOB.STEP.*/agent.sock), or $SOLAR_SOCKET.
std::vector<std::string> stat_sockets(const std::vector<std::string>& given, const std::string& job,
                                      const std::string& runtime_dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  auto add_dir = [&](const fs::path& dir, const std::string& prefix) {
    std::vector<std::string> found;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (!prefix.empty()) {
        if (name.rfind(prefix, 0) == 0 && fs::exists(e.path() / "agent.sock"))
          found.push_back((e.path() / "agent.sock").string());
      } else if (name.rfind("node", 0) == 0 && name.size() > 5 &&
                 name.substr(name.size() - 5) == ".sock") {
        found.push_back(e.path().string());
      }
    }
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
    return !found.empty();
  };
  if (!job.empty()) {
    if (!add_dir(runtime_dir, "solar-" + job + "."))
      throw ConfigError("--job", fmt::format("no agent of step {} on this node (looked for "
                                             "{}/solar-{}.*/agent.sock; give --runtime-dir if the "
                                             "site's plugstack.conf sets runtime_dir)",
                                             job, runtime_dir, job));
    return out;
  }
  for (const std::string& g : given) {
    std::error_code ec;
    if (fs::is_directory(g, ec)) {
      if (!add_dir(g, ""))
        throw ConfigError("SOCKET", fmt::format("{}: a folder without node*.sock (give a solar "
                                                "run's folder, shown by solar run -v)", g));
    } else {
      out.push_back(g);
    }
  }
  if (out.empty()) {
    const char* env = std::getenv("SOLAR_SOCKET");
    if (!env || !*env)
      throw ConfigError("SOCKET", "give an agent's socket, a solar run's folder (solar run -v "
                                  "prints it) or --job JOB.STEP (under Slurm, on the node)");
    out.push_back(env);
  }
  return out;
}

// Characters a line takes on a terminal: its UTF-8 code points (the reports hold no wide ones).
std::size_t columns_of(std::string_view s) {
  return static_cast<std::size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

// The byte position after the first `n` code points of s.
std::size_t after_columns(std::string_view s, std::size_t n) {
  std::size_t i = 0;
  for (std::size_t seen = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 && seen++ == n) break;
  }
  return i;
}

// Every line of `text` in at most `cols` columns: a longer one is broken at its last space that
// fits, the rest indented four columns (so that a redraw moves up exactly the lines it drew,
// whatever the terminal's width). cols 0: as it is.
std::string fit_lines(const std::string& text, std::size_t cols) {
  if (cols < 20) return text;
  std::string out;
  std::string_view rest(text);
  while (!rest.empty()) {
    const std::size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    std::string indent;
    while (columns_of(indent) + columns_of(line) > cols) {
      const std::size_t room = cols - columns_of(indent);
      std::size_t cut = after_columns(line, room);
      const std::size_t space = line.rfind(' ', cut);
      if (space != std::string_view::npos && space > line.find_first_not_of(' ')) cut = space;
      out += indent + std::string(line.substr(0, cut)) + "\n";
      line = line.substr(cut);
      while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      indent = "    ";
    }
    out += indent + std::string(line) + "\n";
  }
  return out;
}

// The terminal's width (stdout), or $COLUMNS, or 80.
std::size_t terminal_columns() {
  winsize ws{};
  if (::ioctl(1, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS"); c && std::atoi(c) > 0)
    return static_cast<std::size_t>(std::atoi(c));
  return 80;
}

// One agent's report: the node line, rates since the last report, and a bar per rank.
struct StatTrack {
  double served = 0, t = 0;             // samples served at the last report, and when
  double min_step = 0;                  // slowest rank's step then
  bool have = false;
};

// Ranks are numbered as solar run numbers them, globally (node × ranks per node + local rank),
// and epochs from 0; `cols` (a terminal's width, 0: none) narrows the rank bars to fit.
std::string stat_block(const nlohmann::json& s, StatTrack& tr, double now, std::size_t cols) {
  const std::uint64_t spe = s["steps_per_epoch"], total = s["total_steps"];
  const std::uint64_t epochs = s["epochs"];
  const nlohmann::json totals = s.value("totals", nlohmann::json::object());
  const double served = totals.value("samples_served", 0.0);
  const double sample_bytes = s.value("sample_bytes", 0.0);
  double min_step = static_cast<double>(total);
  for (const auto& r : s["ranks"])
    min_step = std::min(min_step, r["step"].get<double>());
  std::string rate = "", eta = "";
  if (tr.have && now > tr.t) {
    const double dt = now - tr.t, sps = (served - tr.served) / dt;
    rate = fmt::format(", {:.0f} samples/s, {:.2f} GB/s", sps, sps * sample_bytes / 1e9);
    const double steps_per_s = (min_step - tr.min_step) / dt;
    if (steps_per_s > 0)
      eta = fmt::format(", ETA {:.0f} s", (static_cast<double>(total) - min_step) / steps_per_s);
  }
  tr = {served, now, min_step, true};
  const double hits = totals.value("hits", s["hits"].get<double>());
  const double fetched = totals.value("fetched_samples", s["fetched_samples"].get<double>());
  std::string out = fmt::format(
      "node {}: {} of {} steps prefetched, {} ahead; hit rate {:.1f}%, {} fetched ({}) in {} "
      "reads, {:.2f} s; ranks stalled {:.2f} s{}{}\n",
      s["node"].get<int>(), s["ready_steps"].get<std::uint64_t>(), total,
      s["ahead_steps"].get<std::int64_t>(),
      hits + fetched > 0 ? 100 * hits / (hits + fetched) : 0.0,
      s["fetched_samples"].get<std::uint64_t>(),
      format_bytes(s["bytes_read"].get<std::uint64_t>()),
      s["storage_reads"].get<std::uint64_t>(), s["read_seconds"].get<double>(),
      totals.value("stall_seconds", 0.0), rate, eta);
  if (const auto& t = s.value("transparent", nlohmann::json()); t.is_object())
    out += fmt::format("  {}\n", protocol::transparent_line(t, total, protocol::in_demand_mode(s)));
  if (protocol::in_demand_mode(s)) out += fmt::format("  {}\n", protocol::demand_line(s["demand"]));
  if (const auto& p = s.value("peers", nlohmann::json()); p.is_object())
    out += fmt::format("  {}\n", protocol::peers_line(p));
  const std::uint64_t ranks_here = s["ranks"].size();
  const std::uint64_t node = s["node"].get<std::uint64_t>();
  for (const auto& r : s["ranks"]) {
    const std::uint64_t step = r["step"];
    const std::uint64_t e = std::min<std::uint64_t>(step / std::max<std::uint64_t>(spe, 1),
                                                    epochs - 1);
    const std::uint64_t in_epoch = step >= total ? spe : step % spe;
    const std::uint64_t rank = node * ranks_here + r["local_rank"].get<std::uint64_t>();
    const std::string head = fmt::format("  rank {:>3} epoch {:>3}/{} [", rank, e, epochs - 1);
    const std::string tail = fmt::format("] {:>6} steps, stalled {:.2f} s{}", step,
                                         r["stall_seconds"].get<double>(),
                                         r["attached"].get<bool>() ? "" : " (left)");
    int bar = 30;
    if (cols > 0)
      bar = static_cast<int>(std::clamp<std::int64_t>(
          static_cast<std::int64_t>(cols) - static_cast<std::int64_t>(head.size() + tail.size()), 8, 30));
    out += head + bar_text(in_epoch, spe, bar) + tail + "\n";
  }
  return out;
}

void run_stat(const std::vector<std::string>& given, const std::string& job,
              const std::string& runtime_dir, bool json, bool watch) {
  std::vector<std::string> sockets;
  try {
    sockets = stat_sockets(given, job, runtime_dir);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "solar stat: %s\n", e.what());
    exit_code() = kExitUsage;
    return;
  }
  // On a terminal, --watch redraws the same lines; into a pipe or file it appends reports.
  const bool redraw = watch && !json && ::isatty(1) == 1;
  std::vector<StatTrack> track(sockets.size());
  std::vector<bool> done(sockets.size(), false);
  std::size_t drawn_lines = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (bool first = true;; first = false) {
    const double now = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Again each time (the terminal may be resized); one column spare: no deferred wrap.
    const std::size_t cols = redraw ? terminal_columns() - 1 : 0;
    std::string report;
    std::size_t alive = 0;
    for (std::size_t i = 0; i < sockets.size(); ++i) {
      if (done[i]) {
        report += fmt::format("{}: finished\n", sockets[i]);
        continue;
      }
      nlohmann::json s;
      try {
        s = agent_stats(sockets[i]);
      } catch (const std::exception& e) {
        if (watch && !first) {  // it was there: the agent finished
          done[i] = true;
          report += fmt::format("{}: finished\n", sockets[i]);
          continue;
        }
        std::fprintf(stderr, "solar stat: %s\n", e.what());
        exit_code() = kExitFailure;
        return;
      }
      ++alive;
      report += json ? s.dump() + "\n" : stat_block(s, track[i], now, redraw ? cols : 0);
    }
    if (redraw) report = fit_lines(report, cols);
    if (redraw && drawn_lines > 0) fmt::print("\x1b[{}F\x1b[J", drawn_lines);
    fmt::print("{}", report);
    if (watch && !redraw && !json) fmt::print("\n");
    drawn_lines = static_cast<std::size_t>(std::count(report.begin(), report.end(), '\n'));
    std::fflush(stdout);
    if (!watch || alive == 0) return;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

}  // namespace

void add_stat_command(CLI::App& app) {
  auto sock = std::make_shared<std::vector<std::string>>();
  auto job = std::make_shared<std::string>();
  auto runtime_dir = std::make_shared<std::string>("/run/solar");
  auto json = std::make_shared<bool>(false);
  auto watch = std::make_shared<bool>(false);
  CLI::App* stat = app.add_subcommand(
      "stat", "Show running agents' progress: per node steps prefetched, hit rate, samples/s, "
              "GB/s, ranks' stall and ETA, a bar per rank");
  stat->add_option("socket", *sock,
                   "Agents' sockets, or a solar run's folder (solar run -v prints it) for all "
                   "its agents [$SOLAR_SOCKET]")
      ->type_name("SOCKET|DIR...");
  stat->add_option("--job", *job,
                   "Under Slurm, on a node of the job: the agent of step JOB.STEP there (e.g. "
                   "srun --jobid 42 --overlap -w node1 solar stat --job 42.0 --watch)")
      ->type_name("JOB.STEP");
  stat->add_option("--runtime-dir", *runtime_dir,
                   "The plugin's runtime_dir (plugstack.conf) for --job [/run/solar]")
      ->type_name("DIR");
  stat->add_flag("--json", *json, "One JSON object per agent and report");
  stat->add_flag("--watch", *watch,
                 "Report every second until the agents exit (redrawn in place on a terminal)");
  stat->callback([=] { run_stat(*sock, *job, *runtime_dir, *json, *watch); });
}

}  // namespace solar::cli

// SPDX-License-Identifier: Apache-2.0
// solar bench serve: how fast an agent hands out batches from its buffer, and how fast ranks
// copy samples out of it.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "launcher.h"
#include "options.h"
#include "solar/core/planner.h"
#include "solar/storage/sample_source.h"

namespace solar::cli {

namespace {
namespace fs = std::filesystem;

// The machine's CPU time so far (/proc/stat's first line, in ticks): all of it, and what the
// hypervisor gave other guests (steal). Zero when unreadable.
struct CpuTicks {
  std::uint64_t total = 0, steal = 0;
};
CpuTicks cpu_ticks() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  std::uint64_t v[8] = {};  // user nice system idle iowait irq softirq steal
  if (!(f >> cpu) || cpu != "cpu") return {};
  CpuTicks t;
  for (std::uint64_t& x : v) {
    if (!(f >> x)) return {};
    t.total += x;
  }
  t.steal = v[7];
  return t;
}

struct ServeOptions {
  std::string samples = "20000", ranks = "4", epochs = "10", batch = "16", preset = "tiny";  // one node
  std::string repeat = "1";
  bool zero_copy = false;
};

// One run of `solar bench serve`: what its ranks measured, and the machine's steal time.
struct ServeRun {
  double rate = 0;                  // samples/s handed out, epochs 2.., all ranks together
  double hit_bw = 0, memcpy_bw = 0;  // copy-out from the buffer, and the same from private memory
  std::optional<double> steal;      // share of the machine's CPU time, when /proc/stat tells
};

// How fast an agent hands out batches once everything is in its buffer: 4 KiB samples, a
// buffer holding the whole dataset, so every epoch after the first is all hits.
void run_serve(const ServeOptions& o) {
  PlanConfig c;
  std::uint64_t n = 0, repeat = 1;
  try {
    n = parse_count(o.samples, "--samples", 64, 10000000);
    if (o.preset == "small" && n > 4000)
      throw ConfigError("--samples", "at most 4000 with --preset small (1 GiB); allowed 64..4000");
    c.ranks_per_node = static_cast<std::uint32_t>(parse_count(o.ranks, "-n/--ntasks", 1, 256));
    c.epochs = static_cast<std::uint32_t>(parse_count(o.epochs, "--epochs", 2, 1000));
    c.batch = static_cast<std::uint32_t>(parse_count(o.batch, "--batch", 1, 4096));
    repeat = parse_count(o.repeat, "--repeat", 1, 100);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "solar bench serve: %s\n", e.what());
    exit_code() = kExitUsage;
    return;
  }
  const ScratchDir scratch("solar-bench");
  const fs::path& dir = scratch.path();
  const std::string data = (dir / "tiny.h5").string();
  {
    const std::string self = fs::read_symlink("/proc/self/exe").string();
    const std::string cmd = fmt::format("'{}' gen '{}' --samples {} --preset {} --no-progress "
                                        ">/dev/null", self, data, n, o.preset);
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("solar gen failed");
  }
  storage::SourceOptions so;
  const auto info = storage::open_source(data, so)->info();
  const PlanConfig cfg = plan_for_run(info, BufferSpec::parse("100%", "--buffer"), c);
  const Plan plan = make_plan(cfg);
  LaunchSpec ls;
  ls.plan = &plan;
  ls.dataset = data;
  ls.zero_copy = o.zero_copy;
  ls.command = {find_sibling("solar-example-train", "slurm_examples"), "--quiet", "--touch",
                "--report", (dir / "serve-%r.json").string()};
  std::vector<ServeRun> runs;
  for (std::uint64_t k = 0; k < repeat; ++k) {
    if (repeat > 1) std::fprintf(stderr, "solar bench serve: run %llu of %llu...\n",
                                 static_cast<unsigned long long>(k + 1),
                                 static_cast<unsigned long long>(repeat));
    const CpuTicks before = cpu_ticks();
    const LaunchResult r = launch(ls);
    const CpuTicks after = cpu_ticks();
    if (r.exit_code != 0) throw std::runtime_error(fmt::format("ranks failed (exit {})", r.exit_code));
    // Epochs after the first: every sample is a hit. Ranks run concurrently: rates add up.
    ServeRun run;
    double touch_bytes = 0, touch_s = 0, memcpy_s = 0;
    for (std::uint32_t rank = 0; rank < c.ranks_per_node; ++rank) {
      std::ifstream f(dir / fmt::format("serve-{}.json", rank));
      const auto j = nlohmann::json::parse(f);
      const auto load = j["load_seconds"].get<std::vector<double>>();
      const auto count = j["epoch_samples"].get<std::vector<std::uint64_t>>();
      double s = 0, m = 0;
      for (std::size_t e = 1; e < load.size(); ++e) {
        s += load[e];
        m += double(count[e]);
      }
      run.rate += s > 0 ? m / s : 0;
      touch_bytes += j["touched_bytes"].get<double>();
      touch_s += j["touch_seconds"].get<double>();
      memcpy_s += j["memcpy_seconds"].get<double>();
    }
    run.hit_bw = touch_bytes / touch_s;
    run.memcpy_bw = touch_bytes / memcpy_s;
    if (after.total > before.total && after.steal >= before.steal)
      run.steal = double(after.steal - before.steal) / double(after.total - before.total);
    runs.push_back(run);
  }
  auto all = [&](auto field) {
    std::vector<double> v;
    for (const ServeRun& r : runs) v.push_back(field(r));
    return v;
  };
  const double rate = median(all([](const ServeRun& r) { return r.rate; }));
  const double hit_bw = median(all([](const ServeRun& r) { return r.hit_bw; }));
  const double memcpy_bw = median(all([](const ServeRun& r) { return r.memcpy_bw; }));
  const double of_memcpy = median(all([](const ServeRun& r) { return r.hit_bw / r.memcpy_bw; }));
  const bool steal_known =
      std::all_of(runs.begin(), runs.end(), [](const ServeRun& r) { return r.steal.has_value(); });
  fmt::print("solar bench serve: {} samples of {}, {} ranks, batch {}, {} epochs, buffer = the "
             "whole dataset{}\n",
             n, format_bytes(info.sample_bytes), c.ranks_per_node, c.batch, c.epochs,
             repeat > 1 ? fmt::format("; medians of {} runs", repeat) : "");
  fmt::print("descriptor path (epochs 2..{}, from the buffer): {:.0f} samples/s handed out across {} ranks\n",
             c.epochs, rate, c.ranks_per_node);
  fmt::print("hit path (epochs 2..): copying samples out of the shared buffer {:.2f} GB/s, the "
             "same copies from private memory {:.2f} GB/s: {:.0f}% of memcpy\n",
             hit_bw / 1e9, memcpy_bw / 1e9, 100 * of_memcpy);
  // On a shared virtual machine the hypervisor may run other guests on these cores: the rates
  // above are lower by about that share, and runs are comparable only side by side.
  if (steal_known)
    fmt::print("CPU time taken by the hypervisor for other guests during the run (steal): "
               "{:.0f}% of this machine's\n",
               100 * median(all([](const ServeRun& r) { return *r.steal; })));
  if (repeat > 1) {  // runs differ by more than builds do on a shared machine: show them all
    fmt::print("each run: samples/s, copy-out GB/s, private memcpy GB/s, steal\n");
    for (std::size_t k = 0; k < runs.size(); ++k)
      fmt::print("  run {:>2}: {:>9.0f}  {:6.2f}  {:6.2f}  {}\n", k + 1, runs[k].rate,
                 runs[k].hit_bw / 1e9, runs[k].memcpy_bw / 1e9,
                 runs[k].steal ? fmt::format("{:.0f}%", 100 * *runs[k].steal) : "?");
  }
}

}  // namespace

void add_bench_serve_command(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto so = std::make_shared<ServeOptions>();
  CLI::App* serve = bench->add_subcommand(
      "serve", "How fast an agent hands out batches from its buffer (--buffer 100%: after the\n"
      "first epoch nearly all hits, but for the rings' share of the buffer), and how fast ranks\n"
      "copy samples out of it (against a private memcpy of the same samples, after the run).");
  serve->add_option("--samples", so->samples, "Samples [20000]")->type_name(kUint);
  serve->add_option("-n,--ntasks", so->ranks, "Ranks, on one node [4]")->type_name(kUint);
  serve->add_option("--epochs", so->epochs, "Epochs, the first fills the buffer [10]")
      ->type_name(kUint);
  serve->add_option("--batch", so->batch, "Per-rank batch [16]")->type_name(kUint);
  serve->add_option("--preset", so->preset, "Sample size: tiny (4 KiB) or small (256 KiB) [tiny]")
      ->type_name("NAME")
      ->check(CLI::IsMember({"tiny", "small"}));
  serve->add_flag("--zero-copy", so->zero_copy, "Agents hand out cache slots (no per-rank rings)");
  serve->add_option("--repeat", so->repeat,
                    "Runs, one after the other (the dataset made once): the median of each "
                    "figure and every run's own, with the steal time of each [1]")
      ->type_name(kUint);
  serve->callback([so] {
    try {
      run_serve(*so);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "solar bench serve: %s\n", e.what());
      exit_code() = kExitFailure;
    }
  });
}

}  // namespace solar::cli

// SPDX-License-Identifier: Apache-2.0
// solar plan: compute a plan, compare policies, write the plan file.
// solar plan-dump: print a plan file for people (csv) and scripts (json).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "commands.h"
#include "options.h"
#include "progress.h"
#include "solar/core/extents.h"
#include "solar/core/order_file.h"
#include "solar/core/plan_file.h"
#include "solar/core/plan_stream.h"
#include "solar/core/planner.h"
#include "solar/core/replay.h"
#include "solar/core/rng.h"
#include "solar/stats_file.h"

namespace solar::cli {
namespace {

struct PlanOptions {
  std::string scenario;
  // Numbers are taken as text and parsed strictly (parse_count): a negative or overflowing
  // value is named as such instead of being wrapped or saturated.
  std::optional<std::string> samples, sample_bytes, epochs, nodes, ranks_per_node, batch,
      imbalance, buffer, size_spread;
  std::optional<std::string> local_buffer;  // the local-disk tier per node
  std::string sample_sizes;  // a file of one size per sample
  std::string seed = "0";
  std::string order = "solar";
  std::string order_file;  // the script's own order (order_file.h)
  bool drop_last = false;
  bool peer_fetch = false;
  std::string policy = "solar";
  bool compare = false;
  std::string out;
  bool json = false;
  bool progress = true;
  // Streamed (plan_stream.h): only this node's share, computed a window of steps at a time.
  std::optional<std::string> node, window;
  bool streamed = false;  // --streamed: the streamed plan (its inputs alone), as srun writes it
};

// Peak resident memory of this process since the last reset_peak_rss() (Linux VmHWM).
void reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
}
std::uint64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

// --size-spread P%: sizes spread evenly over mean·[1 - P, 1 + P] (mean: --sample-bytes), drawn
// from --seed, so that a run is repeatable.
std::shared_ptr<const std::vector<std::uint64_t>> spread_sizes(const std::string& text,
                                                               std::uint64_t samples,
                                                               std::uint64_t mean,
                                                               std::uint64_t seed) {
  std::string t = text;
  if (!t.empty() && t.back() == '%') t.pop_back();
  const std::uint64_t pct = parse_count(t, "--size-spread", 0, 99);
  const std::uint64_t lo = std::max<std::uint64_t>(1, mean - mean * pct / 100);
  const std::uint64_t hi = mean + mean * pct / 100;
  std::uint64_t s = seed ^ 0x5a3e5123a5e5ULL;  // not the order's stream
  Xoshiro256 g(splitmix64(s));
  auto v = std::make_shared<std::vector<std::uint64_t>>(samples);
  for (auto& x : *v) x = lo + g.bounded(hi - lo + 1);
  return v;
}

// --sample-sizes FILE: one byte count per line, in sample order; '#' starts a comment.
std::shared_ptr<const std::vector<std::uint64_t>> read_sizes(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw ConfigError("--sample-sizes", fmt::format("cannot read {}: {}", path,
                                                    std::strerror(errno)));
  auto v = std::make_shared<std::vector<std::uint64_t>>();
  std::string line;
  for (std::uint64_t n = 1; std::getline(in, line); ++n) {
    if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    const auto a = line.find_first_not_of(" \t\r"), b = line.find_last_not_of(" \t\r");
    if (a == std::string::npos) continue;
    try {
      v->push_back(parse_count(line.substr(a, b - a + 1), "--sample-sizes", 1, kMaxSampleBytes));
    } catch (const ConfigError& e) {
      throw ConfigError("--sample-sizes", fmt::format("{} line {}: {}", path, n, e.what()));
    }
  }
  if (v->empty())
    throw ConfigError("--sample-sizes", fmt::format("{} lists no sizes (one byte count per "
                                                    "line, in sample order)",
                                                    path));
  return v;
}

PlanConfig build_config(const PlanOptions& o) {
  PlanConfig c;
  std::optional<BufferSpec> buffer;
  c.sample_bytes = 16ULL << 20;
  if (!o.scenario.empty()) {
    const Scenario* s = find_scenario(o.scenario);
    if (!s) {
      std::string names;
      for (const auto& sc : scenarios()) names += (names.empty() ? "" : ", ") + sc.name;
      throw ConfigError("--scenario", fmt::format("unknown scenario '{}'; choose one of {}",
                                                  o.scenario, names));
    }
    c.samples = s->samples;
    c.epochs = s->epochs;
    c.nodes = s->nodes;
    c.ranks_per_node = s->ranks_per_node;
    c.batch = s->batch;
    buffer = BufferSpec{};
    buffer->bytes = s->buffer_samples * c.sample_bytes;
  }
  if (o.sample_bytes) {
    c.sample_bytes = parse_bytes(*o.sample_bytes, "--sample-bytes");
    if (!o.scenario.empty() && !o.buffer)  // the preset's buffer is counted in samples
      buffer->bytes = find_scenario(o.scenario)->buffer_samples * c.sample_bytes;
  }
  using namespace job_params;
  if (o.samples) c.samples = parse_job_param(*o.samples, "--samples", kSamples);
  if (o.epochs) c.epochs = parse_job_param32(*o.epochs, "--epochs", kEpochs);
  if (o.nodes) c.nodes = parse_job_param32(*o.nodes, "--nodes", kNodes);
  if (o.ranks_per_node)
    c.ranks_per_node = parse_job_param32(*o.ranks_per_node, "--ranks-per-node", kRanksPerNode);
  if (o.batch) c.batch = parse_job_param32(*o.batch, "--batch", kBatch);
  if (o.imbalance) c.imbalance = parse_job_param32(*o.imbalance, "--imbalance", kImbalance);
  if (o.buffer) buffer = BufferSpec::parse(*o.buffer, "--buffer");
  if (!o.sample_sizes.empty() && o.size_spread)
    throw ConfigError("--size-spread", "give the sizes either from a file (--sample-sizes) or "
                                       "as a spread around --sample-bytes, not both");
  if (!o.sample_sizes.empty()) {
    c.sample_sizes = read_sizes(o.sample_sizes);
    if (!o.samples && o.scenario.empty()) c.samples = c.sample_sizes->size();
    if (c.sample_sizes->size() != c.samples)
      throw ConfigError("--sample-sizes", fmt::format("{} lists {} sizes for {} samples "
                                                      "(--samples); give one per sample",
                                                      o.sample_sizes, c.sample_sizes->size(),
                                                      c.samples));
  }
  if (o.scenario.empty()) {
    if (!o.samples && !c.sized())
      throw ConfigError("--samples", fmt::format("required without --scenario ({}..{})",
                                                 kSamples.lo, kSamples.hi));
    if (!o.epochs)
      throw ConfigError("--epochs", fmt::format("required without --scenario ({}..{})",
                                                kEpochs.lo, kEpochs.hi));
    if (!o.batch) throw ConfigError("--batch", "required without --scenario (per-rank batch ≥ 1)");
    if (!buffer)
      throw ConfigError("--buffer", "required without --scenario (bytes per node, e.g. 8G, or a "
                                    "percentage of the dataset, e.g. 12.5%)");
  }
  c.seed = parse_job_param(o.seed, "--seed", job_params::kSeed);
  if (o.size_spread) c.sample_sizes = spread_sizes(*o.size_spread, c.samples, c.sample_bytes, c.seed);
  if (c.sized()) c.sample_bytes = std::max<std::uint64_t>(1, c.dataset_bytes() / c.samples);
  c.buffer_bytes = buffer ? buffer->resolve(c.samples, c.sample_bytes) : 0;
  if (c.sized() && buffer && buffer->percent >= 0)  // a share of the dataset's bytes
    c.buffer_bytes = static_cast<std::uint64_t>(
        std::floor(buffer->percent * static_cast<double>(c.dataset_bytes()) / 100.0 + 1e-9));
  auto order = parse_order_mode(o.order);
  if (!order) throw ConfigError("--order", fmt::format("'{}' is not solar or torch", o.order));
  c.order = *order;
  if (!o.order_file.empty()) {
    if (o.order != "solar") throw ConfigError("--order-file", "gives the order itself: drop --order");
    c.order = OrderMode::file;
    c.order_list = read_order_file(o.order_file, c.samples, c.epochs);
  }
  c.drop_last = o.drop_last;
  c.peer_fetch = o.peer_fetch;
  if (o.local_buffer)
    c.local_bytes = BufferSpec::parse(*o.local_buffer, "--local-buffer").resolve(c.samples,
                                                                                  c.sample_bytes);
  return c;
}

struct Result {
  Policy policy = Policy::solar;
  Metrics metrics;
  double seconds = 0;
  std::uint64_t peak_rss = 0;
  // Sized plans: the smallest arena holding each node's samples as best-fit extents
  // (core/extents.h), 0 otherwise.
  std::uint64_t extent_arena = 0;
  // With a local tier: the tiers' metrics, recounted by the replay (replay_tiers).
  TierMetrics tiers;
  // Streamed (--node): when the node's first step was ready, and what its share came to.
  double first_step_seconds = 0;
  std::uint64_t node_accesses = 0, node_fetches = 0, node_steps = 0;
};

nlohmann::json config_json(const PlanConfig& c) {
  return {{"samples", c.samples},
          {"sample_bytes", c.sample_bytes},
          {"epochs", c.epochs},
          {"nodes", c.nodes},
          {"ranks_per_node", c.ranks_per_node},
          {"batch", c.batch},
          {"imbalance", c.imbalance},
          {"drop_last", c.drop_last},
          {"seed", c.seed},
          {"order", std::string(to_string(c.order))},
          {"buffer_bytes", c.buffer_bytes},
          {"buffer_samples", c.buffer_samples()},
          {"peer_fetch", c.peer_fetch},
          {"local_bytes", c.local_bytes},
          {"local_samples", c.local_samples()},
          {"sized", c.sized()},
          {"dataset_bytes", c.dataset_bytes()}};
}

void print_table(const PlanConfig& c, const std::string& scenario,
                 const std::vector<Result>& results) {
  std::string of = format_bytes(c.sample_bytes);
  if (c.sized()) {
    const auto [lo, hi] = std::minmax_element(c.sample_sizes->begin(), c.sample_sizes->end());
    of = fmt::format("{} on average ({}..{}; {} in all)", format_bytes(c.sample_bytes),
                     format_bytes(*lo), format_bytes(*hi), format_bytes(c.dataset_bytes()));
  }
  fmt::print("scenario {}: N={} samples of {}, E={} epochs, {} nodes × {} ranks, batch {}/rank, "
             "δ={}, buffer {} per node ({} samples{}), order {}, seed {}\n",
             scenario.empty() ? "(custom)" : scenario, c.samples, of, c.epochs, c.nodes,
             c.ranks_per_node, c.batch, c.imbalance, format_bytes(c.buffer_bytes),
             c.buffer_samples(), c.sized() ? " of the average size" : "", to_string(c.order),
             c.seed);
  const std::uint64_t lb = lower_bound_fetches(c);
  if (c.tiered())
    fmt::print("local tier: {} per node ({} samples) below the buffer\n"
               "lower bound: {} remote fetches (N + (E-1)·max(0, N - M·(C_mem + C_disk)), "
               "C_mem + C_disk = {})\n",
               format_bytes(c.local_bytes), c.local_samples(), lb,
               c.buffer_samples() + c.local_samples());
  else
    fmt::print("lower bound: {} remote fetches (N + (E-1)·max(0, N - M·C))\n", lb);
  if (c.sized())
    fmt::print("lower bound: {} remote bytes (B + (E-1)·max(0, B - M·buffer), B the bytes an "
               "epoch reads)\n",
               format_bytes(lower_bound_bytes(c)));
  fmt::print("\n");
  const Metrics* ours = nullptr;
  for (const auto& r : results)
    if (r.policy == Policy::solar) ours = &r.metrics;
  fmt::print("{:<12} {:>12} {:>11} {:>12} {:>8} {:>10} {:>8} {:>9} {:>8} {:>10}{}\n", "policy",
             "remote", "remote", "hits", "hit", "reads", "vs lower", "vs solar", "plan",
             "peak", c.sized() ? "   bytes vs" : "");
  fmt::print("{:<12} {:>12} {:>11} {:>12} {:>8} {:>10} {:>8} {:>9} {:>8} {:>10}{}\n", "",
             "fetches", "bytes", "", "rate", "(coalesced)", "bound", "", "seconds", "RSS",
             c.sized() ? " byte bound" : "");
  for (const auto& r : results) {
    const Metrics& m = r.metrics;
    const std::string vs =
        ours && ours->remote_fetches
            ? fmt::format("{:.2f}×", double(m.remote_fetches) / double(ours->remote_fetches))
            : "-";
    fmt::print("{:<12} {:>12} {:>11} {:>12} {:>7.1f}% {:>10} {:>7.3f}× {:>9} {:>8.2f} {:>10}{}\n",
               to_string(r.policy), m.remote_fetches, format_bytes(m.remote_bytes), m.hits,
               100 * m.hit_rate(), m.remote_runs, m.ratio_to_lower_bound(), vs, r.seconds,
               format_bytes(r.peak_rss),
               c.sized() ? fmt::format(" {:>10.3f}×", m.ratio_bytes_to_lower_bound()) : "");
  }
  if (c.sized()) {
    // Fragmentation: what the buffer's bytes take as extents of one memory region.
    fmt::print("\n{:<12} {}\n", "policy", "arena for the resident samples as best-fit extents");
    for (const auto& r : results)
      if (r.extent_arena)
        fmt::print("{:<12} {:>11} = {:.3f}× the buffer\n", to_string(r.policy),
                   format_bytes(r.extent_arena),
                   double(r.extent_arena) / double(c.buffer_bytes));
  }
  if (c.tiered()) {
    // Where the accesses were served: memory, the local disk, storage; the local reads against
    // their bound (Belady's MIN on each node's memory), recounted by the replay.
    fmt::print("\n{:<12} {:>12} {:>12} {:>12} {:>9} {:>12} {:>10} {:>10}\n", "policy",
               "memory hits", "local reads", "their bound", "vs bound", "local writes", "drops",
               "discards");
    for (const auto& r : results) {
      const TierMetrics& t = r.tiers;
      fmt::print("{:<12} {:>12} {:>12} {:>12} {:>8.3f}× {:>12} {:>10} {:>10}\n",
                 to_string(r.policy), t.memory_hits, t.local_reads, t.local_reads_bound,
                 t.local_reads_ratio(), t.local_writes, t.drops, t.discards);
    }
    fmt::print("(every plan replayed: its fetches, evictions and moves between the tiers "
               "recounted, equal)\n");
  }
  if (c.peer_fetch) {
    // Peer reads cost interconnect time, not storage: shown beside the storage fetches.
    fmt::print("\n{:<12} {:>12} {:>9} {:>12} {:>11}\n", "policy", "storage", "vs lower",
               "peer reads", "of accesses");
    for (const auto& r : results) {
      const Metrics& m = r.metrics;
      fmt::print("{:<12} {:>12} {:>8.3f}× {:>12} {:>10.1f}%\n", to_string(r.policy),
                 m.remote_fetches, m.ratio_to_lower_bound(), m.peer_fetches,
                 100.0 * m.peer_share());
    }
  }
  if (results.size() == 1) {
    const Metrics& m = results[0].metrics;
    const bool tiered = c.tiered();
    fmt::print("\n{:>8} {:>12} {:>12} {:>12} {:>8}{}\n", "epoch", "accesses", "hits", "remote",
               "peer", tiered ? fmt::format(" {:>12}", "local reads") : "");
    for (std::size_t p = 0; p < m.per_epoch.size(); ++p) {
      const auto& e = m.per_epoch[p];
      fmt::print("{:>8} {:>12} {:>12} {:>12} {:>8}{}\n", p, e.accesses, e.hits, e.remote_fetches,
                 e.peer_fetches,
                 tiered ? fmt::format(" {:>12}", results[0].tiers.local_reads_per_epoch[p]) : "");
    }
  }
}

// One node's share of the plan, streamed: every step taken as the agent would take it and
// dropped, so the memory is the planner's state and one window, not the plan.
Result stream_plan(const PlanConfig& c, std::uint32_t node, std::uint64_t window, bool progress) {
  Result r;
  r.policy = c.policy;
  ProgressBar bar(fmt::format("planning {} for node {}", to_string(c.policy), node), progress);
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  NodePlanStream stream(c, node, window);
  const std::uint64_t total = stream.total_steps();
  for (std::uint64_t t = 0; t < total; ++t) {
    const NodeStep s = stream.next();
    if (t == 0) r.first_step_seconds = since();
    for (const auto& rank : s.ranks) r.node_accesses += rank.size();
    for (const FetchRun& f : s.fetches) r.node_fetches += f.count;
    if ((t + 1) % 64 == 0 || t + 1 == total) bar(t + 1, total);
  }
  r.metrics = stream.metrics();
  r.seconds = since();
  r.node_steps = total;
  return r;
}

void run_plan(const PlanOptions& o) {
  PlanConfig base;
  std::vector<Policy> policies;
  std::optional<std::uint64_t> stream_node;
  std::uint64_t window = NodePlanStream::kDefaultWindow;
  try {
    base = build_config(o);
    if (o.compare || o.policy == "all") {
      for (Policy p : all_policies())  // nopfs and solar-paper plan samples of one size only
        if ((!base.sized() || (p != Policy::nopfs && p != Policy::solar_paper)) &&
            !(base.tiered() && p == Policy::none))  // none keeps no buffer to tier
          policies.push_back(p);
      if (base.sized())
        std::fprintf(stderr, "solar plan: nopfs and solar-paper plan samples of one size; they "
                             "are left out of this comparison\n");
    } else {
      auto p = parse_policy(o.policy);
      if (!p)
        throw ConfigError("--policy", fmt::format("'{}' is not one of none, lru, solar-paper, "
                                                  "nopfs, solar, sampler, all",
                                                  o.policy));
      policies = {*p};
    }
    if (!o.out.empty() && policies.size() != 1)
      throw ConfigError("--out", "writes one plan; choose a single --policy");
    if (o.streamed && o.node)
      throw ConfigError("--streamed", "is the plan srun writes (its inputs alone); --node computes "
                                      "one node's share: give one of them");
    if (o.streamed && policies.size() != 1)
      throw ConfigError("--streamed", "writes one plan; choose a single --policy");
    if (o.streamed) require_streamable(base);
    if (o.window && !o.node)
      throw ConfigError("--window", "is the window of a streamed plan: give --node too");
    if (o.node) {
      if (!o.out.empty())
        throw ConfigError("--out", "writes the whole plan; --node streams one node's share and "
                                   "writes nothing: drop one of them");
      stream_node = parse_count(*o.node, "--node", 0, ~std::uint32_t{0});
      if (*stream_node >= base.nodes)
        throw ConfigError("--node", fmt::format("{} is not one of the plan's nodes (0..{})",
                                                *stream_node, base.nodes - 1));
      if (o.window) window = parse_count(*o.window, "--window", 1, std::uint64_t{1} << 32);
      if (base.tiered())
        throw ConfigError("--node", "a plan with a local tier (--local-buffer) is computed whole "
                                    "only: drop --node");
    }
    for (Policy p : policies) {
      PlanConfig c = base;
      c.policy = p;
      c.validate();
    }
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "solar plan: %s\n", e.what());
    exit_code() = kExitUsage;
    return;
  }

  std::vector<Result> results;
  for (Policy p : policies) {
    PlanConfig c = base;
    c.policy = p;
    reset_peak_rss();
    if (stream_node) {
      results.push_back(stream_plan(c, static_cast<std::uint32_t>(*stream_node), window,
                                    o.progress));
      results.back().peak_rss = peak_rss_bytes();
      continue;
    }
    ProgressBar bar(fmt::format("planning {}", to_string(p)), o.progress && !o.streamed);
    const auto t0 = std::chrono::steady_clock::now();
    Plan plan = o.streamed ? make_streamed_plan(c)
                           : make_plan(c, [&](std::uint64_t d, std::uint64_t t) { bar(d, t); });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!o.out.empty()) write_plan_file(plan, o.out);
    if (o.streamed) {  // nothing computed: what srun does and writes, and no more
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::uint64_t bytes = encode_plan(plan).size();
      if (o.json)
        fmt::print("{}\n", nlohmann::json{{"scenario", o.scenario},
                                          {"config", config_json(base)},
                                          {"streamed",
                                           {{"seconds", seconds},
                                            {"peak_rss_bytes", peak_rss_bytes()},
                                            {"bytes", bytes},
                                            {"lower_bound_fetches",
                                             plan.metrics.lower_bound_fetches}}}}
                                .dump(2));
      else
        fmt::print("streamed plan ({} policy): its inputs alone, {} bytes{}, made in {:.3f} s, "
                   "peak memory {}; each node computes its share (solar plan --node M shows "
                   "one); the lower bound is {} remote fetches\n",
                   to_string(p), bytes, o.out.empty() ? "" : " written to " + o.out, seconds,
                   format_bytes(peak_rss_bytes()), plan.metrics.lower_bound_fetches);
      return;
    }
    Result& r = results.emplace_back();
    r.policy = p;
    r.metrics = plan.metrics;
    r.seconds = s;
    r.peak_rss = peak_rss_bytes();
    if (c.tiered()) {
      // The replay recounts the plan and its tiers; a difference is a planner bug.
      try {
        results.back().tiers = replay_plan(plan).tiers;
      } catch (const PlanInvalid& e) {
        std::fprintf(stderr, "solar plan: the %s plan does not replay (a bug; please report "
                             "it): %s\n",
                     std::string(to_string(p)).c_str(), e.what());
        exit_code() = kExitFailure;
        return;
      }
    }
    if (c.sized() && p != Policy::none)
      results.back().extent_arena = arena_for_extents(plan, ExtentFit::best);
  }

  if (o.json) {
    nlohmann::json out = {{"scenario", o.scenario}, {"config", config_json(base)}};
    out["results"] = nlohmann::json::array();
    for (const auto& r : results) {
      nlohmann::json j = protocol::plan_metrics_record(r.metrics);
      j["policy"] = std::string(to_string(r.policy));
      j["plan_seconds"] = r.seconds;
      if (r.extent_arena) {
        j["extent_arena_bytes"] = r.extent_arena;
        j["extent_arena_over_buffer"] = double(r.extent_arena) / double(base.buffer_bytes);
      }
      j["peak_rss_bytes"] = r.peak_rss;
      if (stream_node)
        j["streamed"] = {{"node", *stream_node},
                         {"window_steps", window},
                         {"first_step_seconds", r.first_step_seconds},
                         {"steps", r.node_steps},
                         {"node_accesses", r.node_accesses},
                         {"node_fetches", r.node_fetches},
                         {"bytes_written", 0}};
      if (base.tiered())
        j["local_tier"] = {{"memory_hits", r.tiers.memory_hits},
                           {"local_reads", r.tiers.local_reads},
                           {"local_reads_bound", r.tiers.local_reads_bound},
                           {"local_reads_over_bound", r.tiers.local_reads_ratio()},
                           {"local_writes", r.tiers.local_writes},
                           {"drops", r.tiers.drops},
                           {"discards", r.tiers.discards},
                           {"local_reads_per_epoch", r.tiers.local_reads_per_epoch}};
      out["results"].push_back(j);
    }
    if (!o.out.empty()) out["out"] = o.out;
    fmt::print("{}\n", out.dump(2));
  } else {
    print_table(base, o.scenario, results);
    if (stream_node) {
      fmt::print("\nstreamed: node {}'s share only, {} steps ahead at most; nothing written\n",
                 *stream_node, window);
      fmt::print("{:<12} {:>16} {:>14} {:>10} {:>14} {:>14} {:>12}\n", "policy",
                 "first step (s)", "all steps (s)", "steps", "node accesses", "node fetches",
                 "peak RSS");
      for (const auto& r : results)
        fmt::print("{:<12} {:>16.3f} {:>14.2f} {:>10} {:>14} {:>14} {:>12}\n",
                   to_string(r.policy), r.first_step_seconds, r.seconds, r.node_steps,
                   r.node_accesses, r.node_fetches, format_bytes(r.peak_rss));
    }
    if (!o.out.empty()) fmt::print("\nplan written to {}\n", o.out);
  }
}

struct DumpOptions {
  std::string file;
  std::string format = "csv";
  std::optional<std::uint32_t> node;
};

void run_dump(const DumpOptions& o) {
  PlanFile pf = PlanFile::open(o.file);
  const PlanHeader& h = pf.header();
  const PlanConfig& c = h.config;
  if (o.node && *o.node >= c.nodes) {
    std::fprintf(stderr, "solar plan-dump: --node %u: the plan has nodes 0..%u\n", *o.node,
                 c.nodes - 1);
    exit_code() = kExitUsage;
    return;
  }
  const bool csv = o.format == "csv";
  std::string buf;
  auto flush = [&] {
    std::fwrite(buf.data(), 1, buf.size(), stdout);
    buf.clear();
  };
  if (csv) {
    buf += "epoch_position,epoch,step,global_step,node,rank,local_rank,sample,hit\n";
  } else {
    nlohmann::json head = {{"version", kPlanFileVersion},
                           {"policy", std::string(to_string(c.policy))},
                           {"config", config_json(c)},
                           {"steps_per_epoch", h.layout.steps},
                           {"epoch_order", h.epoch_order},
                           {"dataset_identity", h.dataset_identity},
                           {"streamed", h.streamed},  // metrics: the lower bounds only
                           {"metrics", protocol::plan_metrics_record(h.metrics)}};
    if (c.sized()) head["sample_sizes"] = *c.sample_sizes;  // bytes per sample id
    std::string s = head.dump();
    s.pop_back();  // reopen the object to append the rows
    buf += s + ",\"accesses\":[";
  }
  bool first = true;
  const std::uint32_t R = c.ranks_per_node;
  const std::uint32_t from = o.node.value_or(0), to = o.node ? *o.node + 1 : c.nodes;
  for (std::uint32_t n = from; n < to; ++n) {
    const NodePlan np = node_plan(pf, n);
    for (std::uint64_t t = 0; t < std::uint64_t{h.layout.steps} * c.epochs; ++t) {
      const std::uint64_t p = t / h.layout.steps, j = t % h.layout.steps;
      for (std::uint32_t r = 0; r < R; ++r) {
        for (std::uint64_t i = np.rank_offsets[t * R + r]; i < np.rank_offsets[t * R + r + 1];
             ++i) {
          const std::uint32_t a = np.accesses[i];
          const std::uint64_t rank = std::uint64_t{n} * R + r;
          if (csv)
            buf += fmt::format("{},{},{},{},{},{},{},{},{}\n", p, h.epoch_order[p], j, t, n, rank,
                               r, a & kSampleMask, (a & kHitBit) ? 1 : 0);
          else
            buf += fmt::format("{}{{\"epoch_position\":{},\"epoch\":{},\"step\":{},\"node\":{},"
                               "\"rank\":{},\"sample\":{},\"hit\":{}}}",
                               first ? "" : ",", p, h.epoch_order[p], j, n, rank,
                               a & kSampleMask, (a & kHitBit) ? "true" : "false");
          first = false;
          if (buf.size() > (1 << 20)) flush();
        }
      }
    }
  }
  if (!csv) buf += "]}\n";
  flush();
}

}  // namespace

void add_plan_commands(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* plan = app.add_subcommand(
      "plan",
      "Compute the plan of a training run and report how many samples it reads from remote\n"
      "storage, against the lower bound and the baseline policies.");
  plan->add_option("--scenario", o->scenario,
                   "A preset: seed, s1, s2, cosmoflow, huge (flags below override its values)")
      ->type_name("NAME");
  plan->add_option("--samples", o->samples, "Samples in the dataset (N)")->type_name(kUint);
  plan->add_option("--sample-bytes", o->sample_bytes, "Bytes per sample, K/M/G suffixes [16M]")
      ->type_name(kBytes);
  plan->add_option("--epochs", o->epochs, "Epochs (E)")->type_name(kUint);
  plan->add_option("--nodes", o->nodes, "Nodes (M) [1]")->type_name(kUint);
  plan->add_option("--ranks-per-node", o->ranks_per_node, "Ranks per node (R) [1]")
      ->type_name(kUint);
  plan->add_option("--batch", o->batch, "Per-rank batch size (b)")->type_name(kUint);
  plan->add_option("--buffer", o->buffer,
                   "Buffer per node: bytes with K/M/G/T suffix, or a percentage of the dataset "
                   "(e.g. 22.5%)")
      ->type_name(kBuffer);
  plan->add_option("--local-buffer", o->local_buffer,
                   "A local-disk tier per node below --buffer (bytes with K/M/G/T, or a\n"
                   "percentage of the dataset): the plan keeps --buffer + this resident per\n"
                   "node and places it in memory and on the local disk; reports the local\n"
                   "reads against their bound. Samples of one size, no --peer-fetch. With\n"
                   "--out, each agent computes its node's moves from the file (solar-agent\n"
                   "--local-dir)")
      ->type_name(kBuffer);
  plan->add_option("--size-spread", o->size_spread,
                   "Samples of differing sizes, spread evenly over --sample-bytes ± this\n"
                   "percentage (0..99), drawn from --seed; the buffers then hold bytes and the\n"
                   "planner evicts by bytes (policies solar, sampler, lru, none)")
      ->type_name("PERCENT");
  plan->add_option("--sample-sizes", o->sample_sizes,
                   "Samples of differing sizes from a file: one byte count per line, in sample\n"
                   "order ('#' comments); sets --samples when it is not given")
      ->type_name(kFile);
  plan->add_option("--imbalance", o->imbalance,
                   "δ: each rank gets between b-δ and b+δ samples per step [0]")
      ->type_name(kUint);
  plan->add_option("--seed", o->seed, "Shuffle seed [0]")->type_name(kUint);
  plan->add_option("--order", o->order,
                   "Epoch order: solar (portable RNG) or torch (= DistributedSampler) [solar]")
      ->type_name("ORDER");
  plan->add_option("--order-file", o->order_file,
                   "The script's own order instead: .npy of shape (epochs, samples) or text "
                   "ids, each epoch a permutation of 0..N-1 (as solar run --order-file)")
      ->type_name(kFile);
  plan->add_flag("--drop-last", o->drop_last,
                 "Drop the tail that does not fill a step (DistributedSampler and DataLoader)");
  plan->add_flag("--peer-fetch", o->peer_fetch,
                 "Let a node take a sample from a peer node's buffer instead of remote storage\n"
                 "(policies solar and sampler; sampler: the buffers act as one, a sample\n"
                 "handed from node to node as DistributedSampler's ranks read it)");
  plan->add_option("--policy", o->policy,
                   "none, lru, solar-paper, nopfs, solar, sampler, or all [solar]")
      ->type_name("POLICY");
  plan->add_flag("--compare", o->compare, "Same as --policy all");
  plan->add_option("--out", o->out, "Write the plan file here (one policy only)")
      ->type_name(kFile);
  plan->add_option("--node", o->node,
                   "Compute only this node's share, step by step as its agent would (a window "
                   "of steps ahead; nothing written): time to its first step, peak memory")
      ->type_name(kUint);
  plan->add_flag("--streamed", o->streamed,
                 "Make the streamed plan instead, as srun and solar run do for large jobs: its "
                 "inputs alone (with --out, written there), each node computing its share; "
                 "prints its size, time and peak memory");
  plan->add_option("--window", o->window,
                   "With --node: steps computed ahead of the reader at most [256]")
      ->type_name(kUint);
  plan->add_flag("--json", o->json, "Print machine-readable results");
  plan->add_flag_callback("--no-progress", [o] { o->progress = false; }, "No progress bar");
  plan->callback([o] { run_plan(*o); });

  auto d = std::make_shared<DumpOptions>();
  CLI::App* dump = app.add_subcommand(
      "plan-dump", "Print a plan file: one row per (epoch position, step, rank, sample, hit).");
  dump->add_option("file", d->file, "Plan file written by `solar plan --out`")
      ->type_name(kFile)
      ->required();
  dump->add_option("--format", d->format, "csv or json [csv]")
      ->type_name("FORMAT")
      ->check(CLI::IsMember({"csv", "json"}));
  dump->add_option("--node", d->node, "Only this node's part (read without the rest)")
      ->type_name(kUint);
  dump->callback([d] {
    try {
      run_dump(*d);
    } catch (const PlanFileError& e) {
      std::fprintf(stderr, "solar plan-dump: %s\n", e.what());
      exit_code() = kExitFailure;
    }
  });
}

}  // namespace solar::cli

// SPDX-License-Identifier: Apache-2.0
// solar bench loader: the baseline (what a PyTorch DataLoader does: each rank reads its
// DistributedSampler samples directly, one request per sample, K reader threads) against solar
// (agents + shared memory), on the same data and storage, side by side in one run.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "commands.h"
#include "launcher.h"
#include "options.h"
#include "solar/core/job_params.h"
#include "solar/core/planner.h"
#include "solar/storage/dataset_files.h"
#include "solar/storage/sample_source.h"
#include "solar/sys/meminfo.h"
#include "solar/sys/subprocess.h"
#include "throttle.h"

namespace solar::cli {

namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string dataset, labels = "/label";
  std::optional<std::string> ntasks, ranks_per_node;
  std::string nodes = "1", epochs = "3", batch = "16", seed = "0", buffer = "64%";
  std::string readers = "4";
  bool zero_copy = false;
  double compute_ms = 0;
  std::string remote_bandwidth, throttle, read_gap = "auto";
  double remote_latency_ms = 0;
  bool verify = false, json = false;
};

// A solar-stored serving `file` with per-client throttling, stopped on destruction.
class ThrottledServer {
 public:
  ThrottledServer(const std::string& file, const std::string& bandwidth, double latency_ms,
                  const fs::path& dir, const std::string& tag) {
    ready_ = dir / (tag + ".ready");
    std::vector<std::string> argv = {find_sibling("solar-stored", "storage"), "--export",
                                     "d=" + file, "--ready-file", ready_.string(), "--quiet"};
    if (!bandwidth.empty()) argv.insert(argv.end(), {"--throttle-bandwidth", bandwidth});
    if (latency_ms > 0) argv.insert(argv.end(), {"--throttle-latency", fmt::format("{}", latency_ms)});
    // The emulated link is the storage: served from the server's memory where the dataset
    // fits in a quarter of what is available, so that the local disk behind the server (a cold
    // page cache read at random) is not a second, unstated limit of the first epoch.
    std::error_code ec;
    const auto size = fs::file_size(file, ec);
    in_memory_ = !ec && size > 0 && size < sys::mem_available_bytes() / 4;
    if (in_memory_) argv.push_back("--in-memory");
    sys::SpawnOptions quiet;
    quiet.who = nullptr;  // no message of its own: the error below says what to do
    pid_ = sys::spawn(argv, sys::current_environment(), quiet);
    const auto until = Clock::now() + std::chrono::seconds(30);
    for (;;) {
      std::ifstream f(ready_);
      std::string addr;
      if (f >> addr && !addr.empty()) {
        uri_ = "fabric://" + addr + "/d";
        break;
      }
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_ || Clock::now() > until) {
        pid_ = -1;
        throw std::runtime_error("solar-stored did not start (is it built? see storage/)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~ThrottledServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  const std::string& uri() const { return uri_; }
  bool in_memory() const { return in_memory_; }

 private:
  pid_t pid_ = -1;
  bool in_memory_ = false;
  fs::path ready_;
  std::string uri_;
};

std::vector<double> slowest_rank(const fs::path& dir, const std::string& prefix, std::uint64_t world,
                                 std::uint32_t epochs) {
  std::vector<double> worst(epochs, 0.0);
  for (std::uint64_t r = 0; r < world; ++r) {
    std::ifstream f(dir / fmt::format("{}-{}.json", prefix, r));
    if (!f) throw std::runtime_error(fmt::format("rank {} wrote no report ({} phase)", r, prefix));
    const auto j = nlohmann::json::parse(f);
    if (j["wrong"].get<std::uint64_t>() != 0)
      throw std::runtime_error(fmt::format("rank {} read wrong data in the {} phase", r, prefix));
    const auto v = j["load_seconds"].get<std::vector<double>>();
    for (std::uint32_t e = 0; e < epochs && e < v.size(); ++e) worst[e] = std::max(worst[e], v[e]);
  }
  return worst;
}

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// The report: per-epoch loading times of both, the storage's limit (what the plan's remote
// bytes, and requests under an IOPS cap, take at the cap or the measured bandwidth), solar's
// share of it, the agents' head start apart from the ranks' loading time, and under --throttle
// the bytes and requests the disk served each phase against what each plan asked for.
void throttle_report(const BenchOptions& o, const PlanConfig& c, const storage::DatasetInfo& info,
                     const Plan& base_plan, const Plan& solar_plan, double bandwidth,
                     const std::vector<double>& base, const std::vector<double>& ours,
                     std::uint64_t iops, bool throttled, const DiskCounters& disk_base,
                     const DiskCounters& disk_ours, const std::vector<nlohmann::json>& agents) {
  const std::uint64_t sb = info.sample_bytes;
  const Metrics& sm = solar_plan.metrics;
  const Metrics& bm = base_plan.metrics;
  // Time the storage needs at least for `bytes` in `requests` requests.
  auto at_cap = [&](double bytes, double requests) {
    return std::max(bytes / bandwidth, iops ? requests / double(iops) : 0.0);
  };
  // Requests per fetched sample: the plan's coalesced runs (solar), one per sample (baseline).
  const double runs_per_fetch = sm.remote_fetches ? double(sm.remote_runs) / double(sm.remote_fetches) : 1;
  std::vector<double> limit, vs_limit;
  double base_limit = 0;
  for (std::uint32_t e = 0; e < c.epochs; ++e) {
    const auto& pe = sm.per_epoch[e];
    limit.push_back(at_cap(double(pe.remote_fetches * sb), double(pe.remote_fetches) * runs_per_fetch));
    vs_limit.push_back(limit.back() > 0 ? ours[e] / limit.back() : 0);
    const auto& be = bm.per_epoch[e];
    base_limit += at_cap(double(be.remote_fetches * sb), double(be.remote_fetches));
  }
  const double solar_limit = sum(limit);
  const double limit_speedup = solar_limit > 0 ? base_limit / solar_limit : 0;
  const double speedup = sum(ours) > 0 ? sum(base) / sum(ours) : 0;
  // The agents' head start: fetched while the ranks started, before their first request. It
  // is not in the ranks' loading time; charged at the limit's bandwidth, it is added back.
  double head_s = 0, head_bytes = 0;
  for (const auto& a : agents) {
    if (!a.contains("head_start")) continue;
    const auto& h = a["head_start"];
    if (h.value("seconds", nlohmann::json()).is_number())
      head_s = std::max(head_s, h["seconds"].get<double>());
    head_bytes += h.value("fetched_bytes", 0.0);
  }
  const double charged_s = sum(ours) + head_bytes / bandwidth;
  const double speedup_charged = charged_s > 0 ? sum(base) / charged_s : 0;
  const std::uint64_t planned_base = bm.remote_fetches * sb, planned_ours = sm.remote_fetches * sb;
  if (o.json) {
    nlohmann::json j{{"baseline_seconds", base},
                     {"solar_seconds", ours},
                     {"speedup", speedup},
                     {"speedup_charged", speedup_charged},
                     {"hit_rate", sm.hit_rate()},
                     {"bandwidth_bytes_per_s", bandwidth},
                     {"iops", iops},
                     {"limit_seconds", limit},
                     {"solar_vs_limit", vs_limit},
                     {"baseline_limit_seconds", base_limit},
                     {"limit_speedup", limit_speedup},
                     {"of_limit", limit_speedup > 0 ? speedup / limit_speedup : 0},
                     {"of_limit_charged", limit_speedup > 0 ? speedup_charged / limit_speedup : 0},
                     {"head_start", {{"seconds", head_s}, {"fetched_bytes", head_bytes}}},
                     {"planned_bytes", {{"baseline", planned_base}, {"solar", planned_ours}}},
                     {"planned_requests", {{"baseline", bm.remote_fetches}, {"solar", sm.remote_runs}}}};
    if (throttled)
      j["disk"] = {{"baseline", {{"bytes", disk_base.bytes}, {"requests", disk_base.requests}}},
                   {"solar", {{"bytes", disk_ours.bytes}, {"requests", disk_ours.requests}}}};
    fmt::print("{}\n", j.dump(2));
    return;
  }
  auto list = [](const std::vector<double>& v) { return fmt::format("{:.4f}", fmt::join(v, ", ")); };
  std::string storage = ", cold page cache";
  if (throttled)
    storage = fmt::format(" (emulated shared storage: the disk capped at {}/s{}, O_DIRECT reads)",
                          format_bytes(std::uint64_t(bandwidth)),
                          iops ? fmt::format(" and {} IOPS", iops) : "");
  else if (!o.remote_bandwidth.empty() || o.remote_latency_ms > 0)
    storage = fmt::format(" (remote storage emulated: solar-stored, {} in all, +{} ms per request)",
                          o.remote_bandwidth.empty() ? "unthrottled" : o.remote_bandwidth,
                          o.remote_latency_ms);
  fmt::print("dataset {}: {} samples of {}; {} node(s) × {} ranks, batch {}, {} epochs, buffer {} "
             "per node{}\n",
             o.dataset, info.samples, format_bytes(sb), c.nodes, c.ranks_per_node, c.batch,
             c.epochs, o.buffer, storage);
  fmt::print("DataLoading time baseline each epoch: [{}]\n", list(base));
  fmt::print("DataLoading time SOLAR each epoch: [{}]\n", list(ours));
  fmt::print("total: baseline {:.3f} s, solar {:.3f} s: solar is {:.2f}× faster\n", sum(base),
             sum(ours), speedup);
  fmt::print("plan: hit rate {:.1f}%, {} remote fetches ({:.3f}× the lower bound)\n",
             100 * sm.hit_rate(), sm.remote_fetches, sm.ratio_to_lower_bound());
  fmt::print("limit each epoch (the plan's remote bytes{} at {}/s{}): [{}]\n",
             iops ? " and requests" : "", format_bytes(std::uint64_t(bandwidth)),
             throttled ? " (the cap)" : " (measured here)", list(limit));
  fmt::print("solar / limit each epoch: [{}]\n", fmt::format("{:.2f}", fmt::join(vs_limit, ", ")));
  fmt::print("limit of this storage: {:.2f}× (baseline {:.3f} s / solar {:.3f} s at the cap); "
             "solar achieved {:.2f}× = {:.0f}% of it\n",
             limit_speedup, base_limit, solar_limit, speedup,
             limit_speedup > 0 ? 100 * speedup / limit_speedup : 0);
  fmt::print("agents' head start (before the ranks' first request, not in the times above): "
             "{:.2f} s, {} fetched; charged at the limit's bandwidth: {:.2f}× = {:.0f}% of the "
             "limit\n",
             head_s, format_bytes(std::uint64_t(head_bytes)), speedup_charged,
             limit_speedup > 0 ? 100 * speedup_charged / limit_speedup : 0);
  if (throttled)
    fmt::print("read from the disk (the cgroup's counters): baseline {} in {} requests (planned "
               "{}), solar {} in {} requests (planned {})\n",
               format_bytes(disk_base.bytes), disk_base.requests, format_bytes(planned_base),
               format_bytes(disk_ours.bytes), disk_ours.requests, format_bytes(planned_ours));
}

void run_bench(const BenchOptions& o) {
  PlanConfig c;
  std::uint32_t readers = 0;
  try {
    parse_job_shape(o, 4, c);
    readers = static_cast<std::uint32_t>(parse_count(o.readers, "--readers", 1, 256));
    if (!o.remote_bandwidth.empty()) parse_bytes(o.remote_bandwidth, "--remote-bandwidth");
    if (o.read_gap != "auto") parse_bytes(o.read_gap, "--read-gap");
    if (!o.throttle.empty()) {
      parse_throttle(o.throttle, "--throttle");
      if (!o.remote_bandwidth.empty() || o.remote_latency_ms > 0)
        throw ConfigError("--throttle", "caps the disk itself; --remote-bandwidth and "
                                        "--remote-latency emulate storage another way: use one");
      if (o.dataset.rfind("fabric://", 0) == 0)
        throw ConfigError("--throttle", "caps a local disk: give --dataset as FILE.h5 (for "
                                        "fabric:// data, cap solar-stored's disk with "
                                        "scripts/slow-storage instead)");
    }
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "solar bench loader: %s\n", e.what());
    exit_code() = kExitUsage;
    return;
  }
  const bool emulate = !o.remote_bandwidth.empty() || o.remote_latency_ms > 0;
  const ScratchDir scratch("solar-bench");
  const fs::path& dir = scratch.path();

  // Per-client throttles that add up to the same aggregate bandwidth in both phases.
  auto per_client = [&](std::uint64_t clients) {
    if (o.remote_bandwidth.empty()) return std::string();
    return std::to_string(parse_bytes(o.remote_bandwidth, "--remote-bandwidth") / clients);
  };
  const std::uint64_t world = c.world();
  std::unique_ptr<ThrottledServer> server;
  auto source_for = [&](std::uint64_t clients, const char* tag) {
    if (!emulate) return o.dataset;
    server.reset();
    server = std::make_unique<ThrottledServer>(o.dataset, per_client(clients), o.remote_latency_ms,
                                               dir, tag);
    return server->uri();
  };

  storage::SourceOptions so;
  so.label_dataset = o.labels;
  std::unique_ptr<storage::SampleSource> src;
  try {
    src = storage::open_source(o.dataset, so);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solar bench loader: --dataset: %s\n", e.what());
    exit_code() = kExitUsage;
    return;
  }
  const storage::DatasetInfo info = src->info();
  PlanConfig solar_cfg;
  try {
    solar_cfg = plan_for_run(info, BufferSpec::parse(o.buffer, "--buffer"), c);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "solar bench loader: %s\n", e.what());
    exit_code() = kExitUsage;
    return;
  }
  PlanConfig base_cfg = solar_cfg;
  base_cfg.policy = Policy::none;  // DistributedSampler assignment, every sample read
  const Plan base_plan = make_plan(base_cfg);
  const Plan solar_plan = make_plan(solar_cfg);

  // Emulated shared storage: this process and the ranks and agents it starts read the
  // dataset's disk through a kernel cap; the phases read with O_DIRECT (every epoch from
  // storage; simulated nodes do not share a page cache), and the cgroup counts their bytes.
  std::unique_ptr<Throttle> throttle;
  if (!o.throttle.empty()) {
    const auto [bps, iops] = parse_throttle(o.throttle, "--throttle");
    // --dataset is files here (fabric:// is refused above): the cap is on the disk of the
    // first (a dataset of many files lies on one file system).
    const auto& file = src->file_set()->files().front().path;
    try {
      throttle = std::make_unique<Throttle>(file, bps, iops);
    } catch (const ThrottleUnavailable& e) {
      std::fprintf(stderr, "solar bench loader: --throttle: %s\n", e.what());
      exit_code() = kExitFailure;
      return;
    }
    if (!o.json) std::fprintf(stderr, "solar bench loader: %s\n", throttle->describe().c_str());
  }

  // The limit's bandwidth: the cap, or a cold sequential read of the dataset through the same
  // storage path.
  double bandwidth = throttle ? double(throttle->bps()) : 0;
  // The agents' --read-gap: "auto" under an IOPS cap is what one request costs in bytes at the
  // cap (BPS / IOPS: a gap shorter than that is cheaper to read than to skip); else none.
  std::uint64_t read_gap = 0;
  if (o.read_gap != "auto") read_gap = parse_bytes(o.read_gap, "--read-gap");
  else if (throttle && throttle->iops() > 0) read_gap = throttle->bps() / throttle->iops();
  if (!throttle) {
    const std::string spec = source_for(c.nodes, "bw");
    auto s = storage::open_source(spec, so);
    s->drop_cache();
    const std::uint64_t per = std::max<std::uint64_t>(1, (64ULL << 20) / info.sample_bytes);
    std::vector<std::byte> buf(per * info.sample_bytes);
    const auto t0 = Clock::now();
    for (std::uint64_t i = 0; i < info.samples; i += per) {
      const storage::SampleRun run{i, std::min(per, info.samples - i)};
      s->read({&run, 1}, buf.data());
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    bandwidth = double(info.samples * info.sample_bytes) / secs * (emulate ? c.nodes : 1);
  }

  DiskCounters disk_base, disk_ours;
  std::vector<nlohmann::json> agent_stats;
  auto phase = [&](const Plan& plan, bool agents, const std::string& spec, const char* tag) {
    {
      auto s = storage::open_source(spec, so);
      s->drop_cache();
    }
    const DiskCounters before = throttle ? throttle->counters() : DiskCounters{};
    LaunchSpec ls;
    ls.plan = &plan;
    ls.dataset = spec;
    ls.labels = o.labels;
    ls.agents = agents;
    ls.zero_copy = o.zero_copy;
    ls.direct_io = throttle != nullptr;
    ls.read_gap = read_gap;
    ls.command = {find_sibling("solar-example-train", "slurm_examples"), "--quiet", "--report",
                  (dir / fmt::format("{}-%r.json", tag)).string()};
    if (!agents) ls.command.insert(ls.command.end(), {"--baseline", std::to_string(readers)});
    if (!agents && throttle) ls.command.push_back("--direct-io");
    if (o.verify) ls.command.push_back("--verify");
    if (o.compute_ms > 0) ls.command.insert(ls.command.end(), {"--compute-ms", fmt::format("{}", o.compute_ms)});
    if (!o.json) std::fprintf(stderr, "solar bench loader: %s phase...\n", tag);
    const LaunchResult r = launch(ls);
    if (r.exit_code != 0)
      throw std::runtime_error(fmt::format("the {} phase failed (exit {})", tag, r.exit_code));
    if (throttle) {
      const DiskCounters after = throttle->counters();
      (agents ? disk_ours : disk_base) = {after.bytes - before.bytes,
                                          after.requests - before.requests};
    }
    if (agents) agent_stats = r.agents;
    return slowest_rank(dir, tag, world, c.epochs);
  };
  std::vector<double> base, ours;
  try {
    base = phase(base_plan, false, source_for(world, "baseline"), "baseline");
    ours = phase(solar_plan, true, source_for(c.nodes, "solar"), "solar");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solar bench loader: %s\n", e.what());
    exit_code() = kExitFailure;
    return;
  }
  server.reset();
  throttle_report(o, c, info, base_plan, solar_plan, bandwidth, base, ours,
                  throttle ? throttle->iops() : 0, throttle != nullptr, disk_base, disk_ours,
                  agent_stats);
}

}  // namespace

void add_bench_loader_command(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto o = std::make_shared<BenchOptions>();
  CLI::App* loader = bench->add_subcommand(
      "loader",
      "Baseline (direct reads, one request per sample, K reader threads per rank, like a PyTorch\n"
      "DataLoader) against solar (agents + shared memory), same data and storage, one run.\n"
      "Files are read with a cold page cache; --remote-bandwidth/--remote-latency serve the file\n"
      "through solar-stored with throttling to emulate a contended remote file system; --throttle\n"
      "caps the dataset's disk in the kernel instead (as scripts/slow-storage does).");
  loader->add_option("--dataset", o->dataset, "FILE.h5[:/dataset] (or fabric://...)")
      ->type_name(kSource)
      ->required();
  loader->add_option("--labels", o->labels, "Labels dataset ('' for none) [/label]")
      ->type_name("PATH");
  loader->add_option("-n,--ntasks", o->ntasks,
                     "Ranks in all, over all nodes (as srun -n); must divide evenly by --nodes "
                     "[4 per node]")
      ->type_name(kUint);
  loader->add_option("--ranks-per-node", o->ranks_per_node,
                     "Ranks on each node; with -n, must agree [4]")
      ->type_name(kUint);
  loader->add_option("--nodes", o->nodes, "Simulated nodes [1]")->type_name(kUint);
  loader->add_option("--epochs", o->epochs, "Epochs [3]")->type_name(kUint);
  loader->add_option("--batch", o->batch, "Per-rank batch [16]")->type_name(kUint);
  loader->add_option("--buffer", o->buffer, "Per-node memory for solar [64%]")
      ->type_name(kBuffer);
  loader->add_option("--seed", o->seed, "Shuffle seed [0]")->type_name(kUint);
  loader->add_option("--readers", o->readers, "Baseline reader threads per rank [4]")
      ->type_name(kUint);
  loader->add_option("--compute-ms", o->compute_ms, "Compute per batch, both phases [0]")
      ->type_name(kFloat);
  loader->add_option("--throttle", o->throttle,
                     "Emulated shared storage: cap reads of the dataset's disk at BPS bytes/s "
                     "(and IOPS requests/s) for both phases (cgroup blkio/io.max; root), read "
                     "with O_DIRECT, and report the disk's own byte counts")
      ->type_name("BPS[,IOPS]");
  loader->add_option("--read-gap", o->read_gap,
                     "solar phase: the agents' --read-gap (samples this close in the file are "
                     "one request); auto: under --throttle BPS,IOPS, BPS/IOPS, else 0 [auto]")
      ->type_name("SIZE|auto");
  loader->add_option("--remote-bandwidth", o->remote_bandwidth,
                     "EMULATION: aggregate storage bandwidth (e.g. 400M), split over the clients")
      ->type_name(kBytes);
  loader->add_option("--remote-latency", o->remote_latency_ms,
                     "EMULATION: milliseconds added to every storage request")
      ->type_name(kFloat);
  loader->add_flag("--verify", o->verify, "Check every sample's content in both phases");
  loader->add_flag("--json", o->json, "Machine-readable output");
  loader->add_flag("--zero-copy", o->zero_copy, "Agents hand out cache slots (no per-rank rings)");
  loader->callback([o] {
    try {
      run_bench(*o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "solar bench loader: %s\n", e.what());
      exit_code() = kExitFailure;
    }
  });
}

}  // namespace solar::cli

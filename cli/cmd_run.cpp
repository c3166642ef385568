// solar run: the whole data path on one machine (plan, agents, ranks, teardown).
// solar stat: an agent's live metrics.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>

#include "commands.h"
#include "launcher.h"
#include "options.h"
#include "progress.h"
#include "solar/core/plan_file.h"
#include "solar/core/planner.h"
#include "solar/storage/sample_source.h"

namespace solar::cli {

namespace {

struct RunOptions {
  std::optional<std::string> ntasks, ranks_per_node;
  std::string nodes = "1", epochs, batch, seed = "0", imbalance = "0";
  std::string dataset, labels = "/label", buffer, order = "solar";
  std::string plan_out, stats_out;
  bool drop_last = false, no_agent = false, keep = false, verbose = false, zero_copy = false;
  bool direct_io = false, transparent = false, order_given = false, label = false;
  std::vector<std::string> command;
};

// An agent's transparent-mode counters for people: reads served and fallen through, and
// whether the script followed the plan (`solar run`'s summary and `solar stat`).
std::string transparent_line(const nlohmann::json& t, std::uint64_t total_steps) {
  const double served = t["hit_reads"].get<double>(), missed = t["miss_reads"].get<double>();
  const auto consumed = t["consumed_steps"].get<std::uint64_t>();
  return fmt::format(
      "file reads served from the buffer {:.0f} ({}), fallen through {:.0f} ({}), {:.1f}% "
      "served ({} processes attached, {} copies abandoned); {} of {} steps consumed as "
      "planned{}",
      served, format_bytes(t["hit_bytes"].get<std::uint64_t>()), missed,
      format_bytes(t["miss_bytes"].get<std::uint64_t>()),
      served + missed > 0 ? 100 * served / (served + missed) : 0.0,
      t["attached"].get<std::uint64_t>(), t["torn"].get<std::uint64_t>(), consumed, total_steps,
      consumed < total_steps ? " (the script's order differs from the plan: check --seed, "
                               "--batch, --epochs, --drop-last)"
                             : "");
}

void print_summary(const LaunchResult& r) {
  for (const auto& a : r.agents) {
    const double hit = a["hits"].get<double>();
    const double fetched = a["fetched_samples"].get<double>();
    fmt::print(stderr,
               "solar run: node {}: {} steps, {:.0f} hits, {:.0f} samples fetched ({}), hit rate "
               "{:.1f}%, storage read time {:.2f} s\n",
               a["node"].get<int>(), a["ready_steps"].get<std::uint64_t>(), hit, fetched,
               format_bytes(a["bytes_read"].get<std::uint64_t>()),
               hit + fetched > 0 ? 100 * hit / (hit + fetched) : 0.0,
               a["read_seconds"].get<double>());
    if (const auto& t = a.value("transparent", nlohmann::json()); t.is_object())
      fmt::print(stderr, "solar run: node {}: {}\n", a["node"].get<int>(),
                 transparent_line(t, a["total_steps"].get<std::uint64_t>()));
  }
  for (const auto& p : r.problems) fmt::print(stderr, "solar run: {}\n", p);
}

void run_run(const RunOptions& o) {
  PlanConfig c;
  std::unique_ptr<storage::SampleSource> src;
  BufferSpec buffer;
  try {
    const RankLayout ranks =
        resolve_ranks(o.ntasks, o.ranks_per_node, o.nodes, 1, kMaxRanksPerNode);
    c.nodes = ranks.nodes;
    c.ranks_per_node = ranks.per_node;
    c.epochs = static_cast<std::uint32_t>(parse_count(o.epochs, "--epochs", 1, kMaxEpochs));
    c.batch = static_cast<std::uint32_t>(parse_count(o.batch, "--batch", 1, kMaxSamples));
    c.seed = parse_count(o.seed, "--seed", 0, ~std::uint64_t{0});
    c.imbalance = static_cast<std::uint32_t>(parse_count(o.imbalance, "--imbalance", 0, kMaxSamples));
    const auto order = parse_order_mode(o.order);
    if (!order) throw ConfigError("--order", fmt::format("'{}' is not solar or torch", o.order));
    c.order = *order;
    if (o.transparent && o.no_agent)
      throw ConfigError("--transparent", "needs agents; drop --no-agent");
    if (!o.stats_out.empty()) check_output_file(o.stats_out, "--stats-out");
    c.drop_last = o.drop_last;
    buffer = BufferSpec::parse(o.buffer, "--buffer");
    if (o.command.empty())
      throw ConfigError("COMMAND", "give the rank program after --, e.g. solar run -n 4 ... -- "
                                   "python3 train.py");
    storage::SourceOptions so;
    so.label_dataset = o.labels;
    try {
      src = storage::open_source(o.dataset, so);
    } catch (const std::exception& e) {
      throw ConfigError("--dataset", e.what());
    }
    c = plan_for_run(src->info(), buffer, c);
    if (o.transparent) follow_the_script(c, o.order_given);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "solar run: %s\n", e.what());
    exit_code() = kExitUsage;
    return;
  }
  Plan plan = make_plan(c);
  plan.dataset_identity = src->identity();  // agents and ranks refuse any other data
  src.reset();
  if (!o.plan_out.empty()) write_plan_file(plan, o.plan_out);
  if (o.verbose)
    fmt::print(stderr, "solar run: plan: {} remote fetches for {} accesses ({:.3f}× the lower "
                       "bound), {} per node for the resident set\n",
               plan.metrics.remote_fetches, plan.metrics.accesses,
               plan.metrics.ratio_to_lower_bound(), format_bytes(c.buffer_bytes));
  LaunchSpec spec;
  spec.plan = &plan;
  spec.dataset = o.dataset;
  spec.labels = o.labels;
  spec.command = o.command;
  spec.agents = !o.no_agent;
  spec.zero_copy = o.zero_copy;
  spec.direct_io = o.direct_io;
  spec.transparent = o.transparent;
  spec.keep_run_dir = o.keep;
  spec.label_lines = o.label;
  spec.stats_out = o.stats_out;
  try {
    const LaunchResult r = launch(spec);
    print_summary(r);
    exit_code() = r.exit_code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solar run: %s\n", e.what());
    exit_code() = kExitFailure;
  }
}

void run_stat(const std::string& socket, bool json, bool watch) {
  for (;;) {
    nlohmann::json s;
    try {
      s = agent_stats(socket);
    } catch (const std::exception& e) {
      if (watch && exit_code() == kExitOk) return;  // the agent finished
      std::fprintf(stderr, "solar stat: %s\n", e.what());
      exit_code() = kExitFailure;
      return;
    }
    if (json) {
      fmt::print("{}\n", s.dump());
    } else {
      const std::uint64_t spe = s["steps_per_epoch"], total = s["total_steps"];
      const std::uint64_t epochs = s["epochs"];
      fmt::print("node {}: {} of {} steps prefetched, {} ahead of the slowest rank; {} hits, {} "
                 "fetched ({}), {} storage reads in {:.2f} s\n",
                 s["node"].get<int>(), s["ready_steps"].get<std::uint64_t>(), total,
                 s["ahead_steps"].get<std::int64_t>(), s["hits"].get<std::uint64_t>(),
                 s["fetched_samples"].get<std::uint64_t>(),
                 format_bytes(s["bytes_read"].get<std::uint64_t>()),
                 s["storage_reads"].get<std::uint64_t>(), s["read_seconds"].get<double>());
      if (const auto& t = s.value("transparent", nlohmann::json()); t.is_object())
        fmt::print("  {}\n", transparent_line(t, total));
      for (const auto& r : s["ranks"]) {
        const std::uint64_t step = r["step"];
        const std::uint64_t e = std::min<std::uint64_t>(step / std::max<std::uint64_t>(spe, 1),
                                                        epochs - 1);
        const std::uint64_t in_epoch = step >= total ? spe : step % spe;
        fmt::print("  rank {:>3} epoch {:>3}/{} [{}] {:>6} steps, stalled {:.2f} s{}\n",
                   r["local_rank"].get<int>(), e + 1, epochs, bar_text(in_epoch, spe), step,
                   r["stall_seconds"].get<double>(), r["attached"].get<bool>() ? "" : " (left)");
      }
    }
    std::fflush(stdout);
    if (!watch) return;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

}  // namespace

void add_run_commands(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* run = app.add_subcommand(
      "run",
      "Run a training command with solar on this machine: plan the run, start one agent per\n"
      "simulated node, launch the ranks with SOLAR_* and torch.distributed variables, wait,\n"
      "and clean up. Exits with the worst rank's status. Ranks are counted as srun and mpirun\n"
      "count them: -n is the total over all nodes (-n 8 --nodes 2: 4 ranks on each node).\n"
      "Example: solar run -n 4 --dataset data.h5 --buffer 50% --epochs 3 --batch 16 -- \\\n"
      "           solar-example-train --verify");
  run->add_option("-n,--ntasks", o->ntasks,
                  "Ranks in all, over all nodes (as srun -n, mpirun -n); must divide evenly by "
                  "--nodes [1 per node]")
      ->type_name(kUint);
  run->add_option("--ranks-per-node", o->ranks_per_node,
                  "Ranks on each node (as srun --ntasks-per-node); with -n, must agree [1]")
      ->type_name(kUint);
  run->add_option("--nodes", o->nodes, "Simulated nodes, each with its own agent and buffer [1]")
      ->type_name(kUint);
  run->add_option("--dataset", o->dataset, "FILE.h5[:/dataset] or fabric://HOST:PORT/NAME")
      ->type_name(kSource)
      ->required();
  run->add_option("--labels", o->labels, "Labels dataset ('' for none) [/label]")
      ->type_name("PATH");
  run->add_option("--buffer", o->buffer,
                  "Memory per node: bytes (K/M/G/T) or a percentage of the dataset")
      ->type_name(kBuffer)
      ->required();
  run->add_option("--epochs", o->epochs, "Epochs")->type_name(kUint)->required();
  run->add_option("--batch", o->batch, "Per-rank batch size")->type_name(kUint)->required();
  run->add_option("--seed", o->seed, "Shuffle seed [0]")->type_name(kUint);
  run->add_option("--imbalance", o->imbalance, "δ: per-rank batch may be b-δ..b+δ [0]")
      ->type_name(kUint);
  run->add_option("--order", o->order,
                  "solar or torch (= DistributedSampler) [solar; torch with --transparent]")
      ->type_name("ORDER")
      ->each([o](const std::string&) { o->order_given = true; });
  run->add_flag("--drop-last", o->drop_last, "Drop the tail that does not fill a step");
  run->add_flag("--no-agent", o->no_agent, "No agents: ranks read directly (the fallback path)");
  run->add_flag("--zero-copy", o->zero_copy,
                "Agents hand out their cache slots instead of copying each rank's batch into "
                "its ring first (fewer copies; each rank then touches the whole buffer, which "
                "costs page faults where they are expensive, e.g. on VMs)");
  run->add_flag("--direct-io", o->direct_io,
                "Agents read HDF5 files with O_DIRECT, bypassing the page cache (for datasets "
                "far larger than memory)");
  run->add_flag("--transparent", o->transparent,
                "Run an UNMODIFIED script (h5py + DistributedSampler + DataLoader): its reads of "
                "the dataset file are served from the node buffer by libsolar_preload.so when "
                "resident, from the file otherwise. Give the script's own --seed, --batch and "
                "--epochs; contiguous or unfiltered chunked HDF5 datasets");
  run->add_flag("-l,--label", o->label,
                "Prefix every line the ranks write to stdout/stderr with the rank, as srun -l "
                "does ('3: text'; right-aligned to the widest rank); lines are kept whole, never "
                "mixed (up to 1 MiB a line)");
  run->add_option("--plan-out", o->plan_out, "Also save the plan here (for plan-dump)")
      ->type_name(kFile);
  run->add_option("--stats-out", o->stats_out,
                  "Write every node's measured statistics here when the job ends (JSON: per "
                  "epoch hits, fetched samples and bytes, storage read time, ranks' stall, wall "
                  "time; each agent's head start; fields in agent/README.md); `solar report` "
                  "draws it")
      ->type_name(kFile);
  run->add_flag("--keep-run-dir", o->keep, "Keep the plan, sockets and agent logs");
  run->add_flag("-v,--verbose", o->verbose, "Say what is planned");
  run->add_option("command", o->command, "The rank program and its arguments (after --)")
      ->required();
  run->callback([o] { run_run(*o); });

  auto sock = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto watch = std::make_shared<bool>(false);
  CLI::App* stat = app.add_subcommand("stat", "Show a running agent's metrics and progress.");
  stat->add_option("socket", *sock, "The agent's socket (SOLAR_SOCKET of its ranks)")
      ->type_name(kFile)
      ->required();
  stat->add_flag("--json", *json, "One JSON object per report");
  stat->add_flag("--watch", *watch, "Report every second until the agent exits");
  stat->callback([sock, json, watch] { run_stat(*sock, *json, *watch); });
}

}  // namespace solar::cli

// SPDX-License-Identifier: Apache-2.0
// solar run: the whole data path on one machine (plan, agents, ranks, teardown).
#include <fmt/format.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>

#include "commands.h"
#include "launcher.h"
#include "options.h"
#include "progress.h"
#include "solar/core/job_params.h"
#include "solar/core/order_file.h"
#include "solar/core/plan_file.h"
#include "solar/core/plan_stream.h"
#include "solar/core/planner.h"
#include "solar/node_summary.h"
#include "solar/storage/dataset_files.h"
#include "solar/storage/sample_source.h"

namespace solar::cli {

namespace {

struct RunOptions {
  std::optional<std::string> ntasks, ranks_per_node;
  std::string nodes = "1", epochs, batch, seed = "0", imbalance = "0";
  std::string dataset, labels = "/label", buffer, order = "solar";
  std::string plan_out, stats_out, read_gap, order_file;
  std::string plan_mode = "auto";  // --plan: whole, streamed or auto (plan_stream.h)
  std::string local_buffer, local_dir;  // a local-disk tier below --buffer
  std::optional<std::string> start_epoch, start_step;  // resume (--start-epoch, --start-step)
  std::string resume_from;                             // resume: a loader's state_dict as JSON
  bool drop_last = false, no_agent = false, keep = false, verbose = false, zero_copy = false;
  bool direct_io = false, transparent = false, order_given = false, label = false;
  bool peers = false;
  std::string peer_provider = "tcp;ofi_rxm";
  double peer_timeout = 10;
  std::vector<std::string> command;
};

void print_summary(const LaunchResult& r) {
  for (const auto& a : r.agents)
    for (const std::string& line : protocol::node_summary(a, protocol::SummaryFor::solar_run))
      fmt::print(stderr, "solar run: node {}: {}\n", a["node"].get<int>(), line);
  for (const auto& p : r.problems) fmt::print(stderr, "solar run: {}\n", p);
}

using Clock = std::chrono::steady_clock;

// When this process was started (exec), on the steady clock: /proc/self/stat's start time is
// in clock ticks since boot (10 ms steps). nullopt where it cannot be read.
std::optional<Clock::time_point> process_start() {
  std::ifstream f("/proc/self/stat");
  std::string line;
  std::getline(f, line);
  const auto paren = line.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos) return std::nullopt;
  std::istringstream rest(line.substr(paren + 1));
  std::string field;
  for (int i = 3; i < 22; ++i) rest >> field;  // fields 3 (state) .. 21
  unsigned long long ticks = 0;
  timespec boot{};
  if (!(rest >> ticks) || ::clock_gettime(CLOCK_BOOTTIME, &boot) != 0) return std::nullopt;
  const auto now = Clock::now();
  const double age = static_cast<double>(boot.tv_sec) + 1e-9 * static_cast<double>(boot.tv_nsec) -
                     static_cast<double>(ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  if (!(age >= 0)) return std::nullopt;
  return now - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(age));
}

// The times solar run itself took before launch() (its own start, the plan).
struct RunTimes {
  std::optional<Clock::time_point> exec = process_start();
  Clock::time_point main = Clock::now();
};

// --verbose: where the time from launch to the ranks' first batches went, and from the last
// batch to exit. The agents' "startup" times are CLOCK_MONOTONIC seconds, as steady_clock here
// (agent/README.md, `startup`).
void print_timeline(const RunTimes& rt, const LaunchResult& r, std::uint32_t ranks_per_node) {
  using Sec = std::chrono::duration<double>;
  const auto end = Clock::now();
  const Clock::time_point launch = rt.exec.value_or(rt.main);
  const LaunchTimes& lt = r.times;
  auto at = [](const nlohmann::json& v) -> std::optional<Clock::time_point> {
    if (!v.is_number()) return std::nullopt;
    return Clock::time_point(std::chrono::duration_cast<Clock::duration>(Sec(v.get<double>())));
  };
  auto s = [](Clock::time_point a, Clock::time_point b) { return Sec(b - a).count(); };
  // The slowest agent to start, each rank's first batch, the first request, the last batch.
  const nlohmann::json* slow = nullptr;
  std::optional<Clock::time_point> slow_listening, first_request, last_batch;
  std::optional<double> first_read_after;  // an agent's first read done, after its start
  std::vector<std::pair<double, std::uint64_t>> firsts;  // (seconds from launch, global rank)
  for (const auto& a : r.agents) {
    if (!a.contains("startup")) continue;
    const auto& st = a["startup"];
    const auto node = a["node"].get<std::uint64_t>();
    if (const auto l = at(st["listening"]); l && (!slow_listening || *l > *slow_listening)) {
      slow_listening = l;
      slow = &a;
    }
    if (const auto ready = at(st["ready"]); ready && a["head_start"]["seconds"].is_number()) {
      const auto req = *ready + std::chrono::duration_cast<Clock::duration>(
                                    Sec(a["head_start"]["seconds"].get<double>()));
      if (!first_request || req < *first_request) first_request = req;
    }
    if (const auto fr = at(st["first_read"]), ready = at(st["ready"]); fr && ready)
      if (const double d = s(*ready, *fr); !first_read_after || d < *first_read_after)
        first_read_after = d;
    for (std::size_t k = 0; k < st["first_batch"].size(); ++k) {
      if (const auto fb = at(st["first_batch"][k]))
        firsts.emplace_back(s(launch, *fb), node * ranks_per_node + k);
      if (const auto lb = at(st["last_batch"][k]); lb && (!last_batch || *lb > *last_batch))
        last_batch = lb;
    }
  }
  auto line = [](std::string_view what, double secs, const std::string& how) {
    fmt::print(stderr, "solar run:   {:<12} {:7.3f} s  {}\n", what, secs, how);
  };
  if (firsts.empty()) {
    fmt::print(stderr, "solar run: start-up: launch to the ranks' start {:.3f} s (no first batch "
                       "seen: {})\n",
               s(launch, lt.ranks_spawned),
               r.agents.empty() ? "ranks read directly" : "no rank asked for a batch");
  } else {
    const auto [lo, hi] = std::minmax_element(firsts.begin(), firsts.end());
    fmt::print(stderr, "solar run: start-up: launch to first batch {:.3f} s (every rank's by "
                       "{:.3f} s, rank {} last)\n",
               lo->first, hi->first, hi->second);
  }
  if (rt.exec)
    line("solar start", s(launch, rt.main), "exec to main: loading solar and its libraries");
  line("plan", s(rt.main, lt.plan_written), "dataset opened, plan computed and written");
  Clock::time_point ranks_from = lt.plan_written;
  if (!lt.agent_spawned.empty() && slow) {
    const auto& st = (*slow)["startup"];
    const auto node = (*slow)["node"].get<std::size_t>();
    const auto spawned = lt.agent_spawned.at(std::min(node, lt.agent_spawned.size() - 1));
    const auto started = at(st["started"]), plan = at(st["plan_read"]),
               source = at(st["source_opened"]), buffer = at(st["buffer_ready"]);
    std::string how = fmt::format("spawn to ready, node {} slowest:", node);
    if (started && plan && source && buffer && slow_listening)
      how += fmt::format(" process and libraries {:.3f}, plan {:.3f}, source {:.3f}, buffer "
                         "set-up {:.3f}, socket {:.3f}, seen ready {:.3f} later",
                         s(spawned, *started), s(*started, *plan), s(*plan, *source),
                         s(*source, *buffer), s(*buffer, *slow_listening),
                         s(*slow_listening, lt.agents_ready));
    line("agent start", s(lt.plan_written, lt.agents_ready), how);
    ranks_from = lt.agents_ready;
  }
  if (first_request && !firsts.empty()) {
    const double last_first = std::max_element(firsts.begin(), firsts.end())->first;
    line("ranks start", s(ranks_from, *first_request),
         "spawning the ranks, the first one's own start to its first request (interpreter, "
         "imports, libsolar)");
    line("first fill", last_first - s(launch, *first_request),
         first_read_after ? fmt::format("first request to every rank's first batch (the agent's "
                                        "first read was done {:.3f} s after its start)",
                                        *first_read_after)
                    : std::string("first request to every rank's first batch"));
  }
  const Clock::time_point from = last_batch.value_or(lt.ranks_spawned);
  fmt::print(stderr, "solar run: teardown: {} to exit {:.3f} s\n",
             last_batch ? "last batch" : "ranks' start", s(from, end));
  // The agent stamps a batch just after sending it: a rank can take it and exit before that
  // stamp (a few microseconds), which must not print as "-0.000 s".
  line("ranks end", std::max(0.0, s(from, lt.ranks_exited)),
       last_batch ? "last batch served to the last rank's exit" : "ranks' run");
  if (!lt.agent_spawned.empty())
    line("agents stop", s(lt.ranks_exited, lt.agents_stopped),
         "statistics collected, SIGTERM, exited");
  line("summary", s(lt.agents_stopped == Clock::time_point{} ? lt.ranks_exited : lt.agents_stopped,
                    end),
       "run folder removed, summary printed");
}

// Resume: the global step the run starts at, from --start-epoch/--start-step or --resume-from
// (the JSON of a loader's state_dict(): its "step", checked against the plan's shape). Throws
// ConfigError naming the option.
std::uint64_t resume_start(const RunOptions& o, const Plan& plan) {
  const std::uint32_t spe = plan.layout.steps, epochs = plan.config.epochs;
  if (!o.resume_from.empty()) {
    if (o.start_epoch || o.start_step)
      throw ConfigError("--resume-from", "give either it or --start-epoch/--start-step");
    std::ifstream f(o.resume_from);
    if (!f) throw ConfigError("--resume-from", fmt::format("cannot read {}", o.resume_from));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError("--resume-from", fmt::format("{} is not JSON ({}); give the loader's "
                                                     "state_dict() saved with json.dump",
                                                     o.resume_from, e.what()));
    }
    if (j.is_object() && j.contains("loader") && j["loader"].is_object()) j = j["loader"];
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_unsigned())
      throw ConfigError("--resume-from", fmt::format("{} has no \"step\": give a solar.Loader "
                                                     "state_dict() saved with json.dump",
                                                     o.resume_from));
    const std::pair<const char*, std::uint64_t> checked[] = {
        {"steps_per_epoch", spe}, {"epochs", epochs}, {"world_size", plan.config.world()},
        {"samples", plan.config.samples}, {"batch_size", plan.config.batch}};
    for (const auto& [key, want] : checked)
      if (j.contains(key) && j[key].is_number_unsigned() && j[key].get<std::uint64_t>() != want)
        throw ConfigError("--resume-from",
                          fmt::format("{} was saved with {} {}, this run's plan has {}: resume "
                                      "with the run's own settings",
                                      o.resume_from, key, j[key].get<std::uint64_t>(), want));
    return start_global_step(std::nullopt, j["step"].get<std::uint64_t>(), spe, epochs,
                             "--resume-from", "--resume-from");
  }
  if (!o.start_epoch && !o.start_step) return 0;
  std::optional<std::uint64_t> e, st;
  if (o.start_epoch) e = parse_job_param(*o.start_epoch, "--start-epoch", job_params::kStartEpoch);
  if (o.start_step) st = parse_job_param(*o.start_step, "--start-step", job_params::kStartStep);
  if (o.transparent && (e.value_or(0) || st.value_or(0)))
    throw ConfigError("--start-step", "an unmodified script (--transparent) is not resumed by "
                                      "solar: drop --transparent or the start");
  return start_global_step(e, st, spe, epochs, "--start-epoch", "--start-step");
}

void run_run(const RunOptions& o) {
  const RunTimes times;
  PlanConfig c;
  PlanDelivery delivery = PlanDelivery::automatic;
  std::unique_ptr<storage::SampleSource> src;
  std::optional<storage::DatasetIndex> index;  // a dataset of many files
  BufferSpec buffer;
  std::uint64_t read_gap = 0;
  try {
    parse_job_shape(o, 1, c);
    c.imbalance = parse_job_param32(o.imbalance, "--imbalance", job_params::kImbalance);
    // unknown: an unmodified script of its own order; the plan (torch order) lays the buffer
    // out, and the agents keep what the ranks read (demand mode, agent/src/demand_cache.h).
    const bool order_unknown = o.order == "unknown";
    if (order_unknown) {
      if (!o.transparent)
        throw ConfigError("--order", "unknown is for an unmodified script (--transparent): "
                                     "solar's own loader reads the plan's order");
      if (!o.order_file.empty())
        throw ConfigError("--order", "unknown and --order-file contradict: drop one");
      if (!o.local_buffer.empty())
        throw ConfigError("--order", "unknown (demand mode) is not built with --local-buffer "
                                     "yet: drop it, or give the order (--order-file)");
    }
    const auto order = order_unknown ? OrderMode::torch : parse_order_mode(o.order);
    if (!order)
      throw ConfigError("--order", fmt::format("'{}' is not solar, torch or unknown", o.order));
    c.order = *order;
    if (o.transparent && o.no_agent)
      throw ConfigError("--transparent", "needs agents; drop --no-agent");
    if (!o.stats_out.empty()) check_output_file(o.stats_out, "--stats-out");
    c.drop_last = o.drop_last;
    buffer = BufferSpec::parse(o.buffer, "--buffer");
    if (!o.read_gap.empty()) read_gap = parse_bytes(o.read_gap, "--read-gap");
    if (o.command.empty())
      throw ConfigError("COMMAND", "give the rank program after --, e.g. solar run -n 4 ... -- "
                                   "python3 train.py");
    storage::SourceOptions so;
    so.label_dataset = o.labels;
    try {
      if (storage::names_many_files(o.dataset)) {
        // Listed and checked once, here; agents and ranks read the index (launcher.cpp).
        const auto began = std::chrono::steady_clock::now();
        index = storage::index_dataset(o.dataset, o.labels, [&](std::uint64_t done, std::uint64_t n) {
          if (n >= 4096 && done < n)
            fmt::print(stderr, "solar run: checking the dataset's files: {} of {}\r", done, n);
        });
        if (o.verbose || index->files.size() >= 4096)
          fmt::print(stderr, "solar run: dataset: {} files, {} samples, indexed in {:.2f} s\n",
                     index->files.size(), index->info.samples,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - began)
                         .count());
        src = storage::open_files_source(*index, so);
      } else {
        src = storage::open_source(o.dataset, so);
      }
    } catch (const std::exception& e) {
      throw ConfigError("--dataset", e.what());
    }
    if (o.peers && o.no_agent) throw ConfigError("--peers", "needs agents; drop --no-agent");
    if (o.peers && c.nodes < 2)
      throw ConfigError("--peers", "shares buffers between nodes: give --nodes 2 or more");
    storage::DatasetInfo planned = src->info();
    if (planned.whole_files && o.peers)
      throw ConfigError("--peers", fmt::format("'{}' is whole-file samples ({}), which agents do "
                                               "not share between nodes yet; drop --peers",
                                               o.dataset, planned.layout));
    // Transparent over samples as they lie in their files (whole files, filtered chunks): of
    // differing sizes, the buffer holds each in its own bytes and the plan counts bytes
    // (--buffer 64%: of their bytes); of one size, slots of it, as for raw samples.
    // (With --peers, slots of the largest: the agents share samples of one slot size only.)
    // Batch mode over whole files: each sample is its file's bytes (libsolar hands each one's
    // length; the script decodes them), planned by bytes, served zero copy.
    const std::vector<std::uint64_t> sized =
        (o.transparent || planned.whole_files) && !o.peers ? storage::stored_sample_sizes(*src)
                                                           : std::vector<std::uint64_t>{};
    if (!sized.empty()) {
      c = config_for_sized_samples(c, sized, buffer.resolve(sized_buffer_bytes(sized), 1));
    } else {
      if (o.transparent || planned.whole_files)
        if (const std::uint64_t stored = storage::stored_sample_bytes(*src); stored > 0)
          planned.sample_bytes = stored;
      c = plan_for_run(planned, buffer, c, o.peers, !o.transparent && !o.zero_copy);
    }
    if (!o.local_dir.empty() && o.local_buffer.empty())
      throw ConfigError("--local-dir", "is where the local tier goes: give --local-buffer too");
    if (!o.local_buffer.empty()) {
      if (o.no_agent) throw ConfigError("--local-buffer", "needs agents; drop --no-agent");
      if (o.peers)
        throw ConfigError("--local-buffer", "a local tier and --peers do not go together yet");
      // In slots of what the agent keeps of a sample (its bytes and label), as --buffer. The
      // tier's own rules (one sample size, at least a sample) are PlanConfig::validate's.
      c.local_bytes = BufferSpec::parse(o.local_buffer, "--local-buffer")
                          .resolve(c.samples, c.sample_bytes);
      c.validate();
      if (!o.local_dir.empty()) {
        struct stat st {};
        if (::stat(o.local_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
          throw ConfigError("--local-dir", fmt::format("{} is not a folder: give an existing "
                                                       "folder on the local disk",
                                                       o.local_dir));
      }
    }
    if (!o.order_file.empty()) {
      if (o.order_given)
        throw ConfigError("--order-file", "gives the order itself: drop --order");
      follow_order_file(c, o.order_file);
    }
    if (o.transparent) follow_the_script(c, o.order_given && !order_unknown);
    const auto d = parse_plan_delivery(o.plan_mode);
    if (!d)
      throw ConfigError("--plan", fmt::format("'{}' is not auto, whole or streamed", o.plan_mode));
    delivery = *d;
    if (delivery == PlanDelivery::streamed) require_streamable(c);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "solar run: %s\n", e.what());
    exit_code() = kExitUsage;
    return;
  }
  Plan plan = plan_for_job(c, delivery);
  plan.dataset_identity = src->identity();  // agents and ranks refuse any other data
  src.reset();
  std::uint64_t start = 0;
  try {
    start = resume_start(o, plan);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "solar run: %s\n", e.what());
    exit_code() = kExitUsage;
    return;
  }
  if (start > 0 && o.verbose)
    fmt::print(stderr, "solar run: starting at step {} (epoch {}, step {} of it) of {}\n", start,
               start / plan.layout.steps, start % plan.layout.steps, plan.total_steps());
  if (!o.plan_out.empty()) write_plan_file(plan, o.plan_out);
  if (o.verbose && plan.streamed)
    fmt::print(stderr, "solar run: plan: streamed (each node computes its share as the run goes; "
                       "the lower bound is {} remote fetches), {} per node for the resident "
                       "set\n",
               plan.metrics.lower_bound_fetches, format_bytes(c.buffer_bytes));
  else if (o.verbose)
    fmt::print(stderr, "solar run: plan: {} remote fetches for {} accesses ({:.3f}× the lower "
                       "bound), {} per node for the resident set\n",
               plan.metrics.remote_fetches, plan.metrics.accesses,
               plan.metrics.ratio_to_lower_bound(), format_bytes(c.buffer_bytes));
  LaunchSpec spec;
  spec.plan = &plan;
  spec.dataset = o.dataset;
  spec.index = index ? &*index : nullptr;
  spec.labels = o.labels;
  spec.command = o.command;
  spec.agents = !o.no_agent;
  spec.zero_copy = o.zero_copy;
  spec.direct_io = o.direct_io;
  spec.read_gap = read_gap;
  spec.transparent = o.transparent;
  spec.order_unknown = o.order == "unknown";
  spec.peers = o.peers;
  spec.peer_provider = o.peer_provider;
  spec.peer_timeout = o.peer_timeout;
  spec.keep_run_dir = o.keep;
  spec.label_lines = o.label;
  spec.stats_out = o.stats_out;
  spec.verbose = o.verbose;
  spec.start_step = start;
  spec.local_dir = o.local_dir;
  try {
    const LaunchResult r = launch(spec);
    print_summary(r);
    if (o.verbose) print_timeline(times, r, c.ranks_per_node);
    exit_code() = r.exit_code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solar run: %s\n", e.what());
    exit_code() = kExitFailure;
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
  run->add_option("--dataset", o->dataset,
                  "FILE.h5[:/dataset], many files: DIR[:/name] (its *.h5 *.hdf5 *.hdf *.he5, "
                  "recursively), 'GLOB[:/name]' or @LIST[:/name] (one path a line) -- each "
                  "file's array one sample, or with [] after the name its rows (DIR:/records[]); "
                  "samples numbered in sorted path (or list) order -- or fabric://HOST:PORT/NAME")
      ->type_name(kSource)
      ->required();
  run->add_option("--labels", o->labels, "Labels dataset ('' for none) [/label]")
      ->type_name("PATH");
  run->add_option("--buffer", o->buffer,
                  "Memory per node: bytes (K/M/G/T) or a percentage of the dataset")
      ->type_name(kBuffer)
      ->required();
  run->add_option("--local-buffer", o->local_buffer,
                  "A local-disk tier per node below --buffer (bytes with K/M/G/T, or a\n"
                  "percentage of the dataset): the plan keeps --buffer + this resident per\n"
                  "node, the agents move samples between memory and a file on the local\n"
                  "disk ahead of the ranks (agent/README.md, The local tier). Not with --peers")
      ->type_name(kBuffer);
  run->add_option("--local-dir", o->local_dir,
                  "Where the local tier's files go: an existing folder on the local disk; each\n"
                  "agent makes a folder of its own in it, removed when the run ends [the run\n"
                  "folder, in $TMPDIR or /tmp]")
      ->type_name("DIR");
  run->add_option("--epochs", o->epochs, "Epochs")->type_name(kUint)->required();
  run->add_option("--batch", o->batch, "Per-rank batch size")->type_name(kUint)->required();
  run->add_option("--seed", o->seed, "Shuffle seed [0]")->type_name(kUint);
  run->add_option("--imbalance", o->imbalance, "δ: per-rank batch may be b-δ..b+δ [0]")
      ->type_name(kUint);
  run->add_option("--order", o->order,
                  "solar, torch (= DistributedSampler), or with --transparent unknown: the "
                  "script reads an order of its own that solar is not told (its own sampler, "
                  "weights, a list it draws), so the agents keep the samples the ranks read until "
                  "their buffers are full (demand mode; without it they switch so themselves when "
                  "the ranks' reads do not follow the plan) [solar; torch with --transparent]")
      ->type_name("ORDER")
      ->each([o](const std::string&) { o->order_given = true; });
  run->add_option("--order-file", o->order_file,
                  "The script's own order, epoch after epoch (a script that computes it up "
                  "front, as the SOLAR artifact's shuffle lists: np.save(F, np.stack([perm of "
                  "epoch 0, perm of epoch 1, ...]))), .npy of shape (epochs, samples) or text "
                  "ids; the plan follows it exactly, each epoch's row strided among the ranks as "
                  "DistributedSampler(shuffle=False) over indices 0..N-1 does")
      ->type_name("FILE");
  run->add_flag("--drop-last", o->drop_last, "Drop the tail that does not fill a step");
  run->add_flag("--no-agent", o->no_agent, "No agents: ranks read directly (the fallback path)");
  run->add_flag("--zero-copy", o->zero_copy,
                "Agents hand out their cache slots instead of copying each rank's batch into "
                "its ring first (fewer copies; each rank then touches the whole buffer, which "
                "costs page faults where they are expensive, e.g. on VMs)");
  run->add_flag("--direct-io", o->direct_io,
                "Agents read HDF5 files with O_DIRECT, bypassing the page cache (for datasets "
                "far larger than memory)");
  run->add_option("--read-gap", o->read_gap,
                  "Storage bound by requests (IOPS), not bytes: agents read samples at most "
                  "SIZE apart in the file as one request, the bytes between them read and "
                  "dropped, merging the steps queued for reading. Worth it when a request costs "
                  "more than SIZE of bandwidth: about latency x bandwidth (2000 IOPS at 400 MB/s: "
                  "200K). Raw HDF5 layouts [0: off]")
      ->type_name("SIZE");
  run->add_flag("--transparent", o->transparent,
                "Run an UNMODIFIED script (h5py + DistributedSampler + DataLoader): its reads of "
                "the dataset file are served from the node buffer by libsolar_preload.so when "
                "resident, from the file otherwise. Give the script's own --seed, --batch and "
                "--epochs; contiguous or unfiltered chunked HDF5 datasets");
  run->add_flag("--peers", o->peers,
                "Peer sharing: the nodes' buffers act as one. A node's miss on a sample another "
                "node holds is read from that node's buffer over libfabric RMA instead of "
                "storage (the plan places samples for it: policy sampler with --transparent, "
                "solar otherwise). Each agent keeps a few more staging slots for it, out of "
                "--buffer");
  run->add_option("--peer-provider", o->peer_provider,
                  "libfabric provider between the agents [tcp;ofi_rxm]")
      ->type_name("NAME");
  run->add_option("--peer-timeout", o->peer_timeout,
                  "Seconds: a peer agent that does not answer or lacks a sample this long is "
                  "passed over, its samples read from storage [10]")
      ->check(CLI::PositiveNumber);
  run->add_flag("-l,--label", o->label,
                "Prefix every line the ranks write to stdout/stderr with the rank, as srun -l "
                "does ('3: text'; right-aligned to the widest rank); lines are kept whole, never "
                "mixed (up to 1 MiB a line)");
  run->add_option("--plan-out", o->plan_out, "Also save the plan here (for plan-dump)")
      ->type_name(kFile);
  run->add_option("--plan", o->plan_mode,
                  "How the plan reaches the agents and ranks: whole (computed here, every "
                  "access in its file), streamed (its file is the inputs alone; each node "
                  "computes its share as the run goes: no plan-sized file or memory, start-up "
                  "independent of the epochs), auto (streamed above 2^24 accesses) [auto]")
      ->type_name("MODE");
  run->add_option("--stats-out", o->stats_out,
                  "Write every node's measured statistics here when the job ends (JSON: per "
                  "epoch hits, fetched samples and bytes, storage read time, ranks' stall, wall "
                  "time; each agent's head start; fields in agent/README.md); `solar report` "
                  "draws it")
      ->type_name(kFile);
  run->add_option("--start-epoch", o->start_epoch,
                  "Resume (a requeued job, a training checkpoint): start at this epoch; the "
                  "agents begin there and the ranks get only the rest of the plan [0]")
      ->type_name(kUint);
  run->add_option("--start-step", o->start_step,
                  "Resume: start at this step of --start-epoch (without it: this global step) "
                  "[0]")
      ->type_name(kUint);
  run->add_option("--resume-from", o->resume_from,
                  "Resume at the step of a loader's state_dict() saved as JSON (json.dump; a "
                  "\"loader\" key holding it also works); the plan's shape is checked")
      ->type_name(kFile);
  run->add_flag("--keep-run-dir", o->keep, "Keep the plan, sockets and agent logs");
  run->add_flag("-v,--verbose", o->verbose, "Say what is planned");
  run->add_option("command", o->command, "The rank program and its arguments (after --)")
      ->required();
  run->callback([o] { run_run(*o); });
}

}  // namespace solar::cli

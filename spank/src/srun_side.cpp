// SPDX-License-Identifier: Apache-2.0
// The submitting side: srun (local context) and sbatch/salloc (allocator context). Checks the
// user's options and the dataset before anything is allocated or launched, computes the step's
// plan once the step's shape is known, writes it where every node reads it, and exports what
// slurmstepd and the ranks need.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "solar/core/plan_file.h"
#include "solar/core/planner.h"
#include "solar/sys/atomic_file.h"
#include "solar/sys/remove_tree.h"
#include "solar/node_summary.h"
#include "solar/stats_file.h"
#include "solar/sys/subprocess.h"
#include "state.h"
#include "step_folder.h"

namespace solar::spank {
namespace {

// The dataset's shape and identity, from the `solar dataset-info` child process: HDF5 (with
// MPI) and libfabric stay out of srun and slurmstepd. A dataset of many files also gives its
// index (listed and checked once, here), kept in `index` for the step's folder.
DatasetShape read_dataset(const State& s, std::string& index) {
  std::vector<std::string> argv = {s.config.solar, "dataset-info", s.options.dataset_spec(),
                                   "--labels", s.options.labels_dataset()};
  if (!s.config.provider.empty()) argv.insert(argv.end(), {"--provider", s.config.provider});
  // A private folder for the index, removed before this returns.
  const char* tmp = std::getenv("TMPDIR");
  std::string scratch = std::string(tmp && *tmp ? tmp : "/tmp") + "/solar-index-XXXXXX";
  if (!::mkdtemp(scratch.data()))
    throw ConfigError("--solar-dataset", fmt::format("cannot make a temporary folder {}: {}",
                                                     scratch, std::strerror(errno)));
  struct Remove {
    const std::string& dir;
    ~Remove() { sys::remove_tree(dir); }
  } remove{scratch};
  argv.insert(argv.end(), {"--index-out", scratch + "/index"});
  std::string out, err;
  const int status = sys::run_captured(argv, s.config.timeout_s, out, err);
  index.clear();
  if (std::ifstream in(scratch + "/index"); in) {
    std::ostringstream all;
    all << in.rdbuf();
    index = all.str();
  }
  while (!err.empty() && (err.back() == '\n' || err.back() == '\r')) err.pop_back();
  // Stopped at the deadline (run_captured's own suffixes): the tool ran, the listing did not
  // end in time (many files, slow or hung storage), which solar= would not fix.
  if (status == -1 && (err.find("(stopped after ") != std::string::npos ||
                       err.find("(did not finish within ") != std::string::npos))
    throw ConfigError("--solar-dataset",
                      fmt::format("`solar dataset-info` did not finish reading {} within {:g} s "
                                  "and was stopped: a dataset of many files is listed and checked "
                                  "once per step, an open of each file; if the storage answers, "
                                  "the admin raises timeout= in plugstack.conf",
                                  s.options.dataset_spec(), s.config.timeout_s));
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) == 127)
    throw ConfigError("--solar-dataset",
                      fmt::format("cannot read the dataset: the solar tool {} did not run ({}); "
                                  "the admin sets solar= in plugstack.conf",
                                  s.config.solar, err.empty() ? "no reason given" : err));
  if (WEXITSTATUS(status) != 0)
    throw ConfigError("--solar-dataset", err.empty() ? "cannot be read" : err);
  return DatasetShape::parse(out);
}

// A node's final stats, or why there are none.
struct NodeStats {
  std::optional<nlohmann::json> stats;
  std::string why;
  bool log_found = false;  // its agent's log exists (it may still get its final line)
};

// How much of the end of an agent's log is read for its final line (it holds per-epoch
// records: some hundred bytes per epoch).
constexpr std::size_t kLogTailBytes = 8u << 20;

// A node's final stats: the "stopped: {json}" line its agent logs on exit. The log is in the
// step's folder (the user's, 0700) and is read as a regular file of the user's only, its end
// only, never blocking.
NodeStats node_final_stats(const State& s, std::uint32_t m) {
  NodeStats n;
  const std::string path = agent_log_in(s.step_folder, m);
  const int fd = open_owned_file(path, ::getuid());
  if (fd < 0) {
    n.why = errno == ENOENT
                ? fmt::format("no agent stats: no agent log {} (no agent ran there and its ranks "
                              "read directly, or plan_dir is not shared with this node)",
                              path)
                : fmt::format("no agent stats: the agent's log {} is not a file of yours ({})",
                              path, std::strerror(errno));
    return n;
  }
  n.log_found = true;
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0) {
    const auto size = static_cast<std::size_t>(st.st_size);
    const std::size_t from = size > kLogTailBytes ? size - kLogTailBytes : 0;
    text.resize(size - from);
    std::size_t got = 0;
    while (got < text.size()) {
      const ssize_t r = ::pread(fd, text.data() + got, text.size() - got,
                                static_cast<off_t>(from + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += static_cast<std::size_t>(r);
    }
    text.resize(got);
  }
  ::close(fd);
  std::string last;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.find("stopped: {") != std::string::npos) last = line;
  if (last.empty()) {
    n.why = fmt::format("no agent stats: the agent's log {} has no final line (the agent was "
                        "killed before it wrote it, or is still stopping)", path);
    return n;
  }
  try {
    n.stats = nlohmann::json::parse(last.substr(last.find('{')));
  } catch (const std::exception& e) {
    n.why = fmt::format("unreadable agent stats: {}", e.what());
  }
  return n;
}

// Every node's final stats, each log read until it has them. srun can be told that the tasks
// have ended while a node's slurmstepd is still stopping its agent (task_exit), so the agent's
// final line may come a moment after srun gets here: the logs that exist without it are read
// again, polling, for kFinalStatsWaitS (state.h) (an agent killed outright never writes it;
// such a step ends that much later).
std::vector<NodeStats> final_stats(const State& s) {
  std::vector<NodeStats> out(s.nodes);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(kFinalStatsWaitS));
  for (;;) {
    bool waiting = false;
    for (std::uint32_t m = 0; m < s.nodes; ++m) {
      if (out[m].stats) continue;
      out[m] = node_final_stats(s, m);
      if (!out[m].stats && out[m].log_found) waiting = true;
    }
    if (!waiting || std::chrono::steady_clock::now() >= deadline) return out;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Each node's final stats, from its agent's log.
void print_node_summaries(const std::vector<NodeStats>& all) {
  for (std::uint32_t m = 0; m < all.size(); ++m) {
    if (!all[m].stats) {
      info(fmt::format("node {}: {}", m, all[m].why));
      continue;
    }
    try {
      for (const std::string& line :
           protocol::node_summary(*all[m].stats, protocol::SummaryFor::srun))
        info(fmt::format("node {}: {}", m, line));
    } catch (const std::exception& e) {
      info(fmt::format("node {}: unreadable agent stats: {}", m, e.what()));
    }
  }
}

// The step's statistics in one file, in the schema of `solar run --stats-out`
// (solar/stats_file.h): per node the record its agent's --stats-out holds, made from the log
// line's stats document; "missing" where a node has none.
void write_step_stats(const State& s, const std::vector<NodeStats>& all) {
  nlohmann::json nodes = nlohmann::json::array();
  for (std::uint32_t m = 0; m < all.size(); ++m) {
    if (!all[m].stats) {
      nodes.push_back(protocol::missing_node_record(m, all[m].why));
      continue;
    }
    nlohmann::json n = protocol::node_stats_record(*all[m].stats);
    n["node"] = m;
    nodes.push_back(std::move(n));
  }
  nlohmann::json extra = {{"job", s.job}, {"step", s.step}};
  if (!s.plan_metrics.empty()) extra["plan"] = nlohmann::json::parse(s.plan_metrics);
  const nlohmann::json out =
      protocol::run_stats_file("srun --solar-stats", std::move(nodes), extra);
  // %j and %s: the job and step ids, as in srun -o (one file per step of an sbatch job).
  std::string path;
  const std::string spec = s.options.stats_path();
  for (std::size_t i = 0; i < spec.size(); ++i) {
    if (spec[i] == '%' && i + 1 < spec.size() && (spec[i + 1] == 'j' || spec[i + 1] == 's')) {
      path += std::to_string(spec[++i] == 'j' ? s.job : s.step);
    } else {
      path += spec[i];
    }
  }
  if (const char* failed = sys::write_file_atomically(path, protocol::stats_file_text(out), 0666))
    error(fmt::format("--solar-stats: {}: {}: {}", path, failed, std::strerror(errno)));
}

}  // namespace

int validate_options(spank_t, State& s) {
  try {
    s.options.add_environment([](const char* n) { return std::getenv(n); });
    if (!s.options.active()) return 0;
    s.options.validate();
    // --solar-stats: checked now, not when the step is over.
    if (!s.options.stats_path().empty()) check_output_file(s.options.stats_path(), "--solar-stats");
    s.dataset = read_dataset(s, s.dataset_index);
    // What holds for any step shape (one node, one rank) fails now, before an allocation.
    plan_config_for_step(s.options, s.config, *s.dataset, 1, 1, node_memory_bytes());
    return 0;
  } catch (const ConfigError& e) {
    error(e.what());
    return -1;
  }
}

int plan_step(spank_t sp, State& s) {
  if (!s.options.active() || !s.dataset) return 0;
  std::uint32_t job = 0, step = 0, nodes = 0, tasks = 0;
  if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_NNODES, &nodes) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_TOTAL_TASK_COUNT, &tasks) != ESPANK_SUCCESS || nodes == 0) {
    error("cannot read the step's job id, nodes and tasks from Slurm");
    return -1;
  }
  if (tasks % nodes != 0) {
    error(fmt::format("{} tasks on {} nodes: solar needs the same number of tasks on every node "
                      "(use --ntasks-per-node)",
                      tasks, nodes));
    return -1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string note;
  PlanConfig c;
  try {
    c = plan_config_for_step(s.options, s.config, *s.dataset, nodes, tasks / nodes,
                             node_memory_bytes(), &note);
  } catch (const ConfigError& e) {
    error(e.what());
    return -1;
  }
  struct stat st {};
  if (::stat(s.config.plan_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    error(fmt::format("plan_dir {} does not exist: the admin sets plan_dir= in plugstack.conf to "
                      "a folder every node can read and users can write",
                      s.config.plan_dir));
    return -1;
  }
  const PlanDelivery delivery = s.options.plan_delivery();
  if (delivery == PlanDelivery::streamed && !can_stream(c)) {
    error(fmt::format("--solar-plan=streamed: {} is computed whole only (the local tier's "
                      "placement needs each node's whole schedule, an order file's order the "
                      "whole list); drop --solar-plan or give whole",
                      c.tiered() ? "a plan with a local tier (--solar-local-buffer)"
                                 : "a plan of an order file (--solar-order-file)"));
    return -1;
  }
  Plan plan = plan_for_job(c, delivery);
  // For --solar-stats (a streamed plan's are not known here: each node computes its share).
  if (!plan.streamed) s.plan_metrics = protocol::plan_metrics_record(plan.metrics).dump();
  plan.dataset_identity = s.dataset->identity;
  std::uint64_t start = 0;  // resume: --solar-start-epoch / --solar-start-step
  try {
    start = s.options.start_step_in(plan.layout.steps, c.epochs);
    if (start > 0 && s.options.is_transparent())
      throw ConfigError("--solar-start-step", "an unmodified script (--solar-transparent) is not "
                                              "resumed by solar: drop one of them");
  } catch (const ConfigError& e) {
    error(e.what());
    return -1;
  }
  // The step's own folder: a fresh name, 0700, the user's (another user can take any name in
  // the 1777 plan_dir beforehand, but not this one); the nodes find it by the step's ids and
  // its owner.
  std::string folder;
  try {
    folder = create_step_folder(s.config.plan_dir, job, step);
  } catch (const std::exception& e) {
    error(e.what());
    return -1;
  }
  const std::string path = plan_in(folder);
  s.peers = c.peer_fetch;  // --solar-peers on several nodes
  const std::vector<std::uint8_t> bytes = encode_plan(plan);
  const char* failed =
      sys::write_file_atomically(path, std::string_view(reinterpret_cast<const char*>(bytes.data()),
                                                   bytes.size()),
                            0600);
  const int write_errno = errno;
  // --solar-peers: the agents' cards, private to the user (agent/README.md).
  if (!failed && s.peers && ::mkdir(peer_dir_in(folder).c_str(), 0700) != 0) {
    error(fmt::format("--solar-peers: creating {}: {}", peer_dir_in(folder), std::strerror(errno)));
    sys::remove_tree(folder);
    return -1;
  }
  if (failed) {
    error(fmt::format("writing the plan {}: {}: {}", path, failed, std::strerror(write_errno)));
    sys::remove_tree(folder);
    return -1;
  }
  if (!s.dataset_index.empty()) {  // the agents and ranks read it instead of every file
    if (const char* why = sys::write_file_atomically(index_in(folder), s.dataset_index, 0600)) {
      error(fmt::format("writing the dataset index {}: {}: {}", index_in(folder), why,
                        std::strerror(errno)));
      sys::remove_tree(folder);
      return -1;
    }
  }
  s.step_folder = folder;
  s.nodes = nodes;
  s.job = job;
  s.step = step;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  const std::pair<const char*, std::string> env[] = {
      {"SOLAR_PLAN", path},
      {"SOLAR_DATASET", s.options.dataset_spec()},
      {"SOLAR_LABELS", s.options.labels_dataset()},
      {"SOLAR_STEP", fmt::format("{}.{}", job, step)},
      {"SOLAR_VERBOSE", s.options.is_verbose() ? "1" : "0"},
      {"SOLAR_TRANSPARENT", s.options.is_transparent() ? "1" : "0"},
      {"SOLAR_PEERS", s.peers ? "1" : "0"},
      {"SOLAR_ORDER_UNKNOWN", s.options.order_unknown() ? "1" : "0"},
      {"SOLAR_DATASET_INDEX", s.dataset_index.empty() ? "" : index_in(folder)},
  };
  for (const auto& [name, value] : env)
    if (::setenv(name, value.c_str(), 1) != 0) {
      error(fmt::format("setenv {}: {}", name, std::strerror(errno)));
      return -1;
    }
  // The start, as the ranks' libsolar reads it (the step within its epoch) and the nodes'
  // slurmstepd passes it to the agents (solar-agent --start-step, from the plan's steps).
  if (start > 0) {
    ::setenv("SOLAR_START_EPOCH", std::to_string(start / plan.layout.steps).c_str(), 1);
    ::setenv("SOLAR_START_STEP", std::to_string(start % plan.layout.steps).c_str(), 1);
  } else {
    ::unsetenv("SOLAR_START_EPOCH");
    ::unsetenv("SOLAR_START_STEP");
  }
  if (s.options.is_verbose()) {
    if (!note.empty()) info(note);
    if (plan.streamed)
      info(fmt::format("plan {} for {} nodes x {} ranks, batch {}, {} epochs: streamed (each "
                       "node computes its share as the step goes; the lower bound is {} remote "
                       "fetches), {} per node resident; written in {:.0f} ms",
                       path, nodes, tasks / nodes, c.batch, c.epochs,
                       plan.metrics.lower_bound_fetches, format_bytes(c.buffer_bytes), ms));
    else
      info(fmt::format("plan {} for {} nodes x {} ranks, batch {}, {} epochs: {} remote fetches "
                       "for {} accesses ({:.3f}x the lower bound), {} per node resident; "
                       "planned in {:.0f} ms",
                       path, nodes, tasks / nodes, c.batch, c.epochs,
                       plan.metrics.remote_fetches, plan.metrics.accesses,
                       plan.metrics.ratio_to_lower_bound(), format_bytes(c.buffer_bytes), ms));
    if (start > 0)
      info(fmt::format("starting at step {} (epoch {}, step {} of it) of {}", start,
                       start / plan.layout.steps, start % plan.layout.steps,
                       plan.total_steps()));
  }
  return 0;
}

int finish_step(spank_t, State& s) {
  if (s.step_folder.empty()) return 0;
  if (s.options.is_verbose() || !s.options.stats_path().empty()) {
    const std::vector<NodeStats> stats = final_stats(s);
    if (s.options.is_verbose()) print_node_summaries(stats);
    if (!s.options.stats_path().empty()) write_step_stats(s, stats);
  }
  if (!sys::remove_tree(s.step_folder)) error(fmt::format("could not remove {}", s.step_folder));
  s.step_folder.clear();
  return 0;
}

}  // namespace solar::spank

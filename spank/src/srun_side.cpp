// The submitting side: srun (local context) and sbatch/salloc (allocator context). Checks the
// user's options and the dataset before anything is allocated or launched, computes the step's
// plan once the step's shape is known, writes it where every node reads it, and exports what
// slurmstepd and the ranks need.
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "solar/core/plan_file.h"
#include "solar/core/planner.h"
#include "state.h"

namespace solar::spank {
namespace {

storage::DatasetInfo read_dataset(State& s) {
  storage::SourceOptions so;
  so.label_dataset = s.options.labels_dataset();
  so.provider = s.config.provider;
  try {
    const auto src = storage::open_source(s.options.dataset_spec(), so);
    s.dataset_identity = src->identity();
    return src->info();
  } catch (const std::exception& e) {
    throw ConfigError("--solar-dataset", e.what());
  }
}

// Each node's final stats, from the "stopped: {json}" line its agent logs on exit.
void print_node_summaries(const State& s) {
  for (std::uint32_t m = 0; m < s.nodes; ++m) {
    std::ifstream f(agent_log_path(s.plan_written, m));
    std::string line, last;
    while (std::getline(f, line))
      if (line.find("stopped: {") != std::string::npos) last = line;
    if (last.empty()) {
      info(fmt::format("node {}: no agent stats (direct reads, or plan_dir is not shared)", m));
      continue;
    }
    try {
      const auto j = nlohmann::json::parse(last.substr(last.find('{')));
      const double hits = j.value("hits", 0.0), fetched = j.value("fetched_samples", 0.0);
      info(fmt::format("node {}: {:.0f} hits, {:.0f} samples fetched ({}), hit rate {:.1f}%", m,
                       hits, fetched, format_bytes(j.value("bytes_read", std::uint64_t{0})),
                       hits + fetched > 0 ? 100 * hits / (hits + fetched) : 0.0));
      if (const auto t = j.value("transparent", nlohmann::json()); t.is_object()) {
        const double served = t.value("hit_reads", 0.0), missed = t.value("miss_reads", 0.0);
        info(fmt::format("node {}: file reads served from the buffer {:.0f}, fallen through "
                         "{:.0f}; {} of {} steps consumed as planned{}",
                         m, served, missed, t.value("consumed_steps", std::uint64_t{0}),
                         j.value("total_steps", std::uint64_t{0}),
                         t.value("consumed_steps", std::uint64_t{0}) <
                                 j.value("total_steps", std::uint64_t{0})
                             ? " (the script's order differs: check --solar-seed, "
                               "--solar-batch, --solar-epochs)"
                             : ""));
      }
    } catch (const std::exception& e) {
      info(fmt::format("node {}: unreadable agent stats: {}", m, e.what()));
    }
  }
}

}  // namespace

int validate_options(spank_t, State& s) {
  try {
    s.options.add_environment([](const char* n) { return std::getenv(n); });
    if (!s.options.active()) return 0;
    s.options.validate();
    s.dataset = read_dataset(s);
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
  Plan plan = make_plan(c);
  plan.dataset_identity = s.dataset_identity;
  const std::string path = plan_path(s.config, job, step);
  try {
    write_plan_file(plan, path);
  } catch (const std::exception& e) {
    error(fmt::format("writing the plan: {}", e.what()));
    return -1;
  }
  s.plan_written = path;
  s.nodes = nodes;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  const std::pair<const char*, std::string> env[] = {
      {"SOLAR_PLAN", path},
      {"SOLAR_DATASET", s.options.dataset_spec()},
      {"SOLAR_LABELS", s.options.labels_dataset()},
      {"SOLAR_STEP", fmt::format("{}.{}", job, step)},
      {"SOLAR_VERBOSE", s.options.is_verbose() ? "1" : "0"},
      {"SOLAR_TRANSPARENT", s.options.is_transparent() ? "1" : "0"},
  };
  for (const auto& [name, value] : env)
    if (::setenv(name, value.c_str(), 1) != 0) {
      error(fmt::format("setenv {}: {}", name, std::strerror(errno)));
      return -1;
    }
  if (s.options.is_verbose()) {
    if (!note.empty()) info(note);
    info(fmt::format("plan {} for {} nodes x {} ranks, batch {}, {} epochs: {} remote fetches for "
                     "{} accesses ({:.3f}x the lower bound), {} per node resident; planned in "
                     "{:.0f} ms",
                     path, nodes, tasks / nodes, c.batch, c.epochs, plan.metrics.remote_fetches,
                     plan.metrics.accesses, plan.metrics.ratio_to_lower_bound(),
                     format_bytes(c.buffer_bytes), ms));
  }
  return 0;
}

int finish_step(spank_t, State& s) {
  if (s.plan_written.empty()) return 0;
  if (s.options.is_verbose()) print_node_summaries(s);
  std::error_code ec;
  std::filesystem::remove(s.plan_written, ec);
  for (std::uint32_t m = 0; m < s.nodes; ++m)
    std::filesystem::remove(agent_log_path(s.plan_written, m), ec);
  s.plan_written.clear();
  return 0;
}

}  // namespace solar::spank

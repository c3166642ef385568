// SPDX-License-Identifier: Apache-2.0
// Runs a planned job on this machine: one solar-agent per simulated node, R ranks per node
// with the SOLAR_* / torch.distributed environment, signals forwarded, everything stopped and
// removed afterwards. Used by `solar run` and `solar bench loader`. Killed outright (SIGKILL),
// it takes its agents and ranks with it (they get SIGTERM: PR_SET_PDEATHSIG) and a watchdog
// process removes its run folder; a folder left anyway (the whole process group killed) is
// removed by the next launch of the same user under the same TMPDIR once its owner is dead
// (launcher.cpp, "the run folder after a kill").
#pragma once

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "solar/core/plan.h"
#include "solar/storage/dataset_files.h"
#include "solar/storage/sample_source.h"

namespace solar::cli {

// A private (0700) directory under $TMPDIR (or /tmp), removed with its contents when this goes
// away unless keep() was called. Throws std::runtime_error if it cannot be created.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  void keep() { keep_ = true; }

 private:
  std::filesystem::path path_;
  bool keep_ = false;
};

struct LaunchSpec {
  Plan const* plan = nullptr;     // what the agents and ranks follow
  std::string dataset;            // SampleSource spec
  // A dataset of many files: its index, written to the run directory and named to agents and
  // ranks by $SOLAR_DATASET_INDEX, so that none lists and checks the files again.
  const storage::DatasetIndex* index = nullptr;
  std::string labels = "/label";  // labels dataset ("" = none)
  std::vector<std::string> command;         // the rank program and its arguments
  std::vector<std::string> extra_env;       // NAME=VALUE added to every rank
  bool agents = true;             // false: ranks read directly (no agent)
  bool zero_copy = false;         // agents hand out cache slots, no per-rank rings
  bool direct_io = false;         // agents read HDF5 files with O_DIRECT
  std::uint64_t read_gap = 0;     // agents' --read-gap (bytes; 0: off)
  // Job-transparent: agents serve file reads (--transparent) and ranks run unmodified with
  // libsolar_preload.so in LD_PRELOAD ("" = next to solar, in the build tree's interpose/).
  bool transparent = false;
  bool order_unknown = false;  // transparent: agents in demand mode from the start (--order-unknown)
  std::string preload_path;
  std::string agent_path;         // solar-agent binary ("" = next to solar, then PATH)
  bool keep_run_dir = false;      // keep plan, sockets and logs (for debugging; never swept)
  // Like `srun -l`: every line a rank writes to stdout/stderr goes to ours prefixed with its
  // global rank ("3: ", right-aligned to the widest rank), whole lines only. Otherwise ranks
  // inherit our stdout/stderr.
  bool label_lines = false;
  // Measured statistics (agent/README.md) of every node, merged into this JSON file when the
  // job ends ("" = none): {"format_version", "source", "nodes": [per-node --stats-out]}.
  std::string stats_out;
  bool verbose = false;  // say where the agents' sockets are (for solar stat)
  // Peer sharing: agents read the plan's peer reads from each other's buffers over libfabric
  // (solar-agent --peer-dir, a private folder in the run directory; --peer-provider).
  bool peers = false;
  std::string peer_provider = "tcp;ofi_rxm";
  double peer_timeout = 10;
  // Resume: the global step the job starts at (checked against the plan by the caller). The
  // agents get --start-step, the ranks SOLAR_START_EPOCH and SOLAR_START_STEP (the step within
  // the epoch). 0: the whole plan.
  std::uint64_t start_step = 0;
  // A plan with a local tier: the folder in which each agent makes its own (--local-dir
  // BASE/<run folder's name>-node<m>), removed after the agents have stopped, however they
  // ended. "": the run folder.
  std::string local_dir;
};

// When the stages of a launch happened (steady_clock, which is CLOCK_MONOTONIC: comparable with
// the agents' "startup" times on this machine). Unset (epoch) where a stage did not happen.
struct LaunchTimes {
  using Time = std::chrono::steady_clock::time_point;
  Time plan_written;               // the run folder and plan file are there
  std::vector<Time> agent_spawned; // per node: its agent was started (empty: no agents)
  Time agents_ready;               // every agent's socket accepts ranks
  Time ranks_spawned;              // the first rank was started
  Time ranks_exited;               // the last rank exited
  Time agents_stopped;             // the agents' statistics are in and they have exited
};

struct LaunchResult {
  int exit_code = 0;                    // the worst rank's (128+N for a signal)
  double seconds = 0;                   // ranks' wall time
  std::vector<nlohmann::json> agents;   // each agent's final stats (empty if none answered)
  std::vector<std::string> problems;    // agents that failed or died, for the summary
  LaunchTimes times;
};

// The plan config for running c's job over a dataset with `buffer` of agent memory per node
// (config_for_agents on the dataset's sizes). Throws ConfigError.
// peers, rings: as config_for_agents.
PlanConfig plan_for_run(const storage::DatasetInfo& info, const BufferSpec& buffer, PlanConfig c,
                        bool peers = false, bool rings = true);

// Throws std::runtime_error if the job cannot start (agent failed, bad command).
LaunchResult launch(const LaunchSpec& spec);

// Asks an agent for its stats (JSON) over its socket; throws on failure.
nlohmann::json agent_stats(const std::string& socket_path, double timeout_s = 5);

// Where the solar-agent / other solar binaries are: next to this executable, or in the build
// tree beside it, or on PATH.
std::string find_sibling(const std::string& name, const std::string& build_subdir);

}  // namespace solar::cli

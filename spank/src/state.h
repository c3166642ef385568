// SPDX-License-Identifier: Apache-2.0
// What the plugin keeps between callbacks of one process (srun, sbatch/salloc or one node's
// slurmstepd), and the contexts' entry points. plugin.cpp owns the one State and dispatches.
#pragma once

extern "C" {
#include <slurm/spank.h>
}

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "agent_process.h"
#include "settings.h"

namespace solar::spank {

// How long a node's slurmstepd lets its agent stop (SIGTERM) before it kills it (task_exit):
// within it the agent logs its final stats line, which srun then waits for.
constexpr double kAgentStopGraceS = 10;

// How long srun's exit hook reads the agents' logs for their final stats lines (srun_side.cpp,
// final_stats): as long as an agent may take to stop before slurmstepd kills it, and a little
// more. 3 s was too short: on 2 loaded cores (the CI clone's ctest -j2) an agent's line came
// later, and --solar-stats named the node "missing".
constexpr double kFinalStatsWaitS = kAgentStopGraceS + 2;

struct State {
  PluginConfig config;
  JobOptions options;

  // srun / sbatch / salloc
  std::optional<DatasetShape> dataset;  // read in init_post_opt (solar dataset-info)
  std::string dataset_index;  // a dataset of many files: its index (solar dataset-info), or ""
  std::string step_folder;  // plan_dir's folder of the step (plan, logs, peers); removed in exit
  bool peers = false;  // --solar-peers on several nodes: the step's peer folder, removed in exit
  std::uint32_t nodes = 0;
  std::uint32_t job = 0, step = 0;              // of the planned step
  std::string plan_metrics;  // the plan's figures (protocol::plan_metrics_record), JSON text

  // slurmstepd
  bool step_active = false;      // this step uses solar on this node
  std::uint32_t node = 0;
  std::uint32_t local_tasks = 0;
  std::uint32_t tasks_exited = 0;
  std::string runtime_dir;       // the step's private folder (removed in exit)
  std::string local_dir;         // the local tier's folder (the agent's; removed in exit)
  uid_t uid = 0;                 // the job's user (owns local_dir)
  AgentProcess agent;
  double agent_ready_ms = 0;
  std::string problem;           // why the agent is not there (told once by local task 0)
  bool fail_tasks = false;       // the step must fail (on_error=fail, or no usable plan)
};

// Every message starts with "solar: ".
void error(const std::string& message);
void info(const std::string& message);

// srun (local) and sbatch/salloc (allocator) side: srun_side.cpp.
int validate_options(spank_t sp, State& s);  // init_post_opt
int plan_step(spank_t sp, State& s);         // local_user_init
int finish_step(spank_t sp, State& s);       // exit

// slurmstepd side: stepd_side.cpp.
int start_node_agent(spank_t sp, State& s);  // user_init
int prepare_task(spank_t sp, State& s);      // task_init
int task_exited(spank_t sp, State& s);       // task_exit
int end_node_step(spank_t sp, State& s);     // exit
// slurmd's job epilog: anything of the job a crash left (agents, folders, plans).
int sweep_job(spank_t sp, State& s);

}  // namespace solar::spank

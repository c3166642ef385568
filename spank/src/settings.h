// SPDX-License-Identifier: Apache-2.0
// What the plugin is told: the admin's plugstack.conf arguments (PluginConfig) and the user's
// --solar-* options or SOLAR_* variables (JobOptions), and how a job's plan follows from them.
// Plain C++ with no Slurm in it, so tests exercise it without a cluster.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "solar/core/config.h"
#include "solar/core/plan_stream.h"

namespace solar::spank {

// What happens when a node's agent cannot start.
enum class OnError : std::uint8_t { fallback, fail };

// plugstack.conf: `required /usr/lib/x86_64-linux-gnu/slurm-wlm/solar_spank.so agent=... plan_dir=... ...`
struct PluginConfig {
  std::string agent = SOLAR_SPANK_DEFAULT_AGENT;  // the solar-agent binary
  std::string solar = SOLAR_SPANK_DEFAULT_SOLAR;  // the solar tool (reads datasets for srun)
  std::string plan_dir = "/tmp";                   // where srun writes plans; shared by nodes
  std::string runtime_dir = "/run/solar";          // node-local: one private folder per step
  std::optional<BufferSpec> max_buffer;            // clamp per node; % = of the node's memory
  std::string provider;                            // libfabric provider (FI_PROVIDER)
  OnError on_error = OnError::fallback;
  double timeout_s = 60;                           // agent start-up limit
  bool zero_copy = false;  // agents hand out cache slots, no per-rank rings (solar-agent --zero-copy)
  bool allow_transparent = true;                  // transparent=no: --solar-transparent refused
  std::string preload = SOLAR_SPANK_DEFAULT_PRELOAD;  // libsolar_preload.so for transparent tasks
  // The node-local disk for --solar-local-buffer (local_dir=/local/nvme; "" = none: the option
  // is refused). Every node's agent makes its step's folder there as the job's user, so it must
  // let users create folders (1777, like /tmp); slurmstepd and the epilog remove them.
  std::string local_dir;
  std::optional<std::uint64_t> max_local_buffer;  // bytes per node (max_local_buffer=)

  // Parses `key=value` arguments; throws ConfigError naming the argument on an unknown key, a
  // bad value or a relative path. `plugin_path`, the plugin's own file as loaded, places the
  // defaults of agent, solar and preload where the install puts them relative to it (empty:
  // the build's install prefix).
  static PluginConfig parse(const std::vector<std::string>& args,
                            const std::string& plugin_path = {});
};

// What srun needs of the dataset, read by the `solar dataset-info` child process (the plugin
// itself loads no HDF5, MPI or libfabric).
struct DatasetShape {
  std::uint64_t samples = 0, sample_bytes = 0;
  // Filtered chunks of one sample: the longest as stored (the transparent mode buffers them as
  // they are, so its plan counts these); 0 otherwise, or from an older `solar`.
  std::uint64_t stored_sample_bytes = 0;
  std::uint64_t label_bytes = 0;  // 0: no labels
  std::string identity;           // for the plan (Plan::dataset_identity)
  bool whole_files = false;       // every file one sample (planned by bytes where sizes differ)
  // Samples of differing sizes as stored (whole files, filtered chunks): each one's bytes, by
  // global id; empty when they are of one size. The transparent mode plans by these bytes.
  std::vector<std::uint64_t> stored_sizes;
  // `solar dataset-info`'s JSON line; throws ConfigError("--solar-dataset") when malformed.
  static DatasetShape parse(const std::string& json_line);
};

// One user setting: its option name (without --solar-), its SOLAR_* variable, and whether it
// takes a value.
struct OptionSpec {
  const char* name;      // "dataset" -> --solar-dataset
  const char* env;       // "SOLAR_DATASET"
  const char* arginfo;   // nullptr: a flag
  const char* usage;
};
// The option table, in `srun --help` order. Index = JobOptions::Field.
const std::vector<OptionSpec>& option_specs();

struct JobOptions {
  enum Field : int { dataset, labels, buffer, epochs, batch, seed, order, order_file, imbalance,
                     transparent, peers, local_buffer, start_epoch, start_step, verbose, stats,
                     plan, enable, kFields };
  // Raw text per field, and where it came from (command line beats environment).
  std::optional<std::string> value[kFields];
  bool from_command_line[kFields] = {};

  // Records a --solar-* value (the last one given wins, as srun applies #SBATCH and
  // environment options before the command line). Throws ConfigError if its syntax is bad.
  void set(int field, const std::string& text);
  // Fills fields not given on the command line from SOLAR_* variables (`getenv`).
  void add_environment(const std::function<const char*(const char*)>& getenv);

  // Whether this step uses solar: any --solar-* option except --solar=off, or SOLAR_DATASET
  // in the environment outside a solar step (`inside_solar_step`).
  bool active() const;
  bool off() const;
  bool is_verbose() const;
  bool is_transparent() const;
  bool is_peers() const;
  // --solar-order unknown: an unmodified script of its own order (the agents' demand mode).
  bool order_unknown() const;

  // Checks everything that does not need the dataset or the step's shape: required options
  // present, numbers in range. Throws ConfigError naming the option.
  void validate() const;

  std::string dataset_spec() const { return value[dataset].value_or(""); }
  std::string labels_dataset() const { return value[labels].value_or("/label"); }
  // --solar-stats: where srun writes the step's measured statistics ("" = nowhere); relative
  // paths are srun's working directory's.
  std::string stats_path() const { return value[stats].value_or(""); }
  // Resume (--solar-start-epoch, --solar-start-step): the global step the step starts at in a
  // plan of `steps_per_epoch` × `epochs` steps (0 when neither is given). Throws ConfigError
  // naming the option and the plan's length when it is beyond the end.
  std::uint64_t start_step_in(std::uint32_t steps_per_epoch, std::uint32_t epochs) const;
  // The plan's inputs except the dataset's shape and the step's nodes and ranks.
  PlanConfig partial_config() const;
  BufferSpec buffer_spec() const;
  // --solar-plan: how the step's plan reaches its nodes (auto unless given).
  PlanDelivery plan_delivery() const;
};

// The plan a step runs: the dataset's shape, the step's nodes and ranks, and the per-node
// memory budget (the user's --solar-buffer, clamped by the admin's max_buffer; a percentage
// there is of `node_memory_bytes`). Same budget-to-plan rule as `solar run` (plan_for_run in
// cli/cmd_run.cpp). Throws ConfigError naming the option at fault. `notes` gets what a
// verbose user should hear (the clamp).
PlanConfig plan_config_for_step(const JobOptions& o, const PluginConfig& pc,
                                const DatasetShape& info, std::uint32_t nodes,
                                std::uint32_t ranks_per_node, std::uint64_t node_memory_bytes,
                                std::string* notes = nullptr);

// The per-node memory limit of plugstack.conf's max_buffer on a node of `node_memory_bytes`
// (a percentage is of that), if the admin set one.
std::optional<std::uint64_t> buffer_cap(const PluginConfig& pc, std::uint64_t node_memory_bytes);

// Whether a plan is for --solar-transparent: only that mode plans with policy sampler (the
// plan places samples for an unmodified script's DistributedSampler order).
bool plan_is_transparent(const PlanConfig& c);

// The folder in plugstack.conf's local_dir where node `node`'s agent keeps the step's local
// tier (solar-agent --local-dir).
std::string step_local_dir(const PluginConfig& pc, std::uint32_t job, std::uint32_t step,
                           std::uint32_t node);

// Names in runtime_dir (node-local, root's): the step's private folder on one node. The step's
// files in plan_dir are in its step folder (step_folder.h).
std::string step_runtime_dir(const PluginConfig& pc, std::uint32_t job, std::uint32_t step,
                             std::uint32_t node);
// The prefix every folder of `job` starts with (for the epilog sweep).
std::string job_prefix(std::uint32_t job);

// MemTotal of this machine in bytes (0 if unknown).
std::uint64_t node_memory_bytes();

}  // namespace solar::spank

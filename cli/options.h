// SPDX-License-Identifier: Apache-2.0
// Conventions shared by the `solar` subcommands' options.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "solar/core/job_params.h"
#include "solar/core/plan_config.h"

namespace solar::cli {

// Type names shown in --help (`--epochs UINT`, `--buffer SIZE`). Numbers are taken as text and
// parsed strictly (parse_count, parse_bytes), so CLI11 cannot infer these itself.
inline constexpr const char* kUint = "UINT";    // a whole number ≥ 0
inline constexpr const char* kBytes = "SIZE";   // bytes: 512, 64K, 1.5G, 2T
inline constexpr const char* kBuffer = "SIZE";  // bytes, or a percentage of the dataset: 64%
inline constexpr const char* kFloat = "FLOAT";
inline constexpr const char* kSource = "SOURCE";  // FILE.h5[:/dataset] or fabric://HOST:PORT/NAME
inline constexpr const char* kFile = "FILE";

// Ranks as srun/mpirun count them: `-n,--ntasks N` is the total over all nodes, and
// `--ranks-per-node R` (srun's --ntasks-per-node) the count on each. Either may be given, or
// both when they agree (N = R × nodes); with neither, `default_per_node` on each node.
struct RankLayout {
  std::uint32_t nodes = 1;
  std::uint32_t per_node = 1;
  std::uint64_t total() const { return std::uint64_t{nodes} * per_node; }
};

// Throws ConfigError naming -n/--ntasks or --ranks-per-node (or `nodes_flag`) when a value is
// not a number in range (nodes: job_params::kNodes; ranks on a node: `per_node_range`), when N
// does not divide evenly by the nodes, or when both are given and disagree.
RankLayout resolve_ranks(const std::optional<std::string>& ntasks,
                         const std::optional<std::string>& per_node, const std::string& nodes,
                         std::uint32_t default_per_node, JobParamRange per_node_range,
                         const std::string& nodes_flag = "--nodes");

// The job's shape from the options `solar run` and `solar bench loader` share (-n/--ntasks,
// --ranks-per-node, --nodes, --epochs, --batch, --seed: members of those names in `o`), each
// checked against job_params' range, into `c`. Throws ConfigError naming the option.
template <class Options>
void parse_job_shape(const Options& o, std::uint32_t default_per_node, PlanConfig& c) {
  const RankLayout ranks = resolve_ranks(o.ntasks, o.ranks_per_node, o.nodes, default_per_node,
                                         job_params::kRanksPerNode);
  c.nodes = ranks.nodes;
  c.ranks_per_node = ranks.per_node;
  c.epochs = parse_job_param32(o.epochs, "--epochs", job_params::kEpochs);
  c.batch = parse_job_param32(o.batch, "--batch", job_params::kBatch);
  c.seed = parse_job_param(o.seed, "--seed", job_params::kSeed);
}

}  // namespace solar::cli

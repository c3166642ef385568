// SPDX-License-Identifier: Apache-2.0
#include "options.h"

#include <fmt/format.h>

#include "solar/core/config.h"

namespace solar::cli {

RankLayout resolve_ranks(const std::optional<std::string>& ntasks,
                         const std::optional<std::string>& per_node, const std::string& nodes,
                         std::uint32_t default_per_node, JobParamRange per_node_range,
                         const std::string& nodes_flag) {
  RankLayout r;
  const std::uint64_t max_per_node = per_node_range.hi;
  r.nodes = parse_job_param32(nodes, nodes_flag, job_params::kNodes);
  std::optional<std::uint32_t> rpn;
  if (per_node) rpn = parse_job_param32(*per_node, "--ranks-per-node", per_node_range);
  if (ntasks) {
    const std::uint64_t n = parse_count(*ntasks, "-n/--ntasks", 1,
                                        job_params::kNodes.hi * max_per_node);
    const std::string where = fmt::format("{} {}", nodes_flag, r.nodes);
    if (n % r.nodes != 0) {
      const std::uint64_t up = (n + r.nodes - 1) / r.nodes;
      throw ConfigError("-n/--ntasks",
                        fmt::format("{} does not divide evenly by {}: -n is the total over "
                                    "all nodes, as for srun -n (e.g. -n {} {}, or "
                                    "--ranks-per-node {} {})",
                                    n, where, up * r.nodes, where, up, where));
    }
    const std::uint64_t each = n / r.nodes;
    if (each > max_per_node)
      throw ConfigError("-n/--ntasks",
                        fmt::format("{} with {} is {} ranks per node; allowed 1..{} per node",
                                    n, where, each, max_per_node));
    if (rpn && *rpn != each)
      throw ConfigError("-n/--ntasks",
                        fmt::format("{} disagrees with --ranks-per-node {} and {} ({} ranks in "
                                    "all); give one of them, or values that agree",
                                    n, *rpn, where, std::uint64_t{*rpn} * r.nodes));
    r.per_node = static_cast<std::uint32_t>(each);
  } else {
    r.per_node = rpn.value_or(default_per_node);
  }
  return r;
}

}  // namespace solar::cli

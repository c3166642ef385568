#include "options.h"

#include <fmt/format.h>

#include "solar/core/config.h"

namespace solar::cli {

RankLayout resolve_ranks(const std::optional<std::string>& ntasks,
                         const std::optional<std::string>& per_node, const std::string& nodes,
                         std::uint32_t default_per_node, std::uint32_t max_per_node,
                         const std::string& nodes_flag) {
  RankLayout r;
  r.nodes = static_cast<std::uint32_t>(parse_count(nodes, nodes_flag, 1, kMaxNodes));
  std::optional<std::uint32_t> rpn;
  if (per_node)
    rpn = static_cast<std::uint32_t>(parse_count(*per_node, "--ranks-per-node", 1, max_per_node));
  if (ntasks) {
    const std::uint64_t n = parse_count(*ntasks, "-n/--ntasks", 1,
                                        std::uint64_t{kMaxNodes} * max_per_node);
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

// SPDX-License-Identifier: Apache-2.0
// How much room variable-size extents need beyond the plan's bytes (issue 36, item 1: the
// buffer's fragmentation, measured before the agent's allocator is built).
//
// A sized plan holds every node to buffer_bytes of resident samples at every step. An agent
// keeps them in one arena; freed extents are scattered, so a fetch may find enough free bytes
// but no free extent large enough. solar::arena_for_extents (core/extents.h) replays each
// node's schedule through an extent allocator, free neighbours merged, and finds by bisection
// the smallest arena in which every fetch fits, first-fit (the lowest free extent large
// enough) and best-fit (the smallest). Printed over the buffer, the worst node of the plan.
//
//   build/bench/solar-extent-fragmentation [--samples N] [--epochs E] [--nodes M] [--ranks R]
//       [--batch b] [--spread PERCENT] [--buffer PERCENT] [--policy P] [--seed S]
#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "solar/core/extents.h"
#include "solar/core/planner.h"
#include "sized_instance.h"

int main(int argc, char** argv) {
  int rc = 0;
  const auto inst = solar::bench::sized_instance(
      argc, argv,
      "The smallest arena, over the plan's buffer, in which each node's samples of spread sizes "
      "(1 MiB ± --spread percent) fit as first-fit and best-fit extents.",
      true, rc);
  if (!inst) return rc;
  const solar::PlanConfig& c = inst->config;
  const std::uint64_t spread = inst->spread, pct = inst->buffer_percent;
  const std::uint64_t hi = (1 << 20) + (1 << 20) * spread / 100;
  const std::string policy(solar::to_string(c.policy));
  solar::Plan p;
  try {
    p = solar::make_plan(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solar-extent-fragmentation: %s\n", e.what());
    return 2;
  }
  const double first =
      double(solar::arena_for_extents(p, solar::ExtentFit::first)) / double(c.buffer_bytes);
  const double best =
      double(solar::arena_for_extents(p, solar::ExtentFit::best)) / double(c.buffer_bytes);
  fmt::print("N={} E={} {}x{} b={} sizes 1 MiB ±{}% buffer {}% ({} MiB) policy {} seed {}: "
             "arena / buffer first-fit {:.3f}, best-fit {:.3f}; largest sample / buffer {:.4f}\n",
             c.samples, c.epochs, c.nodes, c.ranks_per_node, c.batch, spread, pct,
             c.buffer_bytes >> 20, policy, c.seed, first, best,
             double(hi) / double(c.buffer_bytes));
  return 0;
}

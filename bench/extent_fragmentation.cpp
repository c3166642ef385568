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
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "solar/core/extents.h"
#include "solar/core/planner.h"
#include "solar/core/rng.h"

namespace {

std::uint64_t arg(int argc, char** argv, const char* name, std::uint64_t dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::strtoull(argv[i + 1], nullptr, 10);
  return dflt;
}

}  // namespace

int main(int argc, char** argv) {
  std::string policy = "sampler";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0) {
      std::puts("usage: solar-extent-fragmentation [--samples N] [--epochs E] [--nodes M] "
                "[--ranks R] [--batch b] [--spread PERCENT] [--buffer PERCENT] [--policy P] "
                "[--seed S]\nThe smallest arena, over the plan's buffer, in which each node's "
                "variable-size samples fit with first-fit and best-fit extents.");
      return 0;
    }
    if (std::strcmp(argv[i], "--policy") == 0 && i + 1 < argc) policy = argv[i + 1];
  }
  solar::PlanConfig c;
  c.samples = arg(argc, argv, "--samples", 2000);
  c.epochs = static_cast<std::uint32_t>(arg(argc, argv, "--epochs", 5));
  c.nodes = static_cast<std::uint32_t>(arg(argc, argv, "--nodes", 1));
  c.ranks_per_node = static_cast<std::uint32_t>(arg(argc, argv, "--ranks", 4));
  c.batch = static_cast<std::uint32_t>(arg(argc, argv, "--batch", 8));
  c.seed = arg(argc, argv, "--seed", 0);
  const auto pol = solar::parse_policy(policy);
  if (!pol) {
    std::fprintf(stderr, "solar-extent-fragmentation: --policy %s: not a policy\n", policy.c_str());
    return 2;
  }
  c.policy = *pol;
  const std::uint64_t spread = arg(argc, argv, "--spread", 50), pct = arg(argc, argv, "--buffer", 40);
  const std::uint64_t mean = 1 << 20, lo = mean - mean * spread / 100, hi = mean + mean * spread / 100;
  solar::Xoshiro256 g(c.seed + 1);
  auto sizes = std::make_shared<std::vector<std::uint64_t>>(c.samples);
  std::uint64_t total = 0;
  for (auto& s : *sizes) total += s = lo + g.bounded(hi - lo + 1);
  c.sample_sizes = sizes;
  c.sample_bytes = total / c.samples;
  c.buffer_bytes = total * pct / 100;
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

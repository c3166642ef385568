// How much room variable-size extents need beyond the plan's bytes (issue 36, item 1: the
// buffer's fragmentation, measured before the agent's allocator is built).
//
// A sized plan holds every node to buffer_bytes of resident samples at every step. An agent
// keeps them in one arena; freed extents are scattered, so a fetch may find enough free bytes
// but no free extent large enough. This replays each node's schedule of a plan (evictions, then
// fetches, step by step) through an extent allocator over an arena of A bytes, with adjacent
// free extents merged, and finds by bisection the smallest A at which every fetch fits:
//   first-fit   the lowest free extent that is large enough
//   best-fit    the smallest free extent that is large enough
// Printed as the arena over the buffer (A / buffer_bytes), the worst node of the plan.
//
//   build/bench/solar-extent-fragmentation [--samples N] [--epochs E] [--nodes M] [--ranks R]
//       [--batch b] [--spread PERCENT] [--buffer PERCENT] [--policy P] [--seed S]
#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "solar/core/planner.h"
#include "solar/core/rng.h"

namespace {

enum class Fit { first, best };

// Replays node n's schedule in an arena of `arena` bytes; false when some fetch finds no
// free extent large enough.
bool fits(const solar::Plan& p, std::uint32_t n, std::uint64_t arena, Fit fit) {
  const solar::NodeSchedule& s = p.nodes[n];
  std::map<std::uint64_t, std::uint64_t> free_at{{0, arena}};  // offset -> length
  std::unordered_map<std::uint32_t, std::pair<std::uint64_t, std::uint64_t>> where;
  auto release = [&](std::uint32_t x) {
    auto [off, len] = where.at(x);
    where.erase(x);
    auto it = free_at.emplace(off, len).first;
    if (auto next = std::next(it); next != free_at.end() && off + len == next->first) {
      it->second += next->second;
      free_at.erase(next);
    }
    if (it != free_at.begin())
      if (auto prev = std::prev(it); prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_at.erase(it);
      }
  };
  auto place = [&](std::uint32_t x) {
    const std::uint64_t len = p.config.size_of(x);
    auto pick = free_at.end();
    for (auto it = free_at.begin(); it != free_at.end(); ++it)
      if (it->second >= len) {
        if (fit == Fit::first) {
          pick = it;
          break;
        }
        if (pick == free_at.end() || it->second < pick->second) pick = it;
      }
    if (pick == free_at.end()) return false;
    const auto [off, have] = *pick;
    free_at.erase(pick);
    if (have > len) free_at.emplace(off + len, have - len);
    where[x] = {off, len};
    return true;
  };
  for (std::uint64_t t = 0; t < p.total_steps(); ++t) {
    for (std::uint32_t x : s.evicts_at(t)) release(x);
    for (const solar::FetchRun& r : s.fetches_at(t))
      for (std::uint32_t x = r.first; x < r.first + r.count; ++x)
        if (!place(x)) return false;
  }
  return true;
}

// The smallest arena (to 0.1% of the buffer) in which every node's schedule fits.
std::uint64_t smallest_arena(const solar::Plan& p, Fit fit) {
  std::uint64_t worst = 0;
  const std::uint64_t step = std::max<std::uint64_t>(1, p.config.buffer_bytes / 1000);
  for (std::uint32_t n = 0; n < p.config.nodes; ++n) {
    std::uint64_t lo = p.config.buffer_bytes, hi = 2 * p.config.buffer_bytes;
    while (!fits(p, n, hi, fit)) hi *= 2;
    if (fits(p, n, lo, fit)) hi = lo;
    while (hi - lo > step) {  // fits(hi), !fits(lo)
      const std::uint64_t mid = lo + (hi - lo) / 2;
      (fits(p, n, mid, fit) ? hi : lo) = mid;
    }
    worst = std::max(worst, hi);
  }
  return worst;
}

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
  const double first = double(smallest_arena(p, Fit::first)) / double(c.buffer_bytes);
  const double best = double(smallest_arena(p, Fit::best)) / double(c.buffer_bytes);
  fmt::print("N={} E={} {}x{} b={} sizes 1 MiB ±{}% buffer {}% ({} MiB) policy {} seed {}: "
             "arena / buffer first-fit {:.3f}, best-fit {:.3f}; largest sample / buffer {:.4f}\n",
             c.samples, c.epochs, c.nodes, c.ranks_per_node, c.batch, spread, pct,
             c.buffer_bytes >> 20, policy, c.seed, first, best,
             double(hi) / double(c.buffer_bytes));
  return 0;
}

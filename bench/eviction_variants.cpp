// SPDX-License-Identifier: Apache-2.0
// Eviction by bytes, size-aware variants measured against each other (issue 36, item 1).
//
// One node reading what DistributedSampler gives its ranks (the sampler policy's stream: every
// epoch's sequence in steps of R·b samples), samples of spread sizes, a buffer of bytes. A
// brute-force simulation, independent of the planner (a scan of the resident set per
// eviction), of three rules for which resident, unused-this-step sample goes when a miss does
// not fit:
//   farthest       the one used again farthest ahead (Belady by bytes: what the planner does)
//   size×distance  the largest (distance to next use) × size (GreedyDual-Size's weighting:
//                  frees more bytes per eviction, keeps more samples)
//   best-fit       among the 8 used farthest ahead, the smallest that alone makes room, else
//                  the farthest (less slack left over)
// For each: bytes and fetches against the byte and fetch lower bounds (order.h), and the
// planner's own sampler plan beside them.
//
//   build/bench/solar-eviction-variants [--samples N] [--epochs E] [--ranks R] [--batch b]
//                                       [--spread P] [--buffer PERCENT] [--seed S] (--help)
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "solar/core/order.h"
#include "solar/core/planner.h"
#include "sized_instance.h"

namespace {

using solar::PlanConfig;

enum class Rule { farthest, size_distance, best_fit };
constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();

struct Result {
  std::uint64_t bytes = 0, fetches = 0;
};

Result simulate(const PlanConfig& c, Rule rule) {
  const solar::EpochLayout L = solar::EpochLayout::of(c);
  const std::vector<std::uint64_t>& size = *c.sample_sizes;
  // The whole access stream and each access's next use (global times).
  std::vector<std::uint32_t> stream, seq;
  for (std::uint32_t e = 0; e < c.epochs; ++e) {
    solar::epoch_sequence(c, L, e, seq);
    stream.insert(stream.end(), seq.begin(), seq.begin() + static_cast<std::ptrdiff_t>(L.used()));
  }
  std::vector<std::uint64_t> next(stream.size(), kNever);
  {
    std::vector<std::uint64_t> last(c.samples, kNever);
    for (std::uint64_t i = stream.size(); i-- > 0;) {
      next[i] = last[stream[i]];
      last[stream[i]] = i;
    }
  }
  std::unordered_map<std::uint32_t, std::uint64_t> resident;  // sample -> next use
  std::unordered_map<std::uint32_t, std::uint64_t> step_use;   // this step: sample -> next use
  std::uint64_t used = 0;
  Result r;
  for (std::uint64_t begin = 0; begin < stream.size();) {
    const std::uint64_t p = begin / L.used(), j = (begin % L.used()) / L.step_size(0);
    const std::uint64_t end = begin + L.step_size(static_cast<std::uint32_t>(j));
    (void)p;
    step_use.clear();
    for (std::uint64_t i = begin; i < end; ++i) step_use[stream[i]] = next[i];
    for (std::uint64_t i = begin; i < end; ++i) {
      const std::uint32_t x = stream[i];
      if (resident.count(x)) continue;
      while (used + size[x] > c.buffer_bytes) {
        const std::uint64_t deficit = used + size[x] - c.buffer_bytes;
        std::uint32_t victim = 0;
        bool found = false;
        if (rule == Rule::best_fit) {
          std::vector<std::pair<std::uint64_t, std::uint32_t>> far;  // (next use, sample)
          for (const auto& [y, nu] : resident)
            if (!step_use.count(y)) far.emplace_back(nu, y);
          const std::size_t k = std::min<std::size_t>(8, far.size());
          std::partial_sort(far.begin(), far.begin() + static_cast<std::ptrdiff_t>(k), far.end(),
                            [](auto& a, auto& b) { return a.first != b.first ? a.first > b.first
                                                                             : a.second < b.second; });
          std::uint64_t best = kNever;
          for (std::size_t q = 0; q < k; ++q)
            if (size[far[q].second] >= deficit && size[far[q].second] < best) {
              best = size[far[q].second];
              victim = far[q].second;
              found = true;
            }
          if (!found && k) {
            victim = far[0].second;
            found = true;
          }
        } else {
          double best = -1;
          for (const auto& [y, nu] : resident) {
            if (step_use.count(y)) continue;
            const double dist = nu == kNever ? 1e30 : static_cast<double>(nu - begin);
            const double score = rule == Rule::farthest ? dist : dist * static_cast<double>(size[y]);
            if (score > best || (score == best && y < victim)) {
              best = score;
              victim = y;
              found = true;
            }
          }
        }
        if (!found) {
          std::fprintf(stderr, "every resident sample is used in this step: buffer too small\n");
          std::exit(2);
        }
        used -= size[victim];
        resident.erase(victim);
      }
      resident[x] = 0;
      used += size[x];
      r.bytes += size[x];
      ++r.fetches;
    }
    for (const auto& [x, nu] : step_use) resident[x] = nu;  // next uses after this step
    begin = end;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int rc = 0;
  const auto inst = solar::bench::sized_instance(
      argc, argv,
      "One node, samples of sizes spread evenly over 1 MiB ± --spread percent, a buffer of "
      "--buffer percent of their bytes: three eviction rules by bytes against the lower bounds "
      "and the planner's sampler plan.",
      false, rc);
  if (!inst) return rc;
  const PlanConfig& c = inst->config;
  const std::uint64_t spread = inst->spread, pct = inst->buffer_percent;
  const std::uint64_t lb_bytes = solar::lower_bound_bytes(c), lb_fetches = solar::lower_bound_fetches(c);
  fmt::print("N={} E={} R={} b={} sizes 1 MiB ±{}% buffer {}% of the bytes, seed {}\n", c.samples,
             c.epochs, c.ranks_per_node, c.batch, spread, pct, c.seed);
  fmt::print("{:<16} {:>12} {:>14} {:>10} {:>16}\n", "rule", "bytes", "vs byte bound", "fetches",
             "vs fetch bound");
  auto row = [&](const char* name, std::uint64_t bytes, std::uint64_t fetches) {
    fmt::print("{:<16} {:>12} {:>13.4f}× {:>10} {:>15.4f}×\n", name, bytes,
               double(bytes) / double(lb_bytes), fetches, double(fetches) / double(lb_fetches));
  };
  const solar::Plan plan = solar::make_plan(c);
  row("planner sampler", plan.metrics.remote_bytes, plan.metrics.remote_fetches);
  for (auto [rule, name] : {std::pair{Rule::farthest, "farthest"},
                            std::pair{Rule::size_distance, "size×distance"},
                            std::pair{Rule::best_fit, "best-fit"}}) {
    const Result r = simulate(c, rule);
    row(name, r.bytes, r.fetches);
  }
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
// The solar-paper policy's epoch order: the SOLAR artifact's particle swarm (utils/PSO.py, a
// discrete swap-sequence PSO) over its epoch-to-epoch cost matrix (utils/solar_shuffle.py).
// Deviations, all for reproducibility: the artifact's RNGs are unseeded; ours derive from the
// plan seed.
#include <algorithm>
#include <bit>
#include <numeric>

#include "solar/core/planner.h"
#include "solar/core/rng.h"

namespace solar {

std::vector<std::uint64_t> epoch_overlap_matrix(const PlanConfig& c, std::uint64_t k) {
  const EpochLayout layout = EpochLayout::of(c);
  const std::uint64_t used = layout.used();
  k = std::min(k, used);
  const std::uint64_t words = (c.samples + 63) / 64;
  std::vector<std::uint64_t> head(std::uint64_t{c.epochs} * words), tail(head.size());
  std::vector<std::uint32_t> seq;
  for (std::uint32_t e = 0; e < c.epochs; ++e) {
    epoch_sequence(c, layout, e, seq);
    std::uint64_t* h = &head[std::uint64_t{e} * words];
    std::uint64_t* t = &tail[std::uint64_t{e} * words];
    for (std::uint64_t i = 0; i < k; ++i) h[seq[i] / 64] |= 1ULL << (seq[i] % 64);
    for (std::uint64_t i = used - k; i < used; ++i) t[seq[i] / 64] |= 1ULL << (seq[i] % 64);
  }
  std::vector<std::uint64_t> overlap(std::uint64_t{c.epochs} * c.epochs, 0);
  for (std::uint32_t i = 0; i < c.epochs; ++i)
    for (std::uint32_t j = 0; j < c.epochs; ++j) {
      if (i == j) continue;
      const std::uint64_t* t = &tail[std::uint64_t{i} * words];
      const std::uint64_t* h = &head[std::uint64_t{j} * words];
      std::uint64_t n = 0;
      for (std::uint64_t w = 0; w < words; ++w) n += std::popcount(t[w] & h[w]);
      overlap[std::uint64_t{i} * c.epochs + j] = n;
    }
  return overlap;
}

std::vector<std::uint32_t> paper_epoch_order(const PlanConfig& c) {
  const std::uint32_t n = c.epochs;
  std::vector<std::uint32_t> identity(n);
  std::iota(identity.begin(), identity.end(), 0U);
  if (n <= 2) return identity;
  const EpochLayout layout = EpochLayout::of(c);
  const std::uint64_t k =
      std::min<std::uint64_t>(std::uint64_t{c.nodes} * c.buffer_samples(), layout.used());
  const auto overlap = epoch_overlap_matrix(c, k);
  // cost(i→j) = samples among j's first K that are not among i's last K, per rank (integer
  // division by the world size, as in the artifact).
  std::vector<std::uint64_t> cost(overlap.size());
  for (std::size_t i = 0; i < cost.size(); ++i) cost[i] = (k - overlap[i]) / layout.world;
  auto path_cost = [&](const std::vector<std::uint32_t>& path) {
    std::uint64_t s = 0;
    for (std::uint32_t i = 0; i + 1 < n; ++i) s += cost[std::uint64_t{path[i]} * n + path[i + 1]];
    return s;
  };

  std::uint64_t key = c.seed ^ 0x9a0e5f5eedULL;
  Xoshiro256 rng(splitmix64(key));
  auto uniform01 = [&] { return double(rng.next() >> 11) * 0x1.0p-53; };

  // Population: `epochs` random paths that all start at one random epoch; duplicates dropped.
  const std::uint32_t first = static_cast<std::uint32_t>(rng.bounded(n));
  std::vector<std::vector<std::uint32_t>> current;
  for (std::uint32_t p = 0; p < n; ++p) {
    std::vector<std::uint32_t> path;
    path.push_back(first);
    for (std::uint32_t v = 0; v < n; ++v)
      if (v != first) path.push_back(v);
    for (std::size_t i = path.size() - 1; i > 1; --i)
      std::swap(path[i], path[1 + rng.bounded(i)]);
    if (std::find(current.begin(), current.end(), path) == current.end())
      current.push_back(std::move(path));
  }
  std::vector<std::vector<std::uint32_t>> pbest = current;
  std::vector<std::uint64_t> pbest_cost(current.size());
  for (std::size_t p = 0; p < current.size(); ++p) pbest_cost[p] = path_cost(current[p]);

  constexpr int kIterations = 1000;
  constexpr double kAlfa = 0.9, kBeta = 1.0;
  struct Swap {
    std::uint32_t a, b;
    double prob;
  };
  std::vector<Swap> velocity;
  std::vector<std::uint32_t> where(n);
  auto add_swaps_towards = [&](const std::vector<std::uint32_t>& x, std::vector<std::uint32_t> target,
                               double prob) {
    for (std::uint32_t i = 0; i < n; ++i) where[target[i]] = i;
    for (std::uint32_t i = 0; i < n; ++i) {
      if (x[i] == target[i]) continue;
      const std::uint32_t j = where[x[i]];
      velocity.push_back({i, j, prob});
      std::swap(target[i], target[j]);
      where[target[i]] = i;
      where[target[j]] = j;
    }
  };
  for (int it = 0; it < kIterations; ++it) {
    const std::size_t g = static_cast<std::size_t>(
        std::min_element(pbest_cost.begin(), pbest_cost.end()) - pbest_cost.begin());
    const std::vector<std::uint32_t> gbest = pbest[g];
    for (std::size_t p = 0; p < current.size(); ++p) {
      velocity.clear();
      add_swaps_towards(current[p], pbest[p], kAlfa);
      add_swaps_towards(current[p], gbest, kBeta);
      auto& x = current[p];
      for (const Swap& s : velocity)
        if (uniform01() <= s.prob) std::swap(x[s.a], x[s.b]);
      const std::uint64_t cx = path_cost(x);
      if (cx < pbest_cost[p]) {
        pbest[p] = x;
        pbest_cost[p] = cx;
      }
    }
  }
  const std::size_t g = static_cast<std::size_t>(
      std::min_element(pbest_cost.begin(), pbest_cost.end()) - pbest_cost.begin());
  return pbest[g];
}

}  // namespace solar

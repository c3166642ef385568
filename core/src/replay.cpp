// SPDX-License-Identifier: Apache-2.0
#include "solar/core/replay.h"

#include "solar/core/tiers.h"

#include <algorithm>
#include <fmt/format.h>
#include <unordered_map>
#include <unordered_set>

namespace solar {

ReplayReport replay_plan(const Plan& plan) {
  const PlanConfig& c = plan.config;
  const EpochLayout layout = EpochLayout::of(c);
  const std::uint64_t W = layout.world, R = c.ranks_per_node, M = c.nodes;
  const std::uint64_t cap = effective_capacity(c);
  auto fail = [](const std::string& what) { throw PlanInvalid(what); };

  if (plan.epoch_order.size() != c.epochs) fail("epoch order has the wrong length");
  {
    std::vector<std::uint32_t> sorted = plan.epoch_order;
    std::sort(sorted.begin(), sorted.end());
    for (std::uint32_t e = 0; e < c.epochs; ++e)
      if (sorted[e] != e) fail("epoch order is not a permutation of the epochs");
  }
  if (plan.rank_offsets.size() != plan.total_steps() * W + 1) fail("rank offsets: wrong size");
  if (plan.nodes.size() != M) fail("wrong number of node schedules");

  ReplayReport rep;
  Metrics& m = rep.metrics;
  m.per_epoch.resize(c.epochs);
  m.lower_bound_fetches = lower_bound_fetches(c);
  m.lower_bound_bytes = lower_bound_bytes(c);
  // What a node holds, in the units of its capacity: samples, or bytes when sizes are given.
  std::vector<std::uint64_t> held(M);
  auto units = [&](std::uint32_t x) -> std::uint64_t {
    return c.sized() ? (*c.sample_sizes)[x] : 1;
  };
  std::uint64_t fetched_bytes = 0;
  std::vector<std::unordered_set<std::uint32_t>> resident(M), evicted_now(M);
  std::vector<std::uint64_t> handed(M);  // this step: reads of samples the source evicts
  std::vector<std::uint32_t> seq, expect, got;
  std::vector<std::unordered_map<std::uint32_t, int>> fetched(M);  // this step: sample -> uses
  std::uint64_t t = 0;
  for (std::uint32_t p = 0; p < c.epochs; ++p) {
    epoch_sequence(c, layout, plan.epoch_order[p], seq);
    EpochMetrics& em = m.per_epoch[p];
    for (std::uint32_t j = 0; j < layout.steps; ++j, ++t) {
      const std::uint32_t bj = layout.rank_batch(j);
      const std::uint64_t lo = bj > c.imbalance ? bj - c.imbalance : 1, hi = bj + c.imbalance;
      // Membership and sizes.
      expect.assign(seq.begin() + static_cast<std::ptrdiff_t>(layout.step_begin(j)),
                    seq.begin() + static_cast<std::ptrdiff_t>(layout.step_begin(j) +
                                                              layout.step_size(j)));
      got.clear();
      for (std::uint64_t w = 0; w < W; ++w) {
        const auto b = plan.rank_batch(t, w);
        if (b.size() < lo || b.size() > hi)
          fail(fmt::format("step {} rank {}: {} samples, outside [{}, {}]", t, w, b.size(), lo,
                           hi));
        for (std::uint32_t a : b) got.push_back(a & kSampleMask);
      }
      std::sort(expect.begin(), expect.end());
      std::sort(got.begin(), got.end());
      if (got != expect)
        fail(fmt::format("step {} (epoch position {}, step {}): the global batch's membership "
                         "differs from the epoch's order",
                         t, p, j));
      // Evictions, then fetches, on every node. A peer may read a sample its source evicts in
      // the same step (a handover: the source frees the slot once the read is done).
      for (std::uint64_t n = 0; n < M; ++n) {
        evicted_now[n].clear();
        for (std::uint32_t x : plan.nodes[n].evicts_at(t)) {
          if (resident[n].erase(x) == 0)
            fail(fmt::format("step {} node {}: evicts sample {} that it does not hold", t, n, x));
          held[n] -= units(x);
          evicted_now[n].insert(x);
        }
      }
      for (std::uint64_t n = 0; n < M; ++n) fetched[n].clear();
      std::fill(handed.begin(), handed.end(), 0);
      for (std::uint64_t n = 0; n < M; ++n) {
        auto bring = [&](std::uint32_t x) {
          if (x >= c.samples)
            fail(fmt::format("step {} node {}: fetches sample {}, beyond the dataset's {}", t, n, x,
                             c.samples));
          if (!resident[n].insert(x).second)
            fail(fmt::format("step {} node {}: fetches sample {} that it already holds", t, n, x));
          held[n] += units(x);
          fetched[n][x] = 0;
        };
        for (const FetchRun& run : plan.nodes[n].fetches_at(t)) {
          for (std::uint32_t x = run.first; x < run.first + run.count; ++x) {
            bring(x);
            fetched_bytes += c.sized() ? (*c.sample_sizes)[x] : c.sample_bytes;
          }
          em.remote_fetches += run.count;
          ++m.remote_runs;
        }
        for (const PeerFetch& pf : plan.nodes[n].peers_at(t)) {
          if (pf.from_node >= M || pf.from_node == n ||
              !((resident[pf.from_node].count(pf.sample) &&
                 !fetched[pf.from_node].count(pf.sample)) ||
                evicted_now[pf.from_node].count(pf.sample)))
            fail(fmt::format("step {} node {}: peer node {} did not hold sample {} before the step", t, n,
                             pf.from_node, pf.sample));
          bring(pf.sample);
          ++em.peer_fetches;
          if (evicted_now[pf.from_node].count(pf.sample)) ++handed[pf.from_node];
        }
        if (held[n] > cap)
          fail(fmt::format("step {} node {}: holds {} {}, over its capacity of {}", t, n,
                           held[n], c.sized() ? "bytes" : "samples", cap));
        rep.peak_occupancy = std::max<std::uint64_t>(rep.peak_occupancy, held[n]);
      }
      for (std::uint64_t n = 0; n < M; ++n)
        rep.peak_handovers = std::max(rep.peak_handovers, handed[n]);
      // Accesses.
      for (std::uint64_t w = 0; w < W; ++w) {
        const std::uint64_t n = w / R;
        for (std::uint32_t a : plan.rank_batch(t, w)) {
          const std::uint32_t x = a & kSampleMask;
          if (!resident[n].count(x))
            fail(fmt::format("step {} rank {}: sample {} is not in node {}'s buffer", t, w, x, n));
          auto f = fetched[n].find(x);
          const bool hit = f == fetched[n].end() || f->second++ > 0;
          if (hit != ((a & kHitBit) != 0))
            fail(fmt::format("step {} rank {}: sample {} is flagged {} but was {}", t, w, x,
                             (a & kHitBit) ? "hit" : "miss", hit ? "a hit" : "fetched for it"));
          ++em.accesses;
          if (hit) ++em.hits;
        }
      }
      for (std::uint64_t n = 0; n < M; ++n)
        for (const auto& [x, uses] : fetched[n])
          if (uses == 0)
            fail(fmt::format("step {} node {}: fetches sample {} that no rank of it uses", t, n,
                             x));
    }
  }
  for (const auto& e : m.per_epoch) {
    m.accesses += e.accesses;
    m.hits += e.hits;
    m.remote_fetches += e.remote_fetches;
    m.peer_fetches += e.peer_fetches;
  }
  m.remote_bytes = fetched_bytes;
  if (!(m == plan.metrics))
    fail(fmt::format("recounted metrics differ from the plan's: remote {} vs {} ({} vs {} "
                     "bytes), hits {} vs {}, peer {} vs {}, accesses {} vs {}, runs {} vs {}, "
                     "lower bound {} vs {} ({} vs {} bytes)",
                     m.remote_fetches, plan.metrics.remote_fetches, m.remote_bytes,
                     plan.metrics.remote_bytes, m.hits, plan.metrics.hits, m.peer_fetches,
                     plan.metrics.peer_fetches, m.accesses, plan.metrics.accesses, m.remote_runs,
                     plan.metrics.remote_runs, m.lower_bound_fetches,
                     plan.metrics.lower_bound_fetches, m.lower_bound_bytes,
                     plan.metrics.lower_bound_bytes));
  if (c.tiered()) rep.tiers = replay_tiers(plan);
  else if (!plan.tiers.empty())
    fail("the plan has moves between tiers but no local tier");
  return rep;
}

TierMetrics replay_tiers(const Plan& plan) {
  const PlanConfig& c = plan.config;
  const std::uint64_t T = plan.total_steps(), R = c.ranks_per_node, steps = plan.layout.steps;
  const std::uint64_t mem_cap = c.buffer_samples(), disk_cap = c.local_samples();
  auto fail = [](const std::string& what) { throw PlanInvalid(what); };
  if (plan.tiers.size() != c.nodes) fail("tiers: wrong number of node records");
  TierMetrics tm;
  tm.local_reads_per_epoch.assign(c.epochs, 0);
  for (std::uint64_t n = 0; n < c.nodes; ++n) {
    const NodeTiers& nt = plan.tiers[n];
    for (const auto* o : {&nt.discard_offsets, &nt.write_offsets, &nt.drop_offsets,
                          &nt.read_offsets})
      if (o->size() != T + 1 || o->front() != 0 || !std::is_sorted(o->begin(), o->end()))
        fail(fmt::format("tiers: node {}: offsets of the wrong size or order", n));
    if (nt.discard_offsets.back() != nt.discards.size() ||
        nt.write_offsets.back() != nt.writes.size() || nt.drop_offsets.back() != nt.drops.size() ||
        nt.read_offsets.back() != nt.reads.size())
      fail(fmt::format("tiers: node {}: offsets do not end at their lists' ends", n));
    // Every resident sample is in memory, on the local disk (or both), or dropped (in neither:
    // never read again while resident).
    std::unordered_set<std::uint32_t> mem, disk, dropped;
    for (std::uint64_t t = 0; t < T; ++t) {
      for (std::uint32_t x : plan.nodes[n].evicts_at(t)) {
        const bool held = mem.erase(x) + disk.erase(x) + dropped.erase(x) > 0;
        if (!held)
          fail(fmt::format("tiers: step {} node {}: evicts sample {} held by no tier", t, n, x));
      }
      for (std::uint64_t k = 0; k < R; ++k)
        for (std::uint32_t a : plan.rank_batch(t, n * R + k))
          tm.memory_hits += mem.contains(a & kSampleMask);
      auto bad = [&](const char* what, std::uint32_t x) {
        fail(fmt::format("tiers: step {} node {}: {} sample {}", t, n, what, x));
      };
      for (std::uint32_t x : nt.reads_at(t)) {
        if (!disk.contains(x) || !mem.insert(x).second)
          bad("reads from the local disk (not there, or already in memory)", x);
      }
      for (std::uint32_t x : nt.discards_at(t)) {
        if (!disk.erase(x)) bad("discards from the local disk", x);
        if (!mem.contains(x)) dropped.insert(x);
      }
      for (std::uint32_t x : nt.writes_at(t)) {
        if (!mem.contains(x) || !disk.insert(x).second)
          bad("writes to the local disk (not in memory, or already there)", x);
      }
      for (std::uint32_t x : nt.drops_at(t)) {
        if (!mem.erase(x)) bad("drops from memory (not there)", x);
        if (!disk.contains(x)) dropped.insert(x);
      }
      tm.local_reads_per_epoch[t / steps] += nt.reads_at(t).size();
      for (const FetchRun& f : plan.nodes[n].fetches_at(t))
        for (std::uint32_t x = f.first; x < f.first + f.count; ++x) mem.insert(x);
      for (const PeerFetch& p : plan.nodes[n].peers_at(t)) mem.insert(p.sample);
      for (std::uint64_t k = 0; k < R; ++k)
        for (std::uint32_t a : plan.rank_batch(t, n * R + k))
          if (!mem.contains(a & kSampleMask))
            fail(fmt::format("tiers: step {} rank {}: sample {} is not in node {}'s memory", t,
                             n * R + k, a & kSampleMask, n));
      if (mem.size() > mem_cap || disk.size() > disk_cap)
        fail(fmt::format("tiers: step {} node {}: memory holds {} samples (of {}), the local "
                         "disk {} (of {})",
                         t, n, mem.size(), mem_cap, disk.size(), disk_cap));
    }
    tm.local_reads += nt.reads.size();
    tm.local_writes += nt.writes.size();
    tm.drops += nt.drops.size();
    tm.discards += nt.discards.size();
  }
  tm.local_reads_bound = local_reads_bound(plan);
  if (tm.local_reads < tm.local_reads_bound)
    fail(fmt::format("tiers: {} local reads, below their bound of {}", tm.local_reads,
                     tm.local_reads_bound));
  if (!(tm == plan.tier_metrics))
    fail(fmt::format("tiers: recounted local reads {} vs {}, writes {} vs {}, drops {} vs {}, "
                     "discards {} vs {}, memory hits {} vs {}, bound {} vs {}",
                     tm.local_reads, plan.tier_metrics.local_reads, tm.local_writes,
                     plan.tier_metrics.local_writes, tm.drops, plan.tier_metrics.drops,
                     tm.discards, plan.tier_metrics.discards, tm.memory_hits,
                     plan.tier_metrics.memory_hits, tm.local_reads_bound,
                     plan.tier_metrics.local_reads_bound));
  return tm;
}

}  // namespace solar

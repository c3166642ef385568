// SPDX-License-Identifier: Apache-2.0
#include "solar/core/tiers.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace solar {
namespace {

constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();

// One node's reads: per step, each sample it reads (once, with how many accesses), whether it
// was fetched for that step, and the step it is read next.
struct NodeReads {
  struct Item {
    std::uint32_t sample = 0;
    std::uint32_t uses = 0;
    bool fetched = false;
    std::uint64_t next = kNever;      // the next step the node reads it
    std::uint64_t next_hit = kNever;  // that step, if the node still holds it then (no fetch)
  };
  std::vector<std::uint64_t> offsets;  // total_steps + 1, into items
  std::vector<Item> items;
};

NodeReads node_reads(const NodeSchedule& schedule, std::uint64_t T, std::uint32_t R,
                     const NodeBatch& batch) {
  NodeReads r;
  r.offsets.reserve(T + 1);
  r.offsets.push_back(0);
  std::unordered_set<std::uint32_t> fetched;
  std::unordered_map<std::uint32_t, std::size_t> at;  // this step: sample -> its item
  for (std::uint64_t t = 0; t < T; ++t) {
    fetched.clear();
    for (const FetchRun& f : schedule.fetches_at(t))
      for (std::uint32_t x = f.first; x < f.first + f.count; ++x) fetched.insert(x);
    for (const PeerFetch& p : schedule.peers_at(t)) fetched.insert(p.sample);
    at.clear();
    for (std::uint32_t k = 0; k < R; ++k)
      for (std::uint32_t a : batch(t, k)) {
        const std::uint32_t x = a & kSampleMask;
        const auto [it, fresh] = at.emplace(x, r.items.size());
        if (fresh) r.items.push_back({x, 0, fetched.contains(x)});
        ++r.items[it->second].uses;
      }
    r.offsets.push_back(r.items.size());
  }
  // Backwards: each item's next read, and whether it is one without a fetch.
  std::unordered_map<std::uint32_t, std::pair<std::uint64_t, bool>> next;  // step, fetched
  for (std::uint64_t t = T; t-- > 0;)
    for (std::uint64_t i = r.offsets[t]; i < r.offsets[t + 1]; ++i) {
      auto& item = r.items[i];
      if (const auto it = next.find(item.sample); it != next.end()) {
        item.next = it->second.first;
        item.next_hit = it->second.second ? kNever : it->second.first;
      }
      next[item.sample] = {t, item.fetched};
    }
  return r;
}

NodeReads node_reads(const Plan& plan, std::uint64_t n) {
  const std::uint32_t R = plan.config.ranks_per_node;
  return node_reads(plan.nodes[n], plan.total_steps(), R,
                    [&](std::uint64_t t, std::uint32_t k) { return plan.rank_batch(t, n * R + k); });
}

// Samples ordered by a key (the step they are read next): memory as Belady keeps it, the
// farthest first out, and the local disk's copies of samples in memory, the nearest first out.
class KeyedSet {
 public:
  bool contains(std::uint32_t x) const { return key_.contains(x); }
  std::size_t size() const { return key_.size(); }
  void put(std::uint32_t x, std::uint64_t key) {
    key_[x] = key;
    order_.emplace(key, x);
  }
  void erase(std::uint32_t x) {
    const auto it = key_.find(x);
    if (it == key_.end()) return;
    order_.erase({it->second, x});
    key_.erase(it);
  }
  // Takes out the sample of the largest (smallest) key among those not pinned.
  std::pair<std::uint32_t, std::uint64_t> take_farthest() { return take(std::prev(order_.end())); }
  std::pair<std::uint32_t, std::uint64_t> take_nearest() { return take(order_.begin()); }
  // A sample the step reads: out of the order (it cannot leave) until it gets its next key.
  void pin(std::uint32_t x) { order_.erase({key_.at(x), x}); }
  bool has_unpinned() const { return !order_.empty(); }

 private:
  using Order = std::set<std::pair<std::uint64_t, std::uint32_t>>;
  std::pair<std::uint32_t, std::uint64_t> take(Order::iterator it) {
    const auto [key, x] = *it;
    order_.erase(it);
    key_.erase(x);
    return {x, key};
  }
  std::unordered_map<std::uint32_t, std::uint64_t> key_;
  Order order_;
};

// One node's part of local_reads_bound: the misses of Belady's MIN over its reads with a memory
// of `cap` samples (per step: the step's samples in memory; out goes the one read farthest
// ahead), less the samples fetched for it.
std::uint64_t node_bound(const NodeReads& reads, std::uint64_t cap) {
  KeyedSet mem;
  std::uint64_t misses = 0, fetched = 0;
  for (std::uint64_t t = 0; t + 1 < reads.offsets.size(); ++t) {
    const std::uint64_t b = reads.offsets[t], e = reads.offsets[t + 1];
    std::uint64_t need = 0;
    for (std::uint64_t i = b; i < e; ++i) {
      const auto& item = reads.items[i];
      fetched += item.fetched;
      if (mem.contains(item.sample)) {
        mem.pin(item.sample);
      } else {
        ++misses;
        ++need;
      }
    }
    while (mem.size() + need > cap && mem.has_unpinned()) mem.take_farthest();
    for (std::uint64_t i = b; i < e; ++i) {
      mem.erase(reads.items[i].sample);
      mem.put(reads.items[i].sample, reads.items[i].next);
    }
  }
  return misses > fetched ? misses - fetched : 0;
}

// One node's moves (tiers.h), its counts added to `tm` (the bound aside).
NodeTiers place_node(const NodeSchedule& schedule, const NodeReads& reads, std::uint64_t node,
                     std::uint64_t steps_per_epoch, std::uint64_t mem_cap, std::uint64_t disk_cap,
                     TierMetrics& tm) {
  const std::uint64_t T = reads.offsets.size() - 1, steps = steps_per_epoch, n = node;
  NodeTiers nt;
  for (auto* o : {&nt.read_offsets, &nt.discard_offsets, &nt.write_offsets, &nt.drop_offsets}) {
    o->reserve(T + 1);
    o->push_back(0);
  }
  KeyedSet mem;
  std::unordered_set<std::uint32_t> disk;
  // Samples in memory whose copy on the disk is still there (read back, or written and read
  // since): leaving memory costs them no write. Keyed as in memory: when the disk needs
  // room, the copy of the one needed soonest (the last to leave memory) goes first.
  KeyedSet copies;
  auto discard = [&](std::uint32_t x) {
    copies.erase(x);
    disk.erase(x);
    nt.discards.push_back(x);
  };
  for (std::uint64_t t = 0; t < T; ++t) {
    // The resident set's evictions, from whichever tier holds the sample (a dropped one is in
    // neither: nothing to do).
    for (std::uint32_t x : schedule.evicts_at(t)) {
      mem.erase(x);
      disk.erase(x);
      copies.erase(x);
    }
    const std::uint64_t b = reads.offsets[t], e = reads.offsets[t + 1];
    std::uint64_t need = 0;
    for (std::uint64_t i = b; i < e; ++i) {
      const auto& item = reads.items[i];
      if (mem.contains(item.sample)) {
        tm.memory_hits += item.uses;
        mem.pin(item.sample);
        continue;
      }
      ++need;
      if (item.fetched) continue;
      // Read back first (the step's moves begin with the reads): from here its copy on the
      // disk is one of a sample in memory, which the disk may discard for room.
      if (!disk.contains(item.sample))
        throw std::logic_error(fmt::format("place_in_tiers: step {} node {}: sample {} is "
                                           "neither fetched nor held",
                                           t, n, item.sample));
      nt.reads.push_back(item.sample);
      ++tm.local_reads_per_epoch[t / steps];
      copies.put(item.sample, item.next_hit);
    }
    // Room: the farthest-needed samples leave memory. One read again while held keeps its
    // copy on the disk or is written there (the disk making room by discarding the copy of a
    // sample still in memory); one never read again while held is dropped, its copy too.
    while (mem.size() + need > mem_cap) {
      if (!mem.has_unpinned())
        throw std::logic_error(fmt::format("place_in_tiers: step {} node {} reads more samples "
                                           "than memory holds",
                                           t, n));
      const auto [y, key] = mem.take_farthest();
      const bool copied = copies.contains(y);
      if (key == kNever) {
        if (copied) discard(y);
      } else if (copied) {
        copies.erase(y);
      } else {
        if (disk.size() >= disk_cap) {
          if (!copies.has_unpinned())
            throw std::logic_error(fmt::format("place_in_tiers: step {} node {}: the local "
                                               "tier is full of samples not in memory",
                                               t, n));
          discard(copies.take_nearest().first);
        }
        nt.writes.push_back(y);
        disk.insert(y);
      }
      nt.drops.push_back(y);
    }
    for (std::uint64_t i = b; i < e; ++i) {
      const auto& item = reads.items[i];
      mem.erase(item.sample);  // pinned ones: out of the map too, then back with their key
      mem.put(item.sample, item.next_hit);
      copies.erase(item.sample);
      if (disk.contains(item.sample)) copies.put(item.sample, item.next_hit);
    }
    if (disk.size() > disk_cap)
      throw std::logic_error(fmt::format("place_in_tiers: step {} node {}: the local tier "
                                         "holds {} samples, over its {}",
                                         t, n, disk.size(), disk_cap));
    nt.discard_offsets.push_back(nt.discards.size());
    nt.write_offsets.push_back(nt.writes.size());
    nt.drop_offsets.push_back(nt.drops.size());
    nt.read_offsets.push_back(nt.reads.size());
  }
  tm.local_reads += nt.reads.size();
  tm.local_writes += nt.writes.size();
  tm.drops += nt.drops.size();
  tm.discards += nt.discards.size();
  return nt;
}

}  // namespace

void place_in_tiers(Plan& plan) {
  const PlanConfig& c = plan.config;
  if (!c.tiered()) throw std::logic_error("place_in_tiers: the plan has no local tier");
  TierMetrics& tm = plan.tier_metrics;
  tm = TierMetrics{};
  tm.local_reads_per_epoch.assign(c.epochs, 0);
  plan.tiers.assign(c.nodes, NodeTiers{});
  for (std::uint64_t n = 0; n < c.nodes; ++n) {
    const NodeReads reads = node_reads(plan, n);
    plan.tiers[n] = place_node(plan.nodes[n], reads, n, plan.layout.steps, c.buffer_samples(),
                               c.local_samples(), tm);
    tm.local_reads_bound += node_bound(reads, c.buffer_samples());
  }
}

NodeTiers place_node_in_tiers(const NodeSchedule& schedule, std::uint64_t total_steps,
                              std::uint32_t ranks_per_node, const NodeBatch& batch,
                              std::uint64_t steps_per_epoch, std::uint64_t memory_samples,
                              std::uint64_t local_samples, std::uint32_t node,
                              TierMetrics* counts) {
  TierMetrics tm;
  tm.local_reads_per_epoch.assign((total_steps + steps_per_epoch - 1) / steps_per_epoch, 0);
  const NodeReads reads = node_reads(schedule, total_steps, ranks_per_node, batch);
  NodeTiers nt =
      place_node(schedule, reads, node, steps_per_epoch, memory_samples, local_samples, tm);
  if (counts) {
    tm.local_reads_bound = node_bound(reads, memory_samples);
    *counts = std::move(tm);
  }
  return nt;
}

std::uint64_t local_reads_bound(const Plan& plan) {
  std::uint64_t bound = 0;
  for (std::uint64_t n = 0; n < plan.config.nodes; ++n)
    bound += node_bound(node_reads(plan, n), plan.config.buffer_samples());
  return bound;
}

}  // namespace solar

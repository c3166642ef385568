// SPDX-License-Identifier: Apache-2.0
// Pieces every policy uses to produce a Plan: the stream of epoch sequences (with each access's
// next use, for clairvoyant eviction) and the recorder that turns per-step decisions into the
// Plan's arrays and metrics.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <thread>
#include <vector>

#include "node_buffer.h"
#include "solar/core/plan.h"
#include "solar/core/planner.h"

namespace solar::detail {

inline constexpr std::uint64_t kNever = ~std::uint64_t{0};

// The eviction key of a copy whose next use is at access time `next`: kEvictLast - time, so the
// farthest use goes first, and kEvictFirst (0) for never again. Access times are below epochs ×
// padded accesses per epoch ≤ kMaxAccesses (PlanConfig::validate), so a key never reaches
// kEvictFirst nor wraps.
static_assert(kMaxAccesses < kEvictLast, "access times must fit an eviction key");
inline EvictKey key_for_next_use(std::uint64_t next) {
  return next == kNever ? kEvictFirst : static_cast<EvictKey>(kEvictLast - next);
}

// Epochs in their own order (0, 1, ..., epochs - 1): the policies that do not reorder them.
inline std::vector<std::uint32_t> identity_order(std::uint32_t epochs) {
  std::vector<std::uint32_t> v(epochs);
  std::iota(v.begin(), v.end(), 0U);
  return v;
}

// Walks the epochs in plan order. Access i of epoch position p has the global time
// p·used + i; next_use() gives the time of the same sample's next access (kNever if none).
class EpochStream {
 public:
  EpochStream(const PlanConfig& c, const EpochLayout& layout,
              std::span<const std::uint32_t> order, bool want_next_use);

  void load(std::uint32_t position);
  std::span<const std::uint32_t> batch(std::uint32_t step) const {
    return {cur_.data() + layout_.step_begin(step), layout_.step_size(step)};
  }
  // Next use of the k-th access of `step` in the current epoch.
  std::uint64_t next_use(std::uint32_t step, std::uint64_t k) const;

  // The first use after `step` of the sample at its k-th access, counting only the accesses
  // whose epoch position q (index into the epoch's sequence, the same in every epoch) passes
  // on(q), e.g. those of one node; searched in this epoch and the next, kNever if none there.
  // Follows the chains of the sample's occurrences: O(its occurrences in the two epochs), at
  // most two per epoch when DistributedSampler pads. Needs want_next_use.
  template <class On>
  std::uint64_t next_use_after_step(std::uint32_t step, std::uint64_t k, On&& on) const {
    const std::uint64_t i = layout_.step_begin(step) + k;
    const std::uint64_t end = layout_.step_begin(step) + layout_.step_size(step);
    for (std::uint32_t q = next_in_cur_[i]; q != kNone; q = next_in_cur_[q])
      if (q >= end && on(q)) return std::uint64_t{position_} * layout_.used() + q;
    return use_in_next(cur_[i], on);
  }
  // The first use of sample x at epoch position q0 or later of this epoch, or else in the next
  // one, at a position that passes on(q); kNever if none there. Needs want_next_use.
  template <class On>
  std::uint64_t use_from(std::uint32_t x, std::uint64_t q0, On&& on) const {
    for (std::uint32_t q = first_in_cur_[x]; q != kNone; q = next_in_cur_[q])
      if (q >= q0 && on(q)) return std::uint64_t{position_} * layout_.used() + q;
    return use_in_next(x, on);
  }
  // The first use of sample x from the start of this epoch, in it or the next, at an epoch
  // position that passes on(q); kNever if none there. Needs want_next_use.
  template <class On>
  std::uint64_t first_use(std::uint32_t x, On&& on) const {
    return use_from(x, 0, on);
  }

 private:
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  template <class On>
  std::uint64_t use_in_next(std::uint32_t x, On&& on) const {
    for (std::uint32_t q = first_in_next_[x]; q != kNone; q = next_in_next_[q])
      if (on(q)) return std::uint64_t{position_ + 1} * layout_.used() + q;
    return kNever;
  }

  const PlanConfig& c_;
  const EpochLayout& layout_;
  std::span<const std::uint32_t> order_;
  bool want_next_use_;
  std::uint32_t position_ = 0;
  std::vector<std::uint32_t> cur_, next_;
  std::vector<std::uint32_t> next_in_cur_;    // per access of cur_: index of next occurrence
  std::vector<std::uint32_t> next_in_next_;   // per access of next_: index of next occurrence
  std::vector<std::uint32_t> first_in_cur_;   // per sample: first index in cur_
  std::vector<std::uint32_t> first_in_next_;  // per sample: first index in next_ (all none if
                                              // there is no next epoch)
  bool have_next_ = false;
};

// One step's decisions, filled by a policy and handed to PlanRecorder::commit.
struct StepRecord {
  std::vector<std::vector<std::uint32_t>> ranks;    // W lists: sample | kHitBit
  std::vector<std::vector<std::uint32_t>> misses;   // per node: fetched from remote storage
  std::vector<std::vector<PeerFetch>> peers;        // per node: taken from a peer's buffer
  std::vector<std::vector<std::uint32_t>> evicted;  // per node: evicted before the fetches
  // Per node, filled by PlanRecorder::commit: the misses, sorted, as coalesced storage reads.
  std::vector<std::vector<FetchRun>> runs;

  void reset(std::uint64_t world, std::uint32_t nodes);
};

// Where a streamed plan's steps go (plan_stream.h): handed each step once committed, in order,
// with every node's misses and peer reads sorted and the misses coalesced into rec.runs.
class StepSink {
 public:
  virtual ~StepSink() = default;
  virtual void step(std::uint64_t t, const StepRecord& rec) = 0;
};

// Turns a policy's steps into a Plan (its arrays and metrics), or, given a sink, hands each
// step to it and keeps the metrics only: memory then stays O(one step), whatever the epochs.
// Appends one step's schedule to ns (its offsets begin with {0}): what PlanRecorder records for
// each node, and what collect_node_plan gathers from a stream.
inline void append_schedule_step(NodeSchedule& ns, std::span<const FetchRun> runs,
                                 std::span<const PeerFetch> peers,
                                 std::span<const std::uint32_t> evicts) {
  ns.fetch_runs.insert(ns.fetch_runs.end(), runs.begin(), runs.end());
  ns.fetch_offsets.push_back(ns.fetch_runs.size());
  ns.peer_fetches.insert(ns.peer_fetches.end(), peers.begin(), peers.end());
  ns.peer_offsets.push_back(ns.peer_fetches.size());
  ns.evicts.insert(ns.evicts.end(), evicts.begin(), evicts.end());
  ns.evict_offsets.push_back(ns.evicts.size());
}

class PlanRecorder {
 public:
  PlanRecorder(const PlanConfig& c, std::vector<std::uint32_t> epoch_order,
               const ProgressFn& progress, StepSink* sink = nullptr);
  // Appends step t (steps must come in order) and accounts its metrics in epoch `position`.
  void commit(std::uint32_t position, StepRecord& rec);
  // The plan; with a sink its per-step arrays are empty (the metrics are whole).
  Plan finish();

 private:
  Plan plan_;
  const ProgressFn& progress_;
  StepSink* sink_;
  std::uint64_t steps_done_ = 0;
};

// Runs one node's share of a step through its buffer. `node_samples` are the node's accesses
// in rank order; `key_of(k)` gives the eviction key the k-th of them gets after its use. Hits
// are pinned first so a miss never evicts a sample the same step needs. Returns per-access hit
// flags in `hit`, and fills the misses and evictions of rec for `node`.
template <class KeyFn>
void run_node_step(NodeBuffer& buf, std::uint32_t node, std::uint64_t stamp,
                   std::span<const std::uint32_t> node_samples, KeyFn&& key_of,
                   std::vector<char>& hit, StepRecord& rec) {
  hit.assign(node_samples.size(), 0);
  for (std::size_t k = 0; k < node_samples.size(); ++k) {
    const std::uint32_t x = node_samples[k];
    if (buf.contains(x)) {
      buf.touch(x, stamp, key_of(k));
      hit[k] = 1;
    }
  }
  for (std::size_t k = 0; k < node_samples.size(); ++k) {
    if (hit[k]) continue;
    const std::uint32_t x = node_samples[k];
    if (buf.contains(x)) {  // a duplicate earlier in this step brought it in
      buf.touch(x, stamp, key_of(k));
      hit[k] = 1;
      continue;
    }
    buf.insert(x, stamp, key_of(k), rec.evicted[node]);
    rec.misses[node].push_back(x);
  }
  buf.end_step();
}

// Splits `count` samples over `ranks` ranks as evenly as possible; returns the size of rank r.
inline std::uint64_t even_share(std::uint64_t count, std::uint64_t ranks, std::uint64_t r) {
  return count / ranks + (r < count % ranks ? 1 : 0);
}

// Per-rank lists of batch positions: the assignment of one step.
using Assignment = std::vector<std::vector<std::uint32_t>>;

// DistributedSampler's assignment: batch position k belongs to rank k mod W.
inline void standard_assignment(std::uint64_t size, std::uint64_t world, Assignment& a) {
  a.resize(world);
  for (auto& r : a) r.clear();
  for (std::uint64_t k = 0; k < size; ++k) a[k % world].push_back(static_cast<std::uint32_t>(k));
}

// Runs every node's share of the step through its buffer and writes the ranks' access records.
// key(node, k, x) is the eviction key of batch position k (sample x) after its use.
template <class KeyFn>
void simulate_nodes(const PlanConfig& c, std::span<const std::uint32_t> batch,
                    const Assignment& a, std::vector<NodeBuffer>& bufs, std::uint64_t stamp,
                    KeyFn& key, StepRecord& rec, std::uint32_t first, std::uint32_t last) {
  std::vector<std::uint32_t> samples, pos;
  std::vector<char> hit;
  const std::uint32_t R = c.ranks_per_node;
  for (std::uint32_t m = first; m < last; ++m) {
    samples.clear();
    pos.clear();
    for (std::uint32_t r = 0; r < R; ++r)
      for (std::uint32_t k : a[std::uint64_t{m} * R + r]) {
        samples.push_back(batch[k]);
        pos.push_back(k);
      }
    run_node_step(
        bufs[m], m, stamp, samples,
        [&](std::size_t i) { return key(m, pos[i], samples[i]); },
        hit, rec);
    std::size_t i = 0;
    for (std::uint32_t r = 0; r < R; ++r)
      for (std::uint32_t k : a[std::uint64_t{m} * R + r]) {
        rec.ranks[std::uint64_t{m} * R + r].push_back(batch[k] | (hit[i] ? kHitBit : 0U));
        ++i;
      }
  }
}

// Runs every node's share of the step through its buffer and writes the ranks' access records.
// key(node, k, x) is the eviction key of batch position k (sample x) after its use. Nodes are
// independent within a step, so with `parallel` (for keys that are pure functions of their
// arguments) large steps are split over threads; the result is the same either way.
template <class KeyFn>
void simulate_step(const PlanConfig& c, std::span<const std::uint32_t> batch, const Assignment& a,
                   std::vector<NodeBuffer>& bufs, std::uint64_t stamp, KeyFn&& key,
                   StepRecord& rec, bool parallel = false) {
  const unsigned threads =
      std::min<unsigned>({std::max(1U, std::thread::hardware_concurrency()), 8U, c.nodes});
  if (!parallel || threads < 2 || batch.size() < 4096) {
    simulate_nodes(c, batch, a, bufs, stamp, key, rec, 0, c.nodes);
    return;
  }
  std::vector<std::thread> pool;
  const std::uint32_t per = (c.nodes + threads - 1) / threads;
  for (unsigned i = 1; i < threads; ++i) {
    const std::uint32_t first = std::min(c.nodes, i * per), last = std::min(c.nodes, first + per);
    pool.emplace_back([&, first, last] {
      simulate_nodes(c, batch, a, bufs, stamp, key, rec, first, last);
    });
  }
  simulate_nodes(c, batch, a, bufs, stamp, key, rec, 0, std::min(c.nodes, per));
  for (auto& th : pool) th.join();
}

// Every node's buffer of `capacity` samples; with sized samples (PlanConfig::sized) the
// buffers hold c.buffer_bytes bytes instead (the policies that plan sized samples pass
// effective_capacity(c), which is that).
inline std::vector<NodeBuffer> make_buffers(const PlanConfig& c, std::uint64_t capacity) {
  if (!c.sized()) return std::vector<NodeBuffer>(c.nodes, NodeBuffer(capacity));
  // About as many samples as the buffer holds of the mean size (the maps grow if more).
  const std::uint64_t expected = std::min<std::uint64_t>(c.samples, 2 * c.buffer_samples() + 64);
  return std::vector<NodeBuffer>(c.nodes, NodeBuffer(capacity, c.sample_sizes.get(), expected));
}

}  // namespace solar::detail

// SPDX-License-Identifier: Apache-2.0
// The policies but solar (policy_solar.cpp). All share the epoch stream, the node buffer simulation and the recorder
// (plan_builder.h); they differ in epoch order, in who gets which sample of a step, and in the
// eviction key a buffered sample carries.
#include "policies.h"

#include <algorithm>
#include <queue>

#include "plan_builder.h"
#include <unordered_map>

namespace solar::detail {
namespace {

// The common loop of the policies whose assignment ignores the buffers (none, lru, nopfs; and
// sampler, which runs the same loop with next uses: plan_sampler).
template <class KeyFn>
Plan run_static(const PlanConfig& c, const ProgressFn& progress, StepSink* sink,
                std::uint64_t capacity, KeyFn&& key, bool keep_between_steps = true) {
  const EpochLayout layout = EpochLayout::of(c);
  const auto order = identity_order(c.epochs);
  EpochStream stream(c, layout, order, false);
  PlanRecorder recorder(c, order, progress, sink);
  auto bufs = make_buffers(c, capacity);
  StepRecord rec;
  Assignment a;
  std::uint64_t t = 0;
  for (std::uint32_t p = 0; p < c.epochs; ++p) {
    stream.load(p);
    for (std::uint32_t j = 0; j < layout.steps; ++j, ++t) {
      const auto batch = stream.batch(j);
      rec.reset(layout.world, c.nodes);
      standard_assignment(batch.size(), layout.world, a);
      if (!keep_between_steps)
        for (std::uint32_t m = 0; m < c.nodes; ++m) bufs[m].clear(rec.evicted[m]);
      simulate_step(c, batch, a, bufs, t + 1, key, rec);
      recorder.commit(p, rec);
    }
  }
  return recorder.finish();
}

}  // namespace

Plan plan_none(const PlanConfig& c, const ProgressFn& progress, StepSink* sink) {
  // No buffer: a sample lives only while its step runs.
  return run_static(
      c, progress, sink, effective_capacity(c),
      [](std::uint32_t, std::uint32_t, std::uint32_t) { return 0; }, false);
}

Plan plan_lru(const PlanConfig& c, const ProgressFn& progress, StepSink* sink) {
  std::uint32_t clock = 0;
  return run_static(c, progress, sink, effective_capacity(c),
                    [&](std::uint32_t, std::uint32_t, std::uint32_t) { return ++clock; });
}

Plan plan_nopfs(const PlanConfig& c, const ProgressFn& progress, StepSink* sink) {
  // NoPFS: with the access stream known, each node keeps the samples it will read most often
  // (static assignment) for the whole run; the rest of its buffer stages the current step.
  const EpochLayout layout = EpochLayout::of(c);
  const std::uint64_t step_cap = std::uint64_t{c.ranks_per_node} * c.batch;
  const std::uint64_t static_cap = c.buffer_samples() - std::min(c.buffer_samples(), step_cap);
  const std::uint64_t used = layout.used(), R = c.ranks_per_node, W = layout.world;

  // node_of[e·N + x]: the node that reads x in epoch e (the first time, if padded twice).
  // Extra reads of padded duplicates are few and counted on the side.
  const std::uint16_t none16 = 0xffff;
  std::vector<std::uint16_t> node_of(std::uint64_t{c.epochs} * c.samples, none16);
  std::vector<std::pair<std::uint32_t, std::uint32_t>> extra;  // (x, node)
  {
    std::vector<std::uint32_t> seq;
    for (std::uint32_t e = 0; e < c.epochs; ++e) {
      epoch_sequence(c, layout, e, seq);
      for (std::uint64_t q = 0; q < used; ++q) {
        // Within step j, batch position k = q - j·W·b goes to rank k mod W, i.e. q mod W.
        const auto node = static_cast<std::uint32_t>((q % W) / R);
        auto& slot = node_of[std::uint64_t{e} * c.samples + seq[q]];
        if (slot == none16) slot = static_cast<std::uint16_t>(node);
        else extra.emplace_back(seq[q], node);
      }
    }
  }
  std::sort(extra.begin(), extra.end());
  // Top static_cap samples per node by access count (ties: lower sample id).
  using Item = std::pair<std::uint32_t, std::int64_t>;  // (count, -x): min-heap keeps the best
  std::vector<std::priority_queue<Item, std::vector<Item>, std::greater<>>> top(c.nodes);
  std::vector<std::uint32_t> counts(c.nodes, 0);
  std::vector<std::uint32_t> touched;
  std::size_t ex = 0;
  for (std::uint32_t x = 0; x < c.samples; ++x) {
    touched.clear();
    auto bump = [&](std::uint32_t node) {
      if (counts[node]++ == 0) touched.push_back(node);
    };
    for (std::uint32_t e = 0; e < c.epochs; ++e) {
      const std::uint16_t node = node_of[std::uint64_t{e} * c.samples + x];
      if (node != none16) bump(node);
    }
    while (ex < extra.size() && extra[ex].first == x) bump(extra[ex++].second);
    for (std::uint32_t node : touched) {
      const Item item{counts[node], -std::int64_t{x}};
      auto& h = top[node];
      if (h.size() < static_cap) h.push(item);
      else if (static_cap > 0 && h.top() < item) {
        h.pop();
        h.push(item);
      }
      counts[node] = 0;
    }
  }
  node_of.clear();
  node_of.shrink_to_fit();
  std::vector<std::unordered_map<std::uint32_t, char>> pinned(c.nodes);
  for (std::uint32_t m = 0; m < c.nodes; ++m) {
    pinned[m].reserve(top[m].size() * 2);
    while (!top[m].empty()) {
      pinned[m].emplace(static_cast<std::uint32_t>(-top[m].top().second), 1);
      top[m].pop();
    }
  }
  std::uint32_t clock = 0;
  return run_static(c, progress, sink, c.buffer_samples(),
                    [&](std::uint32_t m, std::uint32_t, std::uint32_t x) {
                      return pinned[m].count(x) ? kEvictLast : ++clock;
                    });
}

Plan plan_sampler(const PlanConfig& c, const ProgressFn& progress, StepSink* sink) {
  // What an unmodified script gets (job-transparent mode): DistributedSampler's assignment and
  // epoch order, exactly as lru; each node evicts clairvoyantly, the resident sample whose next
  // use BY THAT NODE is farthest. Under DistributedSampler, epoch position q belongs to rank
  // q mod W (every step begins at a multiple of W·b), i.e. to node (q mod W) / R. A sample's
  // next use by the node is its next occurrence on that node after the current step, in this
  // epoch or else the next one. The horizon is those two epochs: a sample the node does not
  // read again within it counts as never used again (key kEvictFirst) and goes first. Such
  // keys go stale as the horizon moves, so at each epoch's start every resident still marked
  // never gets its first use by the node in the new horizon (O(resident samples) per epoch).
  // With one node (and without drop_last) every sample is read every epoch, nothing but the
  // last epoch's leftovers is ever "never", and this is exactly Belady's MIN on the node's
  // stream of steps.
  //
  // Keys: key_for_next_use (plan_builder.h).
  if (c.peer_fetch) return plan_sampler_peers(c, progress, sink);
  const EpochLayout layout = EpochLayout::of(c);
  const auto order = identity_order(c.epochs);
  EpochStream stream(c, layout, order, true);
  PlanRecorder recorder(c, order, progress, sink);
  auto bufs = make_buffers(c, effective_capacity(c));
  const std::uint64_t W = layout.world, R = c.ranks_per_node;
  StepRecord rec;
  Assignment a;
  std::vector<std::uint32_t> stale;
  std::uint64_t t = 0;
  for (std::uint32_t p = 0; p < c.epochs; ++p) {
    stream.load(p);
    if (p > 0) {
      for (std::uint32_t m = 0; m < c.nodes; ++m) {
        auto on_m = [&](std::uint64_t q) { return (q % W) / R == m; };
        stale.clear();
        bufs[m].for_each_resident([&](std::uint32_t x, EvictKey key) {
          if (key == kEvictFirst) stale.push_back(x);
        });
        for (std::uint32_t x : stale) bufs[m].rekey(x, key_for_next_use(stream.first_use(x, on_m)));
      }
    }
    for (std::uint32_t j = 0; j < layout.steps; ++j, ++t) {
      const auto batch = stream.batch(j);
      rec.reset(W, c.nodes);
      standard_assignment(batch.size(), W, a);
      // A pure function of (node, position): safe for the parallel node simulation.
      simulate_step(c, batch, a, bufs, t + 1,
                    [&](std::uint32_t m, std::uint32_t k, std::uint32_t) {
                      return key_for_next_use(stream.next_use_after_step(
                          j, k, [&](std::uint64_t q) { return (q % W) / R == m; }));
                    },
                    rec, /*parallel=*/true);
      recorder.commit(p, rec);
    }
  }
  return recorder.finish();
}

Plan plan_solar_paper(const PlanConfig& c, const ProgressFn& progress, StepSink* sink) {
  // The published SOLAR artifact (ANL-FAIR-SBI/SOLAR, utils/solar_shuffle.py and the dataset
  // class), re-implemented:
  //  - epoch order: PSO over the cost "first K of epoch j not in last K of epoch i", K = the
  //    aggregate buffer M·C;
  //  - the first ⌊K/G⌋ steps of each epoch are rescheduled: a sample that was among the last K
  //    of the previous epoch goes to the rank that read it then (its owner) while that rank
  //    has room, all ranks keeping exactly b samples; the rest fill the free slots in order;
  //  - each node's buffer is FIFO (hits do not refresh), filled by every miss.
  const EpochLayout layout = EpochLayout::of(c);
  const auto order = paper_epoch_order(c);
  EpochStream stream(c, layout, order, false);
  PlanRecorder recorder(c, order, progress, sink);
  auto bufs = make_buffers(c, c.buffer_samples());
  const std::uint64_t W = layout.world, used = layout.used();
  const std::uint64_t K = std::min<std::uint64_t>(std::uint64_t{c.nodes} * c.buffer_samples(), used);
  const std::uint64_t G = W * c.batch;
  const std::uint64_t rescheduled = K / G;
  const std::uint32_t none = ~std::uint32_t{0};
  // owner[x]: rank that read x among the previous epoch's last K accesses (none otherwise).
  std::vector<std::uint32_t> owner(c.samples, none), reader(c.samples, none);
  StepRecord rec;
  Assignment a(W);
  std::vector<std::uint32_t> fill(W);
  std::vector<std::uint32_t> misses;
  std::uint32_t clock = 0;
  std::uint64_t t = 0;
  for (std::uint32_t p = 0; p < c.epochs; ++p) {
    stream.load(p);
    std::uint64_t q0 = 0;  // position of the step's first access in the epoch
    for (std::uint32_t j = 0; j < layout.steps; ++j, ++t) {
      const auto batch = stream.batch(j);
      const std::uint32_t bj = layout.rank_batch(j);
      rec.reset(W, c.nodes);
      if (p > 0 && j < rescheduled) {
        for (auto& r : a) r.clear();
        misses.clear();
        for (std::uint32_t k = 0; k < batch.size(); ++k) {
          const std::uint32_t o = owner[batch[k]];
          if (o != none && a[o].size() < bj) a[o].push_back(k);
          else misses.push_back(k);
        }
        std::size_t next = 0;
        for (std::uint64_t w = 0; w < W; ++w)
          while (a[w].size() < bj) a[w].push_back(misses[next++]);
      } else {
        standard_assignment(batch.size(), W, a);
      }
      simulate_step(c, batch, a, bufs, t + 1,
                    [&](std::uint32_t m, std::uint32_t, std::uint32_t x) {
                      return bufs[m].contains(x) ? bufs[m].key(x) : ++clock;
                    },
                    rec);
      for (std::uint64_t w = 0; w < W; ++w)
        for (std::uint32_t k : a[w]) reader[batch[k]] = static_cast<std::uint32_t>(w);
      recorder.commit(p, rec);
      q0 += batch.size();
    }
    // Owners for the next epoch: who read each of this epoch's last K accesses.
    std::fill(owner.begin(), owner.end(), none);
    const auto& seq_end = q0;
    for (std::uint32_t j = 0; j < layout.steps; ++j) {
      const auto batch = stream.batch(j);
      const std::uint64_t begin = layout.step_begin(j);
      for (std::uint64_t k = 0; k < batch.size(); ++k)
        if (begin + k + K >= seq_end) owner[batch[k]] = reader[batch[k]];
    }
  }
  return recorder.finish();
}

}  // namespace solar::detail

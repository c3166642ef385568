// SPDX-License-Identifier: Apache-2.0
// The sampler policy with peer reads (--policy sampler --peer-fetch): DistributedSampler's
// assignment, fixed by the unmodified script, with the nodes' buffers acting as one.
//
// Every resident sample has one *primary* copy, on the node that used it last; any other copy
// (the one a peer read it from, or a second reader's in the same step) is *spare*: it still
// serves its node's own accesses as hits, but it is the first to be evicted. A node that needs a
// sample it does not hold reads it from the primary's node when there is one (a peer read) and
// from storage otherwise; afterwards its own copy is the primary. A primary carries the key of
// the sample's next use by ANY node, so each node evicts clairvoyantly for the whole job: the
// buffers behave as one buffer of M·C samples under Belady's MIN, which on one node reaches
// the lower bound N + (E-1)·max(0, N - M·C).
//
// What a peer read may rely on (checked by replay_plan; the agents rely on it): the source held
// the sample before the step (the primary is decided at the end of a step, never for a sample
// the source fetches in the same step) and keeps it through the step (it is pinned there like
// the source's own accesses). A node never pins more than its capacity: a peer read that would
// push its source past that is a storage fetch instead.
#include <algorithm>

#include "plan_builder.h"
#include "policies.h"

namespace solar::detail {

Plan plan_sampler_peers(const PlanConfig& c, const ProgressFn& progress, StepSink* sink) {
  const EpochLayout layout = EpochLayout::of(c);
  const auto order = identity_order(c.epochs);
  EpochStream stream(c, layout, order, true);
  PlanRecorder recorder(c, order, progress, sink);
  const std::uint64_t capacity = c.buffer_samples();
  auto bufs = make_buffers(c, capacity);
  const std::uint64_t R = c.ranks_per_node;
  const std::uint32_t M = c.nodes;
  constexpr std::uint32_t kNone = ~std::uint32_t{0};
  auto anyone = [](std::uint64_t) { return true; };

  std::vector<std::uint32_t> primary(c.samples, kNone);  // the node holding the primary copy
  // tag[x] = stamp·2^16 + node + 1: the last (step, node) that handled x; first[x]: the first
  // node that used x in the step (valid while first_stamp[x] is the step's stamp).
  std::vector<std::uint64_t> tag(c.samples, 0), first_stamp(c.samples, 0);
  std::vector<std::uint32_t> first(c.samples, kNone);
  std::vector<std::uint64_t> pinned(M);     // distinct samples pinned on each node this step
  std::vector<std::uint64_t> primaries(M);  // primary copies each node holds
  std::vector<std::uint64_t> handovers(M);  // samples each node hands over this step
  std::vector<std::uint64_t> handed(c.samples, 0);  // the step (stamp) x was handed over
  const std::uint64_t handover_limit = R * (std::uint64_t{c.batch} + c.imbalance);
  struct Need {
    std::uint32_t node, x, from;  // from: the source node, kNone for storage
  };
  std::vector<Need> needs;
  struct Use {
    std::uint32_t x, node;
    std::uint64_t next;  // the sample's next use by any node after this step
    bool operator<(const Use& o) const { return x != o.x ? x < o.x : node < o.node; }
  };
  std::vector<Use> uses;
  std::vector<std::uint32_t> orphans;  // primaries evicted this step
  StepRecord rec;
  Assignment a;
  std::uint64_t t = 0;

  for (std::uint32_t p = 0; p < c.epochs; ++p) {
    stream.load(p);
    if (p > 0) {
      // "Never again" keys go stale as the horizon moves (see plan_sampler): primaries marked
      // so get their first use in the new horizon. Spare copies stay first to go.
      for (std::uint32_t m = 0; m < M; ++m) {
        orphans.clear();
        bufs[m].for_each_resident([&](std::uint32_t x, EvictKey key) {
          if (key == kEvictFirst && primary[x] == m) orphans.push_back(x);
        });
        for (std::uint32_t x : orphans) bufs[m].rekey(x, key_for_next_use(stream.first_use(x, anyone)));
      }
    }
    for (std::uint32_t j = 0; j < layout.steps; ++j, ++t) {
      const std::uint64_t stamp = t + 1;
      const auto batch = stream.batch(j);
      rec.reset(layout.world, M);
      standard_assignment(batch.size(), layout.world, a);
      needs.clear();
      uses.clear();
      std::fill(pinned.begin(), pinned.end(), 0);

      // 1. Each node's own accesses: what it holds is a hit (pinned); the rest is needed once
      //    (a sample used twice by a node, DistributedSampler's padding, is fetched once).
      for (std::uint32_t m = 0; m < M; ++m) {
        const std::uint64_t mine = (stamp << 16) + m + 1;
        for (std::uint64_t r = 0; r < R; ++r)
          for (std::uint32_t k : a[m * R + r]) {
            const std::uint32_t x = batch[k];
            if (tag[x] == mine) {
              rec.ranks[m * R + r].push_back(x | kHitBit);  // its second use in the step
              continue;
            }
            tag[x] = mine;
            if (first_stamp[x] != stamp) {
              first_stamp[x] = stamp;
              first[x] = m;
            }
            uses.push_back({x, m, stream.next_use_after_step(j, k, anyone)});
            ++pinned[m];
            if (bufs[m].contains(x)) {
              bufs[m].touch(x, stamp, kPinnedKey);
              rec.ranks[m * R + r].push_back(x | kHitBit);
            } else {
              needs.push_back({m, x, kNone});
              rec.ranks[m * R + r].push_back(x);
            }
          }
      }
      // 2. Sources: the primary's node. It hands the sample over (evicts it this step; the
      //    reader's copy becomes the primary) unless it uses the sample itself or has handed
      //    over a step's worth already; then it keeps its copy pinned for the step, if it may
      //    pin one more sample, and the copy is spare after the step. (Handing over always,
      //    rather than keeping the primary on the node with fewer primaries, came out closest
      //    to the bound: s1 1.006× against 1.103×.)
      std::fill(handovers.begin(), handovers.end(), 0);
      for (Need& n : needs) {
        const std::uint32_t src = primary[n.x];
        if (src == kNone || src == n.node) continue;
        if (handed[n.x] == stamp) {  // a second reader of a sample handed over this step
          n.from = src;
          continue;
        }
        if (!bufs[src].pinned(n.x, stamp)) {  // not used there, nor read by another node yet
          if (handovers[src] < handover_limit) {
            ++handovers[src];
            handed[n.x] = stamp;
            bufs[src].erase(n.x);
            rec.evicted[src].push_back(n.x);
            --primaries[src];
            n.from = src;
            continue;
          }
          if (pinned[src] >= capacity) continue;
          ++pinned[src];
          bufs[src].pin(n.x, stamp);
        }
        n.from = src;
      }
      // 3. Bring them in. Spare copies are evicted first, then the farthest next use.
      orphans.clear();
      for (const Need& n : needs) {
        auto& evicted = rec.evicted[n.node];
        const std::size_t from = evicted.size();
        bufs[n.node].insert(n.x, stamp, kPinnedKey, evicted);
        for (std::size_t i = from; i < evicted.size(); ++i)
          if (primary[evicted[i]] == n.node) {
            primary[evicted[i]] = kNone;
            --primaries[n.node];
            orphans.push_back(evicted[i]);
          }
        if (n.from == kNone) rec.misses[n.node].push_back(n.x);
        else rec.peers[n.node].push_back({n.x, n.from});
      }
      // 4. Keys. Of the nodes that hold the sample after the step (its users, and the old
      //    primary's node), the one with the fewest primaries keeps the primary (the old one on
      //    a tie, else the first user): primaries would otherwise drift by a random walk, the
      //    fullest node evicting primaries while others hold spare copies. The primary gets the
      //    next use by any node; every other copy used or read this step is spare.
      std::sort(uses.begin(), uses.end());
      for (std::size_t i = 0; i < uses.size();) {
        const std::uint32_t x = uses[i].x;
        std::size_t e = i;
        const std::uint32_t old = primary[x];
        const bool old_holds = old != kNone && bufs[old].contains(x);
        std::uint32_t keep = old_holds ? old : first[x];
        if (old_holds) --primaries[old];
        for (; e < uses.size() && uses[e].x == x; ++e) {
          const std::uint32_t m = uses[e].node;
          if (primaries[m] < primaries[keep] ||
              (primaries[m] == primaries[keep] && !old_holds && m == first[x]))
            keep = m;
        }
        for (std::size_t u = i; u < e; ++u)
          bufs[uses[u].node].rekey(x, uses[u].node == keep ? key_for_next_use(uses[i].next) : kEvictFirst);
        if (old_holds && old != keep) bufs[old].rekey(x, kEvictFirst);
        primary[x] = keep;
        ++primaries[keep];
        i = e;
      }
      // 5. A primary evicted while a spare copy remains elsewhere: that copy becomes the primary
      //    (rare: spare copies go first). Its next use is searched from the next step on.
      const std::uint64_t q_next = layout.step_begin(j) + layout.step_size(j);
      for (std::uint32_t y : orphans) {
        if (primary[y] != kNone) continue;  // used this step: it has one again
        for (std::uint32_t m = 0; m < M; ++m)
          if (bufs[m].contains(y)) {
            primary[y] = m;
            ++primaries[m];
            bufs[m].rekey(y, key_for_next_use(stream.use_from(y, q_next, anyone)));
            break;
          }
      }
      for (std::uint32_t m = 0; m < M; ++m) bufs[m].end_step();
      recorder.commit(p, rec);
    }
  }
  return recorder.finish();
}

}  // namespace solar::detail

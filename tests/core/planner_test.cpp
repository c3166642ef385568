// SPDX-License-Identifier: Apache-2.0
// Property tests: many random small configurations, every policy, checked by the independent
// replay (replay.h) — permutations, membership, batch bounds, capacity, and recounted metrics.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <unordered_map>

#include <fmt/format.h>

#include "solar/core/planner.h"
#include "solar/core/replay.h"
#include "solar/core/rng.h"
#include "random_config.h"

namespace solar {
namespace {

// A random sampler-policy config on 2 .. 1 + extra_nodes nodes, with at least one step per
// rank and at least 3 epochs, without peer reads.
PlanConfig random_sampler_config(Xoshiro256& g, std::uint64_t extra_nodes) {
  PlanConfig c = random_config(g);
  c.nodes = 2 + static_cast<std::uint32_t>(g.bounded(extra_nodes));
  c.samples += std::uint64_t{c.nodes} * c.ranks_per_node * c.batch;
  c.epochs = 2 + c.epochs;
  c.policy = Policy::sampler;
  c.peer_fetch = false;
  return c;
}

std::string describe(const PlanConfig& c) {
  return fmt::format("N={} E={} M={} R={} b={} C={} drop_last={}", c.samples, c.epochs, c.nodes,
                     c.ranks_per_node, c.batch, c.buffer_samples(), c.drop_last);
}

TEST(Planner, EveryPolicyKeepsEveryInvariantOnRandomConfigs) {
  Xoshiro256 g(2024);
  int checked = 0;
  for (int i = 0; i < 120; ++i) {
    PlanConfig c = random_config(g);
    for (Policy p : all_policies()) {
      c.policy = p;
      SCOPED_TRACE(describe_random_config(c));
      const Plan plan = make_plan(c);
      const ReplayReport rep = replay_plan(plan);  // throws on any violation
      EXPECT_LE(rep.peak_occupancy, effective_capacity(c));
      EXPECT_GE(plan.metrics.remote_fetches + plan.metrics.peer_fetches,
                c.peer_fetch ? 0 : plan.metrics.lower_bound_fetches);
      EXPECT_EQ(plan.metrics.hits + plan.metrics.remote_fetches + plan.metrics.peer_fetches,
                plan.metrics.accesses);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 720);  // 120 configs × 6 policies
}

TEST(Planner, ReplayCatchesABrokenPlan) {
  PlanConfig c;
  c.samples = 100;
  c.sample_bytes = 1;
  c.epochs = 2;
  c.nodes = 2;
  c.ranks_per_node = 2;
  c.batch = 4;
  c.buffer_bytes = 30;
  Plan plan = make_plan(c);
  ASSERT_NO_THROW(replay_plan(plan));
  Plan swapped = plan;  // a sample no longer matching the epoch's order
  swapped.accesses[0] = (swapped.accesses[0] & kHitBit) | ((swapped.accesses[0] + 1) % 100);
  EXPECT_THROW(replay_plan(swapped), PlanInvalid);
  Plan flag = plan;  // a hit flag flipped
  flag.accesses[5] ^= kHitBit;
  EXPECT_THROW(replay_plan(flag), PlanInvalid);
  Plan count = plan;  // metrics that do not match the records
  count.metrics.hits += 1;
  EXPECT_THROW(replay_plan(count), PlanInvalid);
  Plan noevict = plan;  // drop every eviction: the buffer overflows
  for (auto& n : noevict.nodes) {
    n.evicts.clear();
    std::fill(n.evict_offsets.begin(), n.evict_offsets.end(), 0);
  }
  EXPECT_THROW(replay_plan(noevict), PlanInvalid);
}

TEST(Planner, SolarMeetsTheLowerBoundOnTheSeedScenario) {
  PlanConfig c;
  c.samples = 800;
  c.sample_bytes = 16 << 20;
  c.epochs = 3;
  c.nodes = 1;
  c.ranks_per_node = 4;
  c.batch = 16;
  c.imbalance = 1;
  c.buffer_bytes = 512ULL * c.sample_bytes;
  const Plan plan = make_plan(c);
  EXPECT_EQ(plan.metrics.lower_bound_fetches, 1376U);
  EXPECT_EQ(plan.metrics.remote_fetches, plan.metrics.lower_bound_fetches);
}

TEST(Planner, SolarNeverFetchesMoreThanTheBaselines) {
  Xoshiro256 g(77);
  for (int i = 0; i < 30; ++i) {
    PlanConfig c = random_config(g);
    c.peer_fetch = false;
    c.epochs = 2 + c.epochs;
    c.policy = Policy::solar;
    const auto ours = make_plan(c).metrics.remote_fetches;
    for (Policy p : {Policy::none, Policy::lru}) {
      c.policy = p;
      EXPECT_LE(ours, make_plan(c).metrics.remote_fetches) << to_string(p);
    }
  }
}

TEST(Policies, EveryPolicyHasAName) {
  ASSERT_EQ(all_policies().size(), 6U);
  std::set<std::string_view> names;
  for (Policy p : all_policies()) {
    names.insert(to_string(p));
    EXPECT_EQ(parse_policy(to_string(p)), p) << to_string(p);
  }
  EXPECT_EQ(names.size(), all_policies().size());
  EXPECT_EQ(parse_policy("sampler"), Policy::sampler);
  EXPECT_EQ(static_cast<int>(Policy::sampler), 5);  // its byte in plan files
  EXPECT_FALSE(parse_policy("belady").has_value());
}

// The sample at every time of the plan (epoch position p, sequence position q: p·used + q),
// read back from the ranks' records assuming DistributedSampler's assignment: position q of
// step j is rank (q mod W)'s ((q - j·W·b) / W)-th sample.
std::vector<std::uint32_t> accesses_in_time_order(const Plan& plan) {
  const EpochLayout& L = plan.layout;
  const std::uint64_t W = L.world, used = L.used();
  std::vector<std::uint32_t> seq(std::uint64_t{plan.config.epochs} * used, ~0U);
  for (std::uint64_t t = 0; t < plan.total_steps(); ++t) {
    const std::uint64_t p = t / L.steps;
    const auto j = static_cast<std::uint32_t>(t % L.steps);
    for (std::uint64_t w = 0; w < W; ++w) {
      const auto rb = plan.rank_batch(t, w);
      for (std::size_t i = 0; i < rb.size(); ++i)
        seq[p * used + L.step_begin(j) + i * W + w] = rb[i] & kSampleMask;
    }
  }
  return seq;
}

TEST(Sampler, AssignsExactlyAsDistributedSampler) {
  Xoshiro256 g(5150);
  for (int i = 0; i < 40; ++i) {
    PlanConfig c = random_config(g);
    c.policy = Policy::sampler;
    const Plan plan = make_plan(c);
    SCOPED_TRACE(::testing::Message() << "N=" << c.samples << " M=" << c.nodes << " R="
                                      << c.ranks_per_node << " b=" << c.batch);
    const EpochLayout& L = plan.layout;
    std::vector<std::uint32_t> seq;
    const auto got = accesses_in_time_order(plan);
    for (std::uint32_t p = 0; p < c.epochs; ++p) {
      EXPECT_EQ(plan.epoch_order[p], p);
      epoch_sequence(c, L, p, seq);
      for (std::uint32_t j = 0; j < L.steps; ++j)  // every rank has exactly b_j samples
        for (std::uint64_t w = 0; w < L.world; ++w)
          ASSERT_EQ(plan.rank_batch(std::uint64_t{p} * L.steps + j, w).size(), L.rank_batch(j));
      for (std::uint64_t q = 0; q < L.used(); ++q)
        ASSERT_EQ(got[std::uint64_t{p} * L.used() + q], seq[q]) << "epoch " << p << " at " << q;
    }
    // The same reads as lru's: only the buffers differ.
    c.policy = Policy::lru;
    const Plan lru = make_plan(c);
    ASSERT_EQ(lru.accesses.size(), plan.accesses.size());
    for (std::size_t k = 0; k < plan.accesses.size(); ++k)
      ASSERT_EQ(plan.accesses[k] & kSampleMask, lru.accesses[k] & kSampleMask);
    EXPECT_EQ(lru.rank_offsets, plan.rank_offsets);
  }
}

// Belady's MIN for a one-node plan, written from the plan's records alone: before step t the
// node must hold every sample step t reads; each miss evicts the resident sample, not read in
// step t, whose next access after step t is farthest (never again: first). Fetches per epoch.
std::vector<std::uint64_t> belady_fetches(const Plan& plan) {
  const EpochLayout& L = plan.layout;
  const std::uint64_t used = L.used(), C = plan.config.buffer_samples();
  const auto seq = accesses_in_time_order(plan);
  const std::uint64_t never = ~std::uint64_t{0};
  std::vector<std::uint64_t> next(seq.size(), never);
  std::unordered_map<std::uint32_t, std::uint64_t> seen;
  for (std::uint64_t i = seq.size(); i-- > 0;) {
    auto it = seen.find(seq[i]);
    if (it != seen.end()) next[i] = it->second;
    seen[seq[i]] = i;
  }
  std::set<std::pair<std::uint64_t, std::uint32_t>, std::greater<>> resident;  // farthest first
  std::unordered_map<std::uint32_t, std::uint64_t> due;                     // sample -> its key
  std::vector<std::uint64_t> fetches(plan.config.epochs, 0);
  for (std::uint64_t t = 0; t < plan.total_steps(); ++t) {
    const std::uint64_t p = t / L.steps;
    const auto j = static_cast<std::uint32_t>(t % L.steps);
    const std::uint64_t begin = p * used + L.step_begin(j), end = begin + L.step_size(j);
    std::map<std::uint32_t, std::uint64_t> need;  // sample -> next access after this step
    for (std::uint64_t i = begin; i < end; ++i) {
      std::uint64_t n = next[i];
      while (n != never && n < end) n = next[n];
      need[seq[i]] = n;
    }
    for (const auto& [x, n] : need) {
      auto it = due.find(x);
      if (it == due.end()) {
        ++fetches[p];
      } else {
        resident.erase({it->second, x});
        due.erase(it);
      }
    }
    while (resident.size() + need.size() > C) {
      due.erase(resident.begin()->second);
      resident.erase(resident.begin());
    }
    for (const auto& [x, n] : need) {
      resident.emplace(n, x);
      due[x] = n;
    }
  }
  return fetches;
}

TEST(Sampler, IsBeladyOnOneNodeAndMeetsTheLowerBound) {
  int at_bound = 0, checked = 0;
  for (std::uint64_t n : {200, 357, 600, 1000})
    for (std::uint32_t e : {3, 4, 5})
      for (std::uint32_t r : {1, 2, 3})
        for (std::uint32_t b : {1, 4, 16})
          for (int pct : {10, 25, 50, 75, 90}) {
            PlanConfig c;
            c.samples = n;
            c.sample_bytes = 8;
            c.epochs = e;
            c.ranks_per_node = r;
            c.batch = b;
            c.seed = n * 31 + e * 7 + r * 3 + b + static_cast<std::uint64_t>(pct);
            c.order = (n + b) % 2 ? OrderMode::torch : OrderMode::solar;
            c.buffer_bytes = n * static_cast<std::uint64_t>(pct) / 100 * c.sample_bytes;
            c.policy = Policy::sampler;
            const std::uint64_t step = std::uint64_t{r} * b, cap = c.buffer_samples();
            if (cap < step) continue;
            SCOPED_TRACE(::testing::Message() << "N=" << n << " E=" << e << " R=" << r
                                              << " b=" << b << " C=" << cap);
            const Plan plan = make_plan(c);
            ASSERT_NO_THROW(replay_plan(plan));
            const auto min = belady_fetches(plan);
            for (std::uint32_t p = 0; p < e; ++p)
              EXPECT_EQ(plan.metrics.per_epoch[p].remote_fetches, min[p]) << "epoch " << p;
            // With room for the steps around an epoch boundary besides the carried samples,
            // MIN carries a full buffer into every epoch: N + (E-1)·max(0, N - C).
            if (cap >= 3 * step) {
              EXPECT_EQ(plan.metrics.lower_bound_fetches, n + (e - 1) * (n - std::min(n, cap)));
              EXPECT_EQ(plan.metrics.remote_fetches, plan.metrics.lower_bound_fetches);
              ++at_bound;
            }
            ++checked;
          }
  EXPECT_GT(at_bound, 400);
  EXPECT_GT(checked, at_bound);  // some buffers of only one or two steps: MIN, not the bound
}

TEST(Sampler, NeverFetchesMoreThanLruOrNone) {
  Xoshiro256 g(1312);
  int fewer = 0;
  for (int i = 0; i < 60; ++i) {
    PlanConfig c = random_sampler_config(g, 4);
    SCOPED_TRACE(describe(c));
    const Plan plan = make_plan(c);
    ASSERT_NO_THROW(replay_plan(plan));
    const auto ours = plan.metrics.remote_fetches;
    EXPECT_GE(ours, plan.metrics.lower_bound_fetches);
    EXPECT_EQ(plan.metrics.peer_fetches, 0U);
    c.policy = Policy::lru;
    const auto lru = make_plan(c).metrics.remote_fetches;
    EXPECT_LE(ours, lru);
    fewer += ours < lru;
    c.policy = Policy::none;
    EXPECT_LE(ours, make_plan(c).metrics.remote_fetches);
  }
  EXPECT_GT(fewer, 30);
}

TEST(Sampler, NeverFetchesMoreThanLruOnLargerRuns) {
  // s1's shape (4 nodes × 4 ranks, batch 16), smaller: buffers from one step to most of N.
  for (std::uint64_t buf : {64, 300, 1024, 2500}) {
    PlanConfig c;
    c.samples = 4096 + 77;
    c.sample_bytes = 1;
    c.epochs = 6;
    c.nodes = 4;
    c.ranks_per_node = 4;
    c.batch = 16;
    c.seed = buf;
    c.order = OrderMode::torch;
    c.buffer_bytes = buf;
    c.policy = Policy::sampler;
    const Plan plan = make_plan(c);
    ASSERT_NO_THROW(replay_plan(plan));
    c.policy = Policy::lru;
    EXPECT_LE(plan.metrics.remote_fetches, make_plan(c).metrics.remote_fetches) << buf;
  }
}

TEST(Planner, IdenticalInputsGiveIdenticalPlans) {
  PlanConfig c;
  c.samples = 500;
  c.sample_bytes = 4;
  c.epochs = 3;
  c.nodes = 2;
  c.ranks_per_node = 2;
  c.batch = 5;
  c.buffer_bytes = 4 * 100;
  const Plan a = make_plan(c), b = make_plan(c);
  EXPECT_EQ(a.accesses, b.accesses);
  EXPECT_EQ(a.metrics, b.metrics);
}

TEST(PaperOrder, ChoosesACheapPathOverTheOverlapMatrix) {
  PlanConfig c;
  c.samples = 400;
  c.sample_bytes = 1;
  c.epochs = 6;
  c.nodes = 1;
  c.ranks_per_node = 2;
  c.batch = 4;
  c.buffer_bytes = 200;
  const auto ov = epoch_overlap_matrix(c, 200);
  const auto order = paper_epoch_order(c);
  ASSERT_EQ(order.size(), 6U);
  auto overlap_of = [&](const std::vector<std::uint32_t>& o) {
    std::uint64_t s = 0;
    for (std::size_t i = 0; i + 1 < o.size(); ++i) s += ov[o[i] * 6 + o[i + 1]];
    return s;
  };
  // PSO must do at least as well as the identity order (it is one of many it can reach).
  std::vector<std::uint32_t> identity{0, 1, 2, 3, 4, 5};
  EXPECT_GE(overlap_of(order) + 6, overlap_of(identity));
  for (std::uint32_t i = 0; i < 6; ++i) EXPECT_EQ(ov[i * 6 + i], 0U);
}


// --policy sampler --peer-fetch: DistributedSampler's assignment (an unmodified script's), the
// nodes' buffers acting as one through peer reads and handovers (policy_peers.cpp).
PlanConfig ddp_config(std::uint64_t n, std::uint32_t e, std::uint32_t m, std::uint32_t r,
                      std::uint32_t b, std::uint64_t buffer_samples) {
  PlanConfig c;
  c.samples = n;
  c.sample_bytes = 256 << 10;
  c.epochs = e;
  c.nodes = m;
  c.ranks_per_node = r;
  c.batch = b;
  c.order = OrderMode::torch;
  c.buffer_bytes = buffer_samples * c.sample_bytes;
  c.policy = Policy::sampler;
  return c;
}

TEST(SamplerPeers, StorageFetchesWithinFivePercentOfTheBound) {
  // s1 (8192 samples, 10 epochs, 4 nodes × 4 ranks, batch 16, 90% of the dataset in all) and
  // 800 samples, 5 epochs, 4 nodes × 1 rank, 26% per node (issue: peer sharing). Without
  // peers the same assignment needs 3.5× and 3.4× the bound.
  for (const PlanConfig& base : {ddp_config(8192, 10, 4, 4, 16, 1843),
                                 ddp_config(800, 5, 4, 1, 16, 208)}) {
    PlanConfig c = base;
    SCOPED_TRACE(::testing::Message() << "N=" << c.samples << " M=" << c.nodes);
    const Plan alone = make_plan(c);
    c.peer_fetch = true;
    const Plan plan = make_plan(c);
    const ReplayReport rep = replay_plan(plan);  // every peer read's source held the sample
    EXPECT_EQ(rep.metrics, plan.metrics);
    const double lb = double(plan.metrics.lower_bound_fetches);
    EXPECT_LE(double(rep.metrics.remote_fetches), 1.05 * lb);
    EXPECT_GT(double(alone.metrics.remote_fetches), 3.0 * lb);
    EXPECT_GT(rep.metrics.peer_fetches, rep.metrics.accesses / 2);
    EXPECT_LE(rep.peak_handovers, std::uint64_t{c.ranks_per_node} * c.batch);
    EXPECT_LE(rep.peak_occupancy, c.buffer_samples());
  }
}

TEST(SamplerPeers, RandomConfigsReplayAndFetchNoMoreThanWithoutPeers) {
  Xoshiro256 g(4242);
  int fewer = 0;
  for (int i = 0; i < 80; ++i) {
    PlanConfig c = random_sampler_config(g, 5);
    c.imbalance = 0;  // the script's equal batches
    c.order = OrderMode::torch;
    SCOPED_TRACE(describe(c));
    const auto alone = make_plan(c).metrics.remote_fetches;
    c.peer_fetch = true;
    const Plan plan = make_plan(c);
    ReplayReport rep;
    ASSERT_NO_THROW(rep = replay_plan(plan));
    EXPECT_GE(plan.metrics.remote_fetches, plan.metrics.lower_bound_fetches);
    EXPECT_LE(plan.metrics.remote_fetches, alone);
    EXPECT_LE(rep.peak_handovers, std::uint64_t{c.ranks_per_node} * c.batch);
    fewer += plan.metrics.remote_fetches < alone;
  }
  EXPECT_GT(fewer, 60);
}

TEST(SamplerPeers, ReplayRefusesAPeerReadFromANodeThatDidNotHoldTheSample) {
  PlanConfig c = ddp_config(200, 3, 3, 2, 4, 40);
  c.peer_fetch = true;
  const Plan plan = make_plan(c);
  ASSERT_NO_THROW(replay_plan(plan));
  // Point the first peer read of a later step at the third node, which holds nothing of it at
  // that moment... or at the reader itself: both are refused, naming the step and nodes.
  bool changed = false;
  for (std::uint32_t n = 0; n < c.nodes && !changed; ++n) {
    const NodeSchedule& ns = plan.nodes[n];
    for (std::size_t i = 0; i < ns.peer_fetches.size() && !changed; ++i) {
      Plan broken = plan;
      broken.nodes[n].peer_fetches[i].from_node = n;
      EXPECT_THROW(replay_plan(broken), PlanInvalid);
      changed = true;
    }
  }
  ASSERT_TRUE(changed) << "the plan has no peer read";
  // A source that fetches the sample from storage in the very step a peer reads it from there
  // (it did not hold it before the step): a storage fetch of node 0, claimed as read by node 1
  // from node 0 in that step. (Where node 1 happens to hold that sample already, the replay
  // refuses the duplicate instead; some step has a sample node 1 lacks.)
  int refused_for_the_source = 0;
  for (std::uint64_t t = 1; t < plan.total_steps() && !refused_for_the_source; ++t) {
    const auto runs = plan.nodes[0].fetches_at(t);
    if (runs.empty()) continue;
    const std::uint32_t x = runs[0].first;
    Plan broken = plan;
    auto& ns = broken.nodes[1];
    ns.peer_fetches.insert(
        ns.peer_fetches.begin() + static_cast<std::ptrdiff_t>(ns.peer_offsets[t]),
        PeerFetch{x, 0});
    for (std::uint64_t u = t + 1; u < ns.peer_offsets.size(); ++u) ++ns.peer_offsets[u];
    try {
      replay_plan(broken);
      ADD_FAILURE() << "accepted a peer read of sample " << x << " at step " << t;
    } catch (const PlanInvalid& e) {
      const std::string what = e.what();
      if (what.find(fmt::format("peer node 0 did not hold sample {} before the step", x)) !=
          std::string::npos)
        ++refused_for_the_source;
      else
        EXPECT_NE(what.find("already holds"), std::string::npos) << what;
    }
  }
  EXPECT_EQ(refused_for_the_source, 1);
}

}  // namespace
}  // namespace solar

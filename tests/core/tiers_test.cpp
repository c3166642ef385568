// SPDX-License-Identifier: Apache-2.0
// Plans with a local-disk tier below memory (issue 37, item 1): the resident set of both tiers
// meets the two-tier bound on storage fetches, its placement in the tiers meets the bound on
// local reads, and the independent replay (replay_tiers) recounts both and refuses a plan whose
// moves between the tiers do not hold.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "random_config.h"
#include "solar/core/plan_file.h"
#include "solar/core/planner.h"
#include "solar/core/replay.h"
#include "solar/core/scenarios.h"
#include "solar/core/tiers.h"

namespace solar {
namespace {

constexpr std::uint64_t kSample = 1 << 20;

// s1 (8,192 samples, 10 epochs, 4 nodes × 4 ranks, batch 16) with memory and local disk per
// node given in samples.
PlanConfig s1(std::uint64_t mem, std::uint64_t local, std::uint32_t imbalance, Policy p) {
  const Scenario& s = *find_scenario("s1");
  PlanConfig c;
  c.samples = s.samples;
  c.sample_bytes = kSample;
  c.epochs = s.epochs;
  c.nodes = s.nodes;
  c.ranks_per_node = s.ranks_per_node;
  c.batch = s.batch;
  c.imbalance = imbalance;
  c.buffer_bytes = mem * kSample;
  c.local_bytes = local * kSample;
  c.policy = p;
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Tiers, TheTwoTierBoundCountsBothTiers) {
  // N + (E-1)·max(0, N - M·(C_mem + C_disk)) = 8192 + 9·(8192 - 4·1843) = 15,572.
  const PlanConfig c = s1(614, 1229, 1, Policy::solar);
  EXPECT_EQ(lower_bound_fetches(c), 8192U + 9U * (8192U - 4U * 1843U));
  EXPECT_EQ(effective_capacity(c), 1843U);
  PlanConfig one = c;
  one.local_bytes = 0;
  one.buffer_bytes = 1843 * kSample;
  EXPECT_EQ(lower_bound_fetches(one), lower_bound_fetches(c));
}

TEST(Tiers, SolarOnS1MeetsTheTwoTierBoundAndTheLocalReadBound) {
  // s1's 22.5% of N split between memory and local disk in three ways.
  for (const auto& [mem, local] : {std::pair{614, 1229}, std::pair{409, 1434}, std::pair{819, 1024}})
    for (std::uint32_t d : {1U, 2U}) {
      const Plan p = make_plan(s1(mem, local, d, Policy::solar));
      SCOPED_TRACE(testing::Message() << "mem " << mem << " local " << local << " δ " << d);
      EXPECT_LE(p.metrics.ratio_to_lower_bound(), 1.02);
      const ReplayReport r = replay_plan(p);  // recounts fetches and the tiers
      EXPECT_EQ(r.metrics, p.metrics);
      EXPECT_EQ(r.tiers, p.tier_metrics);
      EXPECT_LE(r.peak_occupancy, std::uint64_t(mem + local));
      const TierMetrics& t = p.tier_metrics;
      EXPECT_GT(t.local_reads, 0U);
      EXPECT_GT(t.local_writes, 0U);
      // The disk keeps a copy read back while it has room: far fewer writes than reads.
      EXPECT_LT(t.local_writes * 10, t.local_reads * 6);
      EXPECT_GT(t.discards, 0U);
      EXPECT_GE(t.local_reads, t.local_reads_bound);
      EXPECT_LE(t.local_reads_ratio(), 1.01);
      // Every access is a memory hit, a local read or a fetch (storage; no peers here).
      EXPECT_EQ(t.memory_hits + t.local_reads + p.metrics.remote_fetches, p.metrics.accesses);
      // The local tier serves every epoch after the first.
      for (std::size_t e = 1; e < t.local_reads_per_epoch.size(); ++e)
        EXPECT_GT(t.local_reads_per_epoch[e], 0U) << e;
    }
}

TEST(Tiers, OnOneNodeTheSamplerPlanIsBeladyOnBothTiers) {
  // One node, the script's order: MIN over memory + disk meets the storage bound, and MIN over
  // memory the local-read bound.
  PlanConfig c = s1(0, 0, 0, Policy::sampler);
  c.nodes = 1;
  c.samples = 2048;
  c.epochs = 4;
  c.buffer_bytes = 256 * kSample;
  c.local_bytes = 768 * kSample;
  const Plan p = make_plan(c);
  EXPECT_LE(p.metrics.ratio_to_lower_bound(), 1.01);
  EXPECT_EQ(replay_plan(p).tiers, p.tier_metrics);
  EXPECT_LE(p.tier_metrics.local_reads_ratio(), 1.01);
  EXPECT_GT(p.tier_metrics.local_reads, 0U);
}

TEST(Tiers, EveryPolicyReplaysOnRandomConfigs) {
  Xoshiro256 g(37);
  int planned = 0;
  for (int i = 0; i < 120; ++i) {
    PlanConfig c = random_config(g);
    c.peer_fetch = false;
    c.local_bytes = (1 + g.bounded(c.samples)) * c.sample_bytes + g.bounded(c.sample_bytes);
    for (Policy pol : all_policies()) {
      if (pol == Policy::none) continue;
      c.policy = pol;
      const Plan p = make_plan(c);
      SCOPED_TRACE(testing::Message() << "config " << i << " policy " << to_string(pol));
      const ReplayReport r = replay_plan(p);
      EXPECT_EQ(r.tiers, p.tier_metrics);
      EXPECT_EQ(p.tier_metrics.memory_hits + p.tier_metrics.local_reads +
                    p.metrics.remote_fetches,
                p.metrics.accesses);
      EXPECT_GE(p.metrics.remote_fetches, p.metrics.lower_bound_fetches);
      // A sample is written only when the node reads it back before the plan evicts it.
      EXPECT_LE(p.tier_metrics.local_writes, p.tier_metrics.local_reads);
      ++planned;
    }
  }
  EXPECT_EQ(planned, 120 * 5);
}

TEST(Tiers, TheReplayRefusesMovesThatDoNotHold) {
  PlanConfig c = s1(96, 192, 1, Policy::solar);
  c.samples = 1024;
  c.epochs = 3;
  const Plan good = make_plan(c);
  ASSERT_GT(good.tier_metrics.local_reads, 0U);
  ASSERT_NO_THROW(replay_plan(good));
  std::uint64_t n = 0;  // a node with local reads
  while (good.tiers[n].reads.empty()) ++n;
  {  // a read of a sample the local disk does not hold
    Plan p = good;
    p.tiers[n].reads[0] = (p.tiers[n].reads[0] + 1) % 1024;
    EXPECT_NE(error_of([&] { replay_plan(p); }).find("tiers: step"), std::string::npos);
  }
  {  // a read left out: the sample is not in memory when its rank reads it
    Plan p = good;
    p.tiers[n].reads.erase(p.tiers[n].reads.begin());
    for (auto& o : p.tiers[n].read_offsets)
      if (o > 0) --o;
    EXPECT_NE(error_of([&] { replay_plan(p); }).find("not in node"), std::string::npos);
  }
  {  // a write of a sample whose copy is already on the disk
    Plan p = good;
    std::uint64_t t = 0;  // the first step with a read, after which that sample has a copy
    while (p.tiers[n].reads_at(t).empty()) ++t;
    const std::uint32_t x = p.tiers[n].reads_at(t)[0];
    auto& w = p.tiers[n].writes;
    w.insert(w.begin() + static_cast<std::ptrdiff_t>(p.tiers[n].write_offsets[t]), x);
    for (std::uint64_t k = t + 1; k < p.tiers[n].write_offsets.size(); ++k)
      ++p.tiers[n].write_offsets[k];
    EXPECT_NE(error_of([&] { replay_plan(p); }).find("already there"), std::string::npos)
        << error_of([&] { replay_plan(p); });
  }
  {  // metrics that are not what the moves add up to
    Plan p = good;
    ++p.tier_metrics.local_writes;
    EXPECT_NE(error_of([&] { replay_plan(p); }).find("recounted local reads"), std::string::npos);
  }
  {  // a memory over its capacity: the same moves under a smaller memory
    Plan p = good;
    p.config.buffer_bytes -= kSample;
    p.config.local_bytes += kSample;
    EXPECT_NE(error_of([&] { replay_plan(p); }).find("memory holds 96 samples (of 95)"),
              std::string::npos)
        << error_of([&] { replay_plan(p); });
  }
}

TEST(Tiers, ConfigsThatCannotBeTieredAreRefusedByName) {
  PlanConfig c = s1(614, 1229, 1, Policy::solar);
  c.local_bytes = kSample / 2;
  EXPECT_NE(error_of([&] { c.validate(); }).find("smaller than one sample"), std::string::npos);
  c = s1(614, 1229, 1, Policy::solar);
  c.peer_fetch = true;
  EXPECT_NE(error_of([&] { c.validate(); }).find("--peer-fetch"), std::string::npos);
  c = s1(614, 1229, 1, Policy::none);
  EXPECT_NE(error_of([&] { c.validate(); }).find("policy none"), std::string::npos);
  c = s1(614, 1229, 1, Policy::solar);
  c.sample_sizes = std::make_shared<const std::vector<std::uint64_t>>(c.samples, kSample);
  EXPECT_NE(error_of([&] { c.validate(); }).find("differing sizes"), std::string::npos);
}

// A tiered plan's file carries the local tier (v4), and each node's moves computed from its
// own section (what an agent does: place_node_in_tiers) are the whole plan's, counts and bound
// included.
TEST(Tiers, FileRoundTripAndEachNodeFromItsSection) {
  PlanConfig c = s1(614, 1229, 1, Policy::solar);
  c.epochs = 3;
  const Plan plan = make_plan(c);
  ASSERT_GT(plan.tier_metrics.local_reads, 0u);
  const std::vector<std::uint8_t> bytes = encode_plan(plan);
  const PlanHeader h = decode_header(bytes.data(), bytes.size(), "test");
  EXPECT_EQ(h.config.local_bytes, c.local_bytes);
  EXPECT_EQ(h.config.local_samples(), c.local_samples());
  TierMetrics sum;
  for (std::uint32_t n = 0; n < c.nodes; ++n) {
    const auto& e = h.directory[n];
    const NodePlan np = decode_node(h, n, bytes.data() + e.offset, e.length, "test");
    const std::uint32_t R = c.ranks_per_node;
    TierMetrics m;
    const NodeTiers nt = place_node_in_tiers(
        np.schedule, plan.total_steps(), R,
        [&](std::uint64_t t, std::uint32_t k) {
          const std::uint64_t i = t * R + k;
          return std::span<const std::uint32_t>(np.accesses.data() + np.rank_offsets[i],
                                                np.rank_offsets[i + 1] - np.rank_offsets[i]);
        },
        plan.layout.steps, c.buffer_samples(), c.local_samples(), n, &m);
    const NodeTiers& want = plan.tiers[n];
    EXPECT_EQ(nt.reads, want.reads) << "node " << n;
    EXPECT_EQ(nt.writes, want.writes) << "node " << n;
    EXPECT_EQ(nt.drops, want.drops) << "node " << n;
    EXPECT_EQ(nt.discards, want.discards) << "node " << n;
    EXPECT_EQ(nt.read_offsets, want.read_offsets) << "node " << n;
    EXPECT_EQ(nt.write_offsets, want.write_offsets) << "node " << n;
    sum.local_reads += m.local_reads;
    sum.local_writes += m.local_writes;
    sum.local_reads_bound += m.local_reads_bound;
    sum.memory_hits += m.memory_hits;
  }
  EXPECT_EQ(sum.local_reads, plan.tier_metrics.local_reads);
  EXPECT_EQ(sum.local_writes, plan.tier_metrics.local_writes);
  EXPECT_EQ(sum.local_reads_bound, plan.tier_metrics.local_reads_bound);
  EXPECT_EQ(sum.memory_hits, plan.tier_metrics.memory_hits);
}

}  // namespace
}  // namespace solar

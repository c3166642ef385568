// Property tests: many random small configurations, every policy, checked by the independent
// replay (replay.h) — permutations, membership, batch bounds, capacity, and recounted metrics.
#include <gtest/gtest.h>

#include "solar/core/planner.h"
#include "solar/core/replay.h"
#include "solar/core/rng.h"

namespace solar {
namespace {

PlanConfig random_config(Xoshiro256& g) {
  PlanConfig c;
  c.nodes = 1 + static_cast<std::uint32_t>(g.bounded(4));
  c.ranks_per_node = 1 + static_cast<std::uint32_t>(g.bounded(3));
  c.batch = 1 + static_cast<std::uint32_t>(g.bounded(6));
  const std::uint64_t world = c.world();
  c.samples = world * c.batch + g.bounded(200);
  c.sample_bytes = 1 + g.bounded(1000);
  c.epochs = 1 + static_cast<std::uint32_t>(g.bounded(5));
  c.imbalance = static_cast<std::uint32_t>(g.bounded(c.batch));
  c.drop_last = g.bounded(2) == 1;
  c.order = g.bounded(2) ? OrderMode::torch : OrderMode::solar;
  c.seed = g.next();
  c.peer_fetch = g.bounded(3) == 0;
  const std::uint64_t min_buf = std::uint64_t{c.ranks_per_node} * (c.batch + c.imbalance);
  const std::uint64_t buf = min_buf + g.bounded(c.samples);
  c.buffer_bytes = buf * c.sample_bytes + g.bounded(c.sample_bytes);
  return c;
}

TEST(Planner, EveryPolicyKeepsEveryInvariantOnRandomConfigs) {
  Xoshiro256 g(2024);
  int checked = 0;
  for (int i = 0; i < 120; ++i) {
    PlanConfig c = random_config(g);
    for (Policy p : all_policies()) {
      c.policy = p;
      SCOPED_TRACE(::testing::Message()
                   << "policy " << to_string(p) << " N=" << c.samples << " E=" << c.epochs
                   << " M=" << c.nodes << " R=" << c.ranks_per_node << " b=" << c.batch
                   << " δ=" << c.imbalance << " C=" << c.buffer_samples()
                   << " drop_last=" << c.drop_last << " order=" << to_string(c.order)
                   << " peer=" << c.peer_fetch);
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
  EXPECT_EQ(checked, 600);
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

}  // namespace
}  // namespace solar

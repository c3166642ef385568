// SPDX-License-Identifier: Apache-2.0
// The streamed plan (plan_stream.h): each node's steps, computed a window at a time, are the
// whole plan's, bit for bit, for every policy, on random configurations and the standard
// scenarios; its metrics are the whole plan's; it refuses what it cannot compute and stops
// when its reader goes away.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "random_config.h"
#include "solar/core/config_error.h"
#include "solar/core/plan_file.h"
#include "solar/core/plan_stream.h"
#include "solar/core/planner.h"
#include "solar/core/rng.h"
#include "solar/core/scenarios.h"

namespace solar {
namespace {

// What the whole plan holds for node m at step t, as a NodeStep.
NodeStep expected_step(const Plan& plan, std::uint32_t m, std::uint64_t t) {
  const std::uint32_t R = plan.config.ranks_per_node;
  NodeStep s;
  s.t = t;
  for (std::uint32_t r = 0; r < R; ++r) {
    const auto b = plan.rank_batch(t, std::uint64_t{m} * R + r);
    s.ranks.emplace_back(b.begin(), b.end());
  }
  const NodeSchedule& ns = plan.nodes[m];
  const auto ev = ns.evicts_at(t);
  s.evicts.assign(ev.begin(), ev.end());
  const auto f = ns.fetches_at(t);
  s.fetches.assign(f.begin(), f.end());
  const auto p = ns.peers_at(t);
  s.peers.assign(p.begin(), p.end());
  for (std::uint32_t other = 0; other < plan.config.nodes; ++other)
    if (other != m)
      for (const PeerFetch& pf : plan.nodes[other].peers_at(t))
        if (pf.from_node == m) s.serves.push_back({pf.sample, other});
  return s;
}

// Every node's stream against the whole plan; returns the steps compared.
std::uint64_t expect_streams_equal_plan(const PlanConfig& c, std::uint64_t window) {
  const Plan plan = make_plan(c);
  std::uint64_t compared = 0;
  for (std::uint32_t m = 0; m < c.nodes; ++m) {
    NodePlanStream stream(c, m, window);
    EXPECT_EQ(stream.total_steps(), plan.total_steps());
    for (std::uint64_t t = 0; t < plan.total_steps(); ++t) {
      const NodeStep got = stream.next();
      const NodeStep want = expected_step(plan, m, t);
      if (got != want) {
        ADD_FAILURE() << "node " << m << " step " << t << " differs from the whole plan's";
        return compared;
      }
      ++compared;
    }
    EXPECT_EQ(stream.taken(), plan.total_steps());
    EXPECT_EQ(stream.metrics(), plan.metrics);
    EXPECT_THROW(stream.next(), std::out_of_range);
  }
  return compared;
}

TEST(PlanStream, EveryNodesStepsAreTheWholePlansOnRandomConfigs) {
  Xoshiro256 g(4040);
  std::uint64_t compared = 0;
  for (int i = 0; i < 40; ++i) {
    PlanConfig c = random_config(g);
    const std::uint64_t window = 1 + g.bounded(5);
    for (Policy p : all_policies()) {
      c.policy = p;
      SCOPED_TRACE(describe_random_config(c) + " window=" + std::to_string(window));
      compared += expect_streams_equal_plan(c, window);
    }
  }
  EXPECT_GT(compared, 1000U);
}

TEST(PlanStream, EveryNodesStepsAreTheWholePlansOnTheStandardScenarios) {
  for (const char* name : {"seed", "s1", "s2", "cosmoflow"}) {
    const Scenario* s = find_scenario(name);
    ASSERT_NE(s, nullptr);
    PlanConfig c;
    c.samples = s->samples;
    c.epochs = s->epochs;
    c.nodes = s->nodes;
    c.ranks_per_node = s->ranks_per_node;
    c.batch = s->batch;
    c.sample_bytes = 1 << 20;
    c.buffer_bytes = s->buffer_samples * c.sample_bytes;
    c.imbalance = 1;
    const bool big = std::string(name) == "cosmoflow";
    for (Policy p : all_policies()) {
      if (big && p != Policy::solar && p != Policy::sampler) continue;
      for (bool peers : {false, true}) {
        if (peers && p != Policy::sampler && p != Policy::solar) continue;
        c.policy = p;
        c.peer_fetch = peers;
        SCOPED_TRACE(::testing::Message() << name << " policy " << to_string(p)
                                          << (peers ? " with peer reads" : ""));
        const std::uint64_t steps = expect_streams_equal_plan(c, 64);
        EXPECT_EQ(steps, std::uint64_t{c.nodes} * EpochLayout::of(c).steps * c.epochs);
      }
    }
  }
}

TEST(PlanStream, SizedSamplesStreamAsTheWholePlan) {
  PlanConfig c;
  c.samples = 600;
  c.epochs = 3;
  c.nodes = 2;
  c.ranks_per_node = 2;
  c.batch = 5;
  auto sizes = std::make_shared<std::vector<std::uint64_t>>(c.samples);
  Xoshiro256 g(9);
  for (auto& x : *sizes) x = 500 + g.bounded(1000);
  c.sample_sizes = sizes;
  c.sample_bytes = c.dataset_bytes() / c.samples;
  c.buffer_bytes = c.dataset_bytes() / 3;
  for (Policy p : {Policy::solar, Policy::sampler, Policy::lru}) {
    c.policy = p;
    SCOPED_TRACE(to_string(p));
    EXPECT_GT(expect_streams_equal_plan(c, 8), 0U);
  }
}

TEST(PlanStream, RefusesWhatItCannotComputeNamingWhy) {
  PlanConfig c;
  c.samples = 100;
  c.epochs = 2;
  c.nodes = 2;
  c.ranks_per_node = 1;
  c.batch = 4;
  c.sample_bytes = 10;
  c.buffer_bytes = 40 * c.sample_bytes;
  try {
    NodePlanStream s(c, 2);
    ADD_FAILURE() << "node 2 of 2 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("0..1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(NodePlanStream(c, 0, 0), ConfigError);
  PlanConfig tiered = c;
  tiered.local_bytes = 20 * c.sample_bytes;
  try {
    NodePlanStream s(tiered, 0);
    ADD_FAILURE() << "a tiered plan accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("local tier"), std::string::npos) << e.what();
  }
  PlanConfig bad = c;
  bad.batch = 0;
  EXPECT_THROW(NodePlanStream(bad, 0), ConfigError);
}

TEST(PlanStream, KeepsAtMostItsWindowAheadAndStopsWhenItsReaderGoesAway) {
  // A plan of 10^7 accesses, read three steps and abandoned: the planner fills its window of
  // two steps and waits there (never more computed than taken + window), and the destructor
  // stops it there.
  PlanConfig c;
  c.samples = 200000;
  c.epochs = 50;
  c.nodes = 4;
  c.ranks_per_node = 2;
  c.batch = 8;
  c.sample_bytes = 1;
  c.buffer_bytes = 20000;
  NodePlanStream s(c, 1, 2);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.next().t, std::uint64_t(i));
  EXPECT_EQ(s.taken(), 3U);
  // Readiness, not a timing: poll until the window is full (the deadline only ends a hang).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (s.ready() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  EXPECT_EQ(s.ready(), 2U);
  EXPECT_EQ(s.next().t, 3U);
  EXPECT_LE(s.ready(), 2U);
}

TEST(PlanStream, AStreamedPlanFileIsItsHeaderAndEachNodeComputesItsSection) {
  // s1's shape over 30 epochs: the whole plan's file holds every access; the streamed one, its
  // header only, from which every node's section comes out as the whole file's.
  PlanConfig c;
  c.samples = 8192;
  c.epochs = 30;
  c.nodes = 4;
  c.ranks_per_node = 4;
  c.batch = 16;
  c.sample_bytes = 1 << 20;
  c.buffer_bytes = 1843 * c.sample_bytes;
  c.imbalance = 1;
  c.peer_fetch = true;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("solar-plan-stream-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  struct Cleanup {
    std::filesystem::path p;
    ~Cleanup() { std::filesystem::remove_all(p); }
  } cleanup{dir};
  for (Policy p : {Policy::solar, Policy::sampler, Policy::solar_paper}) {
    c.policy = p;
    SCOPED_TRACE(to_string(p));
    Plan whole = make_plan(c);
    whole.dataset_identity = "test-identity";
    Plan streamed = make_streamed_plan(c);
    streamed.dataset_identity = "test-identity";
    EXPECT_EQ(streamed.epoch_order, whole.epoch_order);
    write_plan_file(whole, dir / "whole");
    write_plan_file(streamed, dir / "streamed");
    const auto whole_bytes = std::filesystem::file_size(dir / "whole");
    const auto streamed_bytes = std::filesystem::file_size(dir / "streamed");
    EXPECT_GT(whole_bytes, std::uint64_t{c.epochs} * c.samples * 4);  // every access record
    EXPECT_LT(streamed_bytes, 4096U);
    const PlanFile wf = PlanFile::open(dir / "whole"), sf = PlanFile::open(dir / "streamed");
    EXPECT_FALSE(wf.header().streamed);
    ASSERT_TRUE(sf.header().streamed);
    EXPECT_EQ(sf.header().dataset_identity, "test-identity");
    EXPECT_EQ(sf.header().epoch_order, wf.header().epoch_order);
    EXPECT_EQ(sf.header().metrics.lower_bound_fetches, wf.header().metrics.lower_bound_fetches);
    EXPECT_EQ(sf.header().metrics.remote_fetches, 0U);  // not known before it is computed
    EXPECT_THROW((void)sf.node(0), PlanFileError);
    const auto sbytes = encode_plan(streamed);
    EXPECT_THROW((void)decode_plan(sbytes.data(), sbytes.size(), "streamed"), PlanFileError);
    for (std::uint32_t m = 0; m < c.nodes; ++m) {
      const NodePlan a = wf.node(m), b = node_plan(sf, m);
      EXPECT_EQ(b.node, m);
      EXPECT_EQ(a.rank_offsets, b.rank_offsets);
      EXPECT_EQ(a.accesses, b.accesses);
      EXPECT_EQ(a.schedule.fetch_offsets, b.schedule.fetch_offsets);
      EXPECT_EQ(a.schedule.fetch_runs, b.schedule.fetch_runs);
      EXPECT_EQ(a.schedule.peer_offsets, b.schedule.peer_offsets);
      EXPECT_EQ(a.schedule.peer_fetches, b.schedule.peer_fetches);
      EXPECT_EQ(a.schedule.evict_offsets, b.schedule.evict_offsets);
      EXPECT_EQ(a.schedule.evicts, b.schedule.evicts);
    }
    EXPECT_THROW((void)node_plan(sf, c.nodes), PlanFileError);
  }
  // What a streamed file cannot carry is refused by name.
  PlanConfig tiered = c;
  tiered.policy = Policy::solar;
  tiered.peer_fetch = false;
  tiered.local_bytes = 1000 * c.sample_bytes;
  try {
    (void)make_streamed_plan(tiered);
    ADD_FAILURE() << "a tiered plan streamed";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--local-buffer");
  }
  EXPECT_FALSE(can_stream(tiered));
}

}  // namespace
}  // namespace solar

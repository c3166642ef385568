// SPDX-License-Identifier: Apache-2.0
// What an agent measured and its JSON (agent/src/node_stats.h), without processes: reads,
// requests, batches and releases noted at chosen times, then the stats document's fields.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "node_stats.h"
#include "solar/stats_file.h"
#include "solar/transparent.h"

namespace solar::agent {
namespace {

using Clock = NodeStats::Clock;
using std::chrono::milliseconds;

// 2 epochs of 3 steps, 2 ranks, 100-byte samples.
NodeStats::Config config(const std::string& mode = "ring") {
  NodeStats::Config c;
  c.node = 3;
  c.mode = mode;
  c.epochs = 2;
  c.steps_per_epoch = 3;
  c.ranks = 2;
  c.total_steps = 6;
  c.sample_bytes = 100;
  return c;
}

nlohmann::json document(const NodeStats& s, std::uint64_t ready_steps, Clock::time_point now,
                        double max_rank_stall = 0) {
  nlohmann::json j;
  s.put(j, s.snapshot(ready_steps, now), max_rank_stall);
  return j;
}

const Clock::time_point t0 = Clock::now();

TEST(NodeStats, NothingNotedReportsZerosAndNullWhereNothingHappened) {
  NodeStats s(config(), t0);
  s.set_ready(t0 + milliseconds(500));
  const auto j = document(s, 0, t0 + milliseconds(1500));
  EXPECT_EQ(j["node"], 3);
  EXPECT_EQ(j["mode"], "ring");
  EXPECT_EQ(j["total_steps"], 6);
  EXPECT_EQ(j["ranks_per_node"], 2);
  ASSERT_EQ(j["per_epoch"].size(), 2U);
  const auto& e = j["per_epoch"][0];
  EXPECT_EQ(e["started"], false);
  EXPECT_EQ(e["complete"], false);
  EXPECT_EQ(e["fetched_samples"], 0);
  EXPECT_TRUE(e["start_seconds"].is_null());
  EXPECT_TRUE(e["end_seconds"].is_null());
  EXPECT_TRUE(e["wall_seconds"].is_null());
  EXPECT_EQ(e["stall_seconds"], 0.0);  // batch mode measures stall: zero, not null
  EXPECT_FALSE(e.contains("lead"));    // transparent mode only
  EXPECT_FALSE(e.contains("file_reads"));
  EXPECT_EQ(j["head_start"]["requested"], false);
  EXPECT_TRUE(j["head_start"]["seconds"].is_null());
  EXPECT_DOUBLE_EQ(j["head_start"]["startup_seconds"].get<double>(), 0.5);
  EXPECT_TRUE(j["startup"]["first_read"].is_null());
  EXPECT_TRUE(j["startup"]["plan_read"].is_null());
  EXPECT_FALSE(j["startup"]["started"].is_null());
  EXPECT_EQ(j["startup"]["first_batch"].size(), 2U);
  EXPECT_TRUE(j["startup"]["first_batch"][0].is_null());
  EXPECT_TRUE(j["totals"]["wall_seconds"].is_null());
  EXPECT_DOUBLE_EQ(j["totals"]["run_seconds"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["uptime_seconds"].get<double>(), 1.5);
  EXPECT_EQ(j["totals"]["epochs_complete"], 0);
  EXPECT_TRUE(s.transparent_json(0).is_null());
}

TEST(NodeStats, ReadsNotedBecomeTheirEpochsFetchedSamplesAndBytes) {
  NodeStats s(config(), t0);
  s.set_ready(t0);
  s.note_fetching(7);
  s.note_read(0, 4, 1, 0.25, t0 + milliseconds(10));
  s.note_read(2, 2, 2, 0.5, t0 + milliseconds(20));
  s.note_read(3, 1, 1, 0.125, t0 + milliseconds(30));  // epoch 1
  const auto j = document(s, 4, t0 + milliseconds(40));
  const auto& e0 = j["per_epoch"][0];
  EXPECT_EQ(e0["fetched_samples"], 6);
  EXPECT_EQ(e0["fetched_bytes"], 600);
  EXPECT_EQ(e0["storage_reads"], 3);
  EXPECT_DOUBLE_EQ(e0["read_seconds"].get<double>(), 0.75);
  EXPECT_EQ(j["per_epoch"][1]["fetched_samples"], 1);
  EXPECT_EQ(j["per_epoch"][1]["fetched_bytes"], 100);
  // The run's counters: queued for storage (fetched_samples) and read (bytes_read).
  EXPECT_EQ(j["fetched_samples"], 7);
  EXPECT_EQ(j["bytes_read"], 700);
  EXPECT_EQ(j["storage_reads"], 4);
  EXPECT_DOUBLE_EQ(j["read_seconds"].get<double>(), 0.875);
  EXPECT_EQ(j["totals"]["fetched_samples"], 7);
  EXPECT_EQ(j["totals"]["fetched_bytes"], 700);
  EXPECT_FALSE(j["startup"]["first_read"].is_null());
  // No rank asked yet: the head start is what was read so far.
  EXPECT_EQ(j["head_start"]["fetched_samples"], 7);
  EXPECT_EQ(j["head_start"]["fetched_bytes"], 700);
  EXPECT_EQ(j["head_start"]["ready_steps"], 4);
}

TEST(NodeStats, HeadStartIsWhatWasReadAtTheFirstRequest) {
  auto c = config();
  c.start_step = 1;
  NodeStats s(c, t0);
  s.set_ready(t0 + milliseconds(100));
  s.note_read(1, 5, 1, 0.1, t0 + milliseconds(150));
  s.note_request(1, t0 + milliseconds(350), 3);
  s.note_read(2, 5, 1, 0.1, t0 + milliseconds(400));  // after: not the head start's
  const auto j = document(s, 4, t0 + milliseconds(500));
  const auto& h = j["head_start"];
  EXPECT_EQ(h["requested"], true);
  EXPECT_DOUBLE_EQ(h["seconds"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(h["since_start_seconds"].get<double>(), 0.35);
  EXPECT_EQ(h["fetched_samples"], 5);
  EXPECT_EQ(h["fetched_bytes"], 500);
  EXPECT_EQ(h["ready_steps"], 2);  // steps 1 and 2: before the start step none are read
  EXPECT_EQ(j["start_step"], 1);
  EXPECT_EQ(j["per_epoch"][0]["started"], true);
  EXPECT_DOUBLE_EQ(j["per_epoch"][0]["start_seconds"].get<double>(), 0.25);
  // A request beyond the plan's steps is not counted.
  s.note_request(6, t0 + milliseconds(600), 6);
  EXPECT_EQ(document(s, 6, t0)["per_epoch"][1]["started"], false);
}

TEST(NodeStats, ServedReleasedAndStallPerEpochAndRank) {
  NodeStats s(config(), t0);
  s.set_ready(t0);
  for (std::uint64_t t = 0; t < 3; ++t) {
    s.note_request(t, t0 + milliseconds(100 * (t + 1)), t);
    for (std::uint32_t r = 0; r < 2; ++r)
      s.note_served(t, r, 4, 3, r == 0 ? 0.5 : 0.25, t0 + milliseconds(100 * (t + 1) + 10));
  }
  for (std::uint32_t r = 0; r < 2; ++r)
    for (std::uint64_t t = 0; t < 3; ++t) s.note_released(t, t0 + milliseconds(1000));
  s.note_slot_wait(0.125);
  s.note_plan_hit();
  const auto j = document(s, 3, t0 + milliseconds(2000), 1.5);
  const auto& e = j["per_epoch"][0];
  EXPECT_EQ(e["complete"], true);
  EXPECT_EQ(e["samples_served"], 24);
  EXPECT_EQ(e["batches_served"], 6);
  EXPECT_EQ(e["hits"], 18);
  EXPECT_DOUBLE_EQ(e["stall_seconds"].get<double>(), 2.25);
  EXPECT_DOUBLE_EQ(e["stall_max_rank_seconds"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(e["stall_max_wait_seconds"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(e["start_seconds"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(e["end_seconds"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(e["wall_seconds"].get<double>(), 0.9);
  EXPECT_EQ(j["per_epoch"][1]["complete"], false);
  EXPECT_EQ(j["totals"]["epochs_complete"], 1);
  EXPECT_EQ(j["totals"]["batches_served"], 6);
  EXPECT_DOUBLE_EQ(j["totals"]["stall_max_rank_seconds"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(j["totals"]["wall_seconds"].get<double>(), 0.9);
  EXPECT_DOUBLE_EQ(j["totals"]["slot_wait_seconds"].get<double>(), 0.125);
  EXPECT_DOUBLE_EQ(j["slot_wait_seconds"].get<double>(), 0.125);
  EXPECT_EQ(j["hits"], 1);  // the plan's hits, not the served ones
  EXPECT_FALSE(j["startup"]["first_batch"][1].is_null());
  EXPECT_FALSE(j["startup"]["last_batch"][0].is_null());
}

TEST(NodeStats, TransparentModeHasNoStallButLeadFileReadsAndItsBlock) {
  NodeStats s(config("transparent"), t0);
  solar_xstats x{};
  s.attach_xstats(&x);
  s.track_landing();
  s.set_ready(t0);
  // Step 0: storage landed at 0.2 s, a peer read at 0.3 s; rank 0 began at 0.5 s, rank 1 at
  // 0.25 s (before the peer read: late). Step 1: landed at 1.0 s, begun at 0.5 s (the rank
  // first, storage late).
  s.note_read(0, 2, 1, 0.1, t0 + milliseconds(200));
  s.note_peer_read(0, t0 + milliseconds(300));
  s.note_read(1, 2, 1, 0.1, t0 + milliseconds(1000));
  s.note_begun(0, 0.5);
  s.note_begun(0, 0.25);
  s.note_begun(1, 0.5);
  s.note_served(0, 0, 2, 2, -1);  // not measured: no stall, no batch times
  x.hit_reads = 5;
  x.hit_bytes = 500;
  x.miss_reads = 1;
  x.miss_bytes = 100;
  x.waited_reads = 2;
  x.waited_ns = 1500000000;
  const auto j = document(s, 2, t0 + milliseconds(1100));
  const auto& e = j["per_epoch"][0];
  EXPECT_TRUE(e["stall_seconds"].is_null());
  EXPECT_TRUE(e["stall_max_rank_seconds"].is_null());
  EXPECT_TRUE(e["stall_max_wait_seconds"].is_null());
  EXPECT_TRUE(j["totals"]["stall_seconds"].is_null());
  EXPECT_TRUE(j["startup"]["first_batch"][0].is_null());
  EXPECT_EQ(e["peer_samples"], 1);
  const auto& lead = e["lead"];
  EXPECT_EQ(lead["steps"], 3);
  EXPECT_EQ(lead["rank_first"], 2);
  EXPECT_EQ(lead["storage_late"], 1);
  EXPECT_EQ(lead["peer_late"], 1);
  EXPECT_NEAR(lead["min_seconds"].get<double>(), -0.5, 1e-6);
  EXPECT_NEAR(lead["p10_seconds"].get<double>(), -0.5, 1e-6);
  EXPECT_NEAR(lead["median_seconds"].get<double>(), -0.05, 1e-6);
  // An epoch without begun steps: its lead figures are null.
  EXPECT_EQ(j["per_epoch"][1]["lead"]["steps"], 0);
  EXPECT_TRUE(j["per_epoch"][1]["lead"]["median_seconds"].is_null());
  // The interposers' reads so far are the epoch in progress's.
  EXPECT_EQ(e["file_reads"]["hit_reads"], 5);
  EXPECT_EQ(e["file_reads"]["miss_bytes"], 100);
  EXPECT_EQ(j["per_epoch"][1]["file_reads"]["hit_reads"], 0);
  const auto b = s.transparent_json(4);
  EXPECT_EQ(b["hit_reads"], 5);
  EXPECT_EQ(b["hit_bytes"], 500);
  EXPECT_EQ(b["miss_reads"], 1);
  EXPECT_EQ(b["waited_reads"], 2);
  EXPECT_DOUBLE_EQ(b["waited_seconds"].get<double>(), 1.5);
  EXPECT_EQ(b["consumed_steps"], 4);
}

TEST(NodeStats, ACompletedEpochKeepsTheFileReadsUpToItsEnd) {
  NodeStats s(config("transparent"), t0);
  solar_xstats x{};
  s.attach_xstats(&x);
  s.set_ready(t0);
  x.hit_reads = 3;
  for (std::uint32_t r = 0; r < 2; ++r) s.note_released(2, t0 + milliseconds(10));
  x.hit_reads = 10;  // during epoch 1
  const auto j = document(s, 6, t0 + milliseconds(20));
  EXPECT_EQ(j["per_epoch"][0]["file_reads"]["hit_reads"], 3);
  EXPECT_EQ(j["per_epoch"][1]["file_reads"]["hit_reads"], 7);
  EXPECT_EQ(j["totals"]["epochs_complete"], 1);
}

TEST(NodeStats, StatsFileHoldsTheMeasuredPart) {
  NodeStats s(config("zero_copy"), t0);
  nlohmann::json doc = {{"error", ""},        {"transparent", nullptr}, {"peers", nullptr},
                        {"cpu_seconds", 1.5}, {"ready_steps", 0}};
  s.put(doc, s.snapshot(0, t0), 0);
  const auto f = solar::protocol::node_stats_record(doc);  // what --stats-out writes
  EXPECT_EQ(f["format_version"], 1);
  EXPECT_EQ(f["mode"], "zero_copy");
  EXPECT_EQ(f["epochs_planned"], 2);
  EXPECT_EQ(f["steps_per_epoch"], 3);
  EXPECT_EQ(f["epochs"], doc["per_epoch"]);
  EXPECT_EQ(f["totals"], doc["totals"]);
  EXPECT_EQ(f["cpu_seconds"], 1.5);
  EXPECT_FALSE(f.contains("ready_steps"));
}

TEST(NodeStats, ReplyLeavesOutTheOldestEpochsToFit) {
  nlohmann::json doc = {{"node", 0}, {"per_epoch", nlohmann::json::array()}};
  for (int e = 0; e < 100; ++e)
    doc["per_epoch"].push_back({{"epoch", e}, {"pad", std::string(100, 'x')}});
  const std::string whole = NodeStats::reply(doc);
  EXPECT_EQ(nlohmann::json::parse(whole)["per_epoch_omitted"], 0);
  const std::string cut = NodeStats::reply(doc, 2000);
  EXPECT_LE(cut.size(), 2000U);
  const auto j = nlohmann::json::parse(cut);
  const std::size_t kept = j["per_epoch"].size();
  ASSERT_GT(kept, 0U);
  EXPECT_EQ(j["per_epoch_omitted"], 100 - kept);
  EXPECT_EQ(j["per_epoch"].back()["epoch"], 99);  // the newest stay
}

}  // namespace
}  // namespace solar::agent

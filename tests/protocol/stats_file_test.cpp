// SPDX-License-Identifier: Apache-2.0
// The statistics files' schema (protocol/include/solar/stats_file.h): a node's record from its
// agent's stats document, as the agent's --stats-out and srun --solar-stats both write it.
#include "solar/stats_file.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace solar::protocol {
namespace {

// A stats document with every field an agent's has that the record keeps, and some it drops.
nlohmann::json document() {
  return {{"node", 2u},
          {"mode", "ring"},
          {"epochs", 3u},
          {"steps_per_epoch", 8u},
          {"ranks_per_node", 4u},
          {"sample_bytes", 4096u},
          {"start_step", 0u},
          {"unplanned_fetched_samples", 0u},
          {"buffer", {{"plan_bytes", 4096u}, {"unplaced_samples", 0u}}},
          {"error", ""},
          {"per_epoch", {{{"epoch", 0}, {"hits", 5}}, {{"epoch", 1}, {"hits", 7}}}},
          {"head_start", {{"seconds", 0.5}}},
          {"startup", {{"plan_read", 0.01}}},
          {"totals", {{"hits", 12}}},
          {"transparent", nullptr},
          {"peers", nullptr},
          {"cpu_seconds", 1.25},
          // The live state the stats reply and the log line also carry, which files do not.
          {"hits", 12u},
          {"ready_steps", 24u},
          {"ranks", nlohmann::json::array()},
          {"slots", 16u},
          {"total_steps", 24u},
          {"uptime_seconds", 9.5}};
}

TEST(StatsFile, ANodesRecordHasTheFileFieldsOnly) {
  const nlohmann::json r = node_stats_record(document());
  const nlohmann::json want = {{"format_version", 1},
                               {"node", 2u},
                               {"mode", "ring"},
                               {"epochs_planned", 3u},
                               {"steps_per_epoch", 8u},
                               {"ranks_per_node", 4u},
                               {"sample_bytes", 4096u},
                               {"start_step", 0u},
                               {"unplanned_fetched_samples", 0u},
                               {"buffer", {{"plan_bytes", 4096u}, {"unplaced_samples", 0u}}},
                               {"error", ""},
                               {"epochs", document()["per_epoch"]},
                               {"head_start", {{"seconds", 0.5}}},
                               {"startup", {{"plan_read", 0.01}}},
                               {"totals", {{"hits", 12}}},
                               {"transparent", nullptr},
                               {"peers", nullptr},
                               {"local_tier", nullptr},
                               {"demand", nullptr},
                               {"cpu_seconds", 1.25}};
  EXPECT_EQ(r, want) << r.dump(1);
  // What the document lacks is null, not an error (an older agent's log line).
  EXPECT_TRUE(node_stats_record({{"node", 0u}})["epochs"].is_null());
}

TEST(StatsFile, ARunsFileListsEveryNode) {
  const nlohmann::json nodes = {node_stats_record(document()), missing_node_record(3, "why")};
  const nlohmann::json f = run_stats_file("solar run", nodes);
  EXPECT_EQ(f, (nlohmann::json{{"format_version", 1}, {"source", "solar run"}, {"nodes", nodes}}));
  EXPECT_EQ(missing_node_record(3, "why"), (nlohmann::json{{"node", 3u}, {"missing", "why"}}));
  const nlohmann::json s =
      run_stats_file("srun --solar-stats", nodes, {{"job", 7u}, {"step", 0u}});
  EXPECT_EQ(s["job"], 7u);
  EXPECT_EQ(s["step"], 0u);
  EXPECT_EQ(s["nodes"], nodes);
  EXPECT_EQ(stats_file_text(s), s.dump(1) + "\n");
}

}  // namespace
}  // namespace solar::protocol

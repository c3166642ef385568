// SPDX-License-Identifier: Apache-2.0
// One node's summary for people (protocol/include/solar/node_summary.h): the lines `solar run`
// and `srun --solar-verbose` print and their pieces (also `solar stat`'s), from the stats JSON
// alone (no agent, no processes).
#include "solar/node_summary.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "solar/core/units.h"

namespace solar::protocol {
namespace {

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

nlohmann::json transparent(double hits, double misses, std::uint64_t consumed) {
  return {{"hit_reads", hits},   {"miss_reads", misses}, {"hit_bytes", 4096},
          {"miss_bytes", 1024},  {"consumed_steps", consumed}, {"attached", 2},
          {"torn", 1}};
}

TEST(NodeSummary, TransparentCountersAndWhetherTheScriptFollowedThePlan) {
  const std::string all = transparent_line(transparent(90, 10, 5), 5);
  EXPECT_TRUE(has(all, "file reads served from the buffer 90 (")) << all;
  EXPECT_TRUE(has(all, "fallen through 10 (")) << all;
  EXPECT_TRUE(has(all, "90.0% served (2 processes attached, 1 copies abandoned)")) << all;
  EXPECT_TRUE(has(all, "5 of 5 steps consumed as planned")) << all;
  EXPECT_FALSE(has(all, "differs from the plan")) << all;
  const std::string short_of = transparent_line(transparent(90, 10, 3), 5);
  EXPECT_TRUE(has(short_of, "3 of 5 steps consumed as planned (the script's order differs from "
                            "the plan: check --seed, --batch, --epochs, --drop-last, or give "
                            "--order-file)"))
      << short_of;
  EXPECT_TRUE(has(transparent_line(transparent(0, 0, 0), 0), "0.0% served")) << "no reads";
  nlohmann::json many = transparent(90, 10, 5);
  many["opens"] = 256;
  EXPECT_TRUE(has(transparent_line(many, 5),
                  "(2 processes attached, 1 copies abandoned, 256 opens of the dataset's files)"))
      << transparent_line(many, 5);
}

TEST(NodeSummary, DemandModeSaysWhenAndWhyAndTheEpochsServed) {
  const std::string short_of = transparent_line(transparent(90, 10, 3), 5, true);
  EXPECT_TRUE(has(short_of, "3 of 5 steps consumed as planned (the script's order is not the "
                            "plan's: demand mode)"))
      << short_of;
  nlohmann::json a = {{"transparent", transparent(90, 10, 3)}, {"total_steps", 5}};
  a["demand"] = {{"mode", "plan"}, {"epochs", nlohmann::json::array()}};
  EXPECT_FALSE(in_demand_mode(a));
  EXPECT_EQ(node_summary(a, SummaryFor::srun).size(), 2U);
  a["demand"] = {{"mode", "demand"},
                 {"switched_at_seconds", 0.5},
                 {"why", "the ranks read 64 samples and completed no step of the plan"},
                 {"plan_fetched_samples", 32},
                 {"plan_fetched_bytes", 32 * 4096},
                 {"filled_samples", 20},
                 {"filled_bytes", 20 * 4096},
                 {"full", true},
                 {"epochs",
                  {{{"hit_reads", 10}, {"miss_reads", 90}}, {{"hit_reads", 60}, {"miss_reads", 40}}}}};
  EXPECT_TRUE(in_demand_mode(a));
  const std::string line = demand_line(a["demand"]);
  EXPECT_EQ(line, "demand mode from 0.50 s (the ranks read 64 samples and completed no step of "
                  "the plan): the plan had read 32 samples (128 KiB) by then; 20 filled from "
                  "the ranks' reads (80.0 KiB), the buffer full; file reads served per epoch "
                  "(counted by reads): 10.0%, 60.0%")
      << line;
  const auto srun = node_summary(a, SummaryFor::srun);
  ASSERT_EQ(srun.size(), 3U);
  EXPECT_EQ(srun[2], line);
  EXPECT_TRUE(has(srun[1], "demand mode)")) << srun[1];
  const auto run = node_summary(a, SummaryFor::solar_run);
  EXPECT_TRUE(std::find(run.begin(), run.end(), line) != run.end());
  a["demand"]["epochs"] = nlohmann::json::array();
  EXPECT_TRUE(has(demand_line(a["demand"]), "(counted by reads): none complete"));
}

TEST(NodeSummary, FellThroughOnlyPastTwoPercentWithTheLeadFigures) {
  const nlohmann::json a = {
      {"per_epoch",
       {{{"lead", {{"steps", 4}, {"rank_first", 1}, {"storage_late", 1}, {"peer_late", 0}}}},
        {{"no_lead", true}},
        {{"lead", {{"steps", 3}, {"rank_first", 2}, {"storage_late", 1}, {"peer_late", 1}}}}}}};
  EXPECT_EQ(fell_through_line(a, transparent(98, 2, 1)), "");  // exactly 2%: not more
  EXPECT_EQ(fell_through_line(a, transparent(0, 0, 0)), "");
  const std::string line = fell_through_line(a, transparent(90, 10, 1));
  EXPECT_EQ(line.rfind("10.0% of the script's file reads fell through to storage", 0), 0U)
      << line;
  EXPECT_TRUE(has(line, "the rank began 3 of 7 steps before the agent had read them (2 waiting "
                        "on storage reads, 1 on peers' buffers)"))
      << line;
}

TEST(NodeSummary, DeviceBytesOnlyWhenTheKernelCountedThem) {
  EXPECT_EQ(device_bytes(nlohmann::json::object()), "");
  EXPECT_EQ(device_bytes({{"device_read_bytes", -1}}), "");
  EXPECT_EQ(device_bytes({{"device_read_bytes", 1.5}}), "");
  // Unsigned, as agents write it (a plain 1024 literal is a signed JSON number).
  const std::string d = device_bytes({{"device_read_bytes", std::uint64_t{1024}}});
  EXPECT_EQ(d.rfind("; ", 0), 0U) << d;
  EXPECT_TRUE(has(d, " read from the device")) << d;
}

TEST(NodeSummary, PeerCountersAndWhetherSharingWasTurnedOff) {
  const std::string on = peers_line({{"samples", 3}, {"bytes", 0}, {"fallbacks", 1}});
  EXPECT_EQ(on.rfind("3 samples read from peers' buffers (", 0), 0U) << on;
  EXPECT_TRUE(has(on, "), 1 from storage instead (peer unreachable or without the sample)"))
      << on;
  EXPECT_FALSE(has(on, "turned off")) << on;
  const std::string off = peers_line({{"disabled", true}});
  EXPECT_EQ(off.rfind("0 samples read from peers' buffers", 0), 0U) << off;
  EXPECT_TRUE(has(off, "; peer sharing was turned off")) << off;
}

// A document as an agent of two nodes' node 1 reports it (the fields the lines read).
nlohmann::json document() {
  return {{"node", 1},
          {"ready_steps", std::uint64_t{12}},
          {"total_steps", std::uint64_t{12}},
          {"hits", std::uint64_t{300}},
          {"fetched_samples", std::uint64_t{100}},
          {"bytes_read", std::uint64_t{100} * 4096},
          {"device_read_bytes", std::uint64_t{3} << 20},
          {"read_seconds", 0.25},
          {"start_step", std::uint64_t{0}},
          {"unplanned_fetched_samples", std::uint64_t{0}},
          {"transparent", nullptr},
          {"peers", nullptr}};
}

TEST(NodeSummary, SolarRunsLines) {
  nlohmann::json a = document();
  EXPECT_EQ(node_summary(a, SummaryFor::solar_run),
            std::vector<std::string>{"12 steps, 300 hits, 100 samples fetched (400 KiB; 3.00 MiB "
                                     "read from the device), hit rate 75.0%, storage read time "
                                     "0.25 s"});
  a["start_step"] = std::uint64_t{4};
  a["unplanned_fetched_samples"] = std::uint64_t{7};
  a["transparent"] = transparent(90, 10, 12);
  a["peers"] = {{"samples", 3}, {"bytes", 0}, {"fallbacks", 1}};
  const auto lines = node_summary(a, SummaryFor::solar_run);
  ASSERT_EQ(lines.size(), 5U);
  EXPECT_EQ(lines[1], "started at step 4: steps before it neither read nor served; 7 samples "
                      "read that the plan had in the buffer by then");
  EXPECT_EQ(lines[2], transparent_line(a["transparent"], 12));
  EXPECT_EQ(lines[3], fell_through_line(a, a["transparent"]));
  EXPECT_EQ(lines[4], peers_line(a["peers"]));
}

TEST(NodeSummary, SrunsShortLines) {
  nlohmann::json a = document();
  a.erase("device_read_bytes");
  EXPECT_EQ(node_summary(a, SummaryFor::srun),
            std::vector<std::string>{"300 hits, 100 samples fetched (400 KiB), hit rate 75.0%"});
  a["transparent"] = transparent(90, 10, 11);
  a["peers"] = {{"samples", 3}, {"bytes", 2048}, {"fallbacks", 1}, {"disabled", true}};
  const auto lines = node_summary(a, SummaryFor::srun);
  ASSERT_EQ(lines.size(), 3U);
  EXPECT_EQ(lines[1], "3 samples read from peers' buffers (2.00 KiB), 1 from storage instead; "
                      "peer sharing was turned off");
  EXPECT_EQ(lines[2], "file reads served from the buffer 90, fallen through 10; 11 of 12 steps "
                      "consumed as planned (the script's order differs: check --solar-seed, "
                      "--solar-batch, --solar-epochs, or give --solar-order-file)");
  a["transparent"]["consumed_steps"] = 12;
  EXPECT_EQ(node_summary(a, SummaryFor::srun)[2],
            "file reads served from the buffer 90, fallen through 10; 12 of 12 steps consumed "
            "as planned");
  // What an agent's document lacks counts as 0.
  EXPECT_EQ(node_summary(nlohmann::json::object(), SummaryFor::srun),
            std::vector<std::string>{"0 hits, 0 samples fetched (0 B), hit rate 0.0%"});
}

// The lines are printf'd (this target links no formatting library): the same text as fmt's,
// for any value.
TEST(NodeSummary, NumbersReadAsFmtWritesThem) {
  for (std::uint64_t h = 0; h <= 64; ++h)
    for (std::uint64_t f = 0; f <= 64; ++f) {
      const double hits = static_cast<double>(h), fetched = static_cast<double>(f);
      const nlohmann::json a = {{"hits", h}, {"fetched_samples", f}, {"read_seconds", hits / 8}};
      EXPECT_EQ(node_summary(a, SummaryFor::srun)[0],
                fmt::format("{:.0f} hits, {:.0f} samples fetched ({}), hit rate {:.1f}%", hits,
                            fetched, solar::format_bytes(0),
                            hits + fetched > 0 ? 100 * hits / (hits + fetched) : 0.0));
      const std::string run = node_summary(a, SummaryFor::solar_run)[0];
      EXPECT_EQ(run.substr(run.rfind("storage read time")),
                fmt::format("storage read time {:.2f} s", hits / 8));
    }
}

}  // namespace
}  // namespace solar::protocol

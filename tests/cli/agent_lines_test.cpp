// An agent's statistics as lines for people (cli/agent_lines.cpp): `solar run`'s summary and
// `solar stat`, from the stats JSON alone (no agent, no processes).
#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "agent_lines.h"

namespace solar::cli {
namespace {

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

nlohmann::json transparent(double hits, double misses, std::uint64_t consumed) {
  return {{"hit_reads", hits},   {"miss_reads", misses}, {"hit_bytes", 4096},
          {"miss_bytes", 1024},  {"consumed_steps", consumed}, {"attached", 2},
          {"torn", 1}};
}

TEST(AgentLines, TransparentCountersAndWhetherTheScriptFollowedThePlan) {
  const std::string all = transparent_line(transparent(90, 10, 5), 5);
  EXPECT_TRUE(has(all, "file reads served from the buffer 90 (")) << all;
  EXPECT_TRUE(has(all, "fallen through 10 (")) << all;
  EXPECT_TRUE(has(all, "90.0% served (2 processes attached, 1 copies abandoned)")) << all;
  EXPECT_TRUE(has(all, "5 of 5 steps consumed as planned")) << all;
  EXPECT_FALSE(has(all, "differs from the plan")) << all;
  const std::string short_of = transparent_line(transparent(90, 10, 3), 5);
  EXPECT_TRUE(has(short_of, "3 of 5 steps consumed as planned (the script's order differs from "
                            "the plan: check --seed, --batch, --epochs, --drop-last)"))
      << short_of;
  EXPECT_TRUE(has(transparent_line(transparent(0, 0, 0), 0), "0.0% served")) << "no reads";
}

TEST(AgentLines, FellThroughOnlyPastTwoPercentWithTheLeadFigures) {
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

TEST(AgentLines, DeviceBytesOnlyWhenTheKernelCountedThem) {
  EXPECT_EQ(device_bytes(nlohmann::json::object()), "");
  EXPECT_EQ(device_bytes({{"device_read_bytes", -1}}), "");
  EXPECT_EQ(device_bytes({{"device_read_bytes", 1.5}}), "");
  // Unsigned, as agents write it (a plain 1024 literal is a signed JSON number).
  const std::string d = device_bytes({{"device_read_bytes", std::uint64_t{1024}}});
  EXPECT_EQ(d.rfind("; ", 0), 0U) << d;
  EXPECT_TRUE(has(d, " read from the device")) << d;
}

TEST(AgentLines, PeerCountersAndWhetherSharingWasTurnedOff) {
  const std::string on = peers_line({{"samples", 3}, {"bytes", 0}, {"fallbacks", 1}});
  EXPECT_EQ(on.rfind("3 samples read from peers' buffers (", 0), 0U) << on;
  EXPECT_TRUE(has(on, "), 1 from storage instead (peer unreachable or without the sample)"))
      << on;
  EXPECT_FALSE(has(on, "turned off")) << on;
  const std::string off = peers_line({{"disabled", true}});
  EXPECT_EQ(off.rfind("0 samples read from peers' buffers", 0), 0U) << off;
  EXPECT_TRUE(has(off, "; peer sharing was turned off")) << off;
}

}  // namespace
}  // namespace solar::cli

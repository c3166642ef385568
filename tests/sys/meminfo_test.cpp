// SPDX-License-Identifier: Apache-2.0
// solar::sys::meminfo_field (sys/include/solar/sys/meminfo.h): a field of a /proc/meminfo text
// in bytes, from a given text; and this machine's, read.
#include <gtest/gtest.h>

#include "solar/sys/meminfo.h"

namespace solar::sys {
namespace {

constexpr const char* kText =
    "MemTotal:       32791212 kB\n"
    "MemFree:         1209344 kB\n"
    "MemAvailable:   20117028 kB\n"
    "HugePages_Total:       0\n"
    "Hugepagesize:       2048 kB\n";

TEST(Meminfo, AFieldIsInBytes) {
  EXPECT_EQ(meminfo_field(kText, "MemTotal"), std::uint64_t{32791212} * 1024);
  EXPECT_EQ(meminfo_field(kText, "MemAvailable"), std::uint64_t{20117028} * 1024);
  EXPECT_EQ(meminfo_field(kText, "Hugepagesize"), std::uint64_t{2048} * 1024);
}

TEST(Meminfo, AFieldWithoutUnitAndTheLastLineWithoutNewline) {
  EXPECT_EQ(meminfo_field(kText, "HugePages_Total"), 0U);
  EXPECT_EQ(meminfo_field("MemTotal: 4 kB", "MemTotal"), 4096U);
}

TEST(Meminfo, AMissingOrUnreadableFieldIsUnknown) {
  EXPECT_EQ(meminfo_field(kText, "Mem"), std::nullopt);  // a prefix of names is no name
  EXPECT_EQ(meminfo_field(kText, "SwapTotal"), std::nullopt);
  EXPECT_EQ(meminfo_field("MemTotal: lots\n", "MemTotal"), std::nullopt);
  EXPECT_EQ(meminfo_field("", "MemTotal"), std::nullopt);
}

TEST(Meminfo, ThisMachineHasMemory) {
  const auto total = meminfo_bytes("MemTotal");
  ASSERT_TRUE(total.has_value());
  EXPECT_GT(*total, 0U);
  EXPECT_LE(mem_available_bytes(), *total);  // known here, so not ~0
}

}  // namespace
}  // namespace solar::sys

// SPDX-License-Identifier: Apache-2.0
// solar.hpp's RAII batch: an explicit release reports failures, the destructor never throws.
#include <gtest/gtest.h>

#include "solar/solar.hpp"

namespace {

solar_batch* not_from_a_loader() {
  static int dummy;
  return reinterpret_cast<solar_batch*>(&dummy);
}

TEST(Batch, ExplicitReleaseReportsAFailure) {
  solar::Batch b(nullptr, not_from_a_loader());
  EXPECT_THROW(b.release(), solar::Error);
  EXPECT_NO_THROW(b.release());  // released (or given up) once: nothing left to release
}

TEST(Batch, DestructorNeverThrows) {
  static_assert(std::is_nothrow_destructible_v<solar::Batch>);
  // With a destructor that throws, this ends the test program in std::terminate.
  EXPECT_NO_THROW({ solar::Batch b(nullptr, not_from_a_loader()); });
  EXPECT_NE(std::string(solar_last_error()).find("solar_release"), std::string::npos);
}

}  // namespace

namespace {
TEST(Version, HeaderAndLibraryAgree) {
  EXPECT_STREQ(solar_version(), SOLAR_VERSION_STRING);
  EXPECT_EQ(SOLAR_VERSION, SOLAR_VERSION_MAJOR * 10000 + SOLAR_VERSION_MINOR * 100 +
                               SOLAR_VERSION_PATCH);
}
}  // namespace

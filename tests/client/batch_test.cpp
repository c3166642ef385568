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

#include <gtest/gtest.h>

#include "solar/core/order.h"
#include "small_config.h"

namespace solar {
namespace {

TEST(Layout, MatchesDistributedSamplerAndDataLoader) {
  auto c = small_config(10, 1, 4, 2);  // W=4: num_samples = ceil(10/4) = 3 -> steps of 2 and 1
  auto l = EpochLayout::of(c);
  EXPECT_EQ(l.per_rank, 3U);
  EXPECT_EQ(l.steps, 2U);
  EXPECT_EQ(l.last_batch, 1U);
  EXPECT_EQ(l.used(), 12U);
  c.drop_last = true;  // num_samples = ceil((10-4)/4) = 2 -> one full step
  l = EpochLayout::of(c);
  EXPECT_EQ(l.per_rank, 2U);
  EXPECT_EQ(l.steps, 1U);
  EXPECT_EQ(l.used(), 8U);
}

TEST(Layout, PaddingWrapsAroundThePermutation) {
  auto c = small_config(10, 1, 4, 3);
  const auto l = EpochLayout::of(c);
  std::vector<std::uint32_t> seq;
  epoch_sequence(c, l, 0, seq);
  ASSERT_EQ(seq.size(), 12U);
  EXPECT_EQ(seq[10], seq[0]);
  EXPECT_EQ(seq[11], seq[1]);
}

TEST(LowerBound, FormulaAndSaturation) {
  auto c = small_config(800, 1, 4, 16);
  c.sample_bytes = 1;
  c.buffer_bytes = 512;
  EXPECT_EQ(lower_bound_fetches(c), 800U + 2 * 288);
  c.nodes = 2;
  c.buffer_bytes = 512;  // 2·512 ≥ 800: everything can stay
  EXPECT_EQ(lower_bound_fetches(c), 800U);
}

}  // namespace
}  // namespace solar

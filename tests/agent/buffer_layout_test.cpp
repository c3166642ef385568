// SPDX-License-Identifier: Apache-2.0
// The agent's buffer layout: slot counts, rings and where the transparent index goes, a pure
// function of the plan and the options (agent/src/buffer_layout.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>

#include "buffer_layout.h"
#include "solar/core/config.h"
#include "solar/transparent.h"

namespace solar::agent {
namespace {
PlanConfig small_config() {
  PlanConfig c;
  c.samples = 10001;
  c.sample_bytes = 1000;
  c.ranks_per_node = 4;
  c.batch = 16;
  c.imbalance = 2;
  return c;
}

// Batches of 18 slots of 64 KiB (1.125 MiB): too large for the deeper small-batch rings.
PlanConfig large_batch_config() {
  PlanConfig c = small_config();
  c.sample_bytes = 65476;  // a slot of 64 KiB with or without a 4-byte label
  return c;
}

TEST(BufferLayout, RingsFillTheBudgetCoreFittedThePlanTo) {
  for (const std::uint32_t staging : {1U, 2U, 3U}) {
    for (const std::uint64_t label : {0ULL, 4ULL}) {
      PlanConfig c = large_batch_config();
      const std::uint64_t budget = 64ULL << 20;
      // With rings the plan leaves one look-ahead step of the budget to the cache (as
      // config_for_agents does).
      fit_plan_to_agent_budget(c, budget, label, staging + kAgentLookaheadSteps);
      BufferOptions o;
      o.staging_steps = staging;
      const BufferLayout b = buffer_layout(c, label, o);
      SCOPED_TRACE(testing::Message() << "staging " << staging << ", label " << label);
      // Samples and labels apart (protocol version 4): the slot is the sample's 64 KiB.
      EXPECT_EQ(b.slot_bytes, 65536U);
      EXPECT_EQ(b.label_bytes, label);
      EXPECT_EQ(b.slot_bytes + label, agent_slot_bytes(c.sample_bytes, label));
      EXPECT_EQ(b.ring_batch, 18U);
      EXPECT_EQ(b.ring_depth, staging);
      EXPECT_EQ(b.cache_slots, c.buffer_samples() + kAgentLookaheadSteps * 4U * 18U);
      EXPECT_EQ(b.slots, b.cache_slots + 4U * staging * 18U);
      // the whole budget, no more
      EXPECT_EQ(b.slots, budget / agent_slot_bytes(c.sample_bytes, label));
      EXPECT_EQ(b.labels_offset, b.slots * b.slot_bytes);
      EXPECT_EQ(b.label_offset(b.slots - 1) + label, b.labels_offset + b.slots * label);
      EXPECT_EQ(b.map_bytes, b.slots * (b.slot_bytes + label));
      EXPECT_LE(b.map_bytes, budget);
    }
  }
}

// Small batches get rings 2 MiB deep, 8 to 16 batches (18 slots of 1 KiB: 16), beyond the
// budget's staging steps by at most 6 × 512 KiB per rank; deeper staging is kept as it is.
TEST(BufferLayout, SmallBatchRingsAreEightToSixteenDeepBeyondTheBudget) {
  EXPECT_EQ(small_batch_ring_depth(18 * 1024), 16U);
  EXPECT_EQ(small_batch_ring_depth(64 * 1024), 16U);   // 4 KiB × 16
  EXPECT_EQ(small_batch_ring_depth(128 * 1024), 16U);
  EXPECT_EQ(small_batch_ring_depth(200 * 1024), 10U);
  EXPECT_EQ(small_batch_ring_depth(kInlineCopyBytes), 8U);
  std::uint64_t most = 0;  // the most memory beyond 2 staging steps, over batch sizes
  for (std::uint64_t bytes = 64; bytes <= kInlineCopyBytes; bytes += 64)
    most = std::max(most, (small_batch_ring_depth(bytes) - 2) * bytes);
  EXPECT_LE(most, 6 * kInlineCopyBytes);
  for (const std::uint32_t staging : {1U, 2U, 3U, 4U, 6U, 8U, 10U, 16U, 20U}) {
    PlanConfig c = small_config();
    const std::uint64_t budget = 8ULL << 20;
    fit_plan_to_agent_budget(c, budget, 0, staging + kAgentLookaheadSteps);
    BufferOptions o;
    o.staging_steps = staging;
    const BufferLayout b = buffer_layout(c, 0, o);
    SCOPED_TRACE(testing::Message() << "staging " << staging);
    const std::uint64_t depth = std::max<std::uint64_t>(staging, 16U);
    EXPECT_EQ(b.ring_depth, depth);
    EXPECT_EQ(b.cache_slots, c.buffer_samples() + kAgentLookaheadSteps * 4U * 18U);
    EXPECT_EQ(b.slots, budget / b.slot_bytes + 4U * (depth - staging) * 18U);
    EXPECT_LE((b.slots - budget / b.slot_bytes) * b.slot_bytes,
              4U * (depth - staging) * 18U * 1024U);
  }
}

TEST(BufferLayout, ZeroCopyAndTransparentKeepTheStagingSlotsInTheCache) {
  PlanConfig c = large_batch_config();
  const std::uint64_t budget = 64ULL << 20;
  fit_plan_to_agent_budget(c, budget, 0);
  for (const bool transparent : {false, true}) {
    BufferOptions o;
    o.zero_copy = !transparent;
    o.transparent = transparent;
    const BufferLayout b = buffer_layout(c, 0, o);
    EXPECT_EQ(b.ring_depth, 0U);
    EXPECT_EQ(b.slots, budget / b.slot_bytes);  // the whole budget, all of it cache slots
    EXPECT_EQ(b.cache_slots, b.slots);
    EXPECT_EQ(b.cache_slots, c.buffer_samples() + kAgentStagingSteps * 4U * 18U);
  }
  // Small batches: the same, without the rings' extra depth.
  PlanConfig s = small_config();
  fit_plan_to_agent_budget(s, 8ULL << 20, 0);
  BufferOptions zc;
  zc.zero_copy = true;
  EXPECT_EQ(buffer_layout(s, 0, zc).slots, (8ULL << 20) / 1024U);
}

// Labels apart (protocol version 4): a 4 KiB sample with a 4-byte label fills exactly one
// page of the buffer, every slot page-aligned (its copy needs one address translation, not
// two), and a ring batch's samples and labels are each contiguous (one copy out).
TEST(BufferLayout, FourKiBSamplesWithLabelsFillOnePageEach) {
  PlanConfig c = small_config();
  c.sample_bytes = 4096;
  c.buffer_bytes = 300 * c.sample_bytes;
  const BufferLayout b = buffer_layout(c, 4, BufferOptions{});
  EXPECT_EQ(b.slot_bytes, 4096U);
  for (std::uint64_t s = 0; s < b.slots; ++s) {
    EXPECT_EQ(b.slot_offset(s) % 4096, 0U);
    EXPECT_GE(b.label_offset(s), b.slots * 4096U);  // no label on a sample's page
  }
  EXPECT_EQ(b.slot_offset(b.ring_slot(2, 5, 17)) - b.slot_offset(b.ring_slot(2, 5, 0)),
            17U * 4096U);
  EXPECT_EQ(b.label_offset(b.ring_slot(2, 5, 17)) - b.label_offset(b.ring_slot(2, 5, 0)), 17U * 4U);
  EXPECT_EQ(b.map_bytes, b.slots * 4100U);
}

TEST(BufferLayout, APlanHoldingLessThanAStepStillGetsAStepOfCacheSlots) {
  PlanConfig c = small_config();
  c.buffer_bytes = 10 * c.sample_bytes;  // policy none: under R·(b+δ) = 72
  const BufferLayout b = buffer_layout(c, 0, BufferOptions{});
  // a step for the plan, and the look-ahead step (kAgentLookaheadSteps)
  EXPECT_EQ(b.cache_slots, 72U + kAgentLookaheadSteps * 72U);
  EXPECT_EQ(b.slots, b.cache_slots + 4U * 16U * 18U);  // rings 16 deep (small batches)
}

TEST(BufferLayout, RingSlotsTileTheSpaceAfterTheCacheSlots) {
  for (const bool large : {false, true}) {
    PlanConfig c = large ? large_batch_config() : small_config();
    c.buffer_bytes = 500 * c.sample_bytes;
    BufferOptions o;
    o.staging_steps = 3;
    const BufferLayout b = buffer_layout(c, 0, o);
    const std::uint64_t depth = b.ring_depth;
    EXPECT_EQ(depth, large ? 3U : 16U);
    std::set<std::uint32_t> seen;
    for (std::uint32_t r = 0; r < 4; ++r)
      for (std::uint64_t t = 0; t < depth; ++t)
        for (std::size_t i = 0; i < b.ring_batch; ++i) {
          const std::uint32_t s = b.ring_slot(r, t, i);
          EXPECT_GE(s, b.cache_slots);
          EXPECT_LT(s, b.slots);
          EXPECT_TRUE(seen.insert(s).second) << "rank " << r << " step " << t << " slot " << i;
          EXPECT_EQ(b.ring_slot(r, t + depth, i), s);  // step t + depth reuses step t's entry
        }
    EXPECT_EQ(seen.size(), b.slots - b.cache_slots);
    EXPECT_EQ(b.cache_slots, 500U + kAgentLookaheadSteps * 4U * 18U);
    EXPECT_EQ(b.slot_offset(b.ring_slot(1, 0, 0)), (b.cache_slots + depth * 18U) * b.slot_bytes);
  }
}

TEST(BufferLayout, TransparentIndexFollowsTheSlotsAndLabelsPageAligned) {
  PlanConfig c = small_config();  // N = 10001: the consumed counters need padding
  c.buffer_bytes = 333 * c.sample_bytes;
  BufferOptions o;
  o.transparent = true;
  o.page_bytes = 4096;
  const BufferLayout b = buffer_layout(c, 4, o);
  const std::uint64_t N = c.samples;
  const std::uint64_t slots_end = b.slots * b.slot_bytes + b.slots * 4;  // samples, labels
  EXPECT_EQ(b.labels_offset, b.slots * b.slot_bytes);
  EXPECT_EQ(b.index_offset % 4096, 0U);
  EXPECT_GE(b.index_offset, slots_end);
  EXPECT_LT(b.index_offset, slots_end + 4096);
  EXPECT_EQ(b.entries_offset, b.index_offset + sizeof(solar_xindex));
  EXPECT_EQ(b.consumed_offset, b.entries_offset + N * 8);
  EXPECT_EQ(b.files_offset, b.consumed_offset + 40008U);  // 4·N rounded up to 8
  EXPECT_EQ(b.extents_offset, b.files_offset);              // no files counted
  EXPECT_EQ(b.map_bytes, b.extents_offset);
  o.files = 3;  // the file table, then the chunked files' extents
  o.extents = 1000;
  const BufferLayout t = buffer_layout(c, 4, o);
  EXPECT_EQ(t.files_offset, b.files_offset);
  EXPECT_EQ(t.files_offset % 8, 0U);
  EXPECT_EQ(t.extents_offset, t.files_offset + 3 * sizeof(solar_xfile));
  EXPECT_EQ(t.extents_offset % 8, 0U);
  EXPECT_EQ(t.map_bytes, t.extents_offset + 1000 * sizeof(solar_xextent));
  o.page_bytes = 65536;
  EXPECT_EQ(buffer_layout(c, 4, o).index_offset % 65536, 0U);
}

TEST(BufferLayout, SmallBatchesAreCopiedInline) {
  PlanConfig c = small_config();  // 18 slots of 1 KiB
  c.buffer_bytes = 100 * c.sample_bytes;
  EXPECT_TRUE(buffer_layout(c, 0, BufferOptions{}).inline_copy);
  c.sample_bytes = 64 * 1024;  // 18 × 64 KiB > 512 KiB
  c.buffer_bytes = 100 * c.sample_bytes;
  EXPECT_FALSE(buffer_layout(c, 0, BufferOptions{}).inline_copy);
}

}  // namespace
}  // namespace solar::agent

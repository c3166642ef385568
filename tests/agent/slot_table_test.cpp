// SPDX-License-Identifier: Apache-2.0
// The agent's slot table (free list, pins, evictions, zombies, index entries), without threads
// or I/O (agent/src/slot_table.h); its buffer layout: buffer_layout_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <vector>

#include "slot_table.h"

namespace solar::agent {
namespace {

std::uint64_t entry(std::uint64_t gen, std::uint32_t slot) {
  return (gen << 32) | (std::uint64_t{slot} + 1);
}

// Takes every free slot; the table is full afterwards.
std::vector<std::uint32_t> take_all(SlotTable& t) {
  std::vector<std::uint32_t> out;
  while (t.free_slots() > 0) out.push_back(t.take_free());
  return out;
}

// A sample read into a fresh slot whose read has landed: resident, no uses.
std::uint32_t load(SlotTable& t, std::uint32_t sample) {
  const std::uint32_t slot = t.take_free();
  t.place(sample, slot);
  t.drop_use(sample);
  return slot;
}

TEST(SlotTable, HandsOutEverySlotOnceInAscendingOrderUntilFull) {
  SlotTable t(5);
  EXPECT_EQ(t.free_slots(), 5U);
  EXPECT_EQ(take_all(t), (std::vector<std::uint32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(t.free_slots(), 0U);
  EXPECT_THROW(t.take_free(), std::logic_error);
}

TEST(SlotTable, EmptyTableHasNoSlots) {
  SlotTable t;
  EXPECT_EQ(t.free_slots(), 0U);
  EXPECT_THROW(t.take_free(), std::logic_error);
}

TEST(SlotTable, PlacedSampleIsResidentAndPinnedUntilItsReadLands) {
  SlotTable t(2);
  const std::uint32_t s = t.take_free();
  t.place(7, s);
  EXPECT_TRUE(t.resident(7));
  EXPECT_EQ(t.slot_of(7), s);
  EXPECT_EQ(t.uses(7), 1U);  // the read pin
  // Evicted while its read is in flight: the slot must not go back to the free list.
  EXPECT_FALSE(t.evict(7));
  EXPECT_TRUE(t.zombie(7));
  EXPECT_EQ(t.free_slots(), 1U);
  // The read lands: its pin was the last use, the slot is freed.
  EXPECT_TRUE(t.drop_use(7));
  EXPECT_FALSE(t.resident(7));
  EXPECT_FALSE(t.zombie(7));
  EXPECT_EQ(t.free_slots(), 2U);
}

TEST(SlotTable, ReadLandingDoesNotFreeAResidentSample) {
  SlotTable t(2);
  const std::uint32_t s = t.take_free();
  t.place(7, s);
  EXPECT_FALSE(t.drop_use(7));
  EXPECT_TRUE(t.resident(7));
  EXPECT_EQ(t.slot_of(7), s);
  EXPECT_EQ(t.uses(7), 0U);
  EXPECT_EQ(t.free_slots(), 1U);
}

TEST(SlotTable, EvictionWithoutUsesFreesAtOnceAndTheSlotIsReused) {
  SlotTable t(3);
  const std::uint32_t s = load(t, 4);
  load(t, 5);
  EXPECT_EQ(t.free_slots(), 1U);
  EXPECT_TRUE(t.evict(4));
  EXPECT_FALSE(t.resident(4));
  EXPECT_FALSE(t.zombie(4));
  EXPECT_THROW((void)t.slot_of(4), std::out_of_range);
  EXPECT_EQ(t.free_slots(), 2U);
  EXPECT_EQ(t.take_free(), s);  // the slot just freed comes back first
  EXPECT_TRUE(t.resident(5));
}

TEST(SlotTable, EvictedSampleWithUsesIsAZombieFreedOnlyWhenTheLastUseDrops) {
  SlotTable t(2);
  const std::uint32_t s = load(t, 9);
  t.add_use(9);
  t.add_use(9);
  t.add_use(9);
  EXPECT_EQ(t.uses(9), 3U);
  EXPECT_FALSE(t.evict(9));
  EXPECT_TRUE(t.zombie(9));
  EXPECT_TRUE(t.resident(9));
  EXPECT_EQ(t.slot_of(9), s);
  EXPECT_EQ(t.free_slots(), 1U);
  EXPECT_FALSE(t.drop_use(9));
  EXPECT_FALSE(t.drop_use(9));
  EXPECT_TRUE(t.zombie(9));
  EXPECT_EQ(t.free_slots(), 1U);
  EXPECT_TRUE(t.drop_use(9));  // the last one
  EXPECT_FALSE(t.zombie(9));
  EXPECT_FALSE(t.resident(9));
  EXPECT_EQ(t.uses(9), 0U);
  EXPECT_EQ(t.free_slots(), 2U);
}

TEST(SlotTable, ResurrectedZombieKeepsItsSlotAndIsNotFreedByItsLastUse) {
  SlotTable t(2);
  const std::uint32_t s = load(t, 3);
  t.add_use(3);
  EXPECT_FALSE(t.evict(3));
  ASSERT_TRUE(t.zombie(3));
  EXPECT_TRUE(t.resurrect(3));  // wanted again before its uses were done
  EXPECT_FALSE(t.zombie(3));
  EXPECT_EQ(t.slot_of(3), s);
  EXPECT_FALSE(t.drop_use(3));
  EXPECT_TRUE(t.resident(3));
  EXPECT_EQ(t.slot_of(3), s);
  EXPECT_EQ(t.free_slots(), 1U);
  // Only a zombie is resurrected.
  EXPECT_FALSE(t.resurrect(3));
  EXPECT_FALSE(t.resurrect(42));
  EXPECT_TRUE(t.resident(3));
}

TEST(SlotTable, ZombieEvictedAgainAfterResurrectionIsFreedOnItsLastUse) {
  SlotTable t(1);
  load(t, 3);
  t.add_use(3);
  EXPECT_FALSE(t.evict(3));
  EXPECT_TRUE(t.resurrect(3));
  t.add_use(3);
  EXPECT_FALSE(t.evict(3));
  EXPECT_FALSE(t.drop_use(3));
  EXPECT_TRUE(t.drop_use(3));
  EXPECT_FALSE(t.resident(3));
  EXPECT_EQ(t.free_slots(), 1U);
}

// The per-sample state is an array sized from the dataset: a sample past that size (or a table
// made without one) grows it, and the samples already there keep their state.
TEST(SlotTable, SamplesBeyondTheSizedDatasetGrowTheTableAndKeepEarlierState) {
  SlotTable t(4, 10);
  const std::uint32_t s3 = load(t, 3);
  t.add_use(3);
  const std::uint32_t big = load(t, 1000000);
  EXPECT_TRUE(t.resident(1000000));
  EXPECT_EQ(t.slot_of(1000000), big);
  EXPECT_EQ(t.slot_of(3), s3);
  EXPECT_EQ(t.uses(3), 1U);
  EXPECT_FALSE(t.evict(3));  // a use pins it: a zombie, in the grown table too
  EXPECT_TRUE(t.zombie(3));
  EXPECT_FALSE(t.resident(999999));
  EXPECT_THROW(t.slot_of(2000000), std::out_of_range);
  EXPECT_EQ(t.uses(2000000), 0U);
  EXPECT_FALSE(t.zombie(2000000));
  EXPECT_TRUE(t.drop_use(3));  // the last use frees the zombie's slot
  EXPECT_FALSE(t.resident(3));
  SlotTable u(1);  // no size given
  EXPECT_EQ(load(u, 123456), 0U);
  EXPECT_TRUE(u.resident(123456));
}

TEST(SlotTable, DoubleFreeAndUnknownSamplesAreNoOps) {
  SlotTable t(3);
  load(t, 1);
  const std::uint32_t s2 = load(t, 2);
  EXPECT_EQ(t.free_slots(), 1U);
  EXPECT_FALSE(t.free_slot(77));
  EXPECT_FALSE(t.evict(77));
  EXPECT_FALSE(t.zombie(77));
  EXPECT_FALSE(t.drop_use(77));
  EXPECT_EQ(t.uses(77), 0U);
  EXPECT_EQ(t.free_slots(), 1U);
  EXPECT_TRUE(t.free_slot(2));
  EXPECT_FALSE(t.free_slot(2));
  EXPECT_FALSE(t.evict(2));
  EXPECT_EQ(t.free_slots(), 2U);
  // The slot was returned once: no slot is handed out twice.
  const std::vector<std::uint32_t> all = take_all(t);
  EXPECT_EQ(all.size(), 2U);
  EXPECT_EQ(std::set<std::uint32_t>(all.begin(), all.end()).size(), all.size());
  EXPECT_NE(std::find(all.begin(), all.end(), s2), all.end());
  EXPECT_TRUE(t.resident(1));
}

TEST(SlotTable, DroppingMoreUsesThanAddedDoesNotUnderflow) {
  SlotTable t(2);
  load(t, 6);
  EXPECT_FALSE(t.drop_use(6));  // no uses left
  EXPECT_EQ(t.uses(6), 0U);
  t.add_use(6);
  EXPECT_EQ(t.uses(6), 1U);
  EXPECT_FALSE(t.drop_use(6));
  // Not pinned: evicted at once rather than left a zombie.
  EXPECT_TRUE(t.evict(6));
  EXPECT_FALSE(t.zombie(6));
}

TEST(SlotTable, ExplicitFreeOfAZombieReturnsItsSlotOnce) {
  SlotTable t(1);
  load(t, 8);
  t.add_use(8);
  EXPECT_FALSE(t.evict(8));
  EXPECT_TRUE(t.free_slot(8));
  EXPECT_FALSE(t.zombie(8));
  EXPECT_EQ(t.free_slots(), 1U);
  EXPECT_FALSE(t.drop_use(8));  // its last use: nothing left to free
  EXPECT_EQ(t.free_slots(), 1U);
}

// ---- the transparent index ----------------------------------------------------------------

TEST(SlotTableIndex, PublishedOnlyAfterTheWriteWithANewGenerationEachTime) {
  std::vector<std::uint64_t> entries(16, 0);
  SlotTable t(4);
  t.attach_index(entries.data());
  EXPECT_EQ(t.generation(), 0U);
  const std::uint32_t a = t.take_free();
  t.place(3, a);
  EXPECT_EQ(entries[3], 0U);  // being read: not served yet
  t.publish(3, a);            // the reader, once the bytes are in place
  EXPECT_EQ(entries[3], entry(1, a));
  EXPECT_EQ(t.generation(), 1U);
  const std::uint32_t b = t.take_free();
  t.place(5, b);
  t.publish(5, b);
  EXPECT_EQ(entries[5], entry(2, b));
  EXPECT_EQ(entries[3], entry(1, a));
  t.drop_use(3);
  t.drop_use(5);
  EXPECT_EQ(std::count(entries.begin(), entries.end(), 0U), 14);
}

TEST(SlotTableIndex, FreedSlotIsUnpublishedBeforeItCanBeReused) {
  std::vector<std::uint64_t> entries(16, 0);
  SlotTable t(1);
  t.attach_index(entries.data());
  const std::uint32_t s = t.take_free();
  t.place(3, s);
  t.publish(3, s);
  t.drop_use(3);
  const std::uint64_t first = entries[3];
  ASSERT_NE(first, 0U);
  EXPECT_EQ(t.free_slots(), 0U);
  EXPECT_TRUE(t.evict(3));
  EXPECT_EQ(entries[3], 0U);  // cleared as the slot went back, before anyone can take it
  ASSERT_EQ(t.take_free(), s);
  t.place(11, s);
  EXPECT_EQ(entries[11], 0U);
  EXPECT_EQ(entries[3], 0U);
  t.publish(11, s);
  // Same slot, another generation: a reader that saw the old entry sees the change.
  EXPECT_EQ(entries[11], entry(2, s));
  EXPECT_NE(entries[11] >> 32, first >> 32);
  EXPECT_EQ(entries[3], 0U);
}

TEST(SlotTableIndex, ZombieStaysServedUntilItsLastUseDrops) {
  std::vector<std::uint64_t> entries(8, 0);
  SlotTable t(2);
  t.attach_index(entries.data());
  const std::uint32_t s = t.take_free();
  t.place(2, s);
  t.publish(2, s);
  t.drop_use(2);
  t.add_use(2);
  EXPECT_FALSE(t.evict(2));
  EXPECT_EQ(entries[2], entry(1, s));  // still in its slot, still in use
  EXPECT_TRUE(t.drop_use(2));
  EXPECT_EQ(entries[2], 0U);
}

TEST(SlotTableIndex, FreeingAnUnknownSampleLeavesEntriesAlone) {
  std::vector<std::uint64_t> entries(8, 0);
  SlotTable t(2);
  t.attach_index(entries.data());
  const std::uint32_t s = load(t, 1);
  t.publish(1, s);
  const std::vector<std::uint64_t> before = entries;
  EXPECT_FALSE(t.free_slot(4));
  EXPECT_FALSE(t.evict(4));
  EXPECT_FALSE(t.drop_use(4));
  EXPECT_EQ(entries, before);
  t.unpublish(1);
  EXPECT_EQ(entries[1], 0U);
  EXPECT_TRUE(t.resident(1));  // unpublishing alone frees nothing
}

TEST(SlotTableIndex, WithoutAnIndexPublishingDoesNothing) {
  SlotTable t(2);
  const std::uint32_t s = load(t, 1);
  t.publish(1, s);
  t.unpublish(1);
  EXPECT_EQ(t.generation(), 0U);
  EXPECT_TRUE(t.evict(1));
}

// Samples of differing sizes: 64-byte units of one arena, each sample its own run of them.
TEST(SlotTableSized, TakesConsecutiveUnitsPerSampleAllOrNone) {
  SlotTable t(10, {3, 4, 2, 5, 1});
  ASSERT_TRUE(t.sized());
  EXPECT_EQ(t.free_slots(), 10U);
  std::vector<std::uint32_t> slots;
  const std::uint32_t first[] = {0, 1, 2};
  ASSERT_TRUE(t.take_room(first, slots));
  EXPECT_EQ(slots, (std::vector<std::uint32_t>{0, 3, 7}));  // 3, 4 and 2 units back to back
  EXPECT_EQ(t.units_for(first), 9U);
  for (std::size_t i = 0; i < 3; ++i) {
    t.place(first[i], slots[i]);
    t.drop_use(first[i]);
  }
  EXPECT_EQ(t.free_slots(), 1U);
  // Sample 3 needs 5 units: none taken, not even sample 4's one that would fit.
  const std::uint32_t more[] = {4, 3};
  std::vector<std::uint32_t> none;
  EXPECT_FALSE(t.take_room(more, none));
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(t.free_slots(), 1U);
  // Freeing samples 0 and 2 leaves 3 + 2 + 1 units free, no run of 5: still nothing.
  EXPECT_TRUE(t.evict(0));
  EXPECT_TRUE(t.evict(2));
  EXPECT_EQ(t.free_slots(), 6U);
  EXPECT_EQ(t.largest_free(), 3U);
  EXPECT_FALSE(t.take_room(more, none));
  // Sample 1 (units 3..6) goes: 0..9 is one run again.
  t.add_use(1);
  EXPECT_FALSE(t.evict(1));  // in use: a zombie
  EXPECT_EQ(t.zombies(), 1U);
  EXPECT_TRUE(t.drop_use(1));
  EXPECT_EQ(t.zombies(), 0U);
  EXPECT_EQ(t.largest_free(), 10U);
  ASSERT_TRUE(t.take_room(more, none));
  EXPECT_EQ(none, (std::vector<std::uint32_t>{0, 1}));  // best fit from the start
  EXPECT_THROW(t.take_free(), std::logic_error);  // one-size calls are refused
  // Evicting a sample that never got room does nothing (the agent left it to the ranks).
  EXPECT_FALSE(t.evict(2));
  EXPECT_FALSE(t.zombie(2));
}

}  // namespace
}  // namespace solar::agent

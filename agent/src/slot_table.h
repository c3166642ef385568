// SPDX-License-Identifier: Apache-2.0
// The agent's cache slots and the samples in them: the free list, which slot holds which
// sample, the uses pinning each sample (admitted uses of ranks, and reads in flight), the
// zombies (evicted by the plan while still in use) and, in transparent mode, the shared index
// entries of resident samples (solar/transparent.h). No threads and no I/O: the agent calls it
// with its mutex held, and wakes whoever waits for a free slot when a call says one was freed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

#include "solar/core/extents.h"

namespace solar::agent {

class SlotTable {
 public:
  SlotTable() = default;
  // Slots 0..cache_slots-1, all free; take_free() hands them out in ascending order. The
  // per-sample state is a dense array indexed by sample (8 bytes and a bit per sample of the
  // dataset, sized up front from `samples` and grown if a larger sample number comes): a
  // lookup is an index, not a hash (the serving path looks up every sample it hands out).
  explicit SlotTable(std::uint64_t cache_slots, std::uint64_t samples = 0);
  // Samples of differing sizes (the transparent mode over whole files or filtered chunks): the
  // slots are 64-byte units of one arena, and sample x takes units[x] consecutive ones from
  // the one its entry names (best fit, freed neighbours merged: solar::ExtentArena). take_room
  // allocates; free_slots() counts free units.
  SlotTable(std::uint64_t units, std::vector<std::uint32_t> sample_units);
  bool sized() const { return !units_.empty(); }

  // Transparent mode: the index's entries (one per sample of the dataset), written by
  // publish() and free_slot(). Without them, publish() and unpublish() do nothing.
  void attach_index(std::uint64_t* entries) { entries_ = entries; }
  bool indexed() const { return entries_ != nullptr; }

  std::size_t free_slots() const { return sized() ? arena_.free_units() : free_.size(); }
  // A free slot, taken off the free list; there must be one (free_slots() > 0). Samples of one
  // size only.
  std::uint32_t take_free();
  // The slots of `samples` (their first, sized), all of them or none: appends them to `slots`
  // in that order and returns true, or returns false with nothing taken.
  bool take_room(std::span<const std::uint32_t> samples, std::vector<std::uint32_t>& slots);
  // The room take_room(samples, slots) took, given back unused (nothing placed in it).
  void give_room(std::span<const std::uint32_t> samples, std::span<const std::uint32_t> slots);
  // The units `samples` need together (their count, for samples of one size).
  std::uint64_t units_for(std::span<const std::uint32_t> samples) const;
  std::uint32_t units_of(std::uint32_t sample) const { return sized() ? units_.at(sample) : 1; }
  // Samples evicted by the plan and still in use: their slots come free as ranks release them.
  std::uint64_t zombies() const { return zombies_; }
  // The largest run of free units (sized), for messages.
  std::uint64_t largest_free() const { return sized() ? arena_.largest_free() : free_slots() ? 1 : 0; }

  // `sample` is being read into `slot`: it is resident there, and its read pins it like a use
  // until the read lands (drop_use; see prefetch_loop for why).
  void place(std::uint32_t sample, std::uint32_t slot);
  // An admitted use of a resident sample (a rank's access): pins it until drop_use().
  void add_use(std::uint32_t sample);
  // Drops one use (or read pin); frees the slot of a zombie whose last use this was. Returns
  // whether a slot was freed. A sample without uses is left alone.
  bool drop_use(std::uint32_t sample);
  // The plan evicts `sample`: its slot is freed now, or once the ranks still using it release
  // it (it is a zombie until then). Returns whether a slot was freed.
  bool evict(std::uint32_t sample);
  // The plan wants `sample` again: a zombie is still here, so it stays in its slot instead of
  // being re-read. Returns whether it was a zombie.
  bool resurrect(std::uint32_t sample);
  // Its uses are forgotten (demand mode: the plan's admitted uses are never released by a
  // consumed step, and its bytes are no longer the plan's to keep).
  void clear_uses(std::uint32_t sample) {
    if (sample < state_.size()) state_[sample].uses = 0;
  }
  // Frees the sample's slot (unpublished first); a sample without a slot is left alone.
  // Returns whether a slot was freed.
  bool free_slot(std::uint32_t sample);

  // The slot of a resident (or zombie) sample; throws std::out_of_range for any other.
  std::uint32_t slot_of(std::uint32_t sample) const {
    if (!resident(sample)) throw std::out_of_range("SlotTable::slot_of: sample not resident");
    return state_[sample].slot;
  }
  bool resident(std::uint32_t sample) const {
    return sample < state_.size() && state_[sample].slot != kNone;
  }
  bool zombie(std::uint32_t sample) const { return sample < zombie_.size() && zombie_[sample]; }
  std::uint32_t uses(std::uint32_t sample) const {
    return sample < state_.size() ? state_[sample].uses : 0;
  }

  // Transparent mode: the sample's bytes are in `slot`: readers may copy them from now on. Each
  // publication takes a new generation, so a reader sees a slot recycled during its copy.
  void publish(std::uint32_t sample, std::uint32_t slot);
  // The sample is no longer served (its entry is 0).
  void unpublish(std::uint32_t sample);
  // Transparent mode: the sample is being read into a slot (its entry says so, without a slot:
  // an interposer waits for it instead of reading the file too); publish() follows.
  void mark_in_flight(std::uint32_t sample);
  std::uint64_t generation() const { return gen_; }

 private:
  static constexpr std::uint32_t kNone = 0xFFFFFFFFU;
  struct State {
    std::uint32_t slot = kNone;  // resident or zombie: its slot
    std::uint32_t uses = 0;      // admitted uses + reads in flight
  };
  State& at(std::uint32_t sample) {
    if (sample >= state_.size()) grow(sample);
    return state_[sample];
  }
  void grow(std::uint32_t sample);
  std::vector<std::uint32_t> free_;
  std::vector<std::uint32_t> units_;  // sized: by sample
  ExtentArena arena_;                 // sized: the free units
  std::uint64_t zombies_ = 0;
  std::vector<State> state_;  // by sample
  std::vector<bool> zombie_;  // by sample: evicted by the plan, still in use
  std::uint64_t* entries_ = nullptr;
  std::uint64_t gen_ = 0;
};

}  // namespace solar::agent

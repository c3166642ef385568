// SPDX-License-Identifier: Apache-2.0
#include "slot_table.h"

#include <algorithm>
#include <atomic>
#include <stdexcept>

namespace solar::agent {

SlotTable::SlotTable(std::uint64_t cache_slots, std::uint64_t samples)
    : state_(samples), zombie_(samples) {
  if (cache_slots >= kNone) throw std::invalid_argument("SlotTable: too many slots");
  free_.resize(cache_slots);
  for (std::uint64_t i = 0; i < cache_slots; ++i)
    free_[i] = static_cast<std::uint32_t>(cache_slots - 1 - i);
}

SlotTable::SlotTable(std::uint64_t units, std::vector<std::uint32_t> sample_units)
    : units_(std::move(sample_units)), arena_(units), state_(units_.size()),
      zombie_(units_.size()) {
  if (units >= kNone) throw std::invalid_argument("SlotTable: too many units");
  if (units_.empty()) throw std::invalid_argument("SlotTable: no samples");
  for (std::uint32_t u : units_)
    if (u == 0) throw std::invalid_argument("SlotTable: a sample of no units");
}

bool SlotTable::take_room(std::span<const std::uint32_t> samples,
                          std::vector<std::uint32_t>& slots) {
  if (!sized()) {
    if (free_.size() < samples.size()) return false;
    for (std::size_t i = 0; i < samples.size(); ++i) slots.push_back(take_free());
    return true;
  }
  const std::size_t from = slots.size();
  for (const std::uint32_t x : samples) {
    const std::optional<std::uint64_t> at = arena_.take(units_of(x));
    if (!at) {  // all or none: what this call took goes back
      for (std::size_t i = from; i < slots.size(); ++i)
        arena_.give(slots[i], units_of(samples[i - from]));
      slots.resize(from);
      return false;
    }
    slots.push_back(static_cast<std::uint32_t>(*at));
  }
  return true;
}

void SlotTable::give_room(std::span<const std::uint32_t> samples,
                          std::span<const std::uint32_t> slots) {
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (sized()) arena_.give(slots[i], units_of(samples[i]));
    else free_.push_back(slots[i]);
  }
}

std::uint64_t SlotTable::units_for(std::span<const std::uint32_t> samples) const {
  if (!sized()) return samples.size();
  std::uint64_t n = 0;
  for (const std::uint32_t x : samples) n += units_of(x);
  return n;
}

void SlotTable::grow(std::uint32_t sample) {
  const std::size_t n = std::max<std::size_t>(std::size_t{sample} + 1, state_.size() * 2);
  state_.resize(n);
  zombie_.resize(n);
}

std::uint32_t SlotTable::take_free() {
  if (sized()) throw std::logic_error("SlotTable::take_free: samples of differing sizes take_room");
  if (free_.empty()) throw std::logic_error("SlotTable::take_free: no free slot");
  const std::uint32_t slot = free_.back();
  free_.pop_back();
  return slot;
}

void SlotTable::place(std::uint32_t sample, std::uint32_t slot) {
  State& s = at(sample);
  s.slot = slot;
  ++s.uses;
}

void SlotTable::add_use(std::uint32_t sample) { ++at(sample).uses; }

bool SlotTable::free_slot(std::uint32_t sample) {
  if (!resident(sample)) return false;
  unpublish(sample);  // before the slot can take another sample's bytes
  State& s = state_[sample];
  if (sized()) arena_.give(s.slot, units_of(sample));
  else free_.push_back(s.slot);
  s.slot = kNone;
  if (zombie_[sample]) --zombies_;
  zombie_[sample] = false;
  return true;
}

bool SlotTable::drop_use(std::uint32_t sample) {
  if (sample >= state_.size() || state_[sample].uses == 0) return false;
  if (--state_[sample].uses == 0 && zombie_[sample]) return free_slot(sample);
  return false;
}

bool SlotTable::evict(std::uint32_t sample) {
  if (!resident(sample)) return false;  // never placed (sized: no room for it; see prefetch_loop)
  if (uses(sample) != 0) {
    if (!zombie_[sample]) ++zombies_;
    zombie_[sample] = true;
    return false;
  }
  return free_slot(sample);
}

bool SlotTable::resurrect(std::uint32_t sample) {
  if (!zombie(sample)) return false;
  zombie_[sample] = false;
  --zombies_;
  return true;
}

void SlotTable::publish(std::uint32_t sample, std::uint32_t slot) {
  if (!entries_) return;
  const std::uint64_t e = (++gen_ << 32) | (std::uint64_t{slot} + 1);
  std::atomic_ref<std::uint64_t>(entries_[sample]).store(e, std::memory_order_release);
}

void SlotTable::mark_in_flight(std::uint32_t sample) {
  if (entries_)
    std::atomic_ref<std::uint64_t>(entries_[sample]).store(++gen_ << 32, std::memory_order_release);
}

void SlotTable::unpublish(std::uint32_t sample) {
  if (entries_)
    std::atomic_ref<std::uint64_t>(entries_[sample]).store(0, std::memory_order_release);
}

}  // namespace solar::agent

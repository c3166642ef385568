#include "slot_table.h"

#include <atomic>
#include <stdexcept>

namespace solar::agent {

SlotTable::SlotTable(std::uint64_t cache_slots) {
  free_.resize(cache_slots);
  for (std::uint64_t i = 0; i < cache_slots; ++i)
    free_[i] = static_cast<std::uint32_t>(cache_slots - 1 - i);
}

std::uint32_t SlotTable::take_free() {
  if (free_.empty()) throw std::logic_error("SlotTable::take_free: no free slot");
  const std::uint32_t slot = free_.back();
  free_.pop_back();
  return slot;
}

void SlotTable::place(std::uint32_t sample, std::uint32_t slot) {
  slot_of_[sample] = slot;
  ++pending_[sample];
}

void SlotTable::add_use(std::uint32_t sample) { ++pending_[sample]; }

bool SlotTable::free_slot(std::uint32_t sample) {
  auto it = slot_of_.find(sample);
  if (it == slot_of_.end()) return false;
  unpublish(sample);  // before the slot can take another sample's bytes
  free_.push_back(it->second);
  slot_of_.erase(it);
  zombie_.erase(sample);
  return true;
}

bool SlotTable::drop_use(std::uint32_t sample) {
  auto it = pending_.find(sample);
  if (it == pending_.end()) return false;
  if (--it->second == 0) {
    pending_.erase(it);
    if (zombie_.count(sample)) return free_slot(sample);
  }
  return false;
}

bool SlotTable::evict(std::uint32_t sample) {
  if (pending_.count(sample)) {
    zombie_.insert(sample);
    return false;
  }
  return free_slot(sample);
}

bool SlotTable::resurrect(std::uint32_t sample) { return zombie_.erase(sample) != 0; }

void SlotTable::publish(std::uint32_t sample, std::uint32_t slot) {
  if (!entries_) return;
  const std::uint64_t e = (++gen_ << 32) | (std::uint64_t{slot} + 1);
  std::atomic_ref<std::uint64_t>(entries_[sample]).store(e, std::memory_order_release);
}

void SlotTable::unpublish(std::uint32_t sample) {
  if (entries_)
    std::atomic_ref<std::uint64_t>(entries_[sample]).store(0, std::memory_order_release);
}

}  // namespace solar::agent

// One node's buffer as the planner simulates it: at most `capacity` resident samples, each
// with an eviction key; the resident, unpinned sample with the smallest key goes first.
// Policies differ only in the keys they give (recency, insertion order, next use).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

namespace solar::detail {

class NodeBuffer {
 public:
  explicit NodeBuffer(std::uint64_t capacity) : capacity_(capacity) {
    map_.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(capacity, 1u << 22)) * 2);
  }

  std::uint64_t capacity() const { return capacity_; }
  std::size_t size() const { return map_.size(); }
  bool contains(std::uint32_t x) const { return map_.count(x) != 0; }

  // A hit: x is resident; pin it for step `stamp` and give it a new key.
  void touch(std::uint32_t x, std::uint64_t stamp, std::uint64_t key) {
    Entry& e = map_.at(x);
    e.pin = stamp;
    if (e.key != key) {
      e.key = key;
      push(key, x);
    }
  }

  // Pins x for step `stamp` keeping its key (FIFO hits, a copy a peer reads this step).
  void pin(std::uint32_t x, std::uint64_t stamp) { map_.at(x).pin = stamp; }
  std::uint64_t key(std::uint32_t x) const { return map_.at(x).key; }

  // Changes x's key without pinning (e.g. a copy that will never be used here again).
  void rekey(std::uint32_t x, std::uint64_t key) {
    auto it = map_.find(x);
    if (it == map_.end() || it->second.key == key) return;
    it->second.key = key;
    push(key, x);
  }

  // A miss: makes room (appending evicted samples to `evicted`) and inserts x pinned.
  void insert(std::uint32_t x, std::uint64_t stamp, std::uint64_t key,
              std::vector<std::uint32_t>& evicted) {
    while (map_.size() >= capacity_) evicted.push_back(evict_one(stamp));
    map_.emplace(x, Entry{key, stamp});
    push(key, x);
  }

  // Evicts everything, appending the samples (in ascending order) to `evicted`.
  void clear(std::vector<std::uint32_t>& evicted) {
    const std::size_t from = evicted.size();
    for (const auto& [x, e] : map_) evicted.push_back(x);
    std::sort(evicted.begin() + static_cast<std::ptrdiff_t>(from), evicted.end());
    map_.clear();
    heap_.clear();
  }

  template <class F>
  void for_each(F&& f) const {
    for (const auto& [x, e] : map_) f(x, e.key);
  }

 private:
  struct Entry {
    std::uint64_t key;
    std::uint64_t pin;  // the step stamp it is pinned for
  };
  using HeapItem = std::pair<std::uint64_t, std::uint32_t>;

  void push(std::uint64_t key, std::uint32_t x) {
    heap_.emplace_back(key, x);
    std::push_heap(heap_.begin(), heap_.end(), std::greater<>{});
    if (heap_.size() > 4 * map_.size() + 1024) compact();
  }

  void compact() {
    heap_.clear();
    for (const auto& [x, e] : map_) heap_.emplace_back(e.key, x);
    std::make_heap(heap_.begin(), heap_.end(), std::greater<>{});
  }

  std::uint32_t evict_one(std::uint64_t stamp) {
    stash_.clear();
    for (;;) {
      // Config validation guarantees capacity ≥ one step's samples, so an unpinned resident
      // exists; running out means a policy pinned more than a step.
      if (heap_.empty()) throw std::logic_error("node buffer: every resident sample is pinned");
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<>{});
      const HeapItem top = heap_.back();
      heap_.pop_back();
      auto it = map_.find(top.second);
      if (it == map_.end() || it->second.key != top.first) continue;  // stale
      if (it->second.pin == stamp) {
        stash_.push_back(top);
        continue;
      }
      map_.erase(it);
      for (const auto& s : stash_) {
        heap_.push_back(s);
        std::push_heap(heap_.begin(), heap_.end(), std::greater<>{});
      }
      return top.second;
    }
  }

  std::uint64_t capacity_;
  std::unordered_map<std::uint32_t, Entry> map_;
  std::vector<HeapItem> heap_;
  std::vector<HeapItem> stash_;
};

}  // namespace solar::detail

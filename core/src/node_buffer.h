// SPDX-License-Identifier: Apache-2.0
// One node's buffer as the planner simulates it: resident samples of at most `capacity` units
// in all, each with an eviction key; the resident, unpinned sample with the smallest key goes
// first, until the incoming one fits. A unit is a sample (equal-size samples) or, given the
// samples' sizes, a byte: clairvoyant eviction by bytes (farthest next use first, as many as it
// takes). Policies differ only in the keys they give (recency, insertion order, next use).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace solar::detail {

// Open-addressing hash map from sample id to Entry (linear probing, backward-shift deletion):
// the planner's innermost data structure, several lookups per access.
template <class V>
class SampleMap {
 public:
  static constexpr std::uint32_t kEmpty = ~std::uint32_t{0};
  explicit SampleMap(std::uint64_t expected) {
    std::size_t cap = 16;
    while (cap < expected * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.resize(cap);
    mask_ = cap - 1;
  }
  std::size_t size() const { return size_; }
  V* find(std::uint32_t k) {
    for (std::size_t i = hash(k);; i = (i + 1) & mask_) {
      if (keys_[i] == k) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  const V* find(std::uint32_t k) const { return const_cast<SampleMap*>(this)->find(k); }
  // Inserts k (which must be absent).
  V& insert(std::uint32_t k, const V& v) {
    if ((size_ + 1) * 2 > keys_.size()) grow();
    std::size_t i = hash(k);
    while (keys_[i] != kEmpty) i = (i + 1) & mask_;
    keys_[i] = k;
    vals_[i] = v;
    ++size_;
    return vals_[i];
  }
  bool erase(std::uint32_t k) {
    std::size_t i = hash(k);
    while (keys_[i] != k) {
      if (keys_[i] == kEmpty) return false;
      i = (i + 1) & mask_;
    }
    // Backward-shift: move later members of the probe chain into the hole.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask_; keys_[j] != kEmpty; j = (j + 1) & mask_) {
      const std::size_t home = hash(keys_[j]);
      if (((j - home) & mask_) >= ((j - hole) & mask_)) {
        keys_[hole] = keys_[j];
        vals_[hole] = vals_[j];
        hole = j;
      }
    }
    keys_[hole] = kEmpty;
    --size_;
    return true;
  }
  void clear() {
    std::fill(keys_.begin(), keys_.end(), kEmpty);
    size_ = 0;
  }
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] != kEmpty) f(keys_[i], vals_[i]);
  }

 private:
  std::size_t hash(std::uint32_t k) const {
    return static_cast<std::size_t>((std::uint64_t{k} * 0x9e3779b97f4a7c15ULL) >> 20) & mask_;
  }
  void grow() {
    std::vector<std::uint32_t> keys = std::move(keys_);
    std::vector<V> vals = std::move(vals_);
    keys_.assign(keys.size() * 2, kEmpty);
    vals_.assign(keys.size() * 2, V{});
    mask_ = keys_.size() - 1;
    size_ = 0;
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i] != kEmpty) insert(keys[i], vals[i]);
  }
  std::vector<std::uint32_t> keys_;
  std::vector<V> vals_;
  std::size_t mask_ = 0, size_ = 0;
};

// Eviction keys are 32-bit (plans have fewer than 2^32 accesses): a heap item packs key and
// sample into one 64-bit word, so heap comparisons are single integer compares.
using EvictKey = std::uint32_t;
inline constexpr EvictKey kEvictFirst = 0;
inline constexpr EvictKey kEvictLast = ~EvictKey{0} - 1;
// While a step runs, the samples it uses carry this key (they sink to the bottom of the heap)
// and get their real keys at end_step(): so evictions never wade through pinned samples.
inline constexpr EvictKey kPinnedKey = ~EvictKey{0};

class NodeBuffer {
  struct Entry {
    EvictKey key = 0;
    std::uint64_t pin = 0;  // the step stamp it is pinned for
  };

 public:
  // sizes: each sample's bytes (capacity is then bytes), or null (capacity is samples).
  // `expected`: about how many samples it will hold (its map grows beyond that).
  explicit NodeBuffer(std::uint64_t capacity, const std::vector<std::uint64_t>* sizes = nullptr,
                      std::uint64_t expected = 0)
      : capacity_(capacity),
        sizes_(sizes),
        map_(std::min<std::uint64_t>(sizes ? expected : capacity, 1u << 20)) {}

  std::size_t size() const { return map_.size(); }
  // Units held: samples, or bytes with sizes.
  std::uint64_t used() const { return used_; }
  bool contains(std::uint32_t x) const { return map_.find(x) != nullptr; }

  // A hit: x is resident; pin it for step `stamp`; it gets `key` at end_step().
  void touch(std::uint32_t x, std::uint64_t stamp, EvictKey key) {
    Entry& e = *map_.find(x);
    e.pin = stamp;
    if (key != kPinnedKey) pending_.emplace_back(x, key);
    if (e.key != kPinnedKey) {
      e.key = kPinnedKey;
      push(kPinnedKey, x);
    }
  }

  // Ends the step: the samples it used get their eviction keys.
  void end_step() {
    for (const auto& [x, key] : pending_) {
      Entry* e = map_.find(x);
      if (!e || e->key == key) continue;
      e->key = key;
      push(key, x);
    }
    pending_.clear();
  }

  // Pins x for step `stamp` keeping its key (FIFO hits, a copy a peer reads this step).
  void pin(std::uint32_t x, std::uint64_t stamp) { map_.find(x)->pin = stamp; }
  EvictKey key(std::uint32_t x) const { return map_.find(x)->key; }
  // Whether resident x is pinned for step `stamp` (used there, or read by a peer).
  bool pinned(std::uint32_t x, std::uint64_t stamp) const { return map_.find(x)->pin == stamp; }

  // Calls f(x, key) for every resident sample, in no particular order.
  template <class F>
  void for_each_resident(F&& f) const {
    map_.for_each([&](std::uint32_t x, const Entry& e) { f(x, e.key); });
  }

  // Removes resident, unpinned x (handed over to a peer); its heap item goes stale.
  void erase(std::uint32_t x) {
    if (map_.erase(x)) used_ -= units(x);
  }

  // Changes x's key without pinning (e.g. a copy that will never be used here again).
  void rekey(std::uint32_t x, EvictKey key) {
    Entry* e = map_.find(x);
    if (!e || e->key == key) return;
    e->key = key;
    push(key, x);
  }

  // A miss: makes room (appending evicted samples to `evicted`) and inserts x pinned.
  void insert(std::uint32_t x, std::uint64_t stamp, EvictKey key,
              std::vector<std::uint32_t>& evicted) {
    const std::uint64_t need = units(x);
    while (used_ + need > capacity_) evicted.push_back(evict_one(stamp));
    map_.insert(x, Entry{kPinnedKey, stamp});
    used_ += need;
    push(kPinnedKey, x);
    if (key != kPinnedKey) pending_.emplace_back(x, key);
  }

  // Evicts everything, appending the samples (in ascending order) to `evicted`.
  void clear(std::vector<std::uint32_t>& evicted) {
    const std::size_t from = evicted.size();
    map_.for_each([&](std::uint32_t x, const Entry&) { evicted.push_back(x); });
    std::sort(evicted.begin() + static_cast<std::ptrdiff_t>(from), evicted.end());
    map_.clear();
    heap_.clear();
    pending_.clear();
    used_ = 0;
  }

 private:
  std::uint64_t units(std::uint32_t x) const { return sizes_ ? (*sizes_)[x] : 1; }
  static std::uint64_t item(EvictKey key, std::uint32_t x) {
    return (std::uint64_t{key} << 32) | x;
  }

  void push(EvictKey key, std::uint32_t x) {
    heap_.push_back(item(key, x));
    std::push_heap(heap_.begin(), heap_.end(), std::greater<>{});
    if (heap_.size() > 4 * map_.size() + 1024) compact();
  }

  void compact() {
    heap_.clear();
    map_.for_each([&](std::uint32_t x, const Entry& e) { heap_.push_back(item(e.key, x)); });
    std::make_heap(heap_.begin(), heap_.end(), std::greater<>{});
  }

  std::uint32_t evict_one(std::uint64_t stamp) {
    stash_.clear();
    for (;;) {
      // Config validation guarantees capacity ≥ one step's samples (by bytes: its largest
      // samples), so an unpinned resident exists; running out means a policy pinned more than
      // a step.
      if (heap_.empty()) throw std::logic_error("node buffer: every resident sample is pinned");
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<>{});
      const std::uint64_t top = heap_.back();
      heap_.pop_back();
      const auto x = static_cast<std::uint32_t>(top);
      const Entry* e = map_.find(x);
      if (!e || e->key != static_cast<EvictKey>(top >> 32)) continue;  // stale
      if (e->pin == stamp) {
        stash_.push_back(top);
        continue;
      }
      map_.erase(x);
      used_ -= units(x);
      for (const std::uint64_t s : stash_) {
        heap_.push_back(s);
        std::push_heap(heap_.begin(), heap_.end(), std::greater<>{});
      }
      return x;
    }
  }

  std::uint64_t capacity_;
  const std::vector<std::uint64_t>* sizes_;
  std::uint64_t used_ = 0;
  SampleMap<Entry> map_;
  std::vector<std::uint64_t> heap_;
  std::vector<std::uint64_t> stash_;
  std::vector<std::pair<std::uint32_t, EvictKey>> pending_;
};

}  // namespace solar::detail

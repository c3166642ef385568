// SPDX-License-Identifier: Apache-2.0
// A sized plan's samples as extents of one arena per node: how much room that takes beyond the
// plan's bytes (fragmentation). The planner holds every node to buffer_bytes of resident
// samples; an agent keeping them in one memory region also needs a free extent large enough
// for each fetch, and freed extents are scattered. Replaying a node's schedule (evictions, then
// fetches, step by step) through an allocator that merges free neighbours tells the smallest
// arena in which every fetch finds one.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "solar/core/plan.h"

namespace solar {

enum class ExtentFit : std::uint8_t {
  first,  // the lowest free extent large enough (O(free extents) a fetch: for measurement)
  best,   // the smallest free extent large enough (O(log) a fetch)
};

// Free extents of one arena [0, size), in any unit: by offset (to merge freed neighbours) and by
// (length, offset) (best fit in O(log) a call). The replay below and the agent's buffer
// (agent/src/slot_table.h, in 64-byte units) allocate with it.
class ExtentArena {
 public:
  ExtentArena() = default;
  explicit ExtentArena(std::uint64_t size) { add(0, size); }
  // Where `len` units now lie (the free extent chosen by `fit`, from its start), or nothing
  // when no free extent is that large.
  std::optional<std::uint64_t> take(std::uint64_t len, ExtentFit fit = ExtentFit::best);
  // [off, off + len) is free again (it must be what take() returned), merged with free
  // neighbours.
  void give(std::uint64_t off, std::uint64_t len);
  std::uint64_t free_units() const { return free_; }
  std::uint64_t largest_free() const { return by_len_.empty() ? 0 : by_len_.rbegin()->first; }
  std::size_t free_extents() const { return by_off_.size(); }

 private:
  void add(std::uint64_t off, std::uint64_t len);
  void remove(std::uint64_t off, std::uint64_t len);
  std::map<std::uint64_t, std::uint64_t> by_off_;
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_len_;
  std::uint64_t free_ = 0;
};

// Whether a node's schedule (`total_steps` steps of config `c`'s sizes) fits an arena of
// `arena` bytes.
bool extents_fit(const NodeSchedule& s, const PlanConfig& c, std::uint64_t total_steps,
                 std::uint64_t arena, ExtentFit fit);
// The smallest arena, to within a thousandth of the buffer, in which that schedule fits (by
// bisection; the allocators are not monotone, so a larger one is not sure to fit as well).
std::uint64_t arena_for_node(const NodeSchedule& s, const PlanConfig& c,
                             std::uint64_t total_steps, ExtentFit fit);

// Whether node `node`'s schedule of `plan` fits an arena of `arena` bytes.
bool extents_fit(const Plan& plan, std::uint32_t node, std::uint64_t arena, ExtentFit fit);

// The smallest arena, to within a thousandth of the buffer, in which the schedule of every
// node fits: about the worst node's by bisection, then raised until every node's fits (the
// allocators are not monotone in the arena's size). At least each node's peak bytes; for
// equal-size samples at most buffer_bytes (they never fragment).
std::uint64_t arena_for_extents(const Plan& plan, ExtentFit fit);

}  // namespace solar

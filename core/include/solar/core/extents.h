// SPDX-License-Identifier: Apache-2.0
// A sized plan's samples as extents of one arena per node: how much room that takes beyond the
// plan's bytes (fragmentation). The planner holds every node to buffer_bytes of resident
// samples; an agent keeping them in one memory region also needs a free extent large enough
// for each fetch, and freed extents are scattered. Replaying a node's schedule (evictions, then
// fetches, step by step) through an allocator that merges free neighbours tells the smallest
// arena in which every fetch finds one.
#pragma once

#include <cstdint>

#include "solar/core/plan.h"

namespace solar {

enum class ExtentFit : std::uint8_t {
  first,  // the lowest free extent large enough (O(free extents) a fetch: for measurement)
  best,   // the smallest free extent large enough (O(log) a fetch)
};

// Whether node `node`'s schedule of `plan` fits an arena of `arena` bytes.
bool extents_fit(const Plan& plan, std::uint32_t node, std::uint64_t arena, ExtentFit fit);

// The smallest arena, to within a thousandth of the buffer, in which the schedule of every
// node fits: about the worst node's by bisection, then raised until every node's fits (the
// allocators are not monotone in the arena's size). At least each node's peak bytes; for
// equal-size samples at most buffer_bytes (they never fragment).
std::uint64_t arena_for_extents(const Plan& plan, ExtentFit fit);

}  // namespace solar

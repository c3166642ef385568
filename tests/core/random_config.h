// SPDX-License-Identifier: Apache-2.0
// A random small plan configuration (no policy set): the property tests' inputs, shared by
// planner_test.cpp and plan_file_test.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "solar/core/config.h"
#include "solar/core/rng.h"

namespace solar {

inline PlanConfig random_config(Xoshiro256& g) {
  PlanConfig c;
  c.nodes = 1 + static_cast<std::uint32_t>(g.bounded(4));
  c.ranks_per_node = 1 + static_cast<std::uint32_t>(g.bounded(3));
  c.batch = 1 + static_cast<std::uint32_t>(g.bounded(6));
  const std::uint64_t world = c.world();
  c.samples = world * c.batch + g.bounded(200);
  c.sample_bytes = 1 + g.bounded(1000);
  c.epochs = 1 + static_cast<std::uint32_t>(g.bounded(5));
  c.imbalance = static_cast<std::uint32_t>(g.bounded(c.batch));
  c.drop_last = g.bounded(2) == 1;
  c.order = g.bounded(2) ? OrderMode::torch : OrderMode::solar;
  c.seed = g.next();
  c.peer_fetch = g.bounded(3) == 0;
  const std::uint64_t min_buf = std::uint64_t{c.ranks_per_node} * (c.batch + c.imbalance);
  const std::uint64_t buf = min_buf + g.bounded(c.samples);
  c.buffer_bytes = buf * c.sample_bytes + g.bounded(c.sample_bytes);
  return c;
}

// The inputs of a random config, for a test's trace.
inline std::string describe_random_config(const PlanConfig& c) {
  return "policy " + std::string(to_string(c.policy)) + " N=" + std::to_string(c.samples) +
         " E=" + std::to_string(c.epochs) + " M=" + std::to_string(c.nodes) +
         " R=" + std::to_string(c.ranks_per_node) + " b=" + std::to_string(c.batch) +
         " δ=" + std::to_string(c.imbalance) + " C=" + std::to_string(c.buffer_samples()) +
         " drop_last=" + std::to_string(c.drop_last) + " order=" +
         std::string(to_string(c.order)) + " peer=" + std::to_string(c.peer_fetch);
}

}  // namespace solar

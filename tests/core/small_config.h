// SPDX-License-Identifier: Apache-2.0
// A small plan configuration for hand-checked cases: n one-byte samples, 3 epochs, a buffer
// that holds them all; shared by order_test.cpp and config_test.cpp.
#pragma once

#include <cstdint>

#include "solar/core/config.h"

namespace solar {

inline PlanConfig small_config(std::uint64_t n, std::uint32_t nodes, std::uint32_t r,
                               std::uint32_t b) {
  PlanConfig c;
  c.samples = n;
  c.sample_bytes = 1;
  c.epochs = 3;
  c.nodes = nodes;
  c.ranks_per_node = r;
  c.batch = b;
  c.buffer_bytes = n;
  return c;
}

}  // namespace solar

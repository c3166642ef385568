// SPDX-License-Identifier: Apache-2.0
// The presets of `solar plan --scenario`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace solar {

// The presets of `solar plan --scenario` (core/README.md, "Scenarios").
struct Scenario {
  std::string name;
  std::uint64_t samples;
  std::uint32_t epochs, nodes, ranks_per_node, batch;
  std::uint64_t buffer_samples;  // per node
  std::string description;
};
const std::vector<Scenario>& scenarios();
const Scenario* find_scenario(std::string_view name);
}  // namespace solar

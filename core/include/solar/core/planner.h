// SPDX-License-Identifier: Apache-2.0
// Computing a plan.
#pragma once

#include <functional>

#include "solar/core/plan.h"

namespace solar {

// Called now and then with (steps done, steps in all); may be empty.
using ProgressFn = std::function<void(std::uint64_t done, std::uint64_t total)>;

// Computes the whole plan for config.policy. Validates the config first (throws ConfigError).
// Deterministic: the same config gives the same plan, bit for bit, on every platform.
Plan make_plan(const PlanConfig& config, const ProgressFn& progress = {});

// The epoch order the solar-paper policy uses: particle-swarm search over the epoch-to-epoch
// overlap matrix (last K samples of epoch i ∩ first K of epoch j, K = all nodes' buffers).
std::vector<std::uint32_t> paper_epoch_order(const PlanConfig& config);

// Overlap matrix used by paper_epoch_order, row-major E×E; exposed for tests.
std::vector<std::uint64_t> epoch_overlap_matrix(const PlanConfig& config, std::uint64_t k);

}  // namespace solar

// SPDX-License-Identifier: Apache-2.0
// The plan file's constants both its writer (plan_file_write.cpp) and its reader
// (plan_file.cpp) use; the layout itself is described in solar/core/plan_file.h.
#pragma once

#include <bit>
#include <cstdint>

namespace solar::plan_layout {

static_assert(std::endian::native == std::endian::little,
              "the plan file is little-endian; add byte swapping for this platform");

inline constexpr char kMagic[8] = {'S', 'O', 'L', 'A', 'R', 'P', 'L', 'N'};
inline constexpr char kNodeMagic[8] = {'S', 'O', 'L', 'A', 'R', 'N', 'O', 'D'};
// The header's flags (v5).
inline constexpr std::uint64_t kFlagStreamed = 1;  // no node sections: each node computes its own

}  // namespace solar::plan_layout

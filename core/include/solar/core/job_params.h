// SPDX-License-Identifier: Apache-2.0
// The job parameters every front end takes from the user (solar plan, solar run, solar bench
// loader, srun/sbatch --solar-*; libsolar's SOLAR_START_* too), with one range each, so that a
// value one of them accepts is accepted by all. The upper bounds are the limits
// PlanConfig::validate() enforces (plan_config.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "solar/core/plan_config.h"
#include "solar/core/units.h"

namespace solar {

// A parameter's allowed values, lo..hi inclusive.
struct JobParamRange {
  std::uint64_t lo, hi;
};

namespace job_params {
inline constexpr JobParamRange kSamples{1, kMaxSamples};
inline constexpr JobParamRange kEpochs{1, kMaxEpochs};
inline constexpr JobParamRange kBatch{1, kMaxSamples};         // per rank
inline constexpr JobParamRange kImbalance{0, kMaxSamples};     // δ
inline constexpr JobParamRange kNodes{1, kMaxNodes};
inline constexpr JobParamRange kRanksPerNode{1, kMaxRanksPerNode};
inline constexpr JobParamRange kSeed{0, ~std::uint64_t{0}};
inline constexpr JobParamRange kStartEpoch{0, ~std::uint64_t{0}};  // checked against the plan
inline constexpr JobParamRange kStartStep{0, ~std::uint64_t{0}};   // (start_global_step)
}  // namespace job_params

// parse_count within `range`: throws ConfigError(flag, ...) naming the range.
inline std::uint64_t parse_job_param(std::string_view text, const std::string& flag,
                                     JobParamRange range) {
  return parse_count(text, flag, range.lo, range.hi);
}

// The same for the 32-bit fields of PlanConfig (epochs, nodes, ranks, batch, δ).
inline std::uint32_t parse_job_param32(std::string_view text, const std::string& flag,
                                       JobParamRange range) {
  return static_cast<std::uint32_t>(parse_count(text, flag, range.lo, range.hi));
}

}  // namespace solar

// SPDX-License-Identifier: Apache-2.0
// One function per policy; each computes a whole Plan. See core/README.md, "Policies".
#pragma once

#include "solar/core/plan.h"
#include "solar/core/planner.h"

namespace solar::detail {

Plan plan_none(const PlanConfig& c, const ProgressFn& progress);
Plan plan_lru(const PlanConfig& c, const ProgressFn& progress);
Plan plan_nopfs(const PlanConfig& c, const ProgressFn& progress);
Plan plan_solar_paper(const PlanConfig& c, const ProgressFn& progress);
Plan plan_solar(const PlanConfig& c, const ProgressFn& progress);
Plan plan_sampler(const PlanConfig& c, const ProgressFn& progress);
// plan_sampler with peer reads (c.peer_fetch): policy_peers.cpp.
Plan plan_sampler_peers(const PlanConfig& c, const ProgressFn& progress);

}  // namespace solar::detail

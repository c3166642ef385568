// SPDX-License-Identifier: Apache-2.0
// One function per policy; each computes a whole Plan, or with a sink streams its steps there
// (plan_builder.h: PlanRecorder). See core/README.md, "Policies".
#pragma once

#include "solar/core/plan.h"
#include "solar/core/planner.h"

namespace solar::detail {
class StepSink;
}

namespace solar::detail {

Plan plan_none(const PlanConfig& c, const ProgressFn& progress, StepSink* sink = nullptr);
Plan plan_lru(const PlanConfig& c, const ProgressFn& progress, StepSink* sink = nullptr);
Plan plan_nopfs(const PlanConfig& c, const ProgressFn& progress, StepSink* sink = nullptr);
Plan plan_solar_paper(const PlanConfig& c, const ProgressFn& progress, StepSink* sink = nullptr);
Plan plan_solar(const PlanConfig& c, const ProgressFn& progress, StepSink* sink = nullptr);
Plan plan_sampler(const PlanConfig& c, const ProgressFn& progress, StepSink* sink = nullptr);
// The function of config.policy.
Plan plan_by_policy(const PlanConfig& c, const ProgressFn& progress, StepSink* sink = nullptr);
// plan_sampler with peer reads (c.peer_fetch): policy_peers.cpp.
Plan plan_sampler_peers(const PlanConfig& c, const ProgressFn& progress, StepSink* sink = nullptr);

}  // namespace solar::detail

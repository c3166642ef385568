// SPDX-License-Identifier: Apache-2.0
// What a plan is computed from, and how those inputs are checked: an umbrella over the headers
// by subject, so that one include still brings all of it.
#pragma once

#include "solar/core/agent_budget.h"  // an agent's memory budget -> the plan's buffer
#include "solar/core/config_error.h"  // ConfigError
#include "solar/core/plan_config.h"   // PlanConfig, orders, policies, limits, resume step
#include "solar/core/scenarios.h"     // solar plan --scenario presets
#include "solar/core/units.h"         // counts, byte sizes, buffer specs, format_bytes

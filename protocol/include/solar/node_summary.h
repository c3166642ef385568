// SPDX-License-Identifier: Apache-2.0
// One node's summary for people at the end of a run, from its agent's stats document (the
// stats reply `solar run` asks for, the log's last line "stopped: {...}" srun reads): the one
// formatter `solar run` and `srun --solar-verbose` call, and its lines' pieces, which
// `solar stat` shows too. Fields the document lacks count as 0.
//
// The two front ends' lines differ on purpose only where they must: each names its own
// options (--seed or --solar-seed), and srun's lines go into every job's output, so they are
// the short form (no step count, read time, byte counts of the transparent reads).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace solar::protocol {

enum class SummaryFor { solar_run, srun };

// The lines, in order, each to be printed after "node N: " (the front end adds its prefix).
std::vector<std::string> node_summary(const nlohmann::json& doc, SummaryFor who);

// The pieces. An agent's transparent-mode counters (`doc["transparent"]`): reads served and
// fallen through, and whether the script followed the plan (`solar run`'s form; `demand`:
// the agent is in demand mode, so a plan not followed is no mistake to point out).
std::string transparent_line(const nlohmann::json& t, std::uint64_t total_steps,
                             bool demand = false);

// Demand mode (`doc["demand"]`, agent/src/demand_cache.h): when and why it switched, what the
// plan had read by then, what was filled, the file reads served per epoch counted by reads.
std::string demand_line(const nlohmann::json& d);
// Whether the agent's document says it is in demand mode.
bool in_demand_mode(const nlohmann::json& doc);

// When an agent's unmodified ranks read more than 2% of their reads from the file: says so,
// and whether the agent was behind them (its per-epoch lead figures), else "".
std::string fell_through_line(const nlohmann::json& doc, const nlohmann::json& t);

// "; X read from the device" when the agent's kernel counted its block reads
// (device_read_bytes, unsigned), else "".
std::string device_bytes(const nlohmann::json& doc);

// An agent's peer-sharing counters (`doc["peers"]`, `solar run`'s form).
std::string peers_line(const nlohmann::json& p);

}  // namespace solar::protocol

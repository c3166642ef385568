// SPDX-License-Identifier: Apache-2.0
// `solar run --stats-out`: the agents' per-node statistics files merged into one document
// (used by the launcher when the job ends; `solar report` reads it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace solar::cli {

// {"format_version": 1, "source": "solar run", "nodes": [...]}: per node m the agent's
// `dir`/node<m>.stats.json as it wrote it, or {"node": m, "missing": why} where there is none
// (no agents, the agent wrote nothing, the file does not parse); `plan` (the plan's figures,
// protocol::plan_metrics_record) as "plan" unless null.
nlohmann::json run_stats_document(const std::filesystem::path& dir, std::uint32_t nodes,
                                  bool agents, const nlohmann::json& plan = nullptr);

// Writes run_stats_document(...) to `out` atomically. Throws std::runtime_error naming
// --stats-out.
void write_run_stats(const std::string& out, const std::filesystem::path& dir,
                     std::uint32_t nodes, bool agents, const nlohmann::json& plan = nullptr);

}  // namespace solar::cli

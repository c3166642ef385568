// SPDX-License-Identifier: Apache-2.0
// The statistics files of a run (fields and units: agent/README.md), written in one schema by
// every writer: an agent's `--stats-out` (one node), `solar run --stats-out` and
// `srun --solar-stats` (every node of the run or step). A node's record is built from the
// agent's stats document (its stats reply, or the log's last line "stopped: {...}"), so the
// agent's own file and what srun makes of the log line hold the same fields.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace solar {
struct Metrics;  // solar/core/plan.h
}

namespace solar::protocol {

// A plan's figures (solar plan --json's "metrics"; the "plan" of solar run's and srun's stats
// files, which solar report draws): {accesses, remote_fetches, remote_bytes, remote_reads,
// peer_fetches, hits, hit_rate, lower_bound_fetches, ratio_to_lower_bound, lower_bound_bytes,
// ratio_bytes_to_lower_bound, peer_share_of_accesses, per_epoch: [{position, accesses, hits,
// remote_fetches, peer_fetches}]}.
nlohmann::json plan_metrics_record(const Metrics& m);

// One node's record: {"format_version": 1, node, mode, epochs_planned, steps_per_epoch,
// ranks_per_node, sample_bytes, start_step, unplanned_fetched_samples, error, epochs (the
// document's per_epoch), head_start, startup, totals, transparent, peers, cpu_seconds}.
nlohmann::json node_stats_record(const nlohmann::json& doc);

// A node without statistics: {"node": node, "missing": why}.
nlohmann::json missing_node_record(std::uint32_t node, const std::string& why);

// A run's file: {"format_version": 1, "source": source, "nodes": nodes}; `extra` (an object:
// srun's job and step ids) adds its fields.
nlohmann::json run_stats_file(const std::string& source, nlohmann::json nodes,
                              const nlohmann::json& extra = nlohmann::json::object());

// What a stats file holds: the JSON, one space of indent, a newline at the end.
std::string stats_file_text(const nlohmann::json& file);

}  // namespace solar::protocol

// SPDX-License-Identifier: Apache-2.0
#include "solar/stats_file.h"

#include "solar/core/plan.h"

namespace solar::protocol {

nlohmann::json plan_metrics_record(const Metrics& m) {
  nlohmann::json epochs = nlohmann::json::array();
  for (std::size_t p = 0; p < m.per_epoch.size(); ++p) {
    const auto& e = m.per_epoch[p];
    epochs.push_back({{"position", p},
                      {"accesses", e.accesses},
                      {"hits", e.hits},
                      {"remote_fetches", e.remote_fetches},
                      {"peer_fetches", e.peer_fetches}});
  }
  return {{"accesses", m.accesses},
          {"remote_fetches", m.remote_fetches},
          {"remote_bytes", m.remote_bytes},
          {"remote_reads", m.remote_runs},
          {"peer_fetches", m.peer_fetches},
          {"hits", m.hits},
          {"hit_rate", m.hit_rate()},
          {"lower_bound_fetches", m.lower_bound_fetches},
          {"ratio_to_lower_bound", m.ratio_to_lower_bound()},
          {"lower_bound_bytes", m.lower_bound_bytes},
          {"ratio_bytes_to_lower_bound", m.ratio_bytes_to_lower_bound()},
          {"peer_share_of_accesses", m.peer_share()},
          {"per_epoch", epochs}};
}

nlohmann::json node_stats_record(const nlohmann::json& doc) {
  auto field = [&](const char* name) { return doc.value(name, nlohmann::json()); };
  return {{"format_version", 1},
          {"node", field("node")},
          {"mode", field("mode")},
          {"epochs_planned", field("epochs")},
          {"steps_per_epoch", field("steps_per_epoch")},
          {"ranks_per_node", field("ranks_per_node")},
          {"sample_bytes", field("sample_bytes")},
          {"start_step", field("start_step")},
          {"unplanned_fetched_samples", field("unplanned_fetched_samples")},
          {"buffer", field("buffer")},
          {"error", field("error")},
          {"epochs", field("per_epoch")},
          {"head_start", field("head_start")},
          {"startup", field("startup")},
          {"totals", field("totals")},
          {"transparent", field("transparent")},
          {"peers", field("peers")},
          {"local_tier", field("local_tier")},
          {"demand", field("demand")},
          {"cpu_seconds", field("cpu_seconds")}};
}

nlohmann::json missing_node_record(std::uint32_t node, const std::string& why) {
  return {{"node", node}, {"missing", why}};
}

nlohmann::json run_stats_file(const std::string& source, nlohmann::json nodes,
                              const nlohmann::json& extra) {
  nlohmann::json out = {{"format_version", 1}, {"source", source}};
  for (const auto& [k, v] : extra.items()) out[k] = v;
  out["nodes"] = std::move(nodes);
  return out;
}

std::string stats_file_text(const nlohmann::json& file) { return file.dump(1) + '\n'; }

}  // namespace solar::protocol

#include "solar/stats_file.h"

namespace solar::protocol {

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
          {"error", field("error")},
          {"epochs", field("per_epoch")},
          {"head_start", field("head_start")},
          {"startup", field("startup")},
          {"totals", field("totals")},
          {"transparent", field("transparent")},
          {"peers", field("peers")},
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

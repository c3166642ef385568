#include "agent_lines.h"

#include <fmt/format.h>

#include "solar/core/config.h"

namespace solar::cli {

std::string transparent_line(const nlohmann::json& t, std::uint64_t total_steps) {
  const double served = t["hit_reads"].get<double>(), missed = t["miss_reads"].get<double>();
  const auto consumed = t["consumed_steps"].get<std::uint64_t>();
  return fmt::format(
      "file reads served from the buffer {:.0f} ({}), fallen through {:.0f} ({}), {:.1f}% "
      "served ({} processes attached, {} copies abandoned); {} of {} steps consumed as "
      "planned{}",
      served, format_bytes(t["hit_bytes"].get<std::uint64_t>()), missed,
      format_bytes(t["miss_bytes"].get<std::uint64_t>()),
      served + missed > 0 ? 100 * served / (served + missed) : 0.0,
      t["attached"].get<std::uint64_t>(), t["torn"].get<std::uint64_t>(), consumed, total_steps,
      consumed < total_steps ? " (the script's order differs from the plan: check --seed, "
                               "--batch, --epochs, --drop-last)"
                             : "");
}

std::string fell_through_line(const nlohmann::json& a, const nlohmann::json& t) {
  const double served = t["hit_reads"].get<double>(), missed = t["miss_reads"].get<double>();
  if (served + missed <= 0 || missed <= 0.02 * (served + missed)) return "";
  std::uint64_t steps = 0, first = 0, storage = 0, peer = 0;
  for (const auto& e : a.value("per_epoch", nlohmann::json::array())) {
    const auto& l = e.value("lead", nlohmann::json());
    if (!l.is_object()) continue;
    steps += l.value("steps", 0ULL);
    first += l.value("rank_first", 0ULL);
    storage += l.value("storage_late", 0ULL);
    peer += l.value("peer_late", 0ULL);
  }
  return fmt::format(
      "{:.1f}% of the script's file reads fell through to storage (more than 2%; {} read "
      "there instead of from the buffer): the rank began {} of {} steps before the agent had "
      "read them ({} waiting on storage reads, {} on peers' buffers); per epoch: `lead` in the "
      "stats (--stats-out, solar stat --json)",
      100 * missed / (served + missed), format_bytes(t["miss_bytes"].get<std::uint64_t>()), first,
      steps, storage, peer);
}

std::string device_bytes(const nlohmann::json& a) {
  const auto it = a.find("device_read_bytes");
  if (it == a.end() || !it->is_number_unsigned()) return "";
  return fmt::format("; {} read from the device", format_bytes(it->get<std::uint64_t>()));
}

std::string peers_line(const nlohmann::json& p) {
  return fmt::format("{} samples read from peers' buffers ({}), {} from storage instead (peer "
                     "unreachable or without the sample){}",
                     p.value("samples", 0ULL), format_bytes(p.value("bytes", 0ULL)),
                     p.value("fallbacks", 0ULL),
                     p.value("disabled", false) ? "; peer sharing was turned off" : "");
}

}  // namespace solar::cli

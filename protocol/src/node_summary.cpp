// SPDX-License-Identifier: Apache-2.0
#include "solar/node_summary.h"

#include "solar/core/units.h"  // format_bytes

#include <cstdarg>
#include <cstdio>

namespace solar::protocol {
namespace {

// printf into a std::string (the plugin links no formatting library).
[[gnu::format(printf, 1, 2)]] std::string text(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string out(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, format, again);
  va_end(again);
  return out;
}

using ull = unsigned long long;
ull count(const nlohmann::json& j, const char* name) { return j.value(name, ull{0}); }
double real(const nlohmann::json& j, const char* name) { return j.value(name, 0.0); }
double percent(double part, double whole) { return whole > 0 ? 100 * part / whole : 0.0; }

// "N hits, M samples fetched (B; D read from the device), hit rate H%"
std::string hits_part(const nlohmann::json& a) {
  const double hits = real(a, "hits"), fetched = real(a, "fetched_samples");
  return text("%.0f hits, %.0f samples fetched (%s%s), hit rate %.1f%%", hits, fetched,
              format_bytes(count(a, "bytes_read")).c_str(), device_bytes(a).c_str(),
              percent(hits, hits + fetched));
}

// "N samples read from peers' buffers (B), F from storage instead"
std::string peers_part(const nlohmann::json& p) {
  return text("%llu samples read from peers' buffers (%s), %llu from storage instead",
              count(p, "samples"), format_bytes(count(p, "bytes")).c_str(),
              count(p, "fallbacks"));
}
const char* peers_off(const nlohmann::json& p) {
  return p.value("disabled", false) ? "; peer sharing was turned off" : "";
}

// "local tier: N samples read back (B in T s), W written (B), F from storage instead (C
// corrupt, E disk errors[; off])"
std::string local_line(const nlohmann::json& l) {
  return text("local tier: %llu samples read back (%s in %.2f s), %llu written (%s), %llu from "
              "storage instead (%llu corrupt, %llu disk errors)%s",
              count(l, "reads"), format_bytes(count(l, "bytes_read")).c_str(),
              real(l, "read_seconds"), count(l, "writes"),
              format_bytes(count(l, "bytes_written")).c_str(), count(l, "from_storage"),
              count(l, "corrupt"), count(l, "errors"),
              l.value("off", false) ? "; the local tier was turned off" : "");
}

// The short form srun prints.
std::string srun_transparent_line(const nlohmann::json& t, ull total_steps, bool demand) {
  const ull consumed = count(t, "consumed_steps");
  return text("file reads served from the buffer %.0f, fallen through %.0f; %llu of %llu steps "
              "consumed as planned%s",
              real(t, "hit_reads"), real(t, "miss_reads"), consumed, total_steps,
              consumed >= total_steps ? ""
              : demand ? " (the script's order is not the plan's: demand mode)"
                       : " (the script's order differs: check --solar-seed, --solar-batch, "
                         "--solar-epochs, or give --solar-order-file)");
}

}  // namespace

std::string device_bytes(const nlohmann::json& a) {
  const auto it = a.find("device_read_bytes");
  if (it == a.end() || !it->is_number_unsigned()) return "";
  return "; " + format_bytes(it->get<std::uint64_t>()) + " read from the device";
}

std::string transparent_line(const nlohmann::json& t, std::uint64_t total_steps,
                             bool demand) {
  const double served = real(t, "hit_reads"), missed = real(t, "miss_reads");
  const ull consumed = count(t, "consumed_steps");
  // Opens of the dataset's files the interposers saw (a dataset of many files: the script's
  // opens per sample, which reach the file system whatever the buffer holds).
  const ull opens = count(t, "opens");
  return text("file reads served from the buffer %.0f (%s), fallen through %.0f (%s), %.1f%% "
              "served (%llu processes attached, %llu copies abandoned%s); %llu of %llu steps "
              "consumed as planned%s",
              served, format_bytes(count(t, "hit_bytes")).c_str(), missed,
              format_bytes(count(t, "miss_bytes")).c_str(), percent(served, served + missed),
              count(t, "attached"), count(t, "torn"),
              opens ? text(", %llu opens of the dataset's files", opens).c_str() : "", consumed,
              static_cast<ull>(total_steps),
              consumed >= total_steps ? ""
              : demand ? " (the script's order is not the plan's: demand mode)"
                       : " (the script's order differs from the plan: check --seed, --batch, "
                         "--epochs, --drop-last, or give --order-file)");
}

std::string fell_through_line(const nlohmann::json& a, const nlohmann::json& t) {
  const double served = real(t, "hit_reads"), missed = real(t, "miss_reads");
  if (served + missed <= 0 || missed <= 0.02 * (served + missed)) return "";
  ull steps = 0, first = 0, storage = 0, peer = 0;
  for (const auto& e : a.value("per_epoch", nlohmann::json::array())) {
    const auto& l = e.value("lead", nlohmann::json());
    if (!l.is_object()) continue;
    steps += count(l, "steps");
    first += count(l, "rank_first");
    storage += count(l, "storage_late");
    peer += count(l, "peer_late");
  }
  return text("%.1f%% of the script's file reads fell through to storage (more than 2%%; %s "
              "read there instead of from the buffer): the rank began %llu of %llu steps "
              "before the agent had read them (%llu waiting on storage reads, %llu on peers' "
              "buffers); per epoch: `lead` in the stats (--stats-out, solar stat --json)",
              100 * missed / (served + missed), format_bytes(count(t, "miss_bytes")).c_str(),
              first, steps, storage, peer);
}

// "demand mode from T s (why); ..., served per epoch (counted by reads): a%, b%, ..."
std::string demand_line(const nlohmann::json& d) {
  std::string epochs;
  for (const auto& e : d.value("epochs", nlohmann::json::array())) {
    const double hit = real(e, "hit_reads"), miss = real(e, "miss_reads");
    epochs += text("%s%.1f%%", epochs.empty() ? "" : ", ", percent(hit, hit + miss));
  }
  // Across the nodes (--peers): what this node keeps of the samples placed on it, and what its
  // ranks' misses found in other nodes' buffers.
  std::string pooled;
  if (const auto it = d.find("pooled"); it != d.end() && it->is_object()) {
    const auto& p = *it;
    pooled = text(" pooled over %llu nodes: %llu samples kept here (of those placed on this "
                  "node); of %llu misses asked of the others, %llu read from their buffers (%s), "
                  "%llu not held there (read from the files);",
                  count(p, "nodes"), count(p, "held_samples"), count(p, "asked"),
                  count(p, "fetched_samples"), format_bytes(count(p, "fetched_bytes")).c_str(),
                  count(p, "not_held"));
  }
  return text("demand mode from %.2f s (%s): the plan had read %llu samples (%s) by then; %llu "
              "filled from the ranks' reads (%s)%s;%s file reads served per epoch (counted by "
              "reads): %s",
              real(d, "switched_at_seconds"), d.value("why", std::string()).c_str(),
              count(d, "plan_fetched_samples"),
              format_bytes(count(d, "plan_fetched_bytes")).c_str(), count(d, "filled_samples"),
              format_bytes(count(d, "filled_bytes")).c_str(),
              d.value("full", false) ? ", the buffer full" : "", pooled.c_str(),
              epochs.empty() ? "none complete" : epochs.c_str());
}
bool in_demand_mode(const nlohmann::json& a) {
  const auto it = a.find("demand");
  return it != a.end() && it->is_object() && it->value("mode", std::string()) == "demand";
}

std::string peers_line(const nlohmann::json& p) {
  return peers_part(p) + " (peer unreachable or without the sample)" + peers_off(p);
}

std::vector<std::string> node_summary(const nlohmann::json& a, SummaryFor who) {
  std::vector<std::string> lines;
  const auto& t = a.value("transparent", nlohmann::json());
  const auto& p = a.value("peers", nlohmann::json());
  const auto& l = a.value("local_tier", nlohmann::json());
  if (who == SummaryFor::srun) {
    lines.push_back(hits_part(a));
    if (p.is_object()) lines.push_back(peers_part(p) + peers_off(p));
    if (t.is_object())
      lines.push_back(srun_transparent_line(t, count(a, "total_steps"), in_demand_mode(a)));
    if (in_demand_mode(a)) lines.push_back(demand_line(a["demand"]));
    return lines;
  }
  lines.push_back(text("%llu steps, ", count(a, "ready_steps")) + hits_part(a) +
                  text(", storage read time %.2f s", real(a, "read_seconds")));
  if (const ull start = count(a, "start_step"); start > 0)
    lines.push_back(text("started at step %llu: steps before it neither read nor served; %llu "
                         "samples read that the plan had in the buffer by then",
                         start, count(a, "unplanned_fetched_samples")));
  if (t.is_object()) {
    lines.push_back(transparent_line(t, count(a, "total_steps"), in_demand_mode(a)));
    if (in_demand_mode(a)) lines.push_back(demand_line(a["demand"]));
    if (std::string behind = fell_through_line(a, t); !behind.empty())
      lines.push_back(std::move(behind));
  }
  if (p.is_object()) lines.push_back(peers_line(p));
  if (l.is_object()) lines.push_back(local_line(l));
  return lines;
}

}  // namespace solar::protocol

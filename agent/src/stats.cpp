// The stats reply (and the end-of-run log line). See agent_impl.h.
#include <algorithm>
#include <atomic>

#include "agent_impl.h"

namespace solar::agent {

nlohmann::json Agent::Impl::transparent_json() const {
  auto get = [](const std::uint64_t& v) {
    return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(v)).load(std::memory_order_relaxed);
  };
  const solar_xstats& x = xindex_->stats;
  return {{"hit_reads", get(x.hit_reads)},   {"hit_bytes", get(x.hit_bytes)},
          {"miss_reads", get(x.miss_reads)}, {"miss_bytes", get(x.miss_bytes)},
          {"torn", get(x.torn)},             {"attached", get(x.attached)},
          {"consumed_steps", paced_steps_}};
}

std::string Agent::Impl::stats_json() {
  std::lock_guard lk(mu_);
  nlohmann::json ranks = nlohmann::json::array();
  std::uint64_t min_cursor = T_;
  for (std::uint32_t r = 0; r < R_; ++r) {
    const RankState& rs = ranks_[r];
    ranks.push_back({{"local_rank", r},
                     {"attached", rs.attached && !rs.gone},
                     {"step", rs.cursor},
                     {"released", rs.released},
                     {"stall_seconds", rs.stall_seconds}});
    if (!rs.gone) min_cursor = std::min(min_cursor, rs.cursor);
  }
  const nlohmann::json j = {
      {"node", opt_.node},
      {"total_steps", T_},
      {"steps_per_epoch", header_.layout.steps},
      {"epochs", header_.config.epochs},
      {"ready_steps", ready_},
      {"ahead_steps", static_cast<std::int64_t>(ready_) - static_cast<std::int64_t>(min_cursor)},
      {"hits", hits_},
      {"fetched_samples", fetched_},
      {"bytes_read", bytes_read_},
      {"storage_reads", reads_},
      {"read_seconds", read_seconds_},
      {"slot_wait_seconds", slot_wait_seconds_},
      {"slots", buf_.slots},
      {"cache_slots", buf_.cache_slots},
      {"free_slots", table_.free_slots()},
      {"uptime_seconds", seconds_since(started_)},
      {"error", fatal_},
      {"transparent", xindex_ ? transparent_json() : nlohmann::json()},
      {"ranks", ranks}};
  return j.dump();
}

}  // namespace solar::agent

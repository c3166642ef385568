// SPDX-License-Identifier: Apache-2.0
// The stats document: the node's state (ranks, slots, peers, the process's CPU and device
// reads) and what NodeStats measured (node_stats.h), as the stats reply, the end-of-run log
// line and the --stats-out file; --stats-out checked at start-up. See agent/README.md (the
// fields and their units).
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>

#include "agent_impl.h"
#include "solar/stats_file.h"
#include "solar/sys/atomic_file.h"

namespace solar::agent {

namespace {

// This process's CPU time so far, user and system, all threads: on a machine whose cores the
// ranks share, what the agent took from them.
double cpu_seconds() {
  struct rusage ru {};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

// What this process (all its threads) had the block layer read for it: /proc/self/io's
// read_bytes, readahead and O_DIRECT included, page-cache hits not. Null where the kernel
// keeps no such count (no CONFIG_TASK_IO_ACCOUNTING) or /proc is not mounted.
nlohmann::json device_read_bytes() {
  std::FILE* f = std::fopen("/proc/self/io", "re");
  if (!f) return {};
  char line[128];
  nlohmann::json out;
  unsigned long long v = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "read_bytes: %llu", &v) == 1) {
      out = static_cast<std::uint64_t>(v);
      break;
    }
  std::fclose(f);
  return out;
}

namespace fs = std::filesystem;

fs::path stats_out_dir(const fs::path& p) {
  return p.has_parent_path() ? p.parent_path() : fs::path(".");
}

// A temporary file beside `path` (mode 0600, as mkstemp makes it); -1 and errno on failure.
int temp_beside(const fs::path& path, std::string& temp) {
  temp = (stats_out_dir(path) / ("." + path.filename().string() + ".XXXXXX")).string();
  return ::mkstemp(temp.data());
}

}  // namespace

void check_stats_out(const std::string& path) {
  if (path.empty()) return;
  const fs::path p(path);
  std::error_code ec;
  if (!p.has_filename() || fs::is_directory(p, ec))
    throw AgentError(fmt::format("--stats-out {}: is a folder; give the file to write (e.g. "
                                 "{}/agent-stats.json)",
                                 path, path));
  const fs::path dir = stats_out_dir(p);
  if (!fs::is_directory(dir, ec))
    throw AgentError(fmt::format("--stats-out {}: the folder {} does not exist; create it or "
                                 "choose another path",
                                 path, dir.string()));
  // What the exit will do, tried now: a temporary file beside it (then removed).
  std::string temp;
  const int fd = temp_beside(p, temp);
  if (fd < 0)
    throw AgentError(fmt::format("--stats-out {}: cannot create a file in {}: {}", path,
                                 dir.string(), std::strerror(errno)));
  ::close(fd);
  ::unlink(temp.c_str());
}

// ---- the stats document ------------------------------------------------------------------

nlohmann::json Agent::Impl::stats_document() {
  // Under the lock: the node's state and a snapshot of what stats_ measured; the records' JSON
  // is built after, without holding up the ranks.
  nlohmann::json j;
  NodeStats::Snapshot snap;
  double max_rank_stall = 0;
  {
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
      max_rank_stall = std::max(max_rank_stall, rs.stall_seconds);
    }
    j = {{"ready_steps", ready_},
         {"ahead_steps",
          static_cast<std::int64_t>(ready_) - static_cast<std::int64_t>(min_cursor)},
         {"device_read_bytes", device_read_bytes()},
         {"storage_requests", source_->requests()},
         {"cpu_seconds", cpu_seconds()},
         {"slots", buf_.slots},
         {"cache_slots", buf_.cache_slots},
         {"free_slots", table_.free_slots()},
         {"error", fatal_},
         // The buffer: the memfd, the plan's resident set, and for samples of differing sizes
         // the arena it needs as extents and the samples left to the ranks for want of one.
         {"buffer",
          {{"bytes", buf_.map_bytes},
           {"plan_bytes", header_.config.buffer_bytes},
           {"sized", header_.config.sized()},
           {"arena_bytes", arena_bytes_},
           {"unplaced_samples", prefetch_.unplaced_locked()}}},
         {"transparent", stats_.transparent_json(pacer_.paced_steps_locked())},
         {"demand", pacer_.demand_json_locked()},
         {"peers", peers_.json()},
         {"local_tier", local_.stats_json_locked()},
         {"ranks", ranks}};
    snap = stats_.snapshot(ready_);
  }
  stats_.put(j, snap, max_rank_stall);
  return j;
}

void Agent::Impl::write_stats_out(const nlohmann::json& doc) {
  const std::string text = protocol::stats_file_text(protocol::node_stats_record(doc));
  if (const char* failed = sys::write_file_atomically(opt_.stats_out, text, 0600)) {
    spdlog::error("--stats-out {}: {}: {}", opt_.stats_out, failed, std::strerror(errno));
    if (exit_code_ == 0) exit_code_ = 1;
    return;
  }
  spdlog::debug("statistics written to {}", opt_.stats_out);
}

}  // namespace solar::agent

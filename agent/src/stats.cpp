// Statistics: the per-epoch records and the head start (measured as the agent works), the
// stats reply, the end-of-run log line and the --stats-out file. See agent_impl.h and
// agent/README.md (the fields and their units).
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

namespace solar::agent {

namespace {

double since(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// This process's CPU time so far, user and system, all threads: on a machine whose cores the
// ranks share, what the agent took from them.
double cpu_seconds() {
  struct rusage ru {};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

// A measured value, or null where the mode does not measure it.
nlohmann::json maybe(bool measured, double v) {
  return measured ? nlohmann::json(v) : nlohmann::json();
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

// ---- measuring (mu_ held) ------------------------------------------------------------------

void Agent::Impl::note_request_locked(std::uint64_t t, Clock::time_point now) {
  if (t >= T_) return;
  const double at = since(ready_at_, now);
  if (!head_.requested) head_ = {true, at, fetched_done_, bytes_read_, ready_};
  EpochStats& e = epochs_[epoch_of(t)];
  if (e.start < 0) e.start = at;
}

void Agent::Impl::note_served_locked(std::uint64_t t, std::uint32_t r, std::uint64_t samples,
                                     std::uint64_t hits, double wait) {
  const std::uint64_t ep = epoch_of(t);
  EpochStats& e = epochs_[ep];
  e.samples_served += samples;
  e.hits += hits;
  ++e.batches_served;
  if (wait < 0) return;
  const auto now = Clock::now();
  if (startup_.first_batch[r] == Clock::time_point{}) startup_.first_batch[r] = now;
  startup_.last_batch[r] = now;
  e.stall_seconds += wait;
  e.stall_max_wait_seconds = std::max(e.stall_max_wait_seconds, wait);
  epoch_rank_stall_[ep * R_ + r] += wait;
}

void Agent::Impl::note_released_locked(std::uint64_t t, Clock::time_point now) {
  const std::uint64_t ep = epoch_of(t);
  EpochStats& e = epochs_[ep];
  e.end = since(ready_at_, now);
  if (t % header_.layout.steps != header_.layout.steps - 1 || ++e.ranks_done < R_) return;
  // Every rank has released the epoch's last step: it is complete (epochs complete in order,
  // each rank releasing its steps in order). The interposers' reads since the previous epoch
  // completed are this one's.
  epochs_done_ = std::max(epochs_done_, ep + 1);
  if (xindex_) {
    std::uint64_t x[4];
    read_xstats(x);
    for (int i = 0; i < 4; ++i) {
      e.file_reads[i] = x[i] - xsnap_[i];
      xsnap_[i] = x[i];
    }
  }
}

void Agent::Impl::note_read_locked(std::uint64_t t, std::uint64_t samples, std::uint64_t runs,
                                   double secs) {
  EpochStats& e = epochs_[epoch_of(t)];
  if (t < storage_landed_.size())
    storage_landed_[t] = static_cast<float>(since(ready_at_, Clock::now()));
  e.fetched_samples += samples;
  e.storage_reads += runs;
  e.read_seconds += secs;
  fetched_done_ += samples;
  if (startup_.first_read == Clock::time_point{}) startup_.first_read = Clock::now();
}

void Agent::Impl::note_begun_locked(std::uint64_t t, double at) {
  if (t >= storage_landed_.size()) return;
  EpochStats& e = epochs_[epoch_of(t)];
  const double s = storage_landed_[t], p = peer_landed_[t];
  if (s > at) ++e.late_storage;
  if (p > at) ++e.late_peer;
  e.lead.push_back(static_cast<float>(at - std::max({s, p, 0.0})));
}

void Agent::Impl::read_xstats(std::uint64_t out[4]) const {
  auto get = [](const std::uint64_t& v) {
    return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(v))
        .load(std::memory_order_relaxed);
  };
  const solar_xstats& x = xindex_->stats;
  out[0] = get(x.hit_reads);
  out[1] = get(x.hit_bytes);
  out[2] = get(x.miss_reads);
  out[3] = get(x.miss_bytes);
}

// ---- reporting -----------------------------------------------------------------------------

nlohmann::json Agent::Impl::transparent_json() const {
  auto get = [](const std::uint64_t& v) {
    return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(v)).load(std::memory_order_relaxed);
  };
  const solar_xstats& x = xindex_->stats;
  return {{"hit_reads", get(x.hit_reads)},   {"hit_bytes", get(x.hit_bytes)},
          {"miss_reads", get(x.miss_reads)}, {"miss_bytes", get(x.miss_bytes)},
          {"torn", get(x.torn)},             {"attached", get(x.attached)},
          {"waited_reads", get(x.waited_reads)},
          {"waited_seconds", static_cast<double>(get(x.waited_ns)) * 1e-9},
          {"consumed_steps", paced_steps_}};
}

nlohmann::json Agent::Impl::stats_document() {
  // Under the lock: the run totals (as before) and a copy of the per-epoch records; the
  // records' JSON is built after, without holding up the ranks.
  nlohmann::json j;
  std::vector<EpochStats> eps;
  std::vector<double> rank_stall;
  HeadStart head;
  Startup stages;
  std::uint64_t epochs_done = 0, xsnap[4] = {}, xnow[4] = {};
  double max_rank_stall = 0, slot_wait = 0;
  Clock::time_point now;
  {
    std::lock_guard lk(mu_);
    now = Clock::now();
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
    j = {{"node", opt_.node},
         {"total_steps", T_},
         {"steps_per_epoch", header_.layout.steps},
         {"epochs", header_.config.epochs},
         {"sample_bytes", sample_bytes_},
         {"ranks_per_node", R_},
         {"mode", opt_.transparent ? "transparent" : opt_.zero_copy ? "zero_copy" : "ring"},
         {"start_step", start_},
         {"unplanned_fetched_samples", unplanned_},
         {"ready_steps", ready_},
         {"ahead_steps",
          static_cast<std::int64_t>(ready_) - static_cast<std::int64_t>(min_cursor)},
         {"hits", hits_},
         {"fetched_samples", fetched_},
         {"bytes_read", bytes_read_},
         {"device_read_bytes", device_read_bytes()},
         {"storage_reads", reads_},
         {"storage_requests", source_->requests()},
         {"read_seconds", read_seconds_},
         {"cpu_seconds", cpu_seconds()},
         {"slot_wait_seconds", slot_wait_seconds_},
         {"slots", buf_.slots},
         {"cache_slots", buf_.cache_slots},
         {"free_slots", table_.free_slots()},
         {"uptime_seconds", seconds_since(started_)},
         {"error", fatal_},
         {"transparent", xindex_ ? transparent_json() : nlohmann::json()},
         {"peers", peers_json()},
         {"ranks", ranks}};
    eps = epochs_;
    rank_stall = epoch_rank_stall_;
    head = head_;
    stages = startup_;
    if (!head.requested) {  // so far
      head.fetched_samples = fetched_done_;
      head.fetched_bytes = bytes_read_;
      head.ready_steps = ready_;
    }
    head.ready_steps -= start_;  // read by then (steps before the start never are)
    epochs_done = epochs_done_;
    std::copy(std::begin(xsnap_), std::end(xsnap_), xsnap);
    slot_wait = slot_wait_seconds_;
  }
  if (xindex_) read_xstats(xnow);

  const bool stall = !opt_.transparent;  // unmodified ranks send no requests to time
  const std::uint32_t S = header_.layout.steps;
  nlohmann::json per_epoch = nlohmann::json::array();
  struct {
    std::uint64_t hits = 0, fetched = 0, reads = 0, samples = 0, batches = 0;
    double read_s = 0, stall_s = 0, max_wait = 0, first = -1, last = -1;
  } tot;
  for (std::size_t e = 0; e < eps.size(); ++e) {
    const EpochStats& x = eps[e];
    double max_rank = 0;
    for (std::uint32_t r = 0; r < R_; ++r)
      max_rank = std::max(max_rank, rank_stall[e * R_ + r]);
    nlohmann::json o = {
        {"epoch", e},
        {"steps", S},
        {"started", x.start >= 0},
        {"complete", R_ > 0 && x.ranks_done >= R_},
        {"hits", x.hits},
        {"fetched_samples", x.fetched_samples},
        {"fetched_bytes", x.fetched_samples * sample_bytes_},
        {"storage_reads", x.storage_reads},
        {"peer_samples", x.peer_samples},
        {"read_seconds", x.read_seconds},
        {"samples_served", x.samples_served},
        {"batches_served", x.batches_served},
        {"stall_seconds", maybe(stall, x.stall_seconds)},
        {"stall_max_rank_seconds", maybe(stall, max_rank)},
        {"stall_max_wait_seconds", maybe(stall, x.stall_max_wait_seconds)},
        {"start_seconds", maybe(x.start >= 0, x.start)},
        {"end_seconds", maybe(x.end >= 0, x.end)},
        {"wall_seconds", maybe(x.start >= 0 && x.end >= 0, x.end - x.start)}};
    if (xindex_) {
      std::uint64_t fr[4] = {};
      for (int i = 0; i < 4; ++i)
        fr[i] = e < epochs_done ? x.file_reads[i] : e == epochs_done ? xnow[i] - xsnap[i] : 0;
      o["file_reads"] = {{"hit_reads", fr[0]},
                         {"hit_bytes", fr[1]},
                         {"miss_reads", fr[2]},
                         {"miss_bytes", fr[3]}};
      // How far ahead of the ranks the agent was: per (step, rank), when the rank began the
      // step minus when its reads had landed (storage and peers); the rank first where < 0.
      std::vector<float> lead = x.lead;
      std::sort(lead.begin(), lead.end());
      auto q = [&](double f) {
        return lead.empty() ? nlohmann::json()
                            : nlohmann::json(lead[static_cast<std::size_t>(f * static_cast<double>(lead.size() - 1))]);
      };
      o["lead"] = {{"steps", lead.size()},
                   {"rank_first", std::count_if(lead.begin(), lead.end(),
                                                [](float v) { return v < 0; })},
                   {"storage_late", x.late_storage},
                   {"peer_late", x.late_peer},
                   {"min_seconds", q(0)},
                   {"p10_seconds", q(0.1)},
                   {"median_seconds", q(0.5)}};
    }
    per_epoch.push_back(std::move(o));
    tot.hits += x.hits;
    tot.fetched += x.fetched_samples;
    tot.reads += x.storage_reads;
    tot.samples += x.samples_served;
    tot.batches += x.batches_served;
    tot.read_s += x.read_seconds;
    tot.stall_s += x.stall_seconds;
    tot.max_wait = std::max(tot.max_wait, x.stall_max_wait_seconds);
    if (x.start >= 0 && (tot.first < 0 || x.start < tot.first)) tot.first = x.start;
    tot.last = std::max(tot.last, x.end);
  }
  const double startup = since(started_, ready_at_);
  j["per_epoch"] = std::move(per_epoch);
  j["head_start"] = {{"requested", head.requested},
                     {"seconds", maybe(head.requested, head.seconds)},
                     {"since_start_seconds", maybe(head.requested, startup + head.seconds)},
                     {"startup_seconds", startup},
                     {"fetched_samples", head.fetched_samples},
                     {"fetched_bytes", head.fetched_bytes},
                     {"ready_steps", head.ready_steps}};
  // Monotonic seconds (CLOCK_MONOTONIC, as steady_clock), null where it has not happened.
  auto mono = [](Clock::time_point t) {
    return t == Clock::time_point{}
               ? nlohmann::json()
               : nlohmann::json(std::chrono::duration<double>(t.time_since_epoch()).count());
  };
  nlohmann::json first_batch = nlohmann::json::array(), last_batch = nlohmann::json::array();
  for (std::uint32_t r = 0; r < R_; ++r) {
    first_batch.push_back(mono(stages.first_batch[r]));
    last_batch.push_back(mono(stages.last_batch[r]));
  }
  j["startup"] = {{"started", mono(started_)},
                  {"plan_read", mono(stages.plan_read)},
                  {"source_opened", mono(stages.source_opened)},
                  {"buffer_ready", mono(stages.buffer_ready)},
                  {"listening", mono(stages.listening)},
                  {"ready", mono(ready_at_)},
                  {"first_read", mono(stages.first_read)},
                  {"first_batch", std::move(first_batch)},
                  {"last_batch", std::move(last_batch)}};
  j["totals"] = {{"hits", tot.hits},
                 {"fetched_samples", tot.fetched},
                 {"fetched_bytes", tot.fetched * sample_bytes_},
                 {"storage_reads", tot.reads},
                 {"read_seconds", tot.read_s},
                 {"samples_served", tot.samples},
                 {"batches_served", tot.batches},
                 {"stall_seconds", maybe(stall, tot.stall_s)},
                 {"stall_max_rank_seconds", maybe(stall, max_rank_stall)},
                 {"stall_max_wait_seconds", maybe(stall, tot.max_wait)},
                 {"wall_seconds", maybe(tot.first >= 0 && tot.last >= 0, tot.last - tot.first)},
                 {"run_seconds", since(ready_at_, now)},
                 {"slot_wait_seconds", slot_wait},
                 {"epochs_complete", epochs_done}};
  return j;
}

// The reply must fit one message (protocol::kMaxPayload): with very many epochs the oldest
// records are left out of it (per_epoch_omitted says how many; the log line and --stats-out
// keep them all).
std::string Agent::Impl::stats_reply() {
  nlohmann::json j = stats_document();
  j["per_epoch_omitted"] = 0;
  std::string out = j.dump();
  std::size_t omitted = 0;
  while (out.size() > protocol::kMaxPayload && !j["per_epoch"].empty()) {
    auto& pe = j["per_epoch"];
    const std::size_t per = std::max<std::size_t>(1, pe.dump().size() / pe.size());
    const std::size_t drop =
        std::min(pe.size(), (out.size() - protocol::kMaxPayload) / per + 1);
    pe.erase(pe.begin(), pe.begin() + static_cast<std::ptrdiff_t>(drop));
    omitted += drop;
    j["per_epoch_omitted"] = omitted;
    out = j.dump();
  }
  return out;
}

void Agent::Impl::write_stats_out(const nlohmann::json& doc) {
  const nlohmann::json file = {
      {"format_version", 1},
      {"node", opt_.node},
      {"mode", opt_.transparent ? "transparent" : opt_.zero_copy ? "zero_copy" : "ring"},
      {"epochs_planned", header_.config.epochs},
      {"steps_per_epoch", header_.layout.steps},
      {"ranks_per_node", R_},
      {"sample_bytes", sample_bytes_},
      {"start_step", start_},
      {"unplanned_fetched_samples", doc["unplanned_fetched_samples"]},
      {"error", doc["error"]},
      {"epochs", doc["per_epoch"]},
      {"head_start", doc["head_start"]},
      {"startup", doc["startup"]},
      {"totals", doc["totals"]},
      {"transparent", doc["transparent"]},
      {"peers", doc["peers"]},
      {"cpu_seconds", doc["cpu_seconds"]}};
  const std::string text = file.dump(1) + "\n";
  if (const char* failed = write_file_atomically(opt_.stats_out, text, 0600)) {
    spdlog::error("--stats-out {}: {}: {}", opt_.stats_out, failed, std::strerror(errno));
    if (exit_code_ == 0) exit_code_ = 1;
    return;
  }
  spdlog::debug("statistics written to {}", opt_.stats_out);
}

}  // namespace solar::agent

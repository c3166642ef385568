// SPDX-License-Identifier: Apache-2.0
// The agent's measurements and their JSON. See node_stats.h and agent/README.md (the fields
// and their units).
#include "node_stats.h"

#include <algorithm>
#include <atomic>
#include <iterator>

namespace solar::agent {

namespace {

using Clock = NodeStats::Clock;

double since(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// A measured value, or null where the mode does not measure it.
nlohmann::json maybe(bool measured, double v) {
  return measured ? nlohmann::json(v) : nlohmann::json();
}

std::uint64_t relaxed(const std::uint64_t& v) {
  return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(v))
      .load(std::memory_order_relaxed);
}

}  // namespace

NodeStats::NodeStats(const Config& c, Clock::time_point started)
    : cfg_(c), started_(started), ready_at_(started) {
  if (cfg_.steps_per_epoch == 0) cfg_.steps_per_epoch = 1;
  epochs_.resize(cfg_.epochs);
  epoch_rank_stall_.assign(std::uint64_t{cfg_.epochs} * cfg_.ranks, 0.0);
  startup_.first_batch.resize(cfg_.ranks);
  startup_.last_batch.resize(cfg_.ranks);
}

void NodeStats::track_landing() {
  storage_landed_.assign(cfg_.total_steps, -1.0F);
  peer_landed_.assign(cfg_.total_steps, -1.0F);
}

void NodeStats::mark(Stage s, Clock::time_point t) {
  switch (s) {
    case Stage::plan_read: startup_.plan_read = t; break;
    case Stage::source_opened: startup_.source_opened = t; break;
    case Stage::buffer_ready: startup_.buffer_ready = t; break;
    case Stage::listening: startup_.listening = t; break;
  }
}

double NodeStats::since_ready(Clock::time_point now) const { return since(ready_at_, now); }

// ---- measuring (the agent's lock held) -----------------------------------------------------

void NodeStats::note_request(std::uint64_t t, Clock::time_point now, std::uint64_t ready_steps) {
  if (t >= cfg_.total_steps) return;
  const double at = since(ready_at_, now);
  if (!head_.requested) head_ = {true, at, fetched_done_, bytes_read_, ready_steps};
  EpochStats& e = epochs_[epoch_of(t)];
  if (e.start < 0) e.start = at;
}

void NodeStats::note_served(std::uint64_t t, std::uint32_t r, std::uint64_t samples,
                            std::uint64_t hits, double wait, Clock::time_point now) {
  const std::uint64_t ep = epoch_of(t);
  EpochStats& e = epochs_[ep];
  e.samples_served += samples;
  e.hits += hits;
  ++e.batches_served;
  if (wait < 0) return;
  if (startup_.first_batch[r] == Clock::time_point{}) startup_.first_batch[r] = now;
  startup_.last_batch[r] = now;
  e.stall_seconds += wait;
  e.stall_max_wait_seconds = std::max(e.stall_max_wait_seconds, wait);
  epoch_rank_stall_[ep * cfg_.ranks + r] += wait;
}

void NodeStats::note_released(std::uint64_t t, Clock::time_point now) {
  const std::uint64_t ep = epoch_of(t);
  EpochStats& e = epochs_[ep];
  e.end = since(ready_at_, now);
  if (t % cfg_.steps_per_epoch != cfg_.steps_per_epoch - 1 || ++e.ranks_done < cfg_.ranks)
    return;
  // Every rank has released the epoch's last step: it is complete (epochs complete in order,
  // each rank releasing its steps in order). The interposers' reads since the previous epoch
  // completed are this one's.
  epochs_done_ = std::max(epochs_done_, ep + 1);
  if (xstats_) {
    std::uint64_t x[4];
    read_xstats(x);
    for (int i = 0; i < 4; ++i) {
      e.file_reads[i] = x[i] - xsnap_[i];
      xsnap_[i] = x[i];
    }
  }
}

void NodeStats::note_read(std::uint64_t t, std::uint64_t samples, std::uint64_t runs,
                          double seconds, Clock::time_point now) {
  EpochStats& e = epochs_[epoch_of(t)];
  if (t < storage_landed_.size()) storage_landed_[t] = static_cast<float>(since(ready_at_, now));
  read_seconds_ += seconds;
  reads_ += runs;
  bytes_read_ += samples * cfg_.sample_bytes;
  e.fetched_samples += samples;
  e.storage_reads += runs;
  e.read_seconds += seconds;
  fetched_done_ += samples;
  if (startup_.first_read == Clock::time_point{}) startup_.first_read = now;
}

void NodeStats::note_peer_read(std::uint64_t t, Clock::time_point now) {
  ++epochs_[epoch_of(t)].peer_samples;
  if (t < peer_landed_.size()) peer_landed_[t] = static_cast<float>(since(ready_at_, now));
}

void NodeStats::note_begun(std::uint64_t t, double at) {
  if (t >= storage_landed_.size()) return;
  EpochStats& e = epochs_[epoch_of(t)];
  const double s = storage_landed_[t], p = peer_landed_[t];
  if (s > at) ++e.late_storage;
  if (p > at) ++e.late_peer;
  e.lead.push_back(static_cast<float>(at - std::max({s, p, 0.0})));
}

void NodeStats::read_xstats(std::uint64_t out[4]) const {
  const solar_xstats& x = *xstats_;
  out[0] = relaxed(x.hit_reads);
  out[1] = relaxed(x.hit_bytes);
  out[2] = relaxed(x.miss_reads);
  out[3] = relaxed(x.miss_bytes);
}

NodeStats::Snapshot NodeStats::snapshot(std::uint64_t ready_steps, Clock::time_point now) const {
  Snapshot s;
  s.now = now;
  s.hits = hits_;
  s.fetched = fetched_;
  s.unplanned = unplanned_;
  s.bytes_read = bytes_read_;
  s.reads = reads_;
  s.read_seconds = read_seconds_;
  s.slot_wait_seconds = slot_wait_seconds_;
  s.epochs = epochs_;
  s.rank_stall = epoch_rank_stall_;
  s.head = head_;
  s.startup = startup_;
  if (!s.head.requested) {  // so far
    s.head.fetched_samples = fetched_done_;
    s.head.fetched_bytes = bytes_read_;
    s.head.ready_steps = ready_steps;
  }
  s.head.ready_steps -= cfg_.start_step;  // read by then (steps before the start never are)
  s.epochs_done = epochs_done_;
  std::copy(std::begin(xsnap_), std::end(xsnap_), s.xsnap);
  return s;
}

// ---- reporting -----------------------------------------------------------------------------

nlohmann::json NodeStats::transparent_json(std::uint64_t consumed_steps) const {
  if (!xstats_) return {};
  const solar_xstats& x = *xstats_;
  return {{"hit_reads", relaxed(x.hit_reads)},   {"hit_bytes", relaxed(x.hit_bytes)},
          {"miss_reads", relaxed(x.miss_reads)}, {"miss_bytes", relaxed(x.miss_bytes)},
          {"torn", relaxed(x.torn)},             {"attached", relaxed(x.attached)},
          {"waited_reads", relaxed(x.waited_reads)},
          {"waited_seconds", static_cast<double>(relaxed(x.waited_ns)) * 1e-9},
          {"opens", relaxed(x.opens)},
          {"asked_reads", relaxed(x.asked_reads)},
          {"asked_served", relaxed(x.asked_served)},
          {"consumed_steps", consumed_steps}};
}

void NodeStats::put(nlohmann::json& j, const Snapshot& s, double max_rank_stall) const {
  j["node"] = cfg_.node;
  j["total_steps"] = cfg_.total_steps;
  j["steps_per_epoch"] = cfg_.steps_per_epoch;
  j["epochs"] = cfg_.epochs;
  j["sample_bytes"] = cfg_.sample_bytes;
  j["ranks_per_node"] = cfg_.ranks;
  j["mode"] = cfg_.mode;
  j["start_step"] = cfg_.start_step;
  j["unplanned_fetched_samples"] = s.unplanned;
  j["hits"] = s.hits;
  j["fetched_samples"] = s.fetched;
  j["bytes_read"] = s.bytes_read;
  j["storage_reads"] = s.reads;
  j["read_seconds"] = s.read_seconds;
  j["slot_wait_seconds"] = s.slot_wait_seconds;
  j["uptime_seconds"] = since(started_, s.now);

  std::uint64_t xnow[4] = {};
  if (xstats_) read_xstats(xnow);
  const bool stall = stall_measured();
  const std::uint32_t S = cfg_.steps_per_epoch, R = cfg_.ranks;
  nlohmann::json per_epoch = nlohmann::json::array();
  struct {
    std::uint64_t hits = 0, fetched = 0, reads = 0, samples = 0, batches = 0;
    double read_s = 0, stall_s = 0, max_wait = 0, first = -1, last = -1;
  } tot;
  for (std::size_t e = 0; e < s.epochs.size(); ++e) {
    const EpochStats& x = s.epochs[e];
    double max_rank = 0;
    for (std::uint32_t r = 0; r < R; ++r) max_rank = std::max(max_rank, s.rank_stall[e * R + r]);
    nlohmann::json o = {
        {"epoch", e},
        {"steps", S},
        {"started", x.start >= 0},
        {"complete", R > 0 && x.ranks_done >= R},
        {"hits", x.hits},
        {"fetched_samples", x.fetched_samples},
        {"fetched_bytes", x.fetched_samples * cfg_.sample_bytes},
        {"storage_reads", x.storage_reads},
        {"peer_samples", x.peer_samples},
        {"local_samples", x.local_samples},
        {"read_seconds", x.read_seconds},
        {"samples_served", x.samples_served},
        {"batches_served", x.batches_served},
        {"stall_seconds", maybe(stall, x.stall_seconds)},
        {"stall_max_rank_seconds", maybe(stall, max_rank)},
        {"stall_max_wait_seconds", maybe(stall, x.stall_max_wait_seconds)},
        {"start_seconds", maybe(x.start >= 0, x.start)},
        {"end_seconds", maybe(x.end >= 0, x.end)},
        {"wall_seconds", maybe(x.start >= 0 && x.end >= 0, x.end - x.start)}};
    if (xstats_) {
      std::uint64_t fr[4] = {};
      for (int i = 0; i < 4; ++i)
        fr[i] = e < s.epochs_done    ? x.file_reads[i]
                : e == s.epochs_done ? xnow[i] - s.xsnap[i]
                                     : 0;
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
                            : nlohmann::json(lead[static_cast<std::size_t>(
                                  f * static_cast<double>(lead.size() - 1))]);
      };
      o["lead"] = {{"steps", lead.size()},
                   {"rank_first",
                    std::count_if(lead.begin(), lead.end(), [](float v) { return v < 0; })},
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
  const HeadStart& head = s.head;
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
  const Startup& stages = s.startup;
  nlohmann::json first_batch = nlohmann::json::array(), last_batch = nlohmann::json::array();
  for (std::uint32_t r = 0; r < R; ++r) {
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
                 {"fetched_bytes", tot.fetched * cfg_.sample_bytes},
                 {"storage_reads", tot.reads},
                 {"read_seconds", tot.read_s},
                 {"samples_served", tot.samples},
                 {"batches_served", tot.batches},
                 {"stall_seconds", maybe(stall, tot.stall_s)},
                 {"stall_max_rank_seconds", maybe(stall, max_rank_stall)},
                 {"stall_max_wait_seconds", maybe(stall, tot.max_wait)},
                 {"wall_seconds", maybe(tot.first >= 0 && tot.last >= 0, tot.last - tot.first)},
                 {"run_seconds", since(ready_at_, s.now)},
                 {"slot_wait_seconds", s.slot_wait_seconds},
                 {"epochs_complete", s.epochs_done}};
}

std::string NodeStats::reply(nlohmann::json j, std::size_t max_bytes) {
  j["per_epoch_omitted"] = 0;
  std::string out = j.dump();
  std::size_t omitted = 0;
  while (out.size() > max_bytes && !j["per_epoch"].empty()) {
    auto& pe = j["per_epoch"];
    const std::size_t per = std::max<std::size_t>(1, pe.dump().size() / pe.size());
    const std::size_t drop = std::min(pe.size(), (out.size() - max_bytes) / per + 1);
    pe.erase(pe.begin(), pe.begin() + static_cast<std::ptrdiff_t>(drop));
    omitted += drop;
    j["per_epoch_omitted"] = omitted;
    out = j.dump();
  }
  return out;
}

}  // namespace solar::agent

// SPDX-License-Identifier: Apache-2.0
// What one agent measured as it worked, and its JSON: the run's counters, the per-epoch
// records, the head start and the start-up stages, reported in the stats document (the stats
// reply, the log's last line "stopped: {...}", --stats-out; fields and units in
// agent/README.md). No threads, no I/O and no lock of its own: the agent calls every note_*,
// mark and snapshot with its mutex held (the readers, the io thread, the pacer and the peer
// thread all note into it); put() builds JSON from a snapshot without it. The
// transparent interposers' counters (solar_xstats) are atomics in the shared buffer, read
// with relaxed loads at any time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "solar/protocol.h"
#include "solar/transparent.h"

namespace solar::agent {

class NodeStats {
 public:
  using Clock = std::chrono::steady_clock;
  struct Config {
    std::uint32_t node = 0;
    std::string mode = "ring";  // "ring", "zero_copy" or "transparent"
    std::uint32_t epochs = 0, steps_per_epoch = 1, ranks = 0;
    std::uint64_t total_steps = 0;  // epochs × steps_per_epoch
    std::uint64_t sample_bytes = 0;
    std::uint64_t start_step = 0;  // --start-step
  };
  // The moments of start-up as they happened ("startup" in the stats). steady_clock is
  // CLOCK_MONOTONIC, so `solar run` places these on its own timeline (cli/cmd_run.cpp).
  enum class Stage { plan_read, source_opened, buffer_ready, listening };

  NodeStats() = default;
  // `started`: the agent's start (the "startup" timeline begins there, and so does `ready`
  // until set_ready).
  explicit NodeStats(const Config& c, Clock::time_point started = Clock::now());
  const Config& config() const { return cfg_; }
  // Unmodified ranks send no requests to time: stall is null in transparent mode.
  bool stall_measured() const { return cfg_.mode != "transparent"; }

  // Transparent mode: the interposers' counters (the epochs' file_reads, the transparent
  // block), and per-step landing times for the lead figures.
  void attach_xstats(const solar_xstats* x) { xstats_ = x; }
  void track_landing();

  void mark(Stage s, Clock::time_point t = Clock::now());
  // Prefetching starts and requests are served from `t` on: the epochs' seconds count from it.
  void set_ready(Clock::time_point t = Clock::now()) { ready_at_ = t; }
  Clock::time_point ready_at() const { return ready_at_; }
  double since_ready(Clock::time_point now = Clock::now()) const;

  // ---- measuring (the agent's lock held) ----
  void note_plan_hit() { ++hits_; }                      // a use the plan counts as a hit
  void note_fetching(std::uint64_t n) { fetched_ += n; }  // samples queued for storage
  std::uint64_t fetched_samples() const { return fetched_; }
  std::uint64_t fetched_bytes() const { return bytes_read_; }
  // A sample the plan has resident at the start step but a restarted agent lacks, read now.
  void note_unplanned() { ++unplanned_; }
  void note_slot_wait(double seconds) { slot_wait_seconds_ += seconds; }
  // A rank asked for (transparent: began) step t; `ready_steps`: the steps read by then (the
  // head start's, at the first request).
  void note_request(std::uint64_t t, Clock::time_point now, std::uint64_t ready_steps);
  // Rank r was handed step t: `samples` of which `hits` needed no read for it, after waiting
  // `wait` seconds (< 0: not measured, transparent mode).
  void note_served(std::uint64_t t, std::uint32_t r, std::uint64_t samples, std::uint64_t hits,
                   double wait, Clock::time_point now = Clock::now());
  // A rank released step t; the last release of an epoch's last step completes the epoch.
  void note_released(std::uint64_t t, Clock::time_point now);
  // A storage read for step t landed: `samples` in `runs` coalesced requests, `seconds` of a
  // reader thread's time.
  void note_read(std::uint64_t t, std::uint64_t samples, std::uint64_t runs, double seconds,
                 Clock::time_point now = Clock::now());
  // A sample of step t was read from another agent's buffer.
  void note_peer_read(std::uint64_t t, Clock::time_point now = Clock::now());
  // A sample read back from the local tier for step t (local_tier.h).
  void note_local_read(std::uint64_t t) { ++epochs_[epoch_of(t)].local_samples; }
  // Transparent mode: a rank began step t at `at` (seconds since ready): its lead, against
  // when the step's last storage and peer reads landed (track_landing).
  void note_begun(std::uint64_t t, double at);

  // Per-epoch records. The epoch of step t is t / steps_per_epoch (its position in the run).
  struct EpochStats {
    std::uint64_t hits = 0;             // samples served without a read for their step
    std::uint64_t fetched_samples = 0;  // read from storage for its steps (reads completed)
    std::uint64_t storage_reads = 0;    // coalesced storage requests of those reads
    std::uint64_t samples_served = 0, batches_served = 0;
    double read_seconds = 0;            // reader threads' time in those reads, summed
    double stall_seconds = 0;           // sum over requests of request → batch ready
    double stall_max_wait_seconds = 0;  // the longest of those waits
    double start = -1, end = -1;        // since ready: first request, last release so far
    std::uint32_t ranks_done = 0;       // ranks that released its last step
    std::uint64_t file_reads[4] = {};   // transparent: the interposers' counters, see put()
    std::uint64_t peer_samples = 0;     // read from other agents' buffers (peer_sharing.cpp)
    std::uint64_t local_samples = 0;    // read back from the local tier (local_tier.h)
    // Transparent mode, per (step, rank): the lead, when the rank began the step (its first
    // sample consumed, seen by the pacer within 1 ms) minus when the step's last storage and
    // peer reads landed; negative: the rank was there first (it waited, or read the file).
    std::vector<float> lead;
    std::uint64_t late_storage = 0, late_peer = 0;  // (step, rank)s begun before that part
  };
  struct HeadStart {
    bool requested = false;  // a rank asked for its first batch (transparent: began reading)
    double seconds = 0;      // from ready to that request
    std::uint64_t fetched_samples = 0, fetched_bytes = 0, ready_steps = 0;  // by then
  };
  struct Startup {
    Clock::time_point plan_read, source_opened, buffer_ready, listening, first_read;
    std::vector<Clock::time_point> first_batch, last_batch;  // per local rank (batch mode)
  };
  // What put() reports, copied with the agent's lock held (`ready_steps`: the steps read so
  // far, the head start's until a rank asks).
  struct Snapshot {
    Clock::time_point now;
    std::uint64_t hits = 0, fetched = 0, unplanned = 0, bytes_read = 0, reads = 0;
    double read_seconds = 0, slot_wait_seconds = 0;
    std::vector<EpochStats> epochs;
    std::vector<double> rank_stall;  // [e·R + r]
    HeadStart head;
    Startup startup;
    std::uint64_t epochs_done = 0, xsnap[4] = {};
  };
  Snapshot snapshot(std::uint64_t ready_steps, Clock::time_point now = Clock::now()) const;

  // ---- reporting (no lock) ----
  // Adds to `doc` the node's own fields (node, mode, plan shape), the run counters,
  // per_epoch, head_start, startup and totals. `max_rank_stall`: the largest stall of a rank
  // (the agent's ranks hold them).
  void put(nlohmann::json& doc, const Snapshot& s, double max_rank_stall) const;
  // The interposers' counters and the steps every rank has consumed; null without them.
  nlohmann::json transparent_json(std::uint64_t consumed_steps) const;
  // The stats reply: `doc` dumped, cut to fit one message (max_bytes) by leaving out the
  // oldest per-epoch records (per_epoch_omitted says how many; the log line and --stats-out
  // keep them all).
  static std::string reply(nlohmann::json doc, std::size_t max_bytes = protocol::kMaxPayload);

 private:
  std::uint64_t epoch_of(std::uint64_t t) const { return t / cfg_.steps_per_epoch; }
  void read_xstats(std::uint64_t out[4]) const;

  Config cfg_;
  const solar_xstats* xstats_ = nullptr;  // transparent: in the shared buffer (atomics)
  // Run totals.
  std::uint64_t hits_ = 0, fetched_ = 0, unplanned_ = 0, bytes_read_ = 0, reads_ = 0;
  std::uint64_t fetched_done_ = 0;  // samples whose reads completed
  double read_seconds_ = 0, slot_wait_seconds_ = 0;
  Clock::time_point started_{};   // the agent's start
  Clock::time_point ready_at_{};  // prefetching starts, requests are served
  Startup startup_;
  std::vector<EpochStats> epochs_;
  std::vector<double> epoch_rank_stall_;  // [e·R + r]: rank r's stall in epoch e
  std::uint64_t epochs_done_ = 0;         // epochs < epochs_done_: released by every rank
  std::uint64_t xsnap_[4] = {};           // transparent: counters when an epoch last completed
  HeadStart head_;
  // Transparent: per step, seconds since ready when its last storage / peer read landed
  // (-1: none).
  std::vector<float> storage_landed_, peer_landed_;
};

}  // namespace solar::agent

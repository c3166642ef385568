// SPDX-License-Identifier: Apache-2.0
// DemandCache (--transparent): demand mode, for unmodified ranks that read an order the plan
// does not know (issue 38). Internal to solar-agent.
//
// The interposers count every sample a rank reads in the shared consumed[] counters. The
// pacer thread calls poll(), which compares them with the last values seen:
// - In plan mode it watches whether the ranks follow the plan: a step is completed once its
//   samples are read (TransparentPacer), so a run in the plan's order completes one every
//   step's reads, and reads only samples of the plan's steps near its own (a DataLoader
//   reads a few batches ahead; a rank far ahead of the others reads steps not yet admitted,
//   which are near). When the node's ranks have read kStallSteps steps' worth of samples
//   (times the samples one read brings in: HDF5's 64 KiB sieve) that no step within
//   kWindowSteps of theirs holds, without any rank completing a step meanwhile, while every
//   rank had begun the step it is at (one that has not, still starting or between epochs,
//   holds the plan's admission back, and the others, reading on in the plan's order, get
//   past the window), the order is not the plan's: it switches. An epoch must be longer
//   than that window for it to tell (a whole plan; not a streamed one).
//   `solar-agent --order-unknown` starts in demand mode.
// - In demand mode the plan's prefetching stops (Prefetcher::prefetch_loop returns; what it
//   had read stays, its reads in flight land), nothing is evicted, and each sample the ranks
//   read that is not resident is copied into a free slot by the pacer's thread: read again,
//   right after the rank's own read, so from the page cache and not from storage (under
//   --direct-io through a second source without it), never in the rank's way (it is not
//   marked in flight: a rank's read of it goes to the file until it is published), at most
//   64 MiB a poll. Once no slot is free the buffer is a static resident set: over epochs of
//   random orders it keeps a hit rate of its share f of the dataset, which is the most any
//   policy can (each sample is read once an epoch), where LRU keeps f + (1 − f)·ln(1 − f)
//   (15% at f = 50%); LRU wins only where the order has locality, a curriculum that slides
//   over the data (bench/demand_policies.py, bench/README.md "Demand mode").
// - Epochs are not known in demand mode: they are counted by reads, one every time the node's
//   ranks have read as many samples as the plan gives them an epoch; each gets the
//   interposers' hits and misses.
//
// - With peer sharing (--peers), demand mode pools the nodes' buffers, as HVAC does with its
//   nodes' NVMe: each sample has one home node (solar_home_node: a hash of its id), whose
//   buffer alone keeps it. At the switch each agent drops what the plan had read that is not
//   its own (once no rank uses it), and fills only its own samples from its ranks' reads. A
//   rank that misses a sample of another node asks its agent (the interposer, SOLAR_OP_XFETCH)
//   before it reads the file: the agent reads the home's index entry over RMA, and if the home
//   holds it, the sample into a transit slot of its own (reserve_units_ are kept free for
//   them and for pushes, below), published as usual, and answers; the rank copies it, and once its read is counted
//   (its consumed counter moves, or kTransitHold has passed) the slot is freed again. A home
//   that does not hold it costs the rank one RMA read of 8 bytes and a round trip on the
//   agent's socket before its plain read. Samples of one size only (peer reads are a slot's
//   bytes); a sized dataset keeps demand mode node-local.
// - Homes learn what other nodes' ranks read: a sample of another node that a rank read from
//   the file is copied into a transit slot too (from the page cache, as the node's own are)
//   and pushed: the peer thread writes its id into the home's mailbox, the home reads it from
//   us over RMA into a slot of its own (a pull) if it has room, and acknowledges; the transit
//   slot goes then (or after kTransitHold). At most push_transit_ such slots at a time; the
//   rest are not pushed (their homes keep them once their own ranks read them).
//
// Contract: poll() runs on the pacer thread only and takes the agent's lock `mu_` itself; the
// *_locked calls are made with it held. Not with a local tier (the agent keeps the plan there
// and says so once when the order diverges).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "agent.h"
#include "peer_sharing.h"
#include "solar/storage/sample_source.h"
#include "solar/transparent.h"

namespace solar::agent {

class DemandCache {
 public:
  using Clock = std::chrono::steady_clock;
  // Steps' worth of reads without any step completed before the switch.
  static constexpr std::uint64_t kStallSteps = 8;
  // The plan's steps past the furthest one admitted or completed whose samples a rank in the
  // plan's order may read.
  static constexpr std::uint64_t kWindowSteps = 16;
  // Across the nodes: slots kept free for samples read from other nodes for a rank (transit),
  // and how long one stays at most once published.
  // (At most; a sixteenth of the buffer for a small one, a third of them kept for fetches.)
  static constexpr std::uint64_t kTransitSamples = 48;
  static constexpr std::chrono::milliseconds kTransitHold{2000};
  enum class Fetch { not_held, held, pending };

  explicit DemandCache(Agent::Impl& agent) : a_(agent) {}
  DemandCache(const DemandCache&) = delete;
  DemandCache& operator=(const DemandCache&) = delete;

  // Start-up, once the index is in place: `consumed` is its counters; `start_on`: demand mode
  // from the start (--order-unknown).
  void setup(const std::uint32_t* consumed, bool start_on);
  // The pacer's poll (see above); rate-limited by the dataset's size.
  void poll();
  // A step was completed by the ranks' reads (TransparentPacer, mu_ held): the order holds so far.
  void step_completed_locked() { unexpected_since_progress_ = 0; }
  bool on_locked() const { return on_; }
  // Across the nodes: an interposer asks for `sample` (token: the ask, for the reply). held:
  // it is in the buffer already; not_held: not here and not on its home node (or no room, no
  // peer sharing, not demand mode): the rank reads the file; pending: the peer thread reads it
  // from its home, and fetch_done_locked() tells ControlServer::post_fetch_reply.
  Fetch fetch_locked(std::uint32_t sample, std::uint64_t token);
  void fetch_done_locked(const PeerJob& job, bool ok);
  // Node `from` pushed `sample` (placed here): true with `job` filled when it is to be read
  // from there (demand mode, not resident, room kept for transit).
  bool pull_locked(std::uint32_t sample, std::uint32_t from, PeerJob& job);
  // A push of ours was acknowledged (or dropped): its transit slot goes.
  void push_done_locked(std::uint32_t sample);
  // The stats' "demand" block: the mode, when and why it switched, the plan's reads before
  // it, what was filled, and the epochs counted by reads.
  nlohmann::json json_locked() const;

 private:
  void switch_locked(const std::string& why);
  void fill_queued();
  void slide_window_locked();
  void close_epochs_locked();
  bool pooled() const { return nodes_ > 1; }  // demand mode across the nodes' buffers
  bool mine(std::uint32_t x) const { return !pooled() || solar_home_node(x, nodes_) == node_; }
  void drop_foreign_locked();
  bool published_locked(std::uint32_t x) const;  // its entry names a slot
  void release_transit_locked(Clock::time_point now);

  Agent::Impl& a_;
  const std::uint32_t* consumed_ = nullptr;
  // --direct-io: the fills' source, through the page cache (opened at the first fill).
  std::unique_ptr<storage::SampleSource> page_cache_source_;
  std::vector<std::uint32_t> seen_;  // consumed[] at the last scan (pacer thread only)
  std::vector<std::uint32_t> fresh_, fresh_reads_, fill_slots_;  // scratch (pacer thread)
  Clock::time_point next_scan_{};
  bool populated_ = false;  // the cache slots' pages made (setup, else the first fill)

  // Guarded by mu_ (written on the pacer's thread alone, which reads them without it):
  std::vector<std::pair<std::uint32_t, std::uint32_t>> queue_;  // (sample, slot) to fill
  bool on_ = false;
  bool can_switch_ = true;
  bool warned_cannot_ = false;
  bool full_ = false;
  bool fill_failed_ = false;  // a fill failed: nothing more is filled
  std::string why_;
  double switched_at_ = -1;                // seconds since ready
  std::uint64_t reads_ = 0;                // samples the ranks read (consumed increments)
  std::uint64_t reads_at_switch_ = 0;
  std::uint64_t unexpected_since_progress_ = 0;
  std::vector<std::uint32_t> expected_;  // by sample: its accesses in the window's steps
  std::uint64_t window_lo_ = 0, window_hi_ = 0;  // the window: steps [lo, hi)
  std::uint64_t stall_reads_ = 0;          // the switch's threshold
  std::uint64_t plan_fetched_ = 0, plan_bytes_ = 0;  // the plan's reads before the switch
  std::uint64_t taken_ = 0;  // samples given a slot to be filled (queued or done)
  std::uint64_t filled_ = 0, filled_bytes_ = 0;  // of those, copied in and published
  std::uint64_t epoch_reads_ = 0;          // the node's samples in an epoch of the plan
  struct Epoch {
    std::uint64_t reads = 0, hit_reads = 0, hit_bytes = 0, miss_reads = 0, miss_bytes = 0;
    double end = 0;
  };
  std::vector<Epoch> epochs_;             // closed epochs, counted by reads
  // Across the nodes (pooled()): the job's nodes and ours; samples of other nodes the plan had
  // read still to drop; the transit slots (sample, its consumed counter when published, when).
  std::uint32_t nodes_ = 0, node_ = 0;
  bool foreign_left_ = false;
  std::uint64_t reserve_units_ = 0;  // kept free for transit
  std::uint64_t fetch_reserve_ = 0;  // of those, never taken by pushes
  std::uint64_t push_transit_ = 0;   // pushes in transit at most
  struct Transit {
    std::uint32_t sample, consumed;
    Clock::time_point at;
    bool pushed = false;  // to its home: goes once acknowledged (push_done_locked)
  };
  std::vector<Transit> transit_;
  std::vector<std::uint32_t> fill_slots_scratch_;  // fetch_locked's (io thread, mu_ held)
  std::uint64_t pushes_ = 0, pushing_ = 0, pulled_ = 0, pulled_bytes_ = 0, pull_no_room_ = 0,
                pull_failed_ = 0;
  std::uint64_t asked_ = 0, fetched_ = 0, fetched_bytes_ = 0, not_held_ = 0, no_room_ = 0,
                fetch_failed_ = 0, dropped_foreign_ = 0;
  std::uint64_t epoch_start_x_[4] = {};   // the interposers' counters when the open one began
};

}  // namespace solar::agent

// SPDX-License-Identifier: Apache-2.0
// TransparentPacer (--transparent): the shared sample index the interposer serves unmodified
// ranks' reads from (solar/transparent.h, extent mode), the watch's lease on the dataset file,
// and eviction paced on the samples those ranks consume. Internal to solar-agent.
//
// Unmodified ranks send no requests: a rank's step counts as done (its uses are dropped, so
// the plan's evictions may proceed) once every sample of its batch has been read as often as
// the plan says it will have been by then. A script that reads another order never completes
// a step: the agent then keeps what it has and the reads it misses go to the file.
//
// Contract:
// - setup() runs once at start-up, before any thread; without it (batch mode) index() is null
//   and only withdraw_*() may be called (they do nothing then).
// - The index header and the consumed counters live in the shared buffer: the interposers
//   read and write them with atomics, and so does the pacer (no lock). setup() turns on the
//   plan's per-access use counts (PlanSteps::count_uses). paced_steps_ and the ranks' progress are guarded by the agent's lock
//   `Agent::Impl::mu_`, which the pace thread takes itself; paced_steps_locked() is called
//   with it held.
// - The pace thread stops once the agent is stopping or has failed (it polls every 1 ms);
//   a dataset file changed stops the agent (Agent::Impl::fail).
// - It holds a back-reference to the agent (Agent::Impl), which owns it and outlives it.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "agent.h"
#include "buffer_layout.h"
#include "demand_cache.h"
#include "solar/storage/sample_source.h"
#include "solar/transparent.h"

namespace solar::agent {

// The sizes of the file table and the extent table the index carries (BufferOptions::files,
// ::extents) for `source`'s files (none for a source without files: setup() refuses it).
void count_file_tables(const storage::SampleSource& source, BufferOptions& o);

class TransparentPacer {
 public:
  explicit TransparentPacer(Agent::Impl& agent) : a_(agent) {}
  TransparentPacer(const TransparentPacer&) = delete;
  TransparentPacer& operator=(const TransparentPacer&) = delete;

  // Start-up: the index and its file table in the buffer, attached to the slot table; throws
  // AgentError when the dataset's samples do not lie in its files as raw bytes, or a file is
  // not the one indexed.
  void setup();
  // The shared index (null in batch mode): where it lies tells the interposer's hello reply.
  const solar_xindex* index() const { return xindex_; }
  void start();  // the pace thread (transparent mode)
  void join();
  // When the dataset file has changed since the agent opened it, tells every interposer to
  // serve nothing more from the buffer (they read the file instead) and says so; true then.
  // A dataset of many files is not withdrawn for one (the interposers refuse a changed file's
  // reads themselves): false.
  bool withdraw_if_changed();
  // The agent failed: the interposers stop serving its buffer (nobody watches the file once it
  // is gone), FILE_CHANGED if the file changed, else AGENT_STOPPED.
  void withdraw_failed();
  // The agent stopped: nobody watches the file from now on (a FILE_CHANGED already there stays).
  void withdraw_stopped();
  std::uint64_t paced_steps_locked() const { return paced_steps_; }
  // Demand mode (demand_cache.h): the ranks' order is not the plan's; the plan stops.
  bool demand_on_locked() const { return demand_.on_locked(); }
  nlohmann::json demand_json_locked() const { return xindex_ ? demand_.json_locked() : nullptr; }
  // Demand mode across the nodes: an interposer's ask for a sample (ControlServer), and the
  // peer thread's outcome of the read it started (DemandCache::fetch_locked).
  DemandCache::Fetch fetch_locked(std::uint32_t sample, std::uint64_t token) {
    return xindex_ ? demand_.fetch_locked(sample, token) : DemandCache::Fetch::not_held;
  }
  void fetch_done_locked(const PeerJob& job, bool ok) { demand_.fetch_done_locked(job, ok); }
  bool pull_locked(std::uint32_t sample, std::uint32_t from, PeerJob& job) {
    return xindex_ && demand_.pull_locked(sample, from, job);
  }
  void push_done_locked(std::uint32_t sample) {
    if (xindex_) demand_.push_done_locked(sample);
  }
  // Demand mode across `nodes` nodes, this one `node`: the interposers ask for the samples of
  // the others they miss (solar_xindex::peer_nodes).
  void ask_peers(std::uint32_t nodes, std::uint32_t node) {
    std::atomic_ref<std::uint64_t>(xindex_->peer_node).store(node, std::memory_order_relaxed);
    std::atomic_ref<std::uint64_t>(xindex_->peer_nodes).store(nodes, std::memory_order_release);
  }

 private:
  void loop();

  Agent::Impl& a_;  // the agent that owns this part
  solar_xindex* xindex_ = nullptr;
  std::uint32_t* xconsumed_ = nullptr;
  std::uint64_t paced_steps_ = 0;    // steps every rank has consumed
  DemandCache demand_{a_};
  std::thread thread_;
};

}  // namespace solar::agent

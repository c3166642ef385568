// SPDX-License-Identifier: Apache-2.0
// PeerSharing (--peer-dir; agent/README.md, "Peers"): the plan's peer reads executed over
// libfabric RMA from the other agents' buffers, and this agent's buffer served to them.
// Internal to solar-agent.
//
// The prefetch engine hands the plan's peer reads to the peer thread as PeerJobs (their slots
// placed, counted in the prefetcher's outstanding reads); a job that cannot be read from its
// peer becomes a storage read of the same slot. As a source, the agent pins each sample another
// node reads from it at step t (before that step's evictions) until that node's progress
// counter, which it writes into our memory, passes t.
//
// Contract:
// - setup() runs once at start-up (the constructor of the agent), before any thread; without
//   it (no --peer-dir) on() is false and nothing else may be called but json() and reset().
// - The queue, the per-step counts, the counters and the peers' usable/dead/disabled state are
//   guarded by the agent's lock `Agent::Impl::mu_`: methods named *_locked are called with it
//   held; the peer thread (loop) takes it itself. The endpoint, its registrations and the
//   reads in flight are the peer thread's alone.
// - The thread stops once the agent is stopping or has failed, woken by wake_locked() (or
//   wake_all); reset() then closes the endpoint, before the buffer it registered goes.
// - It holds a back-reference to the agent (Agent::Impl), which owns it and outlives it.
// The fabric state (endpoint, registrations, cards, reads in flight) is peer_state.h's.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "agent.h"

namespace solar::agent {

// One sample of step `step` read from node `from`'s buffer into our `slot`; or, `fetch`, one
// a rank of ours asked for in demand mode (DemandCache::fetch_locked; `token` names the ask):
// not the plan's, not counted in its steps, not retried when `from` does not hold it.
struct PeerJob {
  std::uint64_t step = 0;
  std::uint32_t sample = 0, slot = 0, from = 0;
  bool fetch = false;
  bool pull = false;  // a fetch of a sample `from` pushed to us (DemandCache::pull_locked)
  std::uint64_t token = 0;
};

class PeerSharing {
 public:
  explicit PeerSharing(Agent::Impl& agent);
  ~PeerSharing();
  PeerSharing(const PeerSharing&) = delete;
  PeerSharing& operator=(const PeerSharing&) = delete;

  // Start-up: endpoint, registrations, card, the others' cards; `pf` is the plan the agent
  // opened (the other nodes' sections say what they read from this one). Throws AgentError.
  void setup(const PlanFile& pf);
  bool on() const { return state_ != nullptr; }
  void start();     // the peer thread, when on()
  void wake_all();  // stopping or failed: the peer thread looks now (takes the lock)
  void join();
  void reset();  // the endpoint and its registrations of the buffer go (before the buffer)

  // A peer job of step job.step queued; step_queued_locked once all of the step's are.
  void queue_locked(const PeerJob& job) { jobs_.push_back(job); }
  void step_queued_locked(std::uint64_t step, std::uint32_t jobs) {
    pending_[step] = jobs;
    wake_locked();
  }
  // Demand mode: a fetch job (job.fetch) for the peer thread; DemandCache::fetch_done_locked
  // gets its outcome.
  void fetch_locked(const PeerJob& job) {
    jobs_.push_back(job);
    wake_locked();
  }
  // Demand mode across the nodes: `sample`, read by our ranks and placed on node `home`, is
  // in a slot of ours: the peer thread tells `home` (its mailbox), which reads it from us;
  // DemandCache::push_done_locked once `home` says it has looked (or the push was dropped).
  void push_locked(std::uint32_t sample, std::uint32_t home) {
    pushes_.emplace_back(sample, home);
    wake_locked();
  }
  // At step t, before its evictions: pins the samples other nodes read from us in step t.
  void pin_served_locked(std::uint64_t t);
  // Reads from `node` go to it (known, reachable, sharing not turned off).
  bool usable_locked(std::uint32_t node) const;
  // The stats document's "peers" (null without peer sharing); with the lock held.
  nlohmann::json json() const;

 private:
  struct State;
  struct StateDelete {  // State is defined in peer_state.h only
    void operator()(State* p) const;
  };
  void loop();
  void wake_locked();  // peer jobs queued (or stopping): the peer thread looks now
  void done_locked(const PeerJob& j, bool ok);

  Agent::Impl& a_;  // the agent that owns this part
  std::unique_ptr<State, StateDelete> state_;
  std::deque<PeerJob> jobs_;            // queued for the peer thread
  std::deque<std::pair<std::uint32_t, std::uint32_t>> pushes_;  // (sample, home) to tell
  std::vector<std::uint32_t> pending_;  // per step: peer jobs not read or handed to storage
  std::uint64_t samples_ = 0, fallbacks_ = 0, torn_ = 0;
  std::uint64_t pushed_ = 0, pushes_dropped_ = 0, pulls_seen_ = 0;
  std::uint64_t pins_released_early_ = 0;  // samples a stalled reader lost (see peer_sharing.cpp)
  std::thread thread_;
  std::condition_variable wake_;  // peer jobs queued, or stopping
};

}  // namespace solar::agent

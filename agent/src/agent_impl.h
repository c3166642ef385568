// SPDX-License-Identifier: Apache-2.0
// Agent::Impl: the state every part shares (the plan part, the source, the buffer and its slot
// table, the ranks' progress, the steps read and servable, the error), its one lock, and the
// parts that compose the agent, each a class with its own header and members:
//   agent.cpp            start-up (plan, source, buffer, socket), run, stop, fail
//   buffer_layout.*      slot counts, rings and the transparent index's place (a pure function)
//   slot_table.*         free list, pins, evictions, zombies, index entries (no threads, no I/O)
//   prefetcher.*         Prefetcher: the plan → storage reads → slots; copies into the rings
//   control_server.*     ControlServer: the Unix socket, sessions, replies (io thread)
//   control_messages.cpp ControlServer's requests: hellos (libsolar, interposer), next, release
//   serving.cpp          ControlServer's batches handed to ranks (batch mode for libsolar)
//   transparent_pacer.*  TransparentPacer: the shared sample index and pacing (--transparent)
//   demand_cache.*       DemandCache: demand mode, when the ranks' order is not the plan's
//   dataset_watch.*      DatasetWatch: the batch mode's checks of the dataset file
//   local_tier.*         LocalTier: the node's local-disk tier below memory (--local-dir)
//   peer_sharing.*       PeerSharing: other agents' buffers read over libfabric RMA, ours served
//   peer_state.h, peer_setup.cpp  its fabric state and start-up (cards)
//   node_stats.*         NodeStats: what the agent measured and its JSON
//   stats.cpp            the stats document (the node's state and NodeStats), reply, --stats-out
//
// Locking: `mu_` guards every member below that is not const after start-up (the slot table,
// start_/admitted_/ready_, ranks_, stopping_, fatal_, exit_code_, stats_), and the parts' own
// members where their headers say so. Const after start-up (read without it): opt_, header_,
// a whole plan's offsets (steps_), source_, source_options_, R_, T_, sample_bytes_, label_bytes_, buf_, memfd_, base_. The
// parts hold a back-reference to this class and are its friends; they take `mu_` themselves
// (methods named *_locked are called with it held).
// Internal to solar-agent.
#pragma once

#include <sys/uio.h>

#include <utility>  // before asio: with g++ 12 and C++20, Boost.Asio 1.74 uses std::exchange unincluded
#include <boost/asio.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "agent.h"
#include "buffer_layout.h"
#include "control_server.h"
#include "dataset_watch.h"
#include "local_tier.h"
#include "node_stats.h"
#include "peer_sharing.h"
#include "plan_steps.h"
#include "prefetcher.h"
#include "slot_table.h"
#include "transparent_pacer.h"
#include "solar/protocol.h"
#include "solar/transparent.h"

namespace solar::agent {

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// --stats-out: the folder exists and a file can be created in it; throws AgentError.
void check_stats_out(const std::string& path);

// One local rank's progress (guarded by Agent::Impl::mu_; its session is the io thread's).
struct RankState {
  std::shared_ptr<Session> session;
  bool attached = false;
  bool gone = false;        // disconnected: its uses are no longer counted
  bool end_owed = false;    // asked for the step after the last: `end` once all are served
  bool assembling = false;  // a reader-pool job is copying its step `assembled` into its ring
  std::uint64_t assembled = 0;  // steps < assembled are in its ring (its uses dropped)
  std::uint64_t cursor = 0;    // next step to hand out
  std::uint64_t asked = 0;     // steps < asked were asked for (next); cursor..asked-1 wait
  std::uint64_t released = 0;  // steps < released are released
  double begun_at = -1;        // transparent: when step `released` was first seen begun
  double stall_seconds = 0;
  // When the rank began to wait for step `released` (it had released every earlier step and
  // asked for this one): the later of that release and that request. A step handed out
  // before the rank released the one before (asked ahead) was not waited for.
  Clock::time_point wait_since;
};

class Agent::Impl {
 public:
  explicit Impl(const AgentOptions& o);
  ~Impl();
  int run();
  void stop() { control_.stop(); }

 private:
  friend class ControlServer;
  friend class Prefetcher;
  friend class PeerSharing;
  friend class TransparentPacer;
  friend class DemandCache;
  friend class DatasetWatch;
  friend class LocalTier;

  // Ring slot i of rank r's batch of step t (see the buffer layout, buffer_layout.cpp).
  std::uint32_t ring_slot(std::uint32_t r, std::uint64_t t, std::size_t i) const {
    return buf_.ring_slot(r, t, i);
  }
  std::byte* slot_ptr(std::uint64_t slot) const { return base_ + buf_.slot_offset(slot); }
  std::byte* label_ptr(std::uint64_t slot) const { return base_ + buf_.label_offset(slot); }
  // What the hello tells ranks (protocol::HelloOk): steps to ask ahead (small batches: half
  // the ring less the step held, see kSmallBatchRingBytes; other rings: all of it), and whether
  // they hold their releases back until their next write (rings deep enough for both).
  std::uint32_t ask_ahead() const {
    if (buf_.ring_depth < 2) return 1;
    const std::uint64_t a = buf_.inline_copy ? buf_.ring_depth / 2 - 1 : buf_.ring_depth - 1;
    return static_cast<std::uint32_t>(std::min<std::uint64_t>(a, protocol::kMaxStepsAsked - 1));
  }
  bool defer_releases() const { return buf_.ring_depth >= 2 * (std::uint64_t{ask_ahead()} + 1); }
  // The step rank rs waits for once it asks for it: the one after those it released, or with
  // deferred releases, after the one it holds (released, if handed out: its release comes
  // with its next write, which it sends only when it has no other reply left).
  std::uint64_t waits_for(const RankState& rs) const {
    return rs.released + (defer_releases() && rs.cursor > rs.released ? 1 : 0);
  }

  // Plan access: rank r's records at step t (held: see PlanSteps).
  std::span<const std::uint32_t> accesses(std::uint64_t t, std::uint32_t r) const {
    return steps_.accesses(t, r);
  }
  // The oldest step a rank may still need the records of (mu_ held): a streamed plan's steps
  // before it are dropped.
  std::uint64_t oldest_step_needed_locked() const {
    std::uint64_t least = admitted_;
    for (const RankState& rs : ranks_)
      if (!rs.gone) least = std::min(least, rs.released);
    return least;
  }

  // A use of `sample` dropped (mu_ held): a slot it frees wakes the prefetch engine.
  void drop_use_locked(std::uint32_t sample) {
    if (table_.drop_use(sample)) prefetch_.slot_freed_locked();
  }
  // Stops the agent (any thread, without mu_): the first cause is logged and kept (fatal_),
  // every part is woken, and the ranks are told why (ControlServer's last words).
  void fail(const std::string& what);
  // Set-up (agent.cpp): every label at once where that is cheap; the rings' pages made before
  // the agent is ready.
  void read_all_labels();
  void populate_rings();
  void populate_cache_slots();

  // The stats document (stats.cpp): the node's state (ranks, slots, peers, error) and what
  // stats_ measured (the run totals, the per-epoch records, the head start and their totals).
  // The stats reply is it, cut to fit one message; the log's last line ("stopped: {...}") is
  // all of it; --stats-out writes its measured part to a file.
  nlohmann::json stats_document();
  std::string stats_reply() { return NodeStats::reply(stats_document()); }
  void write_stats_out(const nlohmann::json& doc);

  AgentOptions opt_;
  PlanHeader header_;
  // The node's plan, whole or streamed; its hit bits are rewritten at admission (Prefetcher),
  // and a streamed plan's steps come and go (plan_steps.h), under mu_.
  PlanSteps steps_;
  std::unique_ptr<storage::SampleSource> source_;
  storage::SourceOptions source_options_;  // what source_ was opened with
  std::uint32_t R_ = 0;
  std::uint64_t T_ = 0;
  std::uint64_t sample_bytes_ = 0, label_bytes_ = 0;  // what a slot holds of a sample
  bool stored_mode_ = false;  // slots hold samples as stored in their files (read_stored)
  // Every sample's label, read once at set-up where that is one small read (read_all_labels);
  // empty: each read job reads its samples' labels after them.
  std::vector<std::byte> labels_;
  std::uint64_t arena_bytes_ = 0;  // sized plans: the resident set's arena (fragmentation)
  BufferLayout buf_;  // slots, rings, and where the transparent index goes
  int memfd_ = -1;
  std::byte* base_ = nullptr;

  std::mutex mu_;
  SlotTable table_;  // the cache slots: free, resident, pinned, zombie
  std::uint64_t start_ = 0;     // --start-step: the first step read and served
  std::uint64_t admitted_ = 0;  // steps < admitted_ have slots and count their uses
  std::uint64_t ready_ = 0;     // steps < ready_ are read and servable
  std::vector<RankState> ranks_;
  bool stopping_ = false;
  std::string fatal_;  // set when prefetching failed
  int exit_code_ = 0;
  // What the agent measured (node_stats.h): noted with mu_ held by every thread that works
  // (readers, io thread, pacer, peer thread); the stats document copies it under mu_.
  NodeStats stats_;

  // The parts (declared last: destroyed first, before the state they refer to).
  Prefetcher prefetch_{*this};
  LocalTier local_{*this};
  TransparentPacer pacer_{*this};
  DatasetWatch watch_{*this};
  PeerSharing peers_{*this};
  ControlServer control_{*this};
};

}  // namespace solar::agent

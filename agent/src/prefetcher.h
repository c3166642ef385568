// SPDX-License-Identifier: Apache-2.0
// Prefetcher: the prefetch engine (the plan → storage reads → slots) and the copies of batches
// into the ranks' rings. Internal to solar-agent.
//
// One thread (prefetch_loop) walks the plan in step order — evictions (and with a local tier
// the moves between memory and the disk, local_tier.h), slot allocation (waiting for free
// slots), admission of the step's uses — and queues the step's reads; a pool
// of reader threads (reader_loop) executes them, several steps in flight, and copies batches
// into the rings. A step becomes servable (Agent::Impl::ready_) once its reads and all earlier
// steps' are done.
//
// Contract:
// - Every member here is guarded by the agent's lock `Agent::Impl::mu_`, as is the shared state
//   it changes (the slot table, admitted_, ready_, the ranks' assembly). Methods named *_locked
//   are called with that lock held; the others take it themselves.
// - Its threads stop once the agent is stopping or has failed (Agent::Impl::stopping_, fatal_),
//   woken by wake_all(); join() waits for them.
// - A failed read stops the agent (Agent::Impl::fail).
// - It holds a back-reference to the agent (Agent::Impl), which owns it and outlives it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstddef>
#include <deque>
#include <memory>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "agent.h"

namespace solar::agent {

class Prefetcher {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Prefetcher(Agent::Impl& agent) : a_(agent) {}
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Before the agent says it is ready: each of `readers` reader threads' staging memory, as
  // large as its share of a step's reads, allocated and touched now. A first touch is a page
  // fault per 4 KiB, which in a VM cost the first step's reads 0.13 s instead of 0.02 (the
  // demo's bench loader), after the ranks had asked for it.
  void prepare(unsigned readers);
  // Starts the prefetch thread and the reader threads prepare() made room for (at least one;
  // prepare() comes first, in the agent's set-up).
  void start();
  // Wakes every thread waiting for slots or for jobs (the agent is stopping or has failed);
  // call after setting that, without the lock.
  void wake_all();
  // Wakes the reader threads only (read jobs queued without the prefetch engine).
  void wake_readers() { job_ready_.notify_all(); }
  void join();

  // The slot table's calls that may free a slot wake the prefetch engine once as many slots
  // are free as its step needs (slots_wanted_), not for each: woken for one, it would find too
  // few and sleep again, having waited for the lock of the thread that woke it (the io thread:
  // a wake-up per batch served, a third of its time in all-hit epochs with four ranks).
  void slot_freed_locked();
  // The prefetch engine has waited for slots for longer than `timeout`, none freed meanwhile
  // (peer sharing then releases what a stalled reader of ours holds).
  bool starved_locked(Clock::time_point now, Clock::duration timeout) const {
    return slots_wanted_ > 0 && now - slot_wait_since_ > timeout;
  }
  // on_io: called on the io thread (serve at once instead of posting).
  void schedule_assembly_locked(bool on_io = false);
  // One of step `step`'s reads that went elsewhere (a peer read) is done.
  void read_done_locked(std::uint64_t step) {
    if (--outstanding_[step] == 0) complete_steps_locked();
  }
  // A peer read that failed: sample `sample` of step `step` read from storage into `slot`.
  void read_from_storage_locked(std::uint64_t step, std::uint32_t sample, std::uint32_t slot);
  std::uint64_t unplaced_locked() const { return unplaced_; }
  // The sample's `sample_len` bytes into `slot` (through the memfd), and its label (if any)
  // into the labels (also the local tier's reads back).
  void write_slot(std::uint32_t slot, const std::byte* sample, std::size_t sample_len,
                  const std::byte* label);
  // Demand mode (demand_cache.h), on the pacer's thread, without the lock: each of `samples`
  // read from `source` (the agent's, or one through the page cache) into its placed slot,
  // one by one, with its label: straight into the mapping for slots of one size (their pages
  // made by Agent::Impl::populate_cache_slots first), through staging for sized ones.
  void fill_slots(storage::SampleSource& source, std::span<const std::uint32_t> samples,
                  std::span<const std::uint32_t> slots);
  // The bytes of `sample` a slot gets: the sample's, or a sized sample's rounded to 64.
  std::size_t slot_length(std::uint32_t sample) const;

 private:
  struct ReadJob {
    std::uint64_t step = 0;
    int assemble_rank = -1;                // >= 0: copy this rank's batch into its ring
    std::vector<storage::SampleRun> runs;  // coalesced, ascending
    std::vector<std::uint32_t> slots;      // the slot of each sample, in run order
  };

  void prefetch_loop();
  // Samples of differing sizes whose free room is in pieces: takes the slots of those of
  // `incoming` that fit, and moves the others (dropping their `from`) to `unplaced`.
  void leave_unplaced_locked(std::uint64_t step, std::vector<std::uint32_t>& incoming,
                             std::vector<std::uint32_t>& from, std::vector<std::uint32_t>& slots,
                             std::vector<std::uint32_t>& unplaced);
  void assemble(std::uint64_t t, std::uint32_t r);
  void add_copies_locked(std::uint64_t t, std::uint32_t r, std::vector<std::uint32_t>& dst,
                         std::vector<std::uint32_t>& src) const;
  void copy_slots(std::span<const std::uint32_t> dst, std::span<const std::uint32_t> src) const;
  void finish_assembly_locked(std::uint64_t t, std::uint32_t r);
  void complete_steps_locked();

  // A reader's staging memory: grown, never zero-filled (a std::vector would clear every byte
  // it grows by), touched once where prepare() sizes it.
  struct Scratch {
    std::unique_ptr<std::byte[]> p;
    std::size_t cap = 0;
    std::byte* get(std::size_t n) {
      if (n > cap) {
        p = std::make_unique_for_overwrite<std::byte[]>(n);
        cap = n;
      }
      return p.get();
    }
  };
  struct ReaderScratch {
    Scratch samples, labels;
  };
  void reader_loop(ReaderScratch& scratch);

  Agent::Impl& a_;  // the agent that owns this engine
  std::deque<ReadJob> jobs_;
  std::vector<std::uint32_t> outstanding_;  // per step: read jobs not finished
  std::condition_variable job_ready_;
  std::condition_variable slot_freed_;
  Clock::time_point slot_wait_since_{};  // the prefetch engine waits, no slot freed since then
  std::size_t slots_wanted_ = 0;  // the free slots the prefetch engine waits for (0: it doesn't)
  std::uint64_t unplaced_ = 0;    // sized: samples left to the ranks for want of an extent
  bool warned_unplaced_ = false;
  // Small batches copied inline (schedule_assembly_locked): scratch.
  std::vector<std::pair<std::uint64_t, std::uint32_t>> inline_jobs_;  // (step, rank)
  std::vector<std::uint32_t> inline_dst_, inline_src_;
  std::thread prefetch_;
  std::vector<ReaderScratch> scratch_;  // one per reader thread, made by prepare()
  ReaderScratch fill_scratch_;          // fill_slots' (the pacer thread's)
  std::vector<std::thread> readers_;
};

}  // namespace solar::agent

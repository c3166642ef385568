// SPDX-License-Identifier: Apache-2.0
// LocalTier: the node's local-disk tier below the memory buffer (--local-dir, a plan made with
// --local-buffer). Internal to solar-agent; agent/README.md "The local tier" says how it works.
//
// The plan keeps a resident set of memory + local samples per node; which of it is in memory at
// every step is this node's part of solar::place_in_tiers, computed here from the node's own
// section of the plan (core/tiers.h place_node_in_tiers), so the plan file carries no moves.
// Before step t, after the plan's evictions, the prefetch engine (prefetcher.cpp) calls
// moves_locked(t): the disk's discards, its writes (a sample leaving memory that the node reads
// again while holding it: copied to the disk, its memory slot pinned until the copy is made)
// and the drops from memory; then it reads the step's samples on the disk (reads_at(t)) back
// into memory slots through queue_read_locked, as it reads fetches from storage.
//
// The disk holds fixed slots of one sample and its label, each aligned to 4 KiB, in one file
// `tier` (0600) in the folder --local-dir names (created 0700, must not exist; removed with its
// file at exit; a launcher removes it after an agent killed before that: the sweep). The file
// is allocated in full at start-up (fallocate): the space is the tier's until the job ends,
// so the disk cannot fill up under it later. It is written and read with O_DIRECT where the
// file system allows it (not the page cache's memory: that is the memory tier's budget).
//
// Two threads (loop, kThreads: a local NVMe wants requests in flight; on 2 cores, 4 were
// slower than 2, bench/README.md) execute the
// disk's reads and writes, each disk slot's in the order they were queued: a job starts only
// once no earlier job on its slot is queued or running, so a read finds the copy written before
// it and a slot a later write reuses has been read; jobs on other slots pass it.
// Each copy carries the CRC-32 of its bytes, checked when it is read back. Whatever fails — no
// room for the file, a write or read error (EIO), a copy whose bytes changed — the sample is
// read from storage instead, one warning for each kind, never a wrong byte; after a disk error
// the tier writes nothing more (the job goes on from storage).
//
// Contract: the *_locked methods are called with Agent::Impl::mu_ held, and so are the counters
// read by stats_json_locked(); the thread takes mu_ itself. It stops once the agent is stopping
// or has failed, woken by wake_all(); join() waits for it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "agent.h"
#include "solar/core/plan.h"

namespace solar::agent {

class LocalTier {
 public:
  explicit LocalTier(Agent::Impl& agent) : a_(agent) {}
  LocalTier(const LocalTier&) = delete;
  LocalTier& operator=(const LocalTier&) = delete;
  ~LocalTier() { remove_files(); }

  // Start-up, once the plan part and the buffer are known: a plan with a local tier needs `dir`
  // (and one without must not get one); computes the node's moves and creates the folder and
  // its file. Throws AgentError naming the option and the fix.
  void setup(const std::string& dir);
  bool on() const { return on_; }
  void start();
  void wake_all() { cv_.notify_all(); }
  void join();
  // The folder and its file go (at exit; also from the destructor).
  void remove_files();

  // Step t, after the plan's evictions (each through evict_locked): discards, writes, drops.
  void evict_locked(std::uint32_t sample);
  void moves_locked(std::uint64_t t);
  // The samples the step reads back from the disk into memory (each through queue_read_locked
  // unless it is still in memory).
  std::span<const std::uint32_t> reads_at(std::uint64_t t) const { return moves_.reads_at(t); }
  // `sample` is being read into memory for step t (from anywhere): a write of it waits for that.
  void arriving_locked(std::uint32_t sample, std::uint64_t t) {
    if (on_) arrived_[sample] = t;
  }
  // Reads `sample`'s copy into memory slot `slot` for step t (one of the step's outstanding
  // reads: it ends with Prefetcher::read_done_locked, or becomes a storage read).
  void queue_read_locked(std::uint64_t t, std::uint32_t sample, std::uint32_t slot);
  // The step's reads are queued: the copies it discarded that no read took (their samples still
  // in memory) are free now.
  void step_queued_locked();
  // Steps became ready (a write may wait for one).
  void steps_ready_locked() {
    if (on_ && waiting_ > 0) cv_.notify_all();
  }
  nlohmann::json stats_json_locked() const;

 private:
  static constexpr std::uint32_t kNone = 0xFFFFFFFFU;
  struct Job {
    bool write = false;
    bool free_after = false;  // read: its disk slot was discarded in its step, free it after
    std::uint64_t step = 0;   // read: the step it is for; write: wait until it is ready
    std::uint32_t sample = 0, slot = 0, disk = kNone;
  };
  static constexpr unsigned kThreads = 2;
  void loop();
  // The first queued job that may start now (see above), taken off the queue; false: none.
  bool take_job_locked(Job& job);
  // The loop's work; false: the disk failed (errno kept in `err`).
  bool write_copy(const Job& j, std::byte* staging, int& err);
  bool read_copy(const Job& j, std::byte* staging, int& err, bool& corrupt);
  // A write (`writing`) or read of `sample` failed with `err`: the tier full (ENOSPC on a
  // write) or off, one warning each.
  void disk_failed(bool writing, std::uint32_t sample, int err);

  Agent::Impl& a_;
  bool on_ = false;
  NodeTiers moves_;
  std::string dir_, file_;
  int fd_ = -1;
  bool direct_ = false;
  std::uint64_t stride_ = 0, copy_bytes_ = 0;  // a disk slot; the bytes of a copy in it
  std::vector<std::uint32_t> free_disk_;
  // Step t's discards of copies its own reads still need: the plan reads a copy back before the
  // disk discards it in the same step (a copy of a sample now in memory), but the agent frees
  // disk slots before it has the memory slots to read into. Such a slot is freed once its read
  // is done (the file has slots for two steps' reads beyond the tier for them), so that no
  // write of the step overwrites it first. (sample, disk slot) of the current step.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> held_;
  std::vector<std::uint32_t> disk_of_;  // by sample: its disk slot, or kNone
  std::vector<std::uint64_t> arrived_;  // by sample: the step of its last read into memory
  // By disk slot, the sample whose good copy it holds (kNone: none) and that copy's CRC-32:
  // each slot's touched by the one job running on it (no lock). Whether the disk failed
  // (nothing more is written or read back), and whether it is full (a write found no room:
  // nothing more is written, the copies already on it are still read back).
  std::vector<std::uint32_t> holder_, crc_;
  std::atomic<bool> broken_{false}, full_{false};
  std::vector<std::uint32_t> busy_;  // disk slots a job runs on (mu_)
  std::vector<std::uint32_t> scan_;  // take_job_locked's scratch (mu_)
  bool warned_corrupt_ = false, warned_error_ = false, warned_full_ = false;
  // Counters (mu_).
  std::uint64_t reads_ = 0, writes_ = 0, from_storage_ = 0, corrupt_ = 0, errors_ = 0;
  std::uint64_t bytes_read_ = 0, bytes_written_ = 0;
  double read_seconds_ = 0, write_seconds_ = 0;
  std::deque<Job> jobs_;
  unsigned waiting_ = 0;  // threads waiting for a job that may start
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
};

}  // namespace solar::agent

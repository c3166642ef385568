// SPDX-License-Identifier: Apache-2.0
// fabric::Driver: the one loop that keeps fi_reads in flight on an endpoint and reaps their
// completions. Its owner says what to read and hears what completed (Driver::Work); the driver
// owns the slots of the queue depth and knows nothing of sessions, requests or servers.
//
// Contract:
// - run() loops while work.more(): each pass calls start_pass(), then fills every free slot
//   with work.next() (a peek: the read is the owner's until posted() says it was posted; a
//   provider answering EAGAIN 64 times in a row leaves it for the next pass), then reaps the
//   completion queue, then retires each completed read whose emulated delay (work.due(), 0 for
//   none) has passed with work.done(). It returns as soon as more() is false after retiring,
//   so a peer that goes away after the last completion is not the reads' problem. Otherwise
//   it calls work.check() once a pass (the owner's timeouts and liveness checks; all_held:
//   every read in flight has completed and only waits out its delay, until `earliest`).
// - The completion queue is polled; it is slept on (fi_cq_sread, 10 ms at most) only where
//   the endpoint is waitable, work.may_sleep() agrees, no completed read is held, and no read
//   has completed for kPollAfterProgress.
// - A failed post or completion throws DriverError (its text names the libfabric call; the
//   owner adds whose read it was). Reads may still be in flight then, pointing at the slots
//   and the owner's memory: the owner closes the endpoint before either goes, and calls
//   reset() before the next run on a new endpoint. The slots persist between runs (a run may
//   stop with reads in flight and the next one reap them), so one Driver per endpoint.
// - One thread at a time; the callbacks run on it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "solar/storage/fabric.h"

namespace solar::storage::fabric {

// After a read completes, the driver polls the completion queue this long before it sleeps in
// the kernel (providers with a wait object): a core is spent only while reads keep completing.
inline constexpr std::chrono::microseconds kPollAfterProgress{1000};

class DriverError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One fi_read: `len` bytes at remote (key, addr) into `dst` (desc: its registration where the
// provider wants local buffers registered). `tag` and `index` come back in Work::done.
struct Read {
  void* dst = nullptr;
  std::uint64_t len = 0;
  void* desc = nullptr;
  std::uint64_t addr = 0, key = 0;
  void* tag = nullptr;
  std::size_t index = 0;
};

class Driver {
 public:
  using Clock = std::chrono::steady_clock;

  // What one run asks of its owner (see the contract above).
  class Work {
   public:
    virtual void start_pass() {}
    virtual bool more() = 0;
    virtual bool next(Read& read) = 0;  // the next read to post; false: none now
    virtual void posted() = 0;          // the read next() gave was posted
    virtual double due(std::uint64_t len) = 0;  // its emulated completion time (s), 0: none
    virtual void done(void* tag, std::size_t index, std::uint64_t len) = 0;
    virtual bool may_sleep() { return false; }
    virtual void check(bool all_held, double earliest, Clock::time_point& last_progress) = 0;

   protected:
    ~Work() = default;
  };

  struct Options {
    bool yield_when_idle = false;  // yield after a pass that reaped and retired nothing
    std::atomic<std::uint64_t>* peak = nullptr;  // raised to the most reads in flight
  };

  explicit Driver(unsigned depth = 1) : slots_(depth) {}
  void set_depth(unsigned depth);  // between runs, with nothing in flight
  void run(Endpoint& ep, fi_addr_t peer, Work& work, const Options& options);
  void reset();  // forgets every read in flight (their endpoint is closed)
  std::size_t in_flight() const { return in_flight_; }

 private:
  struct Slot {
    fi_context2 ctx;  // first: a completion's op_context points here
    void* tag = nullptr;
    std::size_t index = 0;
    std::uint64_t len = 0;
    double due = 0;
    bool busy = false, completed = false;
  };
  std::vector<Slot> slots_;
  std::size_t in_flight_ = 0;
};

}  // namespace solar::storage::fabric

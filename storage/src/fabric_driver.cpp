// SPDX-License-Identifier: Apache-2.0
#include "fabric_driver.h"

#include <algorithm>
#include <fmt/format.h>
#include <thread>

namespace solar::storage::fabric {

namespace {
double now_s() {
  return std::chrono::duration<double>(Driver::Clock::now().time_since_epoch()).count();
}
}  // namespace

void Driver::set_depth(unsigned depth) {
  if (slots_.size() != depth) slots_.resize(depth);
}

void Driver::reset() {
  for (auto& s : slots_) s = Slot{};
  in_flight_ = 0;
}

void Driver::run(Endpoint& ep, fi_addr_t peer, Work& work, const Options& options) {
  auto last_progress = Clock::now();
  while (work.more()) {
    work.start_pass();
    // Post reads while there is room.
    for (auto& slot : slots_) {
      if (slot.busy) continue;
      Read r;
      if (!work.next(r)) break;
      // A bounded number of tries: a provider that keeps answering EAGAIN (tcp;ofi_rxm
      // reconnecting for ever to a server that was killed after the bootstrap) must come back
      // to the loop below, which notices the peer gone and the timeout. (Unbounded, a rank
      // spun here at 100% CPU for good: found by scripts/soak.)
      ssize_t rc;
      int tries = 0;
      while ((rc = fi_read(ep.ep(), r.dst, r.len, r.desc, peer, r.addr, r.key, &slot.ctx)) ==
                 -FI_EAGAIN &&
             ++tries < 64) {
        fi_cq_entry e[1];
        const ssize_t n = fi_cq_read(ep.cq(), e, 0);  // drive progress
        if (n == -FI_EAVAIL) break;
      }
      if (rc != 0 && rc != -FI_EAGAIN) throw DriverError("fi_read failed: " + error_text(rc));
      if (rc == -FI_EAGAIN) break;
      // The emulated link is charged for reads posted, not for attempts the provider refused.
      const double due = work.due(r.len);
      slot = Slot{};
      slot.busy = true;
      slot.tag = r.tag;
      slot.index = r.index;
      slot.len = r.len;
      slot.due = due;
      ++in_flight_;
      if (options.peak && in_flight_ > options.peak->load(std::memory_order_relaxed))
        options.peak->store(in_flight_, std::memory_order_relaxed);  // one driver at a time
      work.posted();
    }
    // Reap completions: where the provider has a descriptor to wait on (tcp;ofi_rxm), sleep
    // in the kernel until one arrives rather than spin against the peer for the cores, but
    // only once no read has made progress for kPollAfterProgress: while completions flow,
    // polling drives the provider (ofi_rxm progresses inside fi_cq_read) and saves a wake-up
    // per read (tcp 256 KiB one-sample reads from 8 threads: 0.48 -> 0.69 of the raw fabric).
    fi_cq_entry entries[16];
    bool held = false;
    for (const auto& slot : slots_)
      if (slot.busy && slot.completed) held = true;
    const bool sleep = ep.waitable() && in_flight_ > 0 && !held && work.may_sleep() &&
                       Clock::now() - last_progress > kPollAfterProgress;
    const ssize_t n = sleep ? fi_cq_sread(ep.cq(), entries, 16, nullptr, 10)
                            : fi_cq_read(ep.cq(), entries, 16);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) static_cast<Slot*>(entries[i].op_context)->completed = true;
      last_progress = Clock::now();
    } else if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(ep.cq(), &err, 0);
      throw DriverError(fmt::format("a remote read failed: {} ({})", error_text(err.err),
                                    fi_cq_strerror(ep.cq(), err.prov_errno, err.err_data,
                                                   nullptr, 0)));
    } else if (n != -FI_EAGAIN && n != -FI_ETIMEDOUT) {
      throw DriverError("fi_cq_read: " + error_text(n));
    }
    // Retire completed reads whose emulated delay has passed.
    double t = -1;  // read once, and only when a delay is emulated
    double earliest = 0;
    bool waiting = false, retired = false;
    for (auto& slot : slots_) {
      if (!slot.busy || !slot.completed) continue;
      if (slot.due > 0) {
        if (t < 0) t = now_s();
        if (slot.due > t) {
          earliest = waiting ? std::min(earliest, slot.due) : slot.due;
          waiting = true;
          continue;
        }
      }
      slot.busy = false;
      --in_flight_;
      retired = true;
      work.done(slot.tag, slot.index, slot.len);  // may end the owner's request
    }
    if (retired) last_progress = Clock::now();
    if (!work.more()) return;
    bool all_held = waiting;
    for (const auto& slot : slots_)
      if (slot.busy && !slot.completed) all_held = false;
    // The timeout counts also when nothing could be posted.
    work.check(all_held, earliest, last_progress);
    // An empty poll: let a caller that was just told its read is done (or the peer, on a
    // shared core) run before polling again.
    if (options.yield_when_idle && n <= 0 && !retired) std::this_thread::yield();
  }
}

}  // namespace solar::storage::fabric

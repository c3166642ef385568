// SPDX-License-Identifier: Apache-2.0
// Peer sharing: the plan's peer reads executed over libfabric RMA between the job's agents, and
// this agent's buffer served to them. See agent/README.md, "Peers", and peer_sharing.h.
//
// Each agent registers its whole buffer for remote reads (slots and the sample index, whose
// entries say which slot holds a sample, with a generation: solar/transparent.h) and a small
// array of progress counters for remote writes, both under unguessable keys, and writes a card
// (fabric address, keys) into the job's private peer folder. A peer read of sample x from node
// s at step t: read s's index entry of x; read the slot it names into our own slot, then its
// label (labels lie apart, after the slots); read the entry again: the bytes are x's only if
// the entry did not change (a recycled slot changes the generation). A missing entry is
// retried until --peer-timeout, a changed one a few times; then the sample is read from
// storage instead, into the same slot. When our peer reads of every step before v are done,
// we write v into each source's counter for us; a source keeps the samples we read at step t
// pinned (evicted or not) until our counter passes t.
#include "peer_sharing.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include "peer_state.h"

namespace solar::agent {

void PeerSharing::StateDelete::operator()(State* p) const { delete p; }

PeerSharing::PeerSharing(Agent::Impl& agent) : a_(agent) {}
PeerSharing::~PeerSharing() = default;

void PeerSharing::start() {
  if (state_) thread_ = std::thread([this] { loop(); });
}

void PeerSharing::wake_all() { wake_.notify_all(); }

void PeerSharing::join() {
  if (thread_.joinable()) thread_.join();
}

void PeerSharing::reset() { state_.reset(); }

void PeerSharing::wake_locked() {
  wake_.notify_one();
  if (state_ && state_->ep && state_->ep->waitable()) fi_cq_signal(state_->ep->cq());
}

bool PeerSharing::usable_locked(std::uint32_t node) const {
  return state_ && !state_->disabled && node < state_->remote.size() &&
         state_->remote[node].known && !state_->remote[node].dead;
}

void PeerSharing::pin_served_locked(std::uint64_t t) {
  for (const auto& [x, reader] : state_->served[t]) {
    if (state_->disabled || state_->remote[reader].abandoned || !a_.table_.resident(x)) continue;
    a_.table_.add_use(x);
    state_->pins[reader].emplace_back(t, x);
  }
}

void PeerSharing::done_locked(const PeerJob& j, bool ok) {
  if (j.pull) state_->remote[j.from].pulling.erase(static_cast<std::uint32_t>(j.token));
  if (j.fetch) return a_.pacer_.fetch_done_locked(j, ok);
  if (ok) {
    a_.table_.publish(j.sample, j.slot);
    ++samples_;
    a_.stats_.note_peer_read(j.step);
    a_.drop_use_locked(j.sample);  // the read pin (prefetch_loop)
    a_.prefetch_.read_done_locked(j.step);
  } else {
    ++fallbacks_;
    a_.stats_.note_fetching(1);  // from storage after all
    a_.prefetch_.read_from_storage_locked(j.step, j.sample, j.slot);
  }
  --pending_[j.step];
}

void PeerSharing::loop() {
  State& ps = *state_;
  const std::uint32_t M = a_.header_.config.nodes, me = a_.opt_.node;
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(a_.opt_.peer_timeout));
  fid_ep* ep = ps.ep->ep();
  fid_cq* cq = ps.ep->cq();
  std::uint64_t* scratch = ps.scratch.data();
  void* sdesc = ps.scratch_mr.desc();
  std::vector<std::pair<PeerJob, bool>> done;  // finished jobs, handed over under the lock
  std::deque<PeerJob> queue;                   // taken from jobs_, not yet started
  std::vector<std::pair<void*, bool>> completed;  // one fi_cq_read's completions (reused)
  std::deque<std::pair<std::uint32_t, std::uint32_t>> to_push;  // (sample, home), not yet told
  std::vector<std::uint32_t> push_released;  // pushes dropped: their slots go (under the lock)
  const std::size_t push_at = 2 * kInFlight + M, ack_at = push_at + kPushInFlight;
  std::size_t active = 0;
  std::uint32_t writes_in_flight = 0;
  std::uint64_t torn = 0;  // changed entries seen, added to torn_ under the lock
  bool block_next = false;
  std::string dead_why;

  auto post_entry = [&](State::Op& op, std::uint64_t* into) {
    const State::Remote& r = ps.remote[op.job.from];
    return fi_read(ep, into, sizeof(std::uint64_t), sdesc, r.addr,
                   r.buf_base + r.entries_offset + std::uint64_t{op.job.sample} * 8, r.buf_key,
                   &op.ctx) == 0;
  };
  // A peer that answered with an error: asked no more (the prefetch engine reads `dead`
  // under the lock, peer_usable_locked).
  auto mark_dead = [&](std::uint32_t node) {
    std::lock_guard lk(a_.mu_);
    if (ps.remote[node].dead) return;
    ps.remote[node].dead = true;
    spdlog::warn("peer node {}: unreachable ({}); what this node would read from it is read "
                 "from storage",
                 node, dead_why);
  };
  auto finish = [&](State::Op& op, bool ok) {
    done.emplace_back(op.job, ok);
    op.active = false;
    --active;
  };

  for (;;) {
    bool idle = true;
    // 1. New jobs; the sources' progress counters release pins; our own progress.
    std::uint64_t progress = 0;
    {
      std::unique_lock lk(a_.mu_);
      for (auto& [job, ok] : done) done_locked(job, ok);
      done.clear();
      torn_ += torn;
      torn = 0;
      if (a_.stopping_ || !a_.fatal_.empty()) break;
      // Demand mode across the nodes: pushes to tell; the homes' acknowledgments of ours;
      // what the others pushed to us, read from them as pulls.
      while (!pushes_.empty()) {
        to_push.push_back(pushes_.front());
        pushes_.pop_front();
        idle = false;
      }
      for (const std::uint32_t x : push_released) a_.pacer_.push_done_locked(x);
      pushes_dropped_ += push_released.size();
      push_released.clear();
      for (std::uint32_t n = 0; n < M && !ps.disabled; ++n) {
        if (n == me) continue;
        State::Remote& r = ps.remote[n];
        const auto ack = static_cast<std::uint32_t>(
            std::atomic_ref<std::uint64_t>(ps.progress[M + n]).load(std::memory_order_acquire));
        while (!r.unacked.empty() && static_cast<std::int32_t>(ack - r.unacked.front().first) > 0) {
          a_.pacer_.push_done_locked(r.unacked.front().second);
          r.unacked.pop_front();
          idle = false;
        }
        for (std::uint32_t k = 0; k < kMailbox; ++k) {
          const std::uint64_t w =
              std::atomic_ref<std::uint64_t>(
                  ps.progress[2 * M + std::size_t{n} * kMailbox + r.mail_next % kMailbox])
                  .load(std::memory_order_acquire);
          const auto seq = static_cast<std::uint32_t>(w >> 32);
          if ((w & 0xffffffffULL) == 0 || static_cast<std::int32_t>(seq - r.mail_next) < 0) break;
          r.mail_next = seq + 1;  // a later lap than expected: the words overwritten are lost
          ++pulls_seen_;
          PeerJob pull;
          if (a_.pacer_.pull_locked(static_cast<std::uint32_t>((w & 0xffffffffULL) - 1), n,
                                    pull)) {
            pull.token = seq;
            r.pulling.insert(seq);
            queue.push_back(pull);
          }
          idle = false;
        }
      }
      while (!jobs_.empty()) {
        PeerJob j = jobs_.front();
        jobs_.pop_front();
        if (ps.disabled || ps.remote[j.from].dead) done_locked(j, false);
        else queue.push_back(j);
        idle = false;
      }
      const auto now = Clock::now();
      for (std::uint32_t n = 0; n < M; ++n) {
        auto& pins = ps.pins[n];
        if (pins.empty()) continue;
        State::Remote& r = ps.remote[n];
        const std::uint64_t v =
            std::atomic_ref<std::uint64_t>(ps.progress[n]).load(std::memory_order_acquire);
        if (v != r.seen) {
          r.seen = v;
          r.seen_at = now;
        }
        while (!pins.empty() && pins.front().first < v) {
          a_.drop_use_locked(pins.front().second);
          pins.pop_front();
          idle = false;
        }
        // A reader that has not moved for --peer-timeout while we wait for slots: it lost
        // its turn (dead, stopped, or far behind); what it reads from us from now on may be
        // gone, and it then reads storage.
        if (!pins.empty() && a_.prefetch_.starved_locked(now, timeout) &&
            now - r.seen_at > timeout) {
          spdlog::warn("peer node {} has read nothing from this node's buffer for {} s while "
                       "this node waits for slots: {} samples kept for it are released (it "
                       "reads them from storage)",
                       n, a_.opt_.peer_timeout, pins.size());
          pins_released_early_ += pins.size();
          for (const auto& [t, x] : pins) a_.drop_use_locked(x);
          pins.clear();
          r.abandoned = true;
        }
      }
      while (ps.progress_cursor < a_.admitted_ && pending_[ps.progress_cursor] == 0)
        ++ps.progress_cursor;
      progress = ps.progress_cursor;
    }
    if (ps.disabled) {  // everything queued goes to storage (above); nothing is in flight
      std::unique_lock lk(a_.mu_);
      a_.prefetch_.wake_readers();
      wake_.wait_for(lk, std::chrono::milliseconds(50),
                          [&] { return a_.stopping_ || !a_.fatal_.empty() || !jobs_.empty(); });
      continue;
    }
    // 2. Start queued jobs.
    for (std::size_t i = 0; i < ps.ops.size() && !queue.empty(); ++i) {
      State::Op& op = ps.ops[i];
      if (op.active) continue;
      op = State::Op{};
      op.job = queue.front();
      queue.pop_front();
      if (ps.remote[op.job.from].dead) {
        done.emplace_back(op.job, false);
        continue;
      }
      op.active = true;
      op.since = op.retry_at = Clock::now();
      ++active;
    }
    // 3. Post what is due: first entry reads and retries.
    const auto now = Clock::now();
    for (std::size_t i = 0; i < ps.ops.size(); ++i) {
      State::Op& op = ps.ops[i];
      if (!op.active || op.phase != 0 || now < op.retry_at) continue;
      if (ps.remote[op.job.from].dead) {
        finish(op, false);
        continue;
      }
      if (post_entry(op, &scratch[2 * i])) op.phase = 1;
      idle = false;
    }
    // 4. Progress writes to the sources we read from.
    for (std::uint32_t n = 0; n < M; ++n) {
      State::Remote& r = ps.remote[n];
      if (n == me || !r.known || r.dead || r.writing || r.written >= progress) continue;
      scratch[2 * kInFlight + n] = progress;
      ps.writes[n].node = n;
      if (fi_write(ep, &scratch[2 * kInFlight + n], sizeof(std::uint64_t), sdesc, r.addr,
                   r.prog_base + std::uint64_t{me} * 8, r.prog_key, &ps.writes[n].ctx) == 0) {
        r.writing = true;
        ++writes_in_flight;
        idle = false;
      }
    }
    // 4b. Demand mode across the nodes: pushes told to their homes' mailboxes (one a word;
    //     dropped when the home is gone or would be lapped), and acknowledgments of theirs.
    for (std::size_t i = 0; i < kPushInFlight && !to_push.empty(); ++i) {
      if (ps.push_busy[i]) continue;
      const auto [x, home] = to_push.front();
      to_push.pop_front();
      State::Remote& r = ps.remote[home];
      const auto ack = static_cast<std::uint32_t>(
          std::atomic_ref<std::uint64_t>(ps.progress[M + home]).load(std::memory_order_acquire));
      if (home >= M || home == me || !r.known || r.dead || r.sent - ack >= kMailbox) {
        push_released.push_back(x);
        continue;
      }
      scratch[push_at + i] = std::uint64_t{r.sent} << 32 | (std::uint64_t{x} + 1);
      ps.push_writes[i].node = home;
      if (fi_write(ep, &scratch[push_at + i], sizeof(std::uint64_t), sdesc, r.addr,
                   r.prog_base + (2 * std::uint64_t{M} + std::uint64_t{me} * kMailbox +
                                  r.sent % kMailbox) * 8,
                   r.prog_key, &ps.push_writes[i].ctx) != 0) {
        to_push.push_front({x, home});  // the queue is full: after the completions
        break;
      }
      ps.push_busy[i] = true;
      r.unacked.emplace_back(r.sent++, x);
      ++pushed_;
      idle = false;
    }
    for (std::uint32_t n = 0; n < M; ++n) {
      State::Remote& r = ps.remote[n];
      if (n == me || !r.known || r.dead || r.acking || r.ack_written == r.ack_value()) continue;
      scratch[ack_at + n] = r.ack_value();
      ps.ack_writes[n].node = n;
      if (fi_write(ep, &scratch[ack_at + n], sizeof(std::uint64_t), sdesc, r.addr,
                   r.prog_base + (std::uint64_t{M} + me) * 8, r.prog_key,
                   &ps.ack_writes[n].ctx) == 0) {
        r.acking = true;
        idle = false;
      }
    }
    // 5. Completions. After an idle pass, on a provider with a wait object (tcp), the first
    //    read blocks in the kernel until the provider has work or 1 ms has passed: serving
    //    the other agents' reads of our buffer needs this thread to progress the endpoint
    //    (tcp;ofi_rxm's progress is manual), promptly but without spinning.
    fi_cq_entry entries[16];
    for (;;) {
      const ssize_t n = block_next ? fi_cq_sread(cq, entries, 16, nullptr, 1)
                                   : fi_cq_read(cq, entries, 16);
      block_next = false;
      completed.clear();
      if (n > 0) {
        for (ssize_t k = 0; k < n; ++k) completed.emplace_back(entries[k].op_context, true);
      } else if (n == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        if (fi_cq_readerr(cq, &err, 0) > 0) {
          completed.emplace_back(err.op_context, false);
          dead_why = fabric::error_text(err.err);
        }
      } else {
        break;
      }
      idle = false;
      for (const auto& [ctx, ok] : completed) {
        auto* w = static_cast<State::WriteCtx*>(ctx);
        if (w >= ps.push_writes.data() && w < ps.push_writes.data() + ps.push_writes.size()) {
          ps.push_busy[static_cast<std::size_t>(w - ps.push_writes.data())] = false;
          if (!ok) mark_dead(w->node);  // its unacknowledged pushes go after their hold
          continue;
        }
        if (w >= ps.ack_writes.data() && w < ps.ack_writes.data() + ps.ack_writes.size()) {
          State::Remote& r = ps.remote[w->node];
          r.acking = false;
          if (ok) r.ack_written = static_cast<std::uint32_t>(scratch[ack_at + w->node]);
          else mark_dead(w->node);
          continue;
        }
        if (w >= ps.writes.data() && w < ps.writes.data() + ps.writes.size()) {
          State::Remote& r = ps.remote[w->node];
          r.writing = false;
          --writes_in_flight;
          if (ok) r.written = scratch[2 * kInFlight + w->node];
          else mark_dead(w->node);
          continue;
        }
        auto* op = static_cast<State::Op*>(ctx);
        const std::size_t i = static_cast<std::size_t>(op - ps.ops.data());
        State::Remote& r = ps.remote[op->job.from];
        if (!ok) {
          mark_dead(op->job.from);
          finish(*op, false);
          continue;
        }
        if (op->phase == 1) {
          op->e1 = scratch[2 * i];
          if ((op->e1 & 0xffffffffULL) == 0) {  // not there, or in flight: try again shortly
            if (op->job.fetch || Clock::now() - op->since > timeout) {  // a fetch: not held
              finish(*op, false);
              continue;
            }
            op->phase = 0;
            op->retry_at = Clock::now() + std::chrono::microseconds(200);
            continue;
          }
          const std::uint64_t slot = (op->e1 & 0xffffffffULL) - 1;
          if (fi_read(ep, a_.slot_ptr(op->job.slot), a_.buf_.slot_bytes, ps.buf_mr.desc(), r.addr,
                      r.buf_base + slot * r.slot_bytes, r.buf_key, &op->ctx) == 0)
            op->phase = 2;
          else {  // queue full: start over after the completions
            op->phase = 0;
            op->retry_at = Clock::now();
          }
        } else if (op->phase == 2 && a_.buf_.label_bytes) {
          const std::uint64_t slot = (op->e1 & 0xffffffffULL) - 1;
          if (fi_read(ep, a_.label_ptr(op->job.slot), a_.buf_.label_bytes, ps.buf_mr.desc(), r.addr,
                      r.buf_base + r.labels_offset + slot * a_.buf_.label_bytes, r.buf_key,
                      &op->ctx) == 0)
            op->phase = 4;
          else {
            op->phase = 0;
            op->retry_at = Clock::now();
          }
        } else if (op->phase == 2 || op->phase == 4) {
          if (post_entry(*op, &scratch[2 * i + 1])) op->phase = 3;
          else {
            op->phase = 0;
            op->retry_at = Clock::now();
          }
        } else if (op->phase == 3) {
          if (scratch[2 * i + 1] == op->e1) {
            finish(*op, true);
          } else if (++op->torn >= kMaxTorn) {
            ++torn;
            finish(*op, false);
          } else {
            ++torn;
            op->phase = 0;
            op->retry_at = Clock::now();
          }
        }
      }
    }
    // 6. A read that never completes (a stopped peer): the provider may still write into our
    //    slots, so nothing it targets may be reused: peer sharing ends here for this agent
    //    (the endpoint is closed, which ends every operation), all of it from storage.
    const auto late = Clock::now();
    for (State::Op& op : ps.ops)
      if (op.active && op.phase != 0 && late - op.since > 2 * timeout) {
        spdlog::warn("peer node {}: a read of sample {} did not complete in {} s; peer sharing "
                     "is off for the rest of the run (everything from storage)",
                     op.job.from, op.job.sample, 2 * a_.opt_.peer_timeout);
        std::lock_guard lk(a_.mu_);  // the prefetch engine reads it (usable_locked)
        ps.disabled = true;
        break;
      }
    if (ps.disabled) {
      std::lock_guard lk(a_.mu_);
      ps.buf_mr = fabric::Region();
      ps.prog_mr = fabric::Region();
      ps.scratch_mr = fabric::Region();
      ps.ep.reset();
      for (State::Op& op : ps.ops)
        if (op.active) {
          op.active = false;
          done_locked(op.job, false);
        }
      for (const PeerJob& j : queue) done_locked(j, false);
      queue.clear();
      for (auto& pins : ps.pins) {
        for (const auto& [t, x] : pins) a_.drop_use_locked(x);
        pins.clear();
      }
      continue;
    }
    if (idle) {
      if (ps.ep->waitable()) {
        block_next = true;  // step 5 waits in fi_cq_sread (woken early by wake_peer_locked)
      } else {  // shm: readers copy our memory themselves; poll for our own work
        std::unique_lock lk(a_.mu_);
        wake_.wait_for(lk, std::chrono::microseconds(100), [&] {
          return a_.stopping_ || !a_.fatal_.empty() || !jobs_.empty();
        });
      }
    }
  }
}

nlohmann::json PeerSharing::json() const {
  if (!state_) return nullptr;
  return {{"provider", a_.opt_.peer_provider},
          {"samples", samples_},
          {"bytes", samples_ * a_.sample_bytes_},
          {"fallbacks", fallbacks_},
          {"torn", torn_},
          {"released_early", pins_released_early_},
          {"pushed", pushed_},
          {"pushes_dropped", pushes_dropped_},
          {"pushes_seen", pulls_seen_},
          {"disabled", state_->disabled}};
}

}  // namespace solar::agent

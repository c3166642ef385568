// The loops that keep fi_reads in flight on a session and reap their completions: a staged
// export's pieces (run_pieces) and every thread's queued requests (pump).
#include "fabric_source_impl.h"

namespace solar::storage {

namespace {

// After a read completes, the driver polls the completion queue this long before it sleeps in
// the kernel (providers with a wait object): a core is spent only while reads keep completing.
constexpr std::chrono::microseconds kPollAfterProgress{1000};


}  // namespace

void FabricSource::Impl::run_pieces(Session& s, std::vector<Piece>& pieces,
                                    std::vector<char>& done, std::byte* dst,
                                    std::uint64_t dst_len) {
  fabric::Region local;
  void* desc = nullptr;
  if (s.ep->local_mr()) {
    local = s.ep->register_memory(dst, dst_len, FI_READ);
    desc = local.desc();
  }
  const unsigned depth = std::max(1u, opt.queue_depth);
  std::vector<Op> slots(depth);
  std::size_t next = 0, pending = 0;
  auto last_progress = Clock::now();
  auto last_check = last_progress;

  auto advance = [&] {
    while (next < pieces.size() && done[next]) ++next;
  };
  advance();
  // Reads in flight point at `ops` (their contexts) and at the caller's memory: on any error
  // the endpoint is closed here, while both are still alive, before the error unwinds them
  // (closing it later, with the contexts gone, crashed libfabric when the server had died).
  try {
    while (next < pieces.size() || pending > 0) {
      // Issue reads while there is room.
      for (auto& op : slots) {
        if (op.busy) continue;
        advance();
        if (next >= pieces.size()) break;
        const Piece& p = pieces[next];
        // A bounded number of tries: a provider that keeps answering EAGAIN (tcp;ofi_rxm
        // reconnecting for ever to a server that was killed after the bootstrap) must come back
        // to the loop below, which notices the server gone and the timeout. (Unbounded, a rank
        // spun here at 100% CPU for good: found by scripts/soak.)
        ssize_t rc;
        int tries = 0;
        while ((rc = fi_read(s.ep->ep(), p.dst, p.len, desc, s.server, p.addr, p.key, &op.ctx)) ==
                   -FI_EAGAIN &&
               ++tries < 64) {
          fi_cq_entry e[1];
          const ssize_t n = fi_cq_read(s.ep->cq(), e, 0);  // drive progress
          if (n == -FI_EAVAIL) break;
        }
        if (rc != 0 && rc != -FI_EAGAIN)
          throw TransientError(fmt::format("{}: fi_read failed: {}", uri, fabric::error_text(rc)));
        if (rc == -FI_EAGAIN) break;
        // The emulated link is charged for reads issued, not for attempts the provider refused.
        double due = 0;
        if (bandwidth > 0 || latency > 0) {
          const double t = now();
          bucket = std::max(bucket, t) + (bandwidth > 0 ? double(p.len) / bandwidth : 0);
          due = std::max(bucket, t + latency);
        }
        op = Op{};
        op.busy = true;
        op.piece = next;
        op.due = due;
        ++pending;
        ++next;
      }
      // Reap completions.
      fi_cq_entry entries[16];
      const ssize_t n = fi_cq_read(s.ep->cq(), entries, 16);
      if (n > 0) {
        for (ssize_t i = 0; i < n; ++i) static_cast<Op*>(entries[i].op_context)->completed = true;
        last_progress = Clock::now();
      } else if (n == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        fi_cq_readerr(s.ep->cq(), &err, 0);
        throw TransientError(fmt::format("{}: a remote read failed: {} ({})", uri,
                                         fabric::error_text(err.err),
                                         fi_cq_strerror(s.ep->cq(), err.prov_errno, err.err_data,
                                                        nullptr, 0)));
      } else if (n != -FI_EAGAIN) {
        throw TransientError(fmt::format("{}: fi_cq_read: {}", uri, fabric::error_text(n)));
      }
      // Retire completed reads whose emulated delay has passed.
      const double t = (bandwidth > 0 || latency > 0) ? now() : 0;
      double earliest = 0;
      bool waiting = false;
      for (auto& op : slots) {
        if (!op.busy || !op.completed) continue;
        if (op.due > t) {
          earliest = waiting ? std::min(earliest, op.due) : op.due;
          waiting = true;
          continue;
        }
        done[op.piece] = 1;
        bytes += pieces[op.piece].len;
        op.busy = false;
        --pending;
        last_progress = Clock::now();
      }
      check_progress(s, slots, waiting, earliest, pending > 0 || next < pieces.size(),
                     last_check, last_progress);
    }
  } catch (...) {
    if (pending > 0) {
      local = fabric::Region();  // its domain goes with the endpoint
      s.ep.reset();
    }
    throw;
  }
}

void FabricSource::Impl::check_progress(Session& s, const std::vector<Op>& in_flight,
                                        bool waiting, double earliest, bool may_time_out,
                                        Clock::time_point& last_check,
                                        Clock::time_point& last_progress) {
  const auto tnow = Clock::now();
  if (tnow - last_check > std::chrono::milliseconds(20)) {
    last_check = tnow;
    if (s.server_gone())
      throw TransientError(fmt::format("{}: the server closed the connection mid-read", uri));
  }
  bool all_held = waiting;
  for (const auto& op : in_flight)
    if (op.busy && !op.completed) all_held = false;
  if (all_held) {
    std::this_thread::sleep_for(std::chrono::duration<double>(
        std::min(0.005, std::max(0.0, earliest - now()))));
    last_progress = Clock::now();
  } else if (may_time_out && tnow - last_progress > std::chrono::duration<double>(opt.timeout_s)) {
    throw TransientError(fmt::format("{}: no read completed for {:.1f} s (server hung or "
                                     "unreachable)",
                                     uri, opt.timeout_s));
  }
}

void FabricSource::Impl::pump(Session& s, Request* mine) {
  if (ops_gen != session_gen) {  // a new session: what was in flight went with the old one
    for (auto& op : ops) op = Op{};
    inflight = 0;
    for (Request* r : active) {
      r->next = 0;
      r->local = fabric::Region();
    }
    ops_gen = session_gen;
  }
  if (ops.size() != std::max(1u, opt.queue_depth)) ops.resize(std::max(1u, opt.queue_depth));
  auto last_progress = Clock::now();
  auto last_check = last_progress;
  const bool throttled = bandwidth > 0 || latency > 0;
  std::size_t issue_from = 0;  // active requests before this one have nothing left to issue

  auto more = [&] {
    return mine ? mine->left > 0
                : (!active.empty() || has_incoming.load(std::memory_order_acquire));
  };
  while (more()) {
    if (has_incoming.load(std::memory_order_acquire)) {
      std::lock_guard g(mu);
      active.insert(active.end(), incoming.begin(), incoming.end());
      incoming.clear();
      has_incoming = false;
    }
    // Issue reads while there is room, oldest request first.
    for (auto& op : ops) {
      if (op.busy) continue;
      Request* r = nullptr;
      for (; issue_from < active.size(); ++issue_from) {
        Request* a = active[issue_from];
        while (a->next < a->pieces.size() && a->done[a->next]) ++a->next;
        if (a->next < a->pieces.size()) {
          r = a;
          break;
        }
      }
      if (!r) break;
      const Piece& p = r->pieces[r->next];
      void* desc = nullptr;
      if (s.ep->local_mr()) {
        if (r->local_gen != session_gen || !r->local.desc()) {
          r->local = s.ep->register_memory(r->dst, r->bytes, FI_READ);
          r->local_gen = session_gen;
        }
        desc = r->local.desc();
      }
      const RemoteRegion& region = r->labels ? s.labels : s.data;
      // A bounded number of tries: a provider that keeps answering EAGAIN (tcp;ofi_rxm
      // reconnecting for ever to a server that was killed after the bootstrap) must come back
      // to the loop below, which notices the server gone and the timeout. (Unbounded, a rank
      // spun here at 100% CPU for good: found by scripts/soak.)
      ssize_t rc;
      int tries = 0;
      while ((rc = fi_read(s.ep->ep(), p.dst, p.len, desc, s.server, region.base + p.addr,
                           region.key, &op.ctx)) == -FI_EAGAIN &&
             ++tries < 64) {
        fi_cq_entry e[1];
        const ssize_t n = fi_cq_read(s.ep->cq(), e, 0);  // drive progress
        if (n == -FI_EAVAIL) break;
      }
      if (rc != 0 && rc != -FI_EAGAIN)
        throw TransientError(fmt::format("{}: fi_read failed: {}", uri, fabric::error_text(rc)));
      if (rc == -FI_EAGAIN) break;
      // The emulated link is charged for reads issued, not for attempts the provider refused.
      double due = 0;
      if (throttled) {
        const double t = now();
        bucket = std::max(bucket, t) + (bandwidth > 0 ? double(p.len) / bandwidth : 0);
        due = std::max(bucket, t + latency);
      }
      op = Op{};
      op.busy = true;
      op.req = r;
      op.piece = r->next;
      op.due = due;
      ++inflight;
      if (inflight > peak_in_flight.load(std::memory_order_relaxed))
        peak_in_flight.store(inflight, std::memory_order_relaxed);  // one driver at a time
      ++r->next;
    }
    // Reap completions: where the provider has a descriptor to wait on (tcp;ofi_rxm), sleep
    // in the kernel until one arrives rather than spin against the server for the cores, but
    // only once no read has made progress for kPollAfterProgress: while completions flow,
    // polling drives the provider (ofi_rxm progresses inside fi_cq_read) and saves a wake-up
    // per read (tcp 256 KiB one-sample reads from 8 threads: 0.48 -> 0.69 of the raw fabric).
    fi_cq_entry entries[16];
    bool held = false;
    for (auto& op : ops)
      if (op.busy && op.completed) held = true;
    const bool sleep = s.ep->waitable() && inflight > 0 && !held && !has_incoming.load() &&
                       Clock::now() - last_progress > kPollAfterProgress;
    const ssize_t n = sleep ? fi_cq_sread(s.ep->cq(), entries, 16, nullptr, 10)
                            : fi_cq_read(s.ep->cq(), entries, 16);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) static_cast<Op*>(entries[i].op_context)->completed = true;
      last_progress = Clock::now();
    } else if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(s.ep->cq(), &err, 0);
      throw TransientError(fmt::format("{}: a remote read failed: {} ({})", uri,
                                       fabric::error_text(err.err),
                                       fi_cq_strerror(s.ep->cq(), err.prov_errno, err.err_data,
                                                      nullptr, 0)));
    } else if (n != -FI_EAGAIN && n != -FI_ETIMEDOUT) {
      throw TransientError(fmt::format("{}: fi_cq_read: {}", uri, fabric::error_text(n)));
    }
    // Retire completed reads whose emulated delay has passed.
    const double t = throttled ? now() : 0;
    double earliest = 0;
    bool waiting = false, retired = false;
    for (auto& op : ops) {
      if (!op.busy || !op.completed) continue;
      if (op.due > t) {
        earliest = waiting ? std::min(earliest, op.due) : op.due;
        waiting = true;
        continue;
      }
      Request& r = *op.req;
      r.done[op.piece] = 1;
      bytes += r.pieces[op.piece].len;
      op.busy = false;
      --inflight;
      retired = true;
      if (--r.left == 0) {
        active.erase(std::find(active.begin(), active.end(), &r));
        issue_from = 0;
        finish(r, nullptr);  // its owner may return at once: r is not touched after this
      }
    }
    if (retired) last_progress = Clock::now();
    // Done: a server that closes its socket right after the last completion is not this
    // read's problem (else its caller would wait out a reconnection window for bytes it has).
    if (!more()) return;
    // The timeout counts also when nothing could be issued.
    check_progress(s, ops, waiting, earliest, true, last_check, last_progress);
    // An empty poll: let a caller that was just told its read is done (or the server, on a
    // shared core) run before polling again.
    if (n <= 0 && !retired) std::this_thread::yield();
  }
}

}  // namespace solar::storage

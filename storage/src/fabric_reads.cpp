// SPDX-License-Identifier: Apache-2.0
// FabricSource's reads on a session, each a fabric::Driver run (fabric_driver.h): a staged
// export's pieces (run_pieces) and every thread's queued requests (pump). What is theirs is
// what to read next, where it lands, the emulated link, and when a request is finished.
#include "fabric_driver.h"
#include "fabric_source_impl.h"

namespace solar::storage {

double FabricSource::Impl::charge(std::uint64_t len) {
  if (!(link.bandwidth > 0 || link.latency > 0)) return 0;
  const double t = now();
  link.bucket = std::max(link.bucket, t) + (link.bandwidth > 0 ? double(len) / link.bandwidth : 0);
  return std::max(link.bucket, t + link.latency);
}

void FabricSource::Impl::run_pieces(Session& s, std::vector<Piece>& pieces,
                                    std::vector<char>& done, std::byte* dst,
                                    std::uint64_t dst_len) {
  fabric::Region local;
  void* desc = nullptr;
  if (s.ep->local_mr()) {
    local = s.ep->register_memory(dst, dst_len, FI_READ);
    desc = local.desc();
  }
  // A driver of its own, not the session's (pump's): a staged read holds the session alone.
  fabric::Driver own(std::max(1u, opt.queue_depth));
  struct Staged final : fabric::Driver::Work {
    Staged(Impl& i, Session& se, std::vector<Piece>& p, std::vector<char>& d, void* de,
           const fabric::Driver& dr)
        : im(i), s(se), pieces(p), finished(d), desc(de), driver(dr) {}
    Impl& im;
    Session& s;
    std::vector<Piece>& pieces;
    std::vector<char>& finished;
    void* desc;
    const fabric::Driver& driver;
    std::size_t next_piece = 0;
    Clock::time_point last_check = Clock::now();

    void advance() {
      while (next_piece < pieces.size() && finished[next_piece]) ++next_piece;
    }
    bool more() override {
      advance();
      return next_piece < pieces.size() || driver.in_flight() > 0;
    }
    bool next(fabric::Read& r) override {
      advance();
      if (next_piece >= pieces.size()) return false;
      const Piece& p = pieces[next_piece];
      r = {p.dst, p.len, desc, p.addr, p.key, nullptr, next_piece};
      return true;
    }
    void posted() override { ++next_piece; }
    double due(std::uint64_t len) override { return im.charge(len); }
    void done(void*, std::size_t index, std::uint64_t len) override {
      finished[index] = 1;
      im.counts.bytes += len;
    }
    void check(bool all_held, double earliest, Clock::time_point& last_progress) override {
      im.check_progress(s, all_held, earliest, last_check, last_progress);
    }
  } work(*this, s, pieces, done, desc, own);
  // Reads in flight point at the driver's slots and at the caller's memory: on any error the
  // endpoint is closed here, while both are still alive, before the error unwinds them
  // (closing it later, with the contexts gone, crashed libfabric when the server had died).
  auto close_if_in_flight = [&] {
    if (own.in_flight() > 0) {
      local = fabric::Region();  // its domain goes with the endpoint
      s.ep.reset();
    }
  };
  try {
    own.run(*s.ep, s.server, work, {});
  } catch (const fabric::DriverError& e) {
    close_if_in_flight();
    throw TransientError(fmt::format("{}: {}", remote.uri, e.what()));
  } catch (...) {
    close_if_in_flight();
    throw;
  }
}

void FabricSource::Impl::check_progress(Session& s, bool all_held, double earliest,
                                        Clock::time_point& last_check,
                                        Clock::time_point& last_progress) {
  const auto tnow = Clock::now();
  if (tnow - last_check > std::chrono::milliseconds(20)) {
    last_check = tnow;
    if (s.server_gone())
      throw TransientError(
          fmt::format("{}: the server closed the connection mid-read", remote.uri));
  }
  if (all_held) {
    std::this_thread::sleep_for(std::chrono::duration<double>(
        std::min(0.005, std::max(0.0, earliest - now()))));
    last_progress = Clock::now();
  } else if (tnow - last_progress > std::chrono::duration<double>(opt.timeout_s)) {
    throw TransientError(fmt::format("{}: no read completed for {:.1f} s (server hung or "
                                     "unreachable)",
                                     remote.uri, opt.timeout_s));
  }
}

void FabricSource::Impl::pump(Session& s, Request* mine) {
  // One poll per read: a server that hung up (an export withdrawn, a restart) is noticed before
  // any byte is read, not 20 ms into the read, when one-sided reads may already have completed.
  if (s.server_gone())
    throw TransientError(fmt::format("{}: the server closed the connection", remote.uri));
  if (ops_gen != session_gen) {  // a new session: what was in flight went with the old one
    driver.reset();
    for (Request* r : active) {
      r->next = 0;
      r->local = fabric::Region();
    }
    ops_gen = session_gen;
  }
  driver.set_depth(std::max(1u, opt.queue_depth));
  struct Shared final : fabric::Driver::Work {
    Shared(Impl& i, Session& se, Request* m) : im(i), s(se), mine(m) {}
    Impl& im;
    Session& s;
    Request* mine;
    std::size_t issue_from = 0;  // active requests before this one have nothing left to issue
    Request* cur = nullptr;      // the request of the read next() gave
    Clock::time_point last_check = Clock::now();

    void start_pass() override {
      if (im.has_incoming.load(std::memory_order_acquire)) {
        std::lock_guard g(im.mu);
        im.active.insert(im.active.end(), im.incoming.begin(), im.incoming.end());
        im.incoming.clear();
        im.has_incoming = false;
      }
    }
    bool more() override {
      return mine ? mine->left > 0
                  : (!im.active.empty() || im.has_incoming.load(std::memory_order_acquire));
    }
    // Oldest request first.
    bool next(fabric::Read& rd) override {
      cur = nullptr;
      for (; issue_from < im.active.size(); ++issue_from) {
        Request* a = im.active[issue_from];
        while (a->next < a->pieces.size() && a->done[a->next]) ++a->next;
        if (a->next < a->pieces.size()) {
          cur = a;
          break;
        }
      }
      if (!cur) return false;
      const Piece& p = cur->pieces[cur->next];
      void* desc = nullptr;
      if (s.ep->local_mr()) {
        if (cur->local_gen != im.session_gen || !cur->local.desc()) {
          cur->local = s.ep->register_memory(cur->dst, cur->bytes, FI_READ);
          cur->local_gen = im.session_gen;
        }
        desc = cur->local.desc();
      }
      const RemoteRegion& region = cur->labels ? s.labels : s.data;
      rd = {p.dst, p.len, desc, region.base + p.addr, region.key, cur, cur->next};
      return true;
    }
    void posted() override { ++cur->next; }
    double due(std::uint64_t len) override { return im.charge(len); }
    void done(void* tag, std::size_t index, std::uint64_t len) override {
      Request& r = *static_cast<Request*>(tag);
      r.done[index] = 1;
      im.counts.bytes += len;
      if (--r.left == 0) {
        im.active.erase(std::find(im.active.begin(), im.active.end(), &r));
        issue_from = 0;
        im.finish(r, nullptr);  // its owner may return at once: r is not touched after this
      }
    }
    bool may_sleep() override { return !im.has_incoming.load(); }
    void check(bool all_held, double earliest, Clock::time_point& last_progress) override {
      im.check_progress(s, all_held, earliest, last_check, last_progress);
    }
  } work(*this, s, mine);
  fabric::Driver::Options o;
  o.yield_when_idle = true;
  o.peak = &counts.peak_in_flight;
  try {
    driver.run(*s.ep, s.server, work, o);
  } catch (const fabric::DriverError& e) {
    throw TransientError(fmt::format("{}: {}", remote.uri, e.what()));
  }
}

bool FabricSource::Impl::warm_up(Session& s) {
  if (!s.rma || !s.ep || exported.info.samples == 0 || exported.info.sample_bytes == 0)
    return true;
  std::vector<std::byte> buf(std::min<std::uint64_t>(4096, exported.info.sample_bytes));
  fabric::Region local;
  void* desc = nullptr;
  struct One final : fabric::Driver::Work {
    fabric::Read rd;
    bool posted_ = false, finished = false;
    Clock::time_point started = Clock::now();
    bool more() override { return !finished; }
    bool next(fabric::Read& r) override {
      if (posted_) return false;
      r = rd;
      return true;
    }
    void posted() override { posted_ = true; }
    double due(std::uint64_t) override { return 0; }
    void done(void*, std::size_t, std::uint64_t) override { finished = true; }
    void check(bool, double, Clock::time_point&) override {
      if (Clock::now() - started > std::chrono::seconds(2))
        throw fabric::DriverError("warm-up read took over 2 s");
    }
  } one;
  try {
    if (s.ep->local_mr()) {
      local = s.ep->register_memory(buf.data(), buf.size(), FI_READ);
      desc = local.desc();
    }
    one.rd = {buf.data(), buf.size(), desc, s.data.base, s.data.key, nullptr, 0};
    fabric::Driver own(1);
    own.run(*s.ep, s.server, one, {});
    return true;
  } catch (const std::exception& e) {
    // The first real read meets the problem and reports it (retries, reconnects) as it would.
    spdlog::debug("{}: warm-up read: {}", remote.uri, e.what());
    local = fabric::Region();  // a read in flight points at buf: the endpoint goes first
    s.ep.reset();
    return false;
  }
}

}  // namespace solar::storage

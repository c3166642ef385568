#include "solar/storage/fabric_source.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fmt/format.h>
#include <mutex>
#include <optional>
#include <spdlog/spdlog.h>
#include <thread>

#include "fabric.h"
#include "wire.h"

namespace solar::storage {
namespace asio = boost::asio;
using asio::ip::tcp;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// After a read completes, the driver polls the completion queue this long before it sleeps in
// the kernel (providers with a wait object): a core is spent only while reads keep completing.
constexpr std::chrono::microseconds kPollAfterProgress{1000};

// A failure worth retrying on a new connection (the server went away, a read timed out).
class TransientError : public StorageError {
 public:
  using StorageError::StorageError;
};

struct RemoteRegion {
  std::uint64_t key = 0, base = 0;
};

// One connection: the bootstrap socket (kept open: its closing tells us the server is gone)
// and a fabric endpoint that can reach the server.
struct Session {
  asio::io_context io;
  tcp::socket sock{io};
  std::unique_ptr<fabric::Endpoint> ep;
  fi_addr_t server = FI_ADDR_UNSPEC;
  bool rma = false;
  RemoteRegion data, labels;
  std::uint64_t staging_bytes = 0;

  bool server_gone() {
    pollfd p{sock.native_handle(), POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0;  // the server never speaks first: readable means closed
  }
  ~Session() {
    if (sock.is_open()) {
      try {
        wire::send(sock, {{"op", "bye"}});
      } catch (...) {
      }
    }
  }
};

// One fi_read: `len` bytes at remote (key, addr) into `dst`.
struct Piece {
  std::uint64_t key, addr, len;
  std::byte* dst;
};

// One read() or read_labels() of an RMA export: its pieces (addr: the offset in the data or
// labels region), queued for whichever thread drives the session (FabricSource::Impl::pump).
// It lives on its caller's stack until it is finished; the caller waits on its wake-up
// (Impl::wake_of), to be told that it is finished or that it may drive.
struct Request {
  std::vector<Piece> pieces;
  bool labels = false;
  std::byte* dst = nullptr;  // the destination, [dst, dst + bytes): registered when FI_MR_LOCAL
  std::uint64_t bytes = 0;
  std::vector<char> done;
  std::size_t next = 0;  // first piece not issued on the current session (driver only)
  std::size_t left = 0;  // pieces not done (driver only)
  fabric::Region local;  // its registration on the current session (FI_MR_LOCAL providers)
  std::uint64_t local_gen = 0;
  // Under Impl::mu. A failed read's error is its message (and whether it was a StorageError):
  // its owner makes the exception object and throws it in its own thread (submit). An object
  // made by the driver and rethrown by the owner is freed through libstdc++'s reference counts
  // (the exception's and its message's copy-on-write string), which TSan cannot see: two
  // reports (scripts/sanitize thread) before the error crossed threads as text.
  bool finished = false;
  std::optional<std::string> error;  // set: the read failed, with this message
  bool storage_error = false;        // it was a StorageError
  std::uint32_t wake = 0;  // which of Impl::wakes its owner waits on (its thread's)
};

// The wake-up a calling thread waits on (an index into Impl::wakes): one per thread, in the
// order threads first read, so that callers share one only beyond kWakes threads.
constexpr std::uint32_t kWakes = 64;
std::uint32_t caller_wake() {
  static std::atomic<std::uint32_t> next{0};
  thread_local const std::uint32_t mine = next.fetch_add(1, std::memory_order_relaxed) % kWakes;
  return mine;
}

// A slot of the queue depth: one fi_read in flight.
struct Op {
  fi_context2 ctx;  // first: the completion's op_context points here
  Request* req = nullptr;
  std::size_t piece = 0;
  double due = 0;
  bool completed = false;
  bool busy = false;
};

}  // namespace

struct FabricSource::Impl {
  std::string uri, host, port, name;
  FabricOptions opt;
  DatasetInfo info;
  std::string identity, provider;
  double bandwidth = 0, latency = 0;  // emulated contention, from the server
  double bucket = 0;                  // when the emulated link is next free (seconds)
  bool rma = false;  // the export is read one-sided (contiguous): reads share the session
  std::string served_from;  // what the server reads from: file, memory (--in-memory), staged
  std::atomic<std::uint64_t> bytes{0}, reconnects{0};
  std::atomic<std::uint64_t> peak_in_flight{0};  // most fi_reads of read() in flight at once

  // The session is used by one thread at a time, the driver. Reads of an RMA export do not
  // take turns, though: each queues its pieces (a Request) and waits, and a caller that finds
  // no driver becomes it and keeps the queue depth filled with every queued request's pieces
  // until its own request is done. If others' reads are still queued then, it hands the
  // session to the source's engine thread (started on first need), which drives until the
  // queue is empty, so that no caller waits for others' reads and the session never waits for
  // a sleeping caller to wake (handing it from caller to caller instead cost two thirds of
  // the bandwidth of 8 threads' 256 KiB reads over tcp;ofi_rxm here). So reads from several
  // threads (the agent's readers, a DataLoader's workers) are in flight together, a single
  // reader drives its own reads without a thread hop, and only one thread polls the
  // completion queue (on few cores, a poller per reader would take the CPU the server and the
  // copies need). Staged reads, drop_cache and reconnections hold the session alone
  // (exclusive()).
  std::mutex mu;
  bool driving = false;               // under mu
  bool engine_wanted = false, engine_stop = false;  // under mu
  std::condition_variable engine_cv;
  std::thread engine;
  unsigned exclusive_waiting = 0;     // under mu
  std::condition_variable exclusive_cv;
  std::vector<Request*> incoming;     // under mu: queued, not yet seen by the driver
  // What a caller waits on for its request (with mu): its thread's (caller_wake) rather than
  // a condition variable of the request's own, so that finish() can notify after unlocking mu
  // without touching the request, which its owner may have freed by then. Notified before
  // unlocking, the caller woke to find mu still held by the driver and slept again on it: two
  // wake-ups per read instead of one (256 KiB one-sample reads from 8 threads: nearly every
  // read). Beyond kWakes threads some share one: notify_all, each checks its own request.
  std::array<std::condition_variable, kWakes> wakes;
  std::condition_variable& wake_of(const Request* r) { return wakes[r->wake]; }
  std::atomic<bool> has_incoming{false};
  // The driver's (whoever holds the session):
  std::unique_ptr<Session> session;
  std::uint64_t session_gen = 0;      // bumped for every new session
  std::vector<Request*> active;       // requests with pieces not done, in arrival order
  std::vector<Op> ops;                // queue_depth slots
  std::size_t inflight = 0;
  std::uint64_t ops_gen = 0;          // the session `ops` and `active` were issued on
  // The current outage: since when the server has been unreachable, and how many attempts
  // were made. Shared by every read, so that once the window has passed, the reads that
  // follow fail at their first attempt instead of waiting the window again each.
  double reconnect_s = 30;
  std::optional<Clock::time_point> outage_since;
  unsigned outage_attempts = 0;
  // measure_fabric's session and the server memory it reads, kept from one measure to the
  // next (see there). Its caller's thread only.
  struct Reference {
    std::unique_ptr<Session> s;
    ReferenceMemory memory = ReferenceMemory::plain;
    std::uint64_t asked = 0, key = 0, base = 0, bytes = 0;
  };
  std::optional<Reference> reference;

  // wait: a completion queue pump() may sleep on (where the provider has a descriptor);
  // measure_fabric's is polled only, as fi_rma_bw's.
  std::unique_ptr<Session> open_session(bool first, bool wait = true);
  void run_pieces(Session& s, std::vector<Piece>& pieces, std::vector<char>& done,
                  std::byte* dst, std::uint64_t dst_len);
  json request(Session& s, const json& msg);
  template <class Work>
  void with_retries(Work&& work);
  // Queues `req` and returns when it is done; throws its error.
  void submit(Request& req);
  // Drives the session until `mine` is done, or without `mine` until nothing is queued (the
  // caller holds the session).
  void pump(Session& s, Request* mine);
  void engine_loop();
  ~Impl() {
    {
      std::lock_guard g(mu);
      engine_stop = true;
      engine_cv.notify_one();
    }
    if (engine.joinable()) engine.join();
  }
  // The end of one pass of a read loop (run_pieces, pump): every 20 ms, whether the server's
  // bootstrap socket closed; when every busy op has completed and only waits out its emulated
  // delay (`waiting`, until `earliest`), a short sleep; else, when `may_time_out`, the
  // no-progress timeout. Throws TransientError.
  void check_progress(Session& s, const std::vector<Op>& in_flight, bool waiting, double earliest,
                      bool may_time_out, Clock::time_point& last_check,
                      Clock::time_point& last_progress);
  // Tells its owner (error: the current exception, or none: done); r may be gone after.
  void finish(Request& r, std::exception_ptr error);
  void fail_all(std::exception_ptr error);            // every queued request fails with it
  void drop_session();  // closes the session: nothing more lands in anyone's memory
  // Runs work() holding the session alone (no reads issued meanwhile; in-flight ones wait).
  template <class Work>
  void exclusive(Work&& work);
  void release_locked();  // gives the session up (mu held) and wakes who is next
  // Within an outage: throws StorageError when the window has passed, else waits the backoff.
  void next_attempt(const StorageError& e, bool first);
  double now() const {
    return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  }
};

std::unique_ptr<Session> FabricSource::Impl::open_session(bool first, bool wait) {
  auto s = std::make_unique<Session>();
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(opt.timeout_s * 1000));
  try {
    tcp::resolver resolver(s->io);
    const auto endpoints = resolver.resolve(host, port);
    // Within timeout_s: an unreachable host must not hold the caller for the kernel's minutes.
    boost::system::error_code ec = asio::error::would_block;
    asio::async_connect(s->sock, endpoints,
                        [&ec](const boost::system::error_code& e, const tcp::endpoint&) { ec = e; });
    s->io.run_for(timeout);
    if (ec == asio::error::would_block) {
      s->sock.close();
      s->io.restart();
      s->io.run();  // the aborted connect's handler
      ec = asio::error::timed_out;
    }
    if (ec) throw boost::system::system_error(ec);
    s->sock.native_non_blocking(false);  // wire:: does blocking I/O with SO_RCVTIMEO
  } catch (const boost::system::system_error& e) {
    const std::string msg = fmt::format("{}: cannot connect to {}:{}: {}; is solar-stored running "
                                        "there?",
                                        uri, host, port, e.code().message());
    // The first connection fails at once, unless the server is known to exist and may be
    // restarting (wait_for_server): then it is retried within the window, as a lost one is.
    if (first && !opt.wait_for_server) throw StorageError(msg);
    throw TransientError(msg);
  }
  const int ms = static_cast<int>(opt.timeout_s * 1000);
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  ::setsockopt(s->sock.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(s->sock.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  std::string token = opt.token;
  if (token.empty())
    if (const char* t = std::getenv("SOLAR_STORED_TOKEN")) token = t;
  const json reply = request(*s, {{"op", "hello"}, {"version", wire::kVersion}, {"token", token},
                                  {"dataset", name}});
  if (!reply.value("ok", false)) {
    const std::string msg = fmt::format("{}: the server refused: {}", uri,
                                        reply.value("error", std::string("no reason given")));
    if (reply.value("retry", false)) throw TransientError(msg);  // busy: worth another try
    throw StorageError(msg);
  }
  try {
    const std::string bad_hello = uri + ": the server's hello reply is bad";
    const DatasetInfo i = wire::info_from_json(reply.at("info"));
    const std::string id = reply.at("identity").get<std::string>();
    if (first) {
      info = i;
      identity = id;
      provider = opt.provider.empty() ? reply.at("provider").get<std::string>() : opt.provider;
      bandwidth = wire::rate_field(reply.at("throttle").at("bandwidth"), bad_hello);
      latency = wire::rate_field(reply.at("throttle").at("latency_s"), bad_hello);
    } else if (id != identity) {
      throw StorageError(fmt::format("{}: the server came back exporting a different file; "
                                     "refusing to mix its bytes into this read",
                                     uri));
    }
    const json& d = reply.at("data");
    s->rma = d.at("mode") == "rma";
    if (first) {
      rma = s->rma;
      served_from = !s->rma ? "staged" : d.value("memory", std::string("file"));
    }
    if (s->rma)
      s->data = {wire::count_field(d.at("key"), bad_hello),
                 wire::count_field(d.at("base"), bad_hello)};
    else
      s->staging_bytes = wire::count_field(d.at("bytes"), bad_hello);
    if (reply.contains("labels"))
      s->labels = {wire::count_field(reply["labels"].at("key"), bad_hello),
                   wire::count_field(reply["labels"].at("base"), bad_hello)};
    s->ep = fabric::Endpoint::open(provider, "", wait);
    if (s->ep->virt_addr() != reply.at("virt_addr").get<bool>())
      throw StorageError(fmt::format("{}: provider {} disagrees with the server's about "
                                     "FI_MR_VIRT_ADDR; use the server's provider",
                                     uri, provider));
    s->server = s->ep->insert(wire::from_hex(reply.at("address").get<std::string>()));
  } catch (const json::exception& e) {
    throw StorageError(fmt::format("{}: protocol error in the server's reply ({})", uri, e.what()));
  }
  return s;
}

json FabricSource::Impl::request(Session& s, const json& msg) {
  try {
    wire::send(s.sock, msg);
    return wire::receive(s.sock);
  } catch (const boost::system::system_error& e) {
    throw TransientError(fmt::format("{}: lost the connection to the server ({})", uri,
                                     e.code().message()));
  }
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

void FabricSource::Impl::next_attempt(const StorageError& e, bool first) {
  const auto now = Clock::now();
  if (!outage_since) {
    outage_since = now;
    outage_attempts = 0;
    if (reconnect_s > 0)
      spdlog::warn("{}; reconnecting for up to {:g} s (SOLAR_STORED_RECONNECT)", e.what(),
                   reconnect_s);
  }
  ++outage_attempts;
  const double waited = std::chrono::duration<double>(now - *outage_since).count();
  if (waited >= reconnect_s)
    throw StorageError(fmt::format(
        "{} (gave up after {} attempt{} in {:.1f} s: solar-stored at {}:{} did not {} within "
        "{:g} s; SOLAR_STORED_RECONNECT=SECONDS waits longer)",
        e.what(), outage_attempts, outage_attempts == 1 ? "" : "s", waited, host, port,
        first ? "accept the connection" : "come back", reconnect_s));
  const double backoff = 0.1 * static_cast<double>(1u << std::min(outage_attempts - 1, 5u));
  std::this_thread::sleep_for(
      std::chrono::duration<double>(std::min({2.0, backoff, reconnect_s - waited})));
}

// A lost server is reconnected to for up to reconnect_s from the start of the outage, with
// backoff 0.1 s · 2^k (at most 2 s); one warning when it starts, one line when it ends.
template <class Work>
void FabricSource::Impl::with_retries(Work&& work) {
  for (;;) {
    try {
      if (!session) {
        session = open_session(false);
        ++session_gen;
        if (outage_since) ++reconnects;
      }
      work(*session);
      if (outage_since) {
        spdlog::info("{}: the server is back after {:.1f} s; reading on", uri,
                     std::chrono::duration<double>(Clock::now() - *outage_since).count());
        outage_since.reset();
      }
      return;
    } catch (const TransientError& e) {
      drop_session();  // closes the endpoint: nothing more lands in the callers' memory
      next_attempt(e, false);
    } catch (...) {
      drop_session();  // its endpoint may be closed already (run_pieces); start afresh
      throw;
    }
  }
}

void FabricSource::Impl::drop_session() {
  // Registrations first: their domain goes with the endpoint.
  for (Request* r : active) r->local = fabric::Region();
  session.reset();
  // Reads that were in flight land nowhere now: issue them again on the next session.
  for (auto& op : ops) op = Op{};
  inflight = 0;
  for (Request* r : active) r->next = 0;
  ops_gen = session_gen;
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

void FabricSource::Impl::finish(Request& r, std::exception_ptr error) {
  r.local = fabric::Region();
  bool storage = false;
  std::optional<std::string> what;
  if (error) {
    what = "unknown error";
    try {
      std::rethrow_exception(error);
    } catch (const StorageError& e) {
      what = e.what();
      storage = true;
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
  }
  std::condition_variable& wake = wake_of(&r);
  {
    std::lock_guard g(mu);
    r.storage_error = storage;
    r.error = std::move(what);
    r.finished = true;
  }
  wake.notify_all();  // r may be gone already (its owner saw `finished`); `wake` is ours
}

void FabricSource::Impl::fail_all(std::exception_ptr error) {
  drop_session();
  std::vector<Request*> all;
  all.swap(active);
  {
    std::lock_guard g(mu);
    all.insert(all.end(), incoming.begin(), incoming.end());
    incoming.clear();
    has_incoming = false;
  }
  for (Request* r : all) finish(*r, error);  // each owner throws an exception of its own
}

void FabricSource::Impl::release_locked() {
  driving = false;
  if (exclusive_waiting) {
    exclusive_cv.notify_one();
    return;
  }
  if (active.empty() && incoming.empty()) return;
  // Others' reads are queued: the engine thread drives them (the session stays taken).
  try {
    if (!engine.joinable()) engine = std::thread([this] { engine_loop(); });
    driving = true;
    engine_wanted = true;
    engine_cv.notify_one();
  } catch (const std::system_error&) {  // no thread to be had: a waiting caller drives
    wake_of(active.empty() ? incoming.front() : active.front()).notify_all();
  }
}

void FabricSource::Impl::engine_loop() {
  std::unique_lock lk(mu);
  for (;;) {
    engine_cv.wait(lk, [&] { return engine_stop || engine_wanted; });
    if (engine_stop) return;
    engine_wanted = false;  // the session is ours (driving)
    lk.unlock();
    try {
      with_retries([&](Session& s) { pump(s, nullptr); });
    } catch (...) {
      fail_all(std::current_exception());
    }
    lk.lock();
    release_locked();
  }
}

template <class Work>
void FabricSource::Impl::exclusive(Work&& work) {
  {
    std::unique_lock lk(mu);
    ++exclusive_waiting;
    exclusive_cv.wait(lk, [&] { return !driving; });
    --exclusive_waiting;
    driving = true;
  }
  try {
    work();
  } catch (...) {
    std::lock_guard g(mu);
    release_locked();
    throw;
  }
  std::lock_guard g(mu);
  release_locked();
}

void FabricSource::Impl::submit(Request& req) {
  req.left = req.pieces.size();
  req.done.assign(req.pieces.size(), 0);
  req.wake = caller_wake();
  if (req.left == 0) return;
  std::unique_lock lk(mu);
  incoming.push_back(&req);
  has_incoming = true;
  while (!req.finished) {
    if (driving) {
      wake_of(&req).wait(lk);
      continue;
    }
    driving = true;
    lk.unlock();
    try {
      with_retries([&](Session& s) { pump(s, &req); });
    } catch (...) {
      fail_all(std::current_exception());  // req among them
    }
    lk.lock();
    release_locked();
  }
  if (req.error) {
    if (req.storage_error) throw StorageError(*req.error);
    throw std::runtime_error(*req.error);
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

FabricSource::FabricSource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FabricSource::~FabricSource() = default;

std::unique_ptr<FabricSource> FabricSource::connect(const std::string& uri,
                                                    const FabricOptions& options) {
  auto im = std::make_unique<Impl>();
  im->uri = uri;
  im->opt = options;
  const std::string_view rest = std::string_view(uri).substr(std::string_view("fabric://").size());
  const auto slash = rest.find('/');
  const auto colon = rest.substr(0, slash).rfind(':');
  if (!uri.starts_with("fabric://") || slash == std::string_view::npos ||
      colon == std::string_view::npos || slash + 1 == rest.size())
    throw StorageError(fmt::format("source '{}': expected fabric://HOST:PORT/NAME", uri));
  im->host = std::string(rest.substr(0, colon));
  im->port = std::string(rest.substr(colon + 1, slash - colon - 1));
  im->name = std::string(rest.substr(slash + 1));
  unsigned p = 0;
  auto [ptr, ec] = std::from_chars(im->port.data(), im->port.data() + im->port.size(), p);
  if (ec != std::errc() || ptr != im->port.data() + im->port.size() || p == 0 || p > 65535)
    throw StorageError(fmt::format("source '{}': port '{}' is not a number in 1..65535", uri,
                                   im->port));
  if (options.timeout_s <= 0) throw StorageError("fabric timeout must be positive");
  im->reconnect_s = options.reconnect_s;
  if (im->reconnect_s < 0) {
    im->reconnect_s = 30;
    if (const char* env = std::getenv("SOLAR_STORED_RECONNECT"); env && *env) {
      char* end = nullptr;
      const double v = std::strtod(env, &end);
      if (end == env || *end || !(v >= 0) || v > 86400)
        throw StorageError(fmt::format("SOLAR_STORED_RECONNECT='{}': expected seconds to keep "
                                       "reconnecting to solar-stored, 0..86400",
                                       env));
      im->reconnect_s = v;
    }
  }
  // A server that is not there is an error at once (a wrong address should not wait), unless
  // the caller knows it was there (wait_for_server); one that answers busy is tried again
  // within the reconnection window.
  for (;;) {
    try {
      im->session = im->open_session(true);
      break;
    } catch (const TransientError& e) {
      im->next_attempt(e, true);
    }
  }
  im->outage_since.reset();
  return std::unique_ptr<FabricSource>(new FabricSource(std::move(im)));
}

const DatasetInfo& FabricSource::info() const { return impl_->info; }
std::string FabricSource::describe() const { return impl_->uri; }
const std::string& FabricSource::identity() const { return impl_->identity; }
std::string FabricSource::provider() const { return impl_->provider; }
const std::string& FabricSource::served_from() const { return impl_->served_from; }
std::uint64_t FabricSource::bytes_read() const { return impl_->bytes.load(); }
std::uint64_t FabricSource::reconnects() const { return impl_->reconnects.load(); }
std::uint64_t FabricSource::peak_in_flight() const { return impl_->peak_in_flight.load(); }

namespace {
// What a failed read was reading, for its error: the file's samples and where they start.
[[noreturn]] void rethrow_with_offset(const StorageError& e, std::span<const SampleRun> runs,
                                      std::uint64_t unit, const char* what) {
  if (runs.empty()) throw e;
  throw StorageError(fmt::format("{} (reading {} {} from sample {}, byte offset {} of the "
                                 "exported {})",
                                 e.what(), total_samples(runs), what, runs.front().first,
                                 runs.front().first * unit, what));
}
}  // namespace

// Function try blocks: a read that fails for good says where in the dataset it was.
void FabricSource::read(std::span<const SampleRun> runs, std::byte* dst) try {
  Impl& im = *impl_;
  check_runs(im.info, runs, im.uri);
  const std::uint64_t sb = im.info.sample_bytes;
  const std::uint64_t total = total_samples(runs) * sb;
  if (total == 0) return;
  const std::uint64_t max_piece = std::max<std::uint64_t>(1, im.opt.request_bytes);

  if (im.rma) {
    // Contiguous exports: pieces address the remote file directly, read together with other
    // threads' (submit); what is done survives reconnections.
    Request req;
    req.dst = dst;
    req.bytes = total;
    std::byte* out = dst;
    for (const auto& r : runs) {
      std::uint64_t off = r.first * sb, left = r.count * sb;
      while (left) {
        const std::uint64_t n = std::min(left, max_piece);
        req.pieces.push_back({0, off, n, out});
        off += n;
        out += n;
        left -= n;
      }
    }
    im.submit(req);
    return;
  }

  // Staged exports: batches of runs that fit the staging buffer, done batch by batch, on the
  // session alone (its stage requests and replies share the bootstrap socket).
  std::size_t staged_run = 0;
  std::uint64_t staged_skip = 0;  // samples of runs[staged_run] already delivered
  std::byte* staged_out = dst;
  im.exclusive([&] {
    im.with_retries([&](Session& s) {
      if (s.rma)
        throw StorageError(fmt::format("{}: the server now exports the file for RMA reads; "
                                       "reconnect",
                                       im.uri));
      const std::uint64_t per_batch = std::max<std::uint64_t>(1, s.staging_bytes / sb);
      while (staged_run < runs.size()) {
        std::vector<SampleRun> batch;
        std::uint64_t n = 0;
        std::size_t r = staged_run;
        std::uint64_t skip = staged_skip;
        while (r < runs.size() && n < per_batch) {
          const std::uint64_t take = std::min(runs[r].count - skip, per_batch - n);
          batch.push_back({runs[r].first + skip, take});
          n += take;
          skip += take;
          if (skip == runs[r].count) {
            ++r;
            skip = 0;
          }
        }
        json req = {{"op", "stage"}, {"runs", json::array()}};
        for (const auto& b : batch) req["runs"].push_back({b.first, b.count});
        const json reply = im.request(s, req);
        if (!reply.value("ok", false)) {
          const std::string err = reply.value("error", std::string("no reason given"));
          if (reply.value("retry", false)) throw TransientError(im.uri + ": " + err);
          throw StorageError(fmt::format("{}: the server refused a read: {}", im.uri, err));
        }
        const std::string bad = im.uri + ": the server's stage reply is bad";
        const std::uint64_t key = wire::count_field(reply.at("key"), bad);
        const std::uint64_t base = wire::count_field(reply.at("base"), bad);
        std::vector<Piece> bp;
        for (std::uint64_t off = 0; off < n * sb; off += max_piece)
          bp.push_back({key, base + off, std::min(max_piece, n * sb - off), staged_out + off});
        std::vector<char> bdone(bp.size(), 0);
        im.run_pieces(s, bp, bdone, staged_out, n * sb);
        staged_out += n * sb;
        staged_run = r;
        staged_skip = skip;
      }
      // The staged runs are here: the server may hand the staging buffer to another client.
      try {
        wire::send(s.sock, {{"op", "done"}});
      } catch (const boost::system::system_error& e) {
        throw TransientError(fmt::format("{}: lost the connection to the server ({})", im.uri,
                                         e.code().message()));
      }
    });
  });
} catch (const StorageError& e) {
  rethrow_with_offset(e, runs, impl_->info.sample_bytes, "samples");
}

void FabricSource::read_labels(std::span<const SampleRun> runs, std::byte* dst) try {
  Impl& im = *impl_;
  if (!im.info.has_labels)
    throw StorageError(fmt::format("{}: the exported dataset has no labels", im.uri));
  check_runs(im.info, runs, im.uri);
  const std::uint64_t lb = im.info.label_bytes;
  Request req;
  req.labels = true;
  req.dst = dst;
  std::byte* out = dst;
  for (const auto& r : runs) {
    req.pieces.push_back({0, r.first * lb, r.count * lb, out});
    out += r.count * lb;
  }
  req.bytes = static_cast<std::uint64_t>(out - dst);
  if (req.bytes == 0) return;
  if (im.rma) {
    im.submit(req);
    return;
  }
  // A staged export: its session's completion queue is polled by staged reads (run_pieces),
  // so labels are read there too, on the session alone.
  std::vector<char> done(req.pieces.size(), 0);
  im.exclusive([&] {
    im.with_retries([&](Session& s) {
      std::vector<Piece> pieces = req.pieces;
      for (auto& p : pieces) {
        p.key = s.labels.key;
        p.addr += s.labels.base;
      }
      im.run_pieces(s, pieces, done, dst, req.bytes);
    });
  });
} catch (const StorageError& e) {
  rethrow_with_offset(e, runs, impl_->info.label_bytes, "labels");
}

void FabricSource::drop_cache() {
  impl_->exclusive([&] {
    impl_->with_retries([&](Session& s) { impl_->request(s, {{"op", "drop_cache"}}); });
  });
}

}  // namespace solar::storage

namespace solar::storage {

FabricReference FabricSource::measure_fabric(std::span<const FabricRead> reads, unsigned window,
                                             std::span<std::byte> local,
                                             std::uint64_t remote_bytes,
                                             ReferenceMemory memory) {
  Impl& im = *impl_;
  FabricReference r;
  window = std::max(1u, window);
  std::uint64_t longest = 1;
  for (const auto& x : reads) longest = std::max(longest, x.len);
  if (local.size() < longest)
    throw StorageError(fmt::format("{}: a {}-byte reference read does not fit its {}-byte "
                                   "destination",
                                   im.uri, longest, local.size()));
  if (memory == ReferenceMemory::exported && !im.rma)
    throw StorageError(fmt::format("{}: the export is read through the server's staging "
                                   "buffer (chunked or compressed), so it has no memory of its "
                                   "own to read the reference from; measure it against plain "
                                   "memory",
                                   im.uri));
  // A session of its own: nothing it does shares a lock, an endpoint or a queue with reads.
  // It is kept for the next measure of the same memory: the server lends its plain memory
  // for as long as a session holds it, and fills it when it lends it (1 GiB: a memset, and a
  // munmap when the session goes). With a session a measure, that work ran on the server's
  // core between each reference and the solar reads measured beside it: solar's reads
  // measured right after a reference came out at 0.66-0.83 of it, and those measured before
  // one at 0.81-1.20 (medians of four invocations; tcp;ofi_rxm, 256 KiB one-sample reads from
  // 8 threads); kept, both orders at 0.94-1.00.
  if (!im.reference || im.reference->memory != memory || im.reference->asked != remote_bytes) {
    im.reference.reset();  // the old session (and the server memory it holds) first
    Impl::Reference ref;
    ref.s = im.open_session(false, false);
    ref.memory = memory;
    ref.asked = remote_bytes;
    if (memory == ReferenceMemory::exported) {
      ref.key = ref.s->data.key;
      ref.base = ref.s->data.base;
      ref.bytes = im.info.samples * im.info.sample_bytes;
    } else {
      const json reply = im.request(*ref.s, {{"op", "reference"}, {"bytes", remote_bytes}});
      if (!reply.value("ok", false))
        throw StorageError(fmt::format("{}: the server lends no reference buffer: {}", im.uri,
                                       reply.value("error", std::string("no reason given"))));
      const std::string bad = im.uri + ": the server's reference reply is bad";
      ref.key = wire::count_field(reply.at("key"), bad);
      ref.base = wire::count_field(reply.at("base"), bad);
      ref.bytes = wire::count_field(reply.at("bytes"), bad);
    }
    im.reference = std::move(ref);
  }
  Session* s = im.reference->s.get();
  const std::uint64_t key = im.reference->key, base = im.reference->base,
                      rbytes = im.reference->bytes;
  if (longest > rbytes)
    throw StorageError(fmt::format("{}: a {}-byte reference read is longer than the server's "
                                   "{}-byte reference buffer",
                                   im.uri, longest, rbytes));
  // The caller's destination, registered once (FI_MR_LOCAL providers).
  fabric::Region region;
  void* desc = nullptr;
  if (s->ep->local_mr()) {
    region = s->ep->register_memory(local.data(), local.size(), FI_READ);
    desc = region.desc();
  }
  std::vector<fi_context2> ctx(window);
  std::vector<unsigned> free_slots(window);
  for (unsigned i = 0; i < window; ++i) free_slots[i] = window - 1 - i;
  std::uint64_t dpos = 0;
  const auto timeout = std::chrono::duration<double>(im.opt.timeout_s);
  auto fail_cq = [&]() -> StorageError {
    fi_cq_err_entry err{};
    fi_cq_readerr(s->ep->cq(), &err, 0);
    return StorageError(fmt::format("{}: a reference read failed: {}", im.uri,
                                    fabric::error_text(err.err)));
  };
  // Issues `list` and waits for all of it; returns the seconds taken.
  auto run = [&](std::span<const FabricRead> list) {
    std::size_t next = 0, inflight = 0;
    fi_cq_entry entries[16];
    const auto t0 = Clock::now();
    auto last = t0;
    while (next < list.size() || inflight > 0) {
      while (next < list.size() && !free_slots.empty()) {
        const FabricRead& x = list[next];
        std::uint64_t off = x.offset % rbytes;
        if (off + x.len > rbytes) off = rbytes - x.len;
        if (dpos + x.len > local.size()) dpos = 0;
        const ssize_t rc = fi_read(s->ep->ep(), local.data() + dpos, x.len, desc, s->server,
                                   base + off, key, &ctx[free_slots.back()]);
        if (rc == -FI_EAGAIN) break;
        if (rc != 0)
          throw StorageError(fmt::format("{}: fi_read failed: {}", im.uri, fabric::error_text(rc)));
        free_slots.pop_back();
        dpos += x.len;
        ++inflight;
        ++next;
      }
      const ssize_t n = fi_cq_read(s->ep->cq(), entries, 16);
      if (n > 0) {
        for (ssize_t i = 0; i < n; ++i)
          free_slots.push_back(
              static_cast<unsigned>(static_cast<fi_context2*>(entries[i].op_context) - ctx.data()));
        inflight -= static_cast<std::size_t>(n);
        last = Clock::now();
      } else if (n == -FI_EAVAIL) {
        throw fail_cq();
      } else if (n != -FI_EAGAIN) {
        throw StorageError(fmt::format("{}: fi_cq_read: {}", im.uri, fabric::error_text(n)));
      } else if (Clock::now() - last > timeout) {
        throw StorageError(fmt::format("{}: no reference read completed for {:.1f} s", im.uri,
                                       im.opt.timeout_s));
      }
    }
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // The connection itself (ofi_rxm connects at the first read) is not part of the figure.
  const FabricRead warm{0, std::min<std::uint64_t>(4096, rbytes)};
  try {
    run({&warm, 1});
    dpos = 0;
    r.seconds = run(reads);
  } catch (...) {
    region = fabric::Region();  // reads in flight land nowhere once the endpoint is closed,
    im.reference.reset();       // which must happen while `local` and `ctx` are alive
    throw;
  }
  for (const auto& x : reads) r.bytes += x.len;
  r.reads = reads.size();
  r.window = window;
  r.remote_bytes = rbytes;
  r.local_bytes = local.size();
  r.provider = s->ep->provider();
  return r;
}

}  // namespace solar::storage

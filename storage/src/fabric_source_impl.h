// SPDX-License-Identifier: Apache-2.0
// FabricSource's private parts, shared by its files: one connection (Session) and what its
// reads are made of (Piece, Request), and FabricSource::Impl, which owns the connection,
// the queue of every thread's reads and the reconnection window. Who does what:
//   fabric_source.cpp     the public calls: connect, read, read_labels, drop_cache
//   fabric_session.cpp    opening a connection (bootstrap hello, endpoint), bootstrap
//                         requests, losing one and the reconnection window's backoff
//   fabric_reads.cpp      what run_pieces and pump read, each a fabric::Driver run
//                         (fabric_driver.h: the one post/reap loop)
//   fabric_sharing.cpp    several threads' reads on one connection: who drives it, the
//                         engine thread, telling each caller its read is done or failed
//   fabric_reference.cpp  RawFabricReference (its own library, solar_storage_reference)
#pragma once

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

#include "solar/storage/fabric.h"
#include "fabric_driver.h"
#include "wire.h"

namespace solar::storage {
namespace asio = boost::asio;
using asio::ip::tcp;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

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
inline std::uint32_t caller_wake() {
  static std::atomic<std::uint32_t> next{0};
  thread_local const std::uint32_t mine = next.fetch_add(1, std::memory_order_relaxed) % kWakes;
  return mine;
}

// What the source was opened on: fabric://host:port/name (uri: the whole of it).
struct Address {
  std::string uri, host, port, name;
};

// What the server said of the export at the first hello (a reconnection must match identity).
struct RemoteExport {
  DatasetInfo info;
  std::string identity, provider;
  bool rma = false;  // the export is read one-sided (contiguous): reads share the session
  std::string served_from;  // what the server reads from: file, memory (--in-memory), staged
};

// The emulated link: contention the server asks for (Impl::charge), none when both are 0.
struct EmulatedLink {
  double bandwidth = 0, latency = 0;  // emulated contention, from the server
  double bucket = 0;                  // when the emulated link is next free (seconds)
};

// The current outage and its window (Impl::next_attempt): since when the server has been
// unreachable, and how many attempts were made. Shared by every read, so that once the window
// has passed, the reads that follow fail at their first attempt instead of waiting the window
// again each.
struct Outage {
  double reconnect_s = 30;  // the window: how long to keep reconnecting
  std::optional<Clock::time_point> since;
  unsigned attempts = 0;
};

// What the source counts for its callers (bytes_read, reconnects, peak_in_flight).
struct SourceCounters {
  std::atomic<std::uint64_t> bytes{0}, reconnects{0};
  std::atomic<std::uint64_t> peak_in_flight{0};  // most fi_reads of read() in flight at once
};

struct FabricSource::Impl {
  Address remote;
  FabricOptions opt;
  RemoteExport exported;
  EmulatedLink link;
  SourceCounters counts;

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
  fabric::Driver driver;              // the reads in flight on the session (pump)
  std::uint64_t ops_gen = 0;          // the session `driver` and `active` were issued on
  Outage outage;                      // the current outage, if any

  // wait: a completion queue pump() may sleep on (where the provider has a descriptor);
  // the raw-fabric reference's (fabric_reference.cpp) is polled only, as fi_rma_bw's.
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
  // One small fi_read of the export's first bytes on a new RMA session, neither charged to
  // the emulated link nor counted: the provider sets up its data path (a connection, its
  // buffers) on the first transfer, 50 ms here over tcp, which would otherwise land on the
  // first real read (an agent's first step). False: it failed and the session's endpoint is
  // closed (drop the session: the first real read opens another and reports what fails).
  bool warm_up(Session& s);
  void engine_loop();
  ~Impl() {
    {
      std::lock_guard g(mu);
      engine_stop = true;
      engine_cv.notify_one();
    }
    if (engine.joinable()) engine.join();
  }
  // The end of one pass of a read loop (run_pieces, pump: fabric::Driver::Work::check):
  // every 20 ms, whether the server's bootstrap socket closed; when every read in flight has
  // completed and only waits out its emulated delay (`all_held`, until `earliest`), a short
  // sleep; else the no-progress timeout. Throws TransientError.
  void check_progress(Session& s, bool all_held, double earliest, Clock::time_point& last_check,
                      Clock::time_point& last_progress);
  // The emulated link (bandwidth, latency from the server) charged for a read of `len` bytes
  // posted now: when it may complete, 0 when nothing is emulated.
  double charge(std::uint64_t len);
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

// A lost server is reconnected to for up to outage.reconnect_s from the start of the outage,
// with backoff 0.1 s · 2^k (at most 2 s); one warning when it starts, one line when it ends.
template <class Work>
void FabricSource::Impl::with_retries(Work&& work) {
  for (;;) {
    try {
      if (!session) {
        session = open_session(false);
        ++session_gen;
        if (outage.since) ++counts.reconnects;
      }
      work(*session);
      if (outage.since) {
        spdlog::info("{}: the server is back after {:.1f} s; reading on", remote.uri,
                     std::chrono::duration<double>(Clock::now() - *outage.since).count());
        outage.since.reset();
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

}  // namespace solar::storage

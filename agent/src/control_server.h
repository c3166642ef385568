// SPDX-License-Identifier: Apache-2.0
// ControlServer: the agent's Unix socket and the io thread that serves it: accepting (with the
// limits of agent/README.md, "Connections and limits"), the sessions, the hellos of libsolar
// and of the interposer, the ranks' next/release/stats/shutdown requests, the batches handed
// out (serving.cpp) and the agent's last words after a failure. Internal to solar-agent.
//
// Contract:
// - Everything here runs on the io thread (run()), except stop() and post_serve(), which post
//   onto it and may be called from any thread, with or without the agent's lock.
// - Its own members (the acceptor, timers, sessions, unattached list, reserve descriptor,
//   throttled logs, serve_due_/assembly_due_) are the io thread's: no lock guards them.
// - The agent's shared state (Agent::Impl: the ranks, the slot table, the steps) is read and
//   written under the agent's lock `Agent::Impl::mu_`, which the methods here take themselves;
//   those named *_locked are called with it held. Sessions are touched only on the io thread:
//   a RankState's session pointer changes under the lock, but only the io thread follows it.
// - It holds a back-reference to the agent (Agent::Impl), which owns it and outlives it.
#pragma once

#include <sys/uio.h>

#include <utility>  // before asio: with g++ 12 and C++20, Boost.Asio 1.74 uses std::exchange unincluded
#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "agent.h"
#include "request_reader.h"
#include "solar/protocol.h"

namespace solar::agent {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;
using Clock = std::chrono::steady_clock;

struct RankState;

// One message of the protocol: header and body.
std::vector<std::uint8_t> frame(protocol::Op op, const void* body, std::size_t n);
// An error frame written at once, without waiting (the connection is closed next).
void send_error_now(int fd, std::string_view why);

// Limits of the control socket (agent/README.md, "Connections and limits"): what a flood of
// connections from the agent's own user can make it hold.
// Connections that are not an attached rank (nothing said yet, stats requests, refused hellos):
// beyond this many the oldest is closed, so a legitimate rank connecting after a flood is served.
inline constexpr std::size_t kMaxUnattached = 128;
// Replies queued on one connection that does not read them: beyond this it is closed.
inline constexpr std::size_t kMaxQueuedBytes = std::size_t{4} << 20;

// A warning a flood could repeat once per connection: at most `burst` lines per `every`, then
// the number not logged with the next line let through; run() logs what is left at the end. Io
// thread only.
struct ThrottledLog {
  explicit ThrottledLog(std::uint32_t burst_lines = 1) : burst(burst_lines) {}
  std::uint32_t burst;
  Clock::duration every = std::chrono::seconds(10);
  Clock::time_point window{};  // when the current period began
  std::uint32_t lines = 0;     // logged in it
  std::uint64_t quiet = 0;     // not logged since the last line
  std::string quiet_example;   // the latest of those
  void warn(const std::string& what);
  void flush();
};

// One connection (io thread only).
struct Session : std::enable_shared_from_this<Session> {
  explicit Session(asio::io_context& io) : sock(io) {}
  stream::socket sock;
  RequestReader reader;  // received, not yet handled
  std::vector<std::uint8_t> payload;
  std::deque<std::vector<std::uint8_t>> out;
  std::vector<std::uint8_t> scratch;  // a reply being built (serve_waiting_locked)
  int rank = -1;  // local rank once attached
  bool closed = false;
  std::size_t out_bytes = 0;  // queued in `out`
  bool dropping = false;      // too much queued: being closed
  bool listed = false;        // in unattached_ at `where`
  bool xhello_answered = false;  // an interposer's connection asks once (on_xhello)
  std::list<std::weak_ptr<Session>>::iterator where;
};

class ControlServer {
 public:
  explicit ControlServer(Agent::Impl& agent);
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // Start-up: binds and listens on `path` (private to this user; its path was checked before);
  // throws AgentError.
  void listen(const std::string& path);
  // Start-up: the descriptor kept to be given up when the agent runs out of them (shed_one).
  void keep_reserve_fd();
  // The io thread: accepts and serves until shutdown_io() has run (a signal, a shutdown
  // request, stop(), or a failure), then logs what the throttled logs held back.
  void run();
  // Any thread: shutdown_io() on the io thread.
  void stop();
  // Any thread: serve_waiting_locked() on the io thread (sessions are only touched there).
  void post_serve();
  // Any thread (the peer thread, with the agent's lock held): the answer to the interposer's
  // ask `token` for `sample` (on_xfetch), sent on the io thread if its connection is still open.
  void post_fetch_reply(std::uint64_t token, std::uint32_t sample, bool held);
  // Every step asked for whose batch is ready, in order, in one send per rank; then `end` when
  // it is owed (serving.cpp). Io thread, with the agent's lock held.
  void serve_waiting_locked();

 private:
  void accept();
  void accept_failed(const boost::system::error_code& ec);
  bool shed_one(int err);
  std::string refuse_without_fd(int fd);
  void unlist(Session& s);
  void on_message(const std::shared_ptr<Session>& s, protocol::Op op,
                  const std::vector<std::uint8_t>& payload);
  void on_hello(const std::shared_ptr<Session>& s, const std::vector<std::uint8_t>& payload);
  void on_xhello(const std::shared_ptr<Session>& s, const std::vector<std::uint8_t>& payload);
  void on_xfetch(const std::shared_ptr<Session>& s, const std::vector<std::uint8_t>& payload);
  void put_layout(protocol::HelloOk& ok) const;
  bool send_with_buffer_fd(const std::shared_ptr<Session>& s, const std::vector<std::uint8_t>& msg);
  void put_batch_locked(RankState& rs, std::uint32_t r, std::vector<std::uint8_t>& msg);
  void detach(const std::shared_ptr<Session>& s);
  // Rank r will not be served (it left, or was refused): its admitted uses are dropped so that
  // its cache slots can be reused.
  void drop_rank_locked(std::uint32_t r);
  void read_more(const std::shared_ptr<Session>& s);
  // Queues a message; writes go out in order, one at a time. A connection with more than
  // kMaxQueuedBytes queued is closed instead.
  void send(const std::shared_ptr<Session>& s, std::vector<std::uint8_t> msg);
  // The same, from bytes the caller keeps: written at once when nothing is queued (one send,
  // no allocation), the rest (if the socket is full) copied into the queue.
  void send(const std::shared_ptr<Session>& s, std::span<const std::uint8_t> msg);
  void write_front(const std::shared_ptr<Session>& s);  // io thread; s->out not empty
  void shutdown_io();
  void close_when_written();

  Agent::Impl& a_;  // the agent that owns this server
  asio::io_context io_;
  stream::acceptor acceptor_{io_};
  asio::steady_timer accept_retry_{io_};  // accepting again after an error
  // After a failure: the error frame is queued to every rank, and the connections close once
  // it is written (shutdown_io, close_when_written).
  bool last_words_sent_ = false;
  Clock::time_point closing_deadline_{};
  asio::steady_timer closing_timer_{io_};
  // Kept open to be given up when the agent runs out of descriptors: the connection it then
  // accepts is answered at once (its rank reads directly) instead of waiting unseen.
  int reserve_fd_ = -1;
  // Connections that are not an attached rank, oldest first (kMaxUnattached).
  std::list<std::weak_ptr<Session>> unattached_;
  ThrottledLog fd_log_, accept_log_, stranger_log_, bad_request_log_, cap_log_, queue_log_;
  // An interposer refused (a transparent script on a batch agent): one per worker process is
  // normal, a flood is not.
  ThrottledLog xhello_log_{64};
  // Interposers' asks being read from a peer (on_xfetch), by token.
  std::unordered_map<std::uint64_t, std::weak_ptr<Session>> asks_;
  std::uint64_t next_ask_ = 1;
  // A `next` or a release was read; served or copied once the whole read is handled.
  bool serve_due_ = false, assembly_due_ = false;
};

}  // namespace solar::agent

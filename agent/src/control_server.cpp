// SPDX-License-Identifier: Apache-2.0
// The control server (the io thread): the Unix socket, accepting, sessions, reading requests
// and writing replies, and the last words after a failure; the requests themselves are
// control_messages.cpp's. See control_server.h.
#include "control_server.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <functional>

#include "agent_impl.h"

namespace solar::agent {

// ---- control server ------------------------------------------------------------------------

std::vector<std::uint8_t> frame(protocol::Op op, const void* body, std::size_t n) {
  std::vector<std::uint8_t> out(sizeof(protocol::Header) + n);
  protocol::put_frame(out.data(), op, body, n);
  return out;
}

void send_error_now(int fd, std::string_view why) {
  const auto out = frame(protocol::Op::error, why.data(), why.size());
  [[maybe_unused]] const ssize_t n = ::send(fd, out.data(), out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

void ThrottledLog::warn(const std::string& what) {
  const auto now = Clock::now();
  if (lines == 0 || now - window >= every) {
    window = now;
    lines = 0;
  } else if (lines >= burst) {
    ++quiet;
    quiet_example = what;
    return;
  }
  ++lines;
  if (quiet)
    spdlog::warn("{} ({} more like this before it, not logged)", what, quiet);
  else
    spdlog::warn("{}", what);
  quiet = 0;
  quiet_example.clear();
}

void ThrottledLog::flush() {
  if (quiet) spdlog::warn("{} more like this, not logged; the latest: {}", quiet, quiet_example);
  quiet = 0;
}

ControlServer::ControlServer(Agent::Impl& agent) : a_(agent) {}

ControlServer::~ControlServer() {
  if (reserve_fd_ >= 0) ::close(reserve_fd_);
}

void ControlServer::listen(const std::string& path) {
  boost::system::error_code bec;
  const mode_t old = ::umask(0077);
  acceptor_.open();
  acceptor_.bind(stream::endpoint(path), bec);
  ::umask(old);
  if (bec) throw AgentError(fmt::format("{}: cannot bind: {}", path, bec.message()));
  ::chmod(path.c_str(), 0600);
  acceptor_.listen();
}

void ControlServer::keep_reserve_fd() { reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC); }
                                    
                                    void ControlServer::run() {
  asio::signal_set signals(io_, SIGTERM, SIGINT);
  signals.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    spdlog::info("signal {}: stopping", sig);
    shutdown_io();
  });
  accept();
  io_.run();
  for (ThrottledLog* l :
       {&fd_log_, &accept_log_, &stranger_log_, &bad_request_log_, &cap_log_, &queue_log_,
        &xhello_log_})
    l->flush();
}

void ControlServer::stop() {
  asio::post(io_, [this] { shutdown_io(); });
}

void ControlServer::shutdown_io() {
  boost::system::error_code ec;
  acceptor_.close(ec);
  accept_retry_.cancel();
  bool last_words_queued = false;
  {
    std::lock_guard lk(a_.mu_);
    // After a failure the ranks are told why before the connection closes: one error frame,
    // queued behind the replies still going out (a rank asks for steps ahead, so batches may
    // be queued), then the connections close once written or after 200 ms at most.
    // libsolar finds it among what it has received when its next request fails.
    if (!a_.fatal_.empty() && !last_words_sent_) {
      last_words_sent_ = true;
      const std::string why = "the agent stopped: " + a_.fatal_;
      const auto msg = frame(protocol::Op::error, why.data(), std::min<std::size_t>(why.size(), 4096));
      bool queued = false;
      for (auto& rs : a_.ranks_)
        if (rs.session && !rs.session->closed) {
          send(rs.session, std::vector<std::uint8_t>(msg));
          queued = queued || !rs.session->out.empty();
        }
      if (queued) {
        closing_deadline_ = Clock::now() + std::chrono::milliseconds(200);
        last_words_queued = true;
      }
    }
    if (!last_words_queued)
      for (auto& rs : a_.ranks_)
        if (rs.session) rs.session->sock.close(ec);
  }
  // close_when_written takes mu_ itself: called with it held, the io thread would wait on its
  // own lock forever (and SIGTERM, handled on that thread, could not stop the agent either).
  if (last_words_queued) return close_when_written();
  io_.stop();
}

// Io thread: polls every 5 ms until every rank's queued replies (its last words included)
// are written or the deadline has passed, then closes and stops.
void ControlServer::close_when_written() {
  bool pending = false;
  {
    std::lock_guard lk(a_.mu_);
    for (auto& rs : a_.ranks_)
      if (rs.session && !rs.session->closed && !rs.session->out.empty()) pending = true;
  }
  if (pending && Clock::now() < closing_deadline_) {
    closing_timer_.expires_after(std::chrono::milliseconds(5));
    closing_timer_.async_wait([this](const boost::system::error_code& e) {
      if (!e) close_when_written();
    });
    return;
  }
  shutdown_io();  // last words sent: closes the connections and stops
}

void ControlServer::accept() {
  if (!acceptor_.is_open()) return;
  auto s = std::make_shared<Session>(io_);
  acceptor_.async_accept(s->sock, [this, s](const boost::system::error_code& ec) {
    if (!acceptor_.is_open() || ec == asio::error::operation_aborted) return;  // stopping
    if (ec) return accept_failed(ec);
    struct ucred cred {};
    socklen_t len = sizeof cred;
    if (::getsockopt(s->sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        cred.uid != ::geteuid()) {
      stranger_log_.warn(fmt::format("refused a connection from uid {} pid {} (only uid {} may "
                                     "attach)",
                                     cred.uid, cred.pid, ::geteuid()));
      boost::system::error_code ignored;
      s->sock.close(ignored);
    } else {
      unattached_.push_back(s);
      s->where = std::prev(unattached_.end());
      s->listed = true;
      if (unattached_.size() > kMaxUnattached) {
        const auto oldest = unattached_.front().lock();
        if (oldest) {
          cap_log_.warn(fmt::format("more than {} connections are not attached ranks: closed the "
                                    "oldest of them",
                                    kMaxUnattached));
          detach(oldest);
        } else {
          unattached_.pop_front();
        }
      }
      read_more(s);
    }
    accept();
  });
}

// Accepting failed: the agent keeps accepting, after a pause unless a connection could be shed.
void ControlServer::accept_failed(const boost::system::error_code& ec) {
  const bool out_of_fds = ec.category() == boost::system::system_category() &&
                          (ec.value() == EMFILE || ec.value() == ENFILE);
  if (out_of_fds && shed_one(ec.value())) return accept();  // more may wait: the same answer
  if (!out_of_fds)
    accept_log_.warn(fmt::format("accepting a connection failed: {}; retrying", ec.message()));
  accept_retry_.expires_after(std::chrono::milliseconds(100));
  accept_retry_.async_wait([this](const boost::system::error_code& e) {
    if (!e) accept();
  });
}

// Out of descriptors: the reserve descriptor is given up to accept the oldest waiting
// connection, which is answered at once with an error (its rank reads directly, rather than
// wait for an agent that never looks at it), and taken back. True when one was shed.
bool ControlServer::shed_one(int err) {
  if (reserve_fd_ < 0) reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  struct rlimit lim {};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  const std::string limit = lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited")
                                                          : std::to_string(lim.rlim_cur);
  if (reserve_fd_ < 0) {
    fd_log_.warn(fmt::format("out of file descriptors ({}; ulimit -n {}): a connection waits "
                             "until one is free",
                             std::strerror(err), limit));
    return false;
  }
  ::close(reserve_fd_);
  reserve_fd_ = -1;
  int fd = -1;
  pollfd lp{acceptor_.native_handle(), POLLIN, 0};
  if (::poll(&lp, 1, 0) == 1)
    fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
  std::string who;
  if (fd >= 0) {
    who = refuse_without_fd(fd);
    ::close(fd);
  }
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  fd_log_.warn(fmt::format("out of file descriptors ({}; ulimit -n {}): refused {} at once, "
                           "which reads the dataset directly; raise the agent's limit (ulimit "
                           "-n) to serve every rank",
                           std::strerror(err), limit, who));
  return true;
}

// The connection accepted on the reserve descriptor: a rank's hello (when it has arrived, as it
// normally has) says which rank will not be served, so that its slots are not kept for it.
// Returns who it was, for the log.
std::string ControlServer::refuse_without_fd(int fd) {
  struct ucred cred {};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != ::geteuid())
    return fmt::format("a connection from uid {}", cred.uid);
  std::uint8_t in[sizeof(protocol::Header) + sizeof(protocol::Hello)];
  std::size_t got = 0;
  const auto until = Clock::now() + std::chrono::milliseconds(100);
  while (got < sizeof in) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) != 1) break;
    const ssize_t n = ::recv(fd, in + got, sizeof in - got, MSG_DONTWAIT);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  std::string who = fmt::format("a connection (pid {})", cred.pid);
  protocol::Header h;
  protocol::Hello hello;
  std::memcpy(&h, in, sizeof h);
  std::memcpy(&hello, in + sizeof h, sizeof hello);
  if (got == sizeof in && protocol::acceptable(h) &&
      h.op == static_cast<std::uint16_t>(protocol::Op::hello) && h.length == sizeof hello &&
      hello.local_rank < a_.R_ && !a_.pacer_.index()) {
    std::lock_guard lk(a_.mu_);
    RankState& rs = a_.ranks_[hello.local_rank];
    if (!rs.attached && !rs.gone) {
      drop_rank_locked(hello.local_rank);
      who = fmt::format("local rank {} (pid {})", hello.local_rank, cred.pid);
    }
  }
  send_error_now(fd, "the agent is out of file descriptors (see its log)");
  return who;
}

void ControlServer::unlist(Session& s) {
  if (!s.listed) return;
  unattached_.erase(s.where);
  s.listed = false;
}

// Reads whatever has arrived and handles every complete frame in it: a rank's release and next
// requests, sent together, cost one read. Nothing is allocated for a frame before its header is
// checked against its op's size.
void ControlServer::read_more(const std::shared_ptr<Session>& s) {
  const auto space = s->reader.space();
  s->sock.async_read_some(
      asio::buffer(space.data(), space.size()),
      [this, s](const boost::system::error_code& e, std::size_t n) {
        if (e) return detach(s);
        s->reader.received(n);
        protocol::Header h;
        while (!s->closed) {
          const auto got = s->reader.next(h, s->payload);
          if (got == RequestReader::Next::more) break;
          if (got == RequestReader::Next::malformed && protocol::other_version(h)) {
            // A libsolar (or interposer) of another build: it hears why, in this version.
            const std::string why = fmt::format(
                "this agent speaks protocol version {} (solar {}), the request version {}: the "
                "rank's libsolar and the agent come from different solar builds; install both "
                "from one",
                protocol::kVersion, SOLAR_PROJECT_VERSION, h.version);
            bad_request_log_.warn(fmt::format("refused a connection: {}", why));
            send_error_now(s->sock.native_handle(), why);
            return detach(s);
          }
          if (got == RequestReader::Next::malformed) {
            const std::string what = fmt::format(
                "malformed or oversized request (magic {:#x}, version {}, op {}, length {}; at "
                "most {} bytes for this op): closing the connection",
                h.magic, h.version, h.op, h.length, max_request_payload(h.op));
            if (s->rank >= 0)
              spdlog::warn("rank {}: {}", s->rank, what);
            else
              bad_request_log_.warn(what);
            return detach(s);
          }
          on_message(s, static_cast<protocol::Op>(h.op), s->payload);
        }
        // The replies to every request read here, together (one send per rank), then the
        // copies into the rings that its releases allow.
        if (serve_due_ || assembly_due_) {
          std::lock_guard lk(a_.mu_);
          if (serve_due_) serve_waiting_locked();
          if (assembly_due_) a_.prefetch_.schedule_assembly_locked(true);
          serve_due_ = assembly_due_ = false;
        }
        if (s->closed) return;
        read_more(s);
      });
}

void ControlServer::detach(const std::shared_ptr<Session>& s) {
  if (s->closed) return;
  s->closed = true;
  unlist(*s);
  boost::system::error_code ec;
  s->sock.close(ec);
  if (s->rank < 0) return;
  std::lock_guard lk(a_.mu_);
  RankState& rs = a_.ranks_[static_cast<std::size_t>(s->rank)];
  drop_rank_locked(static_cast<std::uint32_t>(s->rank));
  if (rs.cursor < a_.T_)
    spdlog::warn("local rank {} left at step {} of {}; its slots are reclaimed", s->rank,
                 rs.cursor, a_.T_);
  else
    spdlog::info("local rank {} finished", s->rank);
}

void ControlServer::drop_rank_locked(std::uint32_t r) {
  RankState& rs = a_.ranks_[r];
  // Every admitted use not yet copied to its ring is dropped (a copy in flight drops its own).
  const std::uint64_t from =
      a_.buf_.ring_depth ? rs.assembled + (rs.assembling ? 1 : 0) : rs.released;
  for (std::uint64_t t = from; t < a_.admitted_; ++t)
    for (std::uint32_t a : a_.accesses(t, r)) a_.drop_use_locked(a & kSampleMask);
  rs.gone = true;
  rs.session.reset();
  rs.end_owed = false;
}

// Nothing queued: the reply goes straight to the socket (non-blocking), without the queue and
// the completion handler an asynchronous write costs; only what does not fit is queued.
void ControlServer::send(const std::shared_ptr<Session>& s, std::span<const std::uint8_t> msg) {
  if (s->closed || s->dropping) return;
  std::size_t done = 0;
  if (s->out.empty()) {
    ssize_t n;
    do n = ::send(s->sock.native_handle(), msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n == static_cast<ssize_t>(msg.size())) return;
    // Gone: the read side sees the connection close and detaches the session.
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return;
    done = n > 0 ? static_cast<std::size_t>(n) : 0;
  }
  send(s, std::vector<std::uint8_t>(msg.begin() + static_cast<std::ptrdiff_t>(done), msg.end()));
}

void ControlServer::send(const std::shared_ptr<Session>& s, std::vector<std::uint8_t> msg) {
  if (s->closed || s->dropping) return;
  if (s->out_bytes + msg.size() > kMaxQueuedBytes) {  // it does not read its replies
    s->dropping = true;
    queue_log_.warn(fmt::format("{} has more than {} of replies it does not read: closing it",
                                s->rank >= 0 ? fmt::format("rank {}", s->rank)
                                             : std::string("a connection"),
                                format_bytes(kMaxQueuedBytes)));
    asio::post(io_, [this, s] { detach(s); });  // not now: the caller may hold the agent's lock
    return;
  }
  const bool idle = s->out.empty();
  s->out_bytes += msg.size();
  s->out.push_back(std::move(msg));
  if (!idle) return;
  write_front(s);
}

// Writes s->out.front(), then the rest of the queue, one at a time. The handler holds the
// session only while a write is pending (a handler that held itself, as a self-referencing
// std::function did, kept every session it ever wrote to alive for good).
void ControlServer::write_front(const std::shared_ptr<Session>& s) {
  asio::async_write(s->sock, asio::buffer(s->out.front()),
                    [this, s](const boost::system::error_code& ec, std::size_t) {
                      if (ec || s->out.empty()) {
                        s->out.clear();
                        s->out_bytes = 0;
                        return;
                      }
                      s->out_bytes -= s->out.front().size();
                      s->out.pop_front();
                      if (!s->out.empty()) write_front(s);
                    });
}

}  // namespace solar::agent

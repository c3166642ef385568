// The control server (the io thread): the Unix socket, sessions, hellos and messages. See
// agent_impl.h.
#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
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

void Agent::Impl::accept() {
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
void Agent::Impl::accept_failed(const boost::system::error_code& ec) {
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
bool Agent::Impl::shed_one(int err) {
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
std::string Agent::Impl::refuse_without_fd(int fd) {
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
      hello.local_rank < R_ && !xindex_) {
    std::lock_guard lk(mu_);
    RankState& rs = ranks_[hello.local_rank];
    if (!rs.attached && !rs.gone) {
      drop_rank_locked(hello.local_rank);
      who = fmt::format("local rank {} (pid {})", hello.local_rank, cred.pid);
    }
  }
  send_error_now(fd, "the agent is out of file descriptors (see its log)");
  return who;
}

void Agent::Impl::unlist(Session& s) {
  if (!s.listed) return;
  unattached_.erase(s.where);
  s.listed = false;
}

// Reads whatever has arrived and handles every complete frame in it: a rank's release and next
// requests, sent together, cost one read. Nothing is allocated for a frame before its header is
// checked against its op's size.
void Agent::Impl::read_more(const std::shared_ptr<Session>& s) {
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
          std::lock_guard lk(mu_);
          if (serve_due_) serve_waiting_locked();
          if (assembly_due_) schedule_assembly_locked(true);
          serve_due_ = assembly_due_ = false;
        }
        if (s->closed) return;
        read_more(s);
      });
}


// What a sample's bytes are, from the source (protocol version 2), for the hello reply.
void Agent::Impl::put_layout(protocol::HelloOk& ok) const {
  const auto& info = source_->info();
  auto name = [](char (&out)[sizeof ok.dtype], storage::DType t) {
    const std::string_view n = storage::to_string(t);
    std::memset(out, 0, sizeof out);
    std::memcpy(out, n.data(), std::min(n.size(), sizeof out - 1));
  };
  name(ok.dtype, info.dtype);
  if (info.has_labels) name(ok.label_dtype, info.label_dtype);
  if (info.sample_shape.size() <= protocol::HelloOk::kMaxShapeDims) {
    ok.shape_dims = static_cast<std::uint32_t>(info.sample_shape.size());
    std::copy(info.sample_shape.begin(), info.sample_shape.end(), ok.shape);
  }
}

void Agent::Impl::on_message(const std::shared_ptr<Session>& s, protocol::Op op,
                             const std::vector<std::uint8_t>& payload) {
  auto refuse = [&](const std::string& why) {
    if (s->rank >= 0)
      spdlog::warn("rank {}: {}", s->rank, why);
    else
      bad_request_log_.warn("refused a request of a connection that is not a rank: " + why);
    send(s, frame(protocol::Op::error, why.data(), why.size()));
  };
  switch (op) {
    case protocol::Op::hello:
      return on_hello(s, payload);
    case protocol::Op::xhello:
      return on_xhello(s, payload);
    case protocol::Op::next: {
      protocol::Next n;
      if (!decode_payload(std::span(payload), n) || s->rank < 0)
        return refuse("next before hello, or malformed");
      std::lock_guard lk(mu_);
      RankState& rs = ranks_[static_cast<std::size_t>(s->rank)];
      if (n.step != rs.asked)
        return refuse(fmt::format("asked for step {} but the next step to ask for is {}", n.step,
                                  rs.asked));
      if (rs.asked >= T_) {  // past the last step: `end`, after the batches still owed
        rs.end_owed = true;
        serve_due_ = true;
        return;
      }
      if (rs.asked - rs.cursor >= protocol::kMaxStepsAsked)
        return refuse(fmt::format("more than {} steps asked for and not yet served",
                                  protocol::kMaxStepsAsked));
      if (rs.asked++ == waits_for(rs)) {  // it holds nothing older: it waits for this one now
        rs.wait_since = Clock::now();
        stats_.note_request(n.step, rs.wait_since, ready_);
      }
      serve_due_ = true;  // once every request read with it is handled (read_more)
      return;
    }
    case protocol::Op::release: {
      protocol::Release rl;
      if (!decode_payload(std::span(payload), rl) || s->rank < 0)
        return refuse("release before hello, or malformed");
      std::lock_guard lk(mu_);
      RankState& rs = ranks_[static_cast<std::size_t>(s->rank)];
      if (rl.step != rs.released || rl.step >= rs.cursor)
        return refuse(fmt::format("release of step {} out of order (next to release: {}, handed "
                                  "out: {})",
                                  rl.step, rs.released, rs.cursor));
      if (buf_.ring_depth == 0)  // zero copy: the rank no longer reads those cache slots
        for (std::uint32_t a : accesses(rl.step, static_cast<std::uint32_t>(s->rank)))
          drop_use_locked(a & kSampleMask);
      ++rs.released;  // its ring entry can take a later batch
      const auto now = Clock::now();
      stats_.note_released(rl.step, now);
      if (const std::uint64_t w = waits_for(rs); w < rs.asked && w < T_) {  // asked ahead
        rs.wait_since = now;  // it waits for it now
        stats_.note_request(w, now, ready_);
      }
      // Its ring entry is copied once every request read with it is handled (read_more),
      // after the replies.
      assembly_due_ = true;
      return;
    }
    case protocol::Op::stats: {
      const std::string j = stats_reply();
      send(s, frame(protocol::Op::stats_reply, j.data(), j.size()));
      return;
    }
    case protocol::Op::shutdown:
      spdlog::info("shutdown requested");
      asio::post(io_, [this] { shutdown_io(); });
      return;
    default:  // not reached: request_acceptable refuses other ops (read_more closes those)
      bad_request_log_.warn(fmt::format("unknown op {}: closing the connection",
                                        static_cast<unsigned>(op)));
      detach(s);
  }
}

void Agent::Impl::on_hello(const std::shared_ptr<Session>& s,
                           const std::vector<std::uint8_t>& payload) {
  protocol::Hello h;
  auto refuse = [&](const std::string& why) {
    bad_request_log_.warn("hello refused: " + why);
    send(s, frame(protocol::Op::error, why.data(), why.size()));
  };
  if (!decode_payload(std::span(payload), h)) return refuse("malformed hello");
  if (xindex_)  // the unmodified ranks' reads pace this agent; batches would pace it twice
    return refuse("this agent serves an unmodified script's file reads (--transparent); solar's "
                  "loader reads directly in this step");
  if (s->rank >= 0) return refuse("already attached");
  if (h.local_rank >= R_)
    return refuse(fmt::format("local rank {} does not exist (this node has ranks 0..{})",
                              h.local_rank, R_ - 1));
  {
    std::lock_guard lk(mu_);
    RankState& rs = ranks_[h.local_rank];
    if (rs.attached || rs.gone)
      return refuse(fmt::format("local rank {} is already attached (or has left)", h.local_rank));
    rs.attached = true;
    rs.session = s;
  }
  s->rank = static_cast<int>(h.local_rank);
  unlist(*s);
  protocol::HelloOk ok;
  ok.node = opt_.node;
  ok.ranks_per_node = R_;
  ok.samples = header_.config.samples;
  ok.sample_bytes = sample_bytes_;
  ok.label_bytes = label_bytes_;
  ok.slot_bytes = buf_.slot_bytes;
  ok.labels_offset = label_bytes_ ? buf_.labels_offset : 0;
  ok.slots = buf_.slots;
  ok.total_steps = T_;
  ok.steps_per_epoch = header_.layout.steps;
  ok.start_step = start_;
  ok.ask_ahead = ask_ahead();  // zero copy: one step, as before the field
  ok.defer_releases = defer_releases() ? 1 : 0;
  put_layout(ok);
  if (!send_with_buffer_fd(s, frame(protocol::Op::hello_ok, &ok, sizeof ok))) {
    spdlog::warn("rank {}: could not send the hello reply", h.local_rank);
    return detach(s);
  }
  spdlog::info("local rank {} attached (pid {})", h.local_rank, h.pid);
}

// An unmodified rank's interposer (or one of its DataLoader workers): no batches, just the
// buffer and where its index is. Any number of processes may attach this way.
void Agent::Impl::on_xhello(const std::shared_ptr<Session>& s,
                            const std::vector<std::uint8_t>& payload) {
  solar_xhello h{};
  auto refuse = [&](const std::string& why) {
    xhello_log_.warn("interposer refused: " + why);
    send(s, frame(protocol::Op::error, why.data(), why.size()));
  };
  if (!decode_payload(std::span(payload), h)) return refuse("malformed hello");
  if (!xindex_)
    return refuse("this agent serves batches, not file reads (start it with --transparent)");
  if (s->xhello_answered) {  // an interposer asks once per connection, then closes it
    xhello_log_.warn(fmt::format("a connection (pid {}) asked for the buffer twice: closing it",
                                 h.pid));
    return detach(s);
  }
  s->xhello_answered = true;
  static_assert(static_cast<int>(protocol::Op::xhello) == SOLAR_OP_XHELLO &&
                static_cast<int>(protocol::Op::xhello_ok) == SOLAR_OP_XHELLO_OK);
  const solar_xhello_ok ok{
      buf_.map_bytes, static_cast<std::uint64_t>(reinterpret_cast<std::byte*>(xindex_) - base_)};
  if (!send_with_buffer_fd(s, frame(protocol::Op::xhello_ok, &ok, sizeof ok)))
    return detach(s);
  spdlog::debug("interposer attached (pid {})", h.pid);
}

// The buffer's fd travels with the reply (SCM_RIGHTS), written at once, before any queued
// message, since it is the session's first. Never blocking: the io thread serves every
// connection, and one whose peer does not read (its socket buffer full of replies) would stop
// it. Such a connection is refused (false: the caller detaches it); the part of the reply that
// did not fit (the fd has gone with its first byte) is queued.
bool Agent::Impl::send_with_buffer_fd(const std::shared_ptr<Session>& s,
                                      const std::vector<std::uint8_t>& msg) {
  if (s->closed || s->dropping || !s->out.empty()) return false;
  struct iovec iov{const_cast<std::uint8_t*>(msg.data()), msg.size()};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr mh {};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof control;
  struct cmsghdr* cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &memfd_, sizeof(int));
  ssize_t n;
  do n = ::sendmsg(s->sock.native_handle(), &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n <= 0) return false;  // EAGAIN: it does not read; or gone
  if (static_cast<std::size_t>(n) < msg.size())
    send(s, std::vector<std::uint8_t>(msg.begin() + n, msg.end()));
  return true;
}

void Agent::Impl::detach(const std::shared_ptr<Session>& s) {
  if (s->closed) return;
  s->closed = true;
  unlist(*s);
  boost::system::error_code ec;
  s->sock.close(ec);
  if (s->rank < 0) return;
  std::lock_guard lk(mu_);
  RankState& rs = ranks_[static_cast<std::size_t>(s->rank)];
  drop_rank_locked(static_cast<std::uint32_t>(s->rank));
  if (rs.cursor < T_)
    spdlog::warn("local rank {} left at step {} of {}; its slots are reclaimed", s->rank,
                 rs.cursor, T_);
  else
    spdlog::info("local rank {} finished", s->rank);
}

void Agent::Impl::drop_rank_locked(std::uint32_t r) {
  RankState& rs = ranks_[r];
  // Every admitted use not yet copied to its ring is dropped (a copy in flight drops its own).
  const std::uint64_t from =
      buf_.ring_depth ? rs.assembled + (rs.assembling ? 1 : 0) : rs.released;
  for (std::uint64_t t = from; t < admitted_; ++t)
    for (std::uint32_t a : accesses(t, r)) drop_use_locked(a & kSampleMask);
  rs.gone = true;
  rs.session.reset();
  rs.end_owed = false;
}

// Nothing queued: the reply goes straight to the socket (non-blocking), without the queue and
// the completion handler an asynchronous write costs; only what does not fit is queued.
void Agent::Impl::send(const std::shared_ptr<Session>& s, std::span<const std::uint8_t> msg) {
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

void Agent::Impl::send(const std::shared_ptr<Session>& s, std::vector<std::uint8_t> msg) {
  if (s->closed || s->dropping) return;
  if (s->out_bytes + msg.size() > kMaxQueuedBytes) {  // it does not read its replies
    s->dropping = true;
    queue_log_.warn(fmt::format("{} has more than {} of replies it does not read: closing it",
                                s->rank >= 0 ? fmt::format("rank {}", s->rank)
                                             : std::string("a connection"),
                                format_bytes(kMaxQueuedBytes)));
    asio::post(io_, [this, s] { detach(s); });  // not now: the caller may hold mu_
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
void Agent::Impl::write_front(const std::shared_ptr<Session>& s) {
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

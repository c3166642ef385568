// SPDX-License-Identifier: Apache-2.0
// The control server's requests (the io thread): libsolar's hello and its next, release, stats
// and shutdown requests, and the interposer's hello; both hellos hand over the buffer's fd.
// See control_server.h.
#include "control_server.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>

#include "agent_impl.h"
#include "solar/fd_passing.h"

namespace solar::agent {

// What a sample's bytes are, from the source (protocol version 2), for the hello reply.
void ControlServer::put_layout(protocol::HelloOk& ok) const {
  const auto& info = a_.source_->info();
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

void ControlServer::on_message(const std::shared_ptr<Session>& s, protocol::Op op,
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
    case protocol::Op::xfetch:
      return on_xfetch(s, payload);
    case protocol::Op::next: {
      protocol::Next n;
      if (!decode_payload(std::span(payload), n) || s->rank < 0)
        return refuse("next before hello, or malformed");
      std::lock_guard lk(a_.mu_);
      RankState& rs = a_.ranks_[static_cast<std::size_t>(s->rank)];
      if (n.step != rs.asked)
        return refuse(fmt::format("asked for step {} but the next step to ask for is {}", n.step,
                                  rs.asked));
      if (rs.asked >= a_.T_) {  // past the last step: `end`, after the batches still owed
        rs.end_owed = true;
        serve_due_ = true;
        return;
      }
      if (rs.asked - rs.cursor >= protocol::kMaxStepsAsked)
        return refuse(fmt::format("more than {} steps asked for and not yet served",
                                  protocol::kMaxStepsAsked));
      if (rs.asked++ == a_.waits_for(rs)) {  // it holds nothing older: it waits for this one now
        rs.wait_since = Clock::now();
        a_.stats_.note_request(n.step, rs.wait_since, a_.ready_);
      }
      serve_due_ = true;  // once every request read with it is handled (read_more)
      return;
    }
    case protocol::Op::release: {
      protocol::Release rl;
      if (!decode_payload(std::span(payload), rl) || s->rank < 0)
        return refuse("release before hello, or malformed");
      std::lock_guard lk(a_.mu_);
      RankState& rs = a_.ranks_[static_cast<std::size_t>(s->rank)];
      if (rl.step != rs.released || rl.step >= rs.cursor)
        return refuse(fmt::format("release of step {} out of order (next to release: {}, handed "
                                  "out: {})",
                                  rl.step, rs.released, rs.cursor));
      if (a_.buf_.ring_depth == 0)  // zero copy: the rank no longer reads those cache slots
        for (std::uint32_t a : a_.accesses(rl.step, static_cast<std::uint32_t>(s->rank)))
          a_.drop_use_locked(a & kSampleMask);
      ++rs.released;  // its ring entry can take a later batch
      const auto now = Clock::now();
      a_.stats_.note_released(rl.step, now);
      if (const std::uint64_t w = a_.waits_for(rs); w < rs.asked && w < a_.T_) {  // asked ahead
        rs.wait_since = now;  // it waits for it now
        a_.stats_.note_request(w, now, a_.ready_);
      }
      // Its ring entry is copied once every request read with it is handled (read_more),
      // after the replies.
      assembly_due_ = true;
      return;
    }
    case protocol::Op::stats: {
      const std::string j = a_.stats_reply();
      send(s, frame(protocol::Op::stats_reply, j.data(), j.size()));
      return;
    }
    case protocol::Op::shutdown:
      spdlog::info("shutdown requested");
      stop();
      return;
    default:  // not reached: request_acceptable refuses other ops (read_more closes those)
      bad_request_log_.warn(fmt::format("unknown op {}: closing the connection",
                                        static_cast<unsigned>(op)));
      detach(s);
  }
}

void ControlServer::on_hello(const std::shared_ptr<Session>& s,
                             const std::vector<std::uint8_t>& payload) {
  protocol::Hello h;
  auto refuse = [&](const std::string& why) {
    bad_request_log_.warn("hello refused: " + why);
    send(s, frame(protocol::Op::error, why.data(), why.size()));
  };
  if (!decode_payload(std::span(payload), h)) return refuse("malformed hello");
  // The unmodified ranks' reads pace this agent; batches would pace it twice.
  if (a_.pacer_.index())
    return refuse("this agent serves an unmodified script's file reads (--transparent); solar's "
                  "loader reads directly in this step");
  if (s->rank >= 0) return refuse("already attached");
  if (h.local_rank >= a_.R_)
    return refuse(fmt::format("local rank {} does not exist (this node has ranks 0..{})",
                              h.local_rank, a_.R_ - 1));
  {
    std::lock_guard lk(a_.mu_);
    RankState& rs = a_.ranks_[h.local_rank];
    if (rs.attached || rs.gone)
      return refuse(fmt::format("local rank {} is already attached (or has left)", h.local_rank));
    rs.attached = true;
    rs.session = s;
  }
  s->rank = static_cast<int>(h.local_rank);
  unlist(*s);
  protocol::HelloOk ok;
  ok.node = a_.opt_.node;
  ok.ranks_per_node = a_.R_;
  ok.samples = a_.header_.config.samples;
  ok.sample_bytes = a_.sample_bytes_;
  ok.label_bytes = a_.label_bytes_;
  ok.slot_bytes = a_.buf_.slot_bytes;
  ok.labels_offset = a_.label_bytes_ ? a_.buf_.labels_offset : 0;
  ok.slots = a_.buf_.slots;
  ok.total_steps = a_.T_;
  ok.steps_per_epoch = a_.header_.layout.steps;
  ok.start_step = a_.start_;
  ok.ask_ahead = a_.ask_ahead();  // zero copy: one step, as before the field
  ok.defer_releases = a_.defer_releases() ? 1 : 0;
  put_layout(ok);
  if (!send_with_buffer_fd(s, frame(protocol::Op::hello_ok, &ok, sizeof ok))) {
    spdlog::warn("rank {}: could not send the hello reply", h.local_rank);
    return detach(s);
  }
  spdlog::info("local rank {} attached (pid {})", h.local_rank, h.pid);
}

// An unmodified rank's interposer (or one of its DataLoader workers): no batches, just the
// buffer and where its index is. Any number of processes may attach this way.
void ControlServer::on_xhello(const std::shared_ptr<Session>& s,
                              const std::vector<std::uint8_t>& payload) {
  solar_xhello h{};
  auto refuse = [&](const std::string& why) {
    xhello_log_.warn("interposer refused: " + why);
    send(s, frame(protocol::Op::error, why.data(), why.size()));
  };
  if (!decode_payload(std::span(payload), h)) return refuse("malformed hello");
  if (!a_.pacer_.index())
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
      a_.buf_.map_bytes,
      static_cast<std::uint64_t>(reinterpret_cast<const std::byte*>(a_.pacer_.index()) - a_.base_)};
  if (!send_with_buffer_fd(s, frame(protocol::Op::xhello_ok, &ok, sizeof ok)))
    return detach(s);
  spdlog::debug("interposer attached (pid {})", h.pid);
}

// An interposer's miss of a sample another node keeps (demand mode across the nodes): answered
// at once when this agent will not read it from there, else once the peer thread has.
void ControlServer::on_xfetch(const std::shared_ptr<Session>& s,
                              const std::vector<std::uint8_t>& payload) {
  static_assert(static_cast<int>(protocol::Op::xfetch) == SOLAR_OP_XFETCH &&
                static_cast<int>(protocol::Op::xfetch_ok) == SOLAR_OP_XFETCH_OK);
  solar_xfetch f{};
  if (!decode_payload(std::span(payload), f)) {
    xhello_log_.warn("interposer's ask refused: malformed");
    const std::string why = "malformed ask";
    return send(s, frame(protocol::Op::error, why.data(), why.size()));
  }
  // A process's asking connection stays for its life: not one of the connections that are
  // not an attached rank (kMaxUnattached closes the oldest of those).
  unlist(*s);
  DemandCache::Fetch got = DemandCache::Fetch::not_held;
  const std::uint64_t token = next_ask_++;
  {
    std::lock_guard lk(a_.mu_);
    if (!a_.stopping_ && a_.fatal_.empty()) got = a_.pacer_.fetch_locked(f.sample, token);
  }
  if (got == DemandCache::Fetch::pending) {
    asks_.emplace(token, s);
    return;
  }
  f.held = got == DemandCache::Fetch::held;
  send(s, frame(protocol::Op::xfetch_ok, &f, sizeof f));
}

void ControlServer::post_fetch_reply(std::uint64_t token, std::uint32_t sample, bool held) {
  asio::post(io_, [this, token, sample, held] {
    const auto it = asks_.find(token);
    if (it == asks_.end()) return;
    const std::shared_ptr<Session> s = it->second.lock();
    asks_.erase(it);
    if (!s || s->closed) return;
    const solar_xfetch f{sample, held ? 1U : 0U};
    send(s, frame(protocol::Op::xfetch_ok, &f, sizeof f));
  });
}

// The buffer's fd travels with the reply (SCM_RIGHTS), written at once, before any queued
// message, since it is the session's first. Never blocking: the io thread serves every
// connection, and one whose peer does not read (its socket buffer full of replies) would stop
// it. Such a connection is refused (false: the caller detaches it); the part of the reply that
// did not fit (the fd has gone with its first byte) is queued.
bool ControlServer::send_with_buffer_fd(const std::shared_ptr<Session>& s,
                                        const std::vector<std::uint8_t>& msg) {
  if (s->closed || s->dropping || !s->out.empty()) return false;
  const ssize_t n = protocol::send_with_fd(s->sock.native_handle(), msg.data(), msg.size(),
                                           a_.memfd_, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n <= 0) return false;  // EAGAIN: it does not read; or gone
  if (static_cast<std::size_t>(n) < msg.size())
    send(s, std::vector<std::uint8_t>(msg.begin() + n, msg.end()));
  return true;
}

}  // namespace solar::agent

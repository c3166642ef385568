// SPDX-License-Identifier: Apache-2.0
// Batch mode: the batches handed to libsolar's ranks. See control_server.h.
#include "control_server.h"

#include <cstring>

#include "agent_impl.h"

namespace solar::agent {

// Serves waiting ranks from the io thread (sessions are only touched there).
void ControlServer::post_serve() {
  asio::post(io_, [this] {
    std::lock_guard lk(a_.mu_);
    serve_waiting_locked();
  });
}

// Appends the reply for rank r's step rs.cursor to `msg` (sent by the caller).
void ControlServer::put_batch_locked(RankState& rs, std::uint32_t r,
                                     std::vector<std::uint8_t>& msg) {
  const std::uint64_t t = rs.cursor;
  const auto acc = a_.accesses(t, r);
  // The reply: header, BatchHead, then one BatchEntry per sample, built in place at the end
  // of `msg` (the session's scratch buffer: no allocation once it has grown).
  constexpr std::size_t kHead = sizeof(protocol::Header) + sizeof(protocol::BatchHead);
  const std::size_t from = msg.size();
  msg.resize(from + kHead + acc.size() * sizeof(protocol::BatchEntry));
  std::uint8_t* m = msg.data() + from;
  protocol::BatchHead bh;
  bh.step = t;
  bh.count = static_cast<std::uint32_t>(acc.size());
  const std::size_t at =
      protocol::put_header(m, protocol::Op::batch, msg.size() - from - sizeof(protocol::Header));
  std::memcpy(m + at, &bh, sizeof bh);
  std::uint64_t hits = 0;  // the hit bits say what the agent did (see prefetch_loop)
  for (std::size_t i = 0; i < acc.size(); ++i) {
    const std::uint32_t x = acc[i] & kSampleMask;
    hits += acc[i] >> 31;
    // Samples of differing sizes: one the cache had no extent for (Prefetcher's unplaced) is
    // the rank's to read itself (protocol::kReadItYourself).
    const std::uint32_t slot = a_.buf_.ring_depth ? a_.ring_slot(r, t, i)
                               : a_.table_.sized() && !a_.table_.resident(x)
                                   ? protocol::kReadItYourself
                                   : a_.table_.slot_of(x);
    const protocol::BatchEntry e{x, slot};
    std::memcpy(m + kHead + i * sizeof e, &e, sizeof e);
  }
  // Waited for only when every earlier step is released (or held, waits_for): one handed out
  // ahead was not.
  const double wait = a_.waits_for(rs) == t ? seconds_since(rs.wait_since) : 0.0;
  rs.stall_seconds += wait;
  a_.stats_.note_served(t, r, acc.size(), hits, wait);
  ++rs.cursor;
}

// Every step asked for whose batch is ready, in order, in one send per rank (one wake-up of a
// rank that waits); then `end` when it is owed.
void ControlServer::serve_waiting_locked() {
  for (std::uint32_t r = 0; r < a_.R_; ++r) {
    RankState& rs = a_.ranks_[r];
    if (!rs.session) continue;
    const std::uint64_t ready = a_.buf_.ring_depth ? rs.assembled : a_.ready_;
    if (rs.cursor < rs.asked && rs.cursor < ready) {
      std::vector<std::uint8_t>& msg = rs.session->scratch;
      msg.clear();
      while (rs.cursor < rs.asked && rs.cursor < ready) put_batch_locked(rs, r, msg);
      send(rs.session, std::span<const std::uint8_t>(msg));
    }
    if (rs.end_owed && rs.session && rs.cursor >= rs.asked) {
      rs.end_owed = false;
      std::uint8_t end[sizeof(protocol::Header)];
      protocol::put_header(end, protocol::Op::end, 0);
      send(rs.session, std::span<const std::uint8_t>(end));
    }
  }
}

}  // namespace solar::agent

// SPDX-License-Identifier: Apache-2.0
// PeerSharing's fabric state (peer_sharing.h): the endpoint, the registrations of the buffer,
// the progress counters and the scratch words, what is known of each other node, and the reads
// in flight. The peer thread's alone, except where peer_sharing.h says the agent's lock guards
// it (remote[].dead and disabled, read by the prefetch engine; pins, served). Internal to
// solar-agent: only peer_setup.cpp and peer_sharing.cpp include it.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agent_impl.h"
#include "solar/storage/fabric.h"  // the endpoint and registrations solar-stored uses

namespace solar::agent {

namespace fabric = storage::fabric;

inline constexpr std::size_t kInFlight = 32;  // peer reads in flight
inline constexpr int kMaxTorn = 3;            // changed entries before a sample goes to storage
// Demand mode across the nodes: the mailbox each node has for each other (words a sender
// writes: seq << 32 | sample + 1, at seq % kMailbox), and the pushes one may have in flight.
inline constexpr std::uint32_t kMailbox = 256;
inline constexpr std::size_t kPushInFlight = 32;

struct PeerSharing::State {
  struct Remote {
    bool needed = false;   // we read from it, or it reads from us
    bool known = false;    // its card was read and its address inserted
    bool dead = false;     // unreachable: our reads from it go to storage
    fi_addr_t addr = FI_ADDR_UNSPEC;
    std::uint64_t buf_key = 0, buf_base = 0, prog_key = 0, prog_base = 0;
    std::uint64_t entries_offset = 0, slot_bytes = 0, labels_offset = 0;
    std::uint64_t written = 0;  // the progress value it has from us
    bool writing = false;       // a progress write to it is in flight
    // As a reader of ours: its counter as last seen, and since when; abandoned: its pins were
    // released because it stalled while we needed the slots.
    std::uint64_t seen = 0;
    Clock::time_point seen_at = Clock::now();
    bool abandoned = false;
    // Demand mode across the nodes, as a sender of pushes to it: the next seq, the pushes not
    // yet acknowledged (seq, sample); as their receiver: the next seq we expect from it, the
    // acknowledgment we have written to it, whether one is in flight.
    std::uint32_t sent = 0;
    std::deque<std::pair<std::uint32_t, std::uint32_t>> unacked;
    std::uint32_t mail_next = 0, ack_written = 0;
    bool acking = false;
    // Its pushes we are reading (their seqs): we acknowledge only below the oldest, so that
    // it keeps the sample's slot until we have it.
    std::set<std::uint32_t> pulling;
    std::uint32_t ack_value() const { return pulling.empty() ? mail_next : *pulling.begin(); }
  };
  struct Op {
    fi_context2 ctx;  // first: completions point here
    PeerJob job;
    // 0 post entry read, 1 entry read, 2 sample read, 4 label read (labels lie apart), 3 entry
    // re-read
    int phase = 0;
    int torn = 0;
    bool active = false;
    Clock::time_point since, retry_at;
    std::uint64_t e1 = 0;
  };
  struct WriteCtx {
    fi_context2 ctx;
    std::uint32_t node = 0;
  };
  // Declared before the registrations of their memory, so destroyed after them.
  std::unique_ptr<fabric::Endpoint> ep;
  // Remote-written, one registration: [n] node n's progress reading from us; [M + n] node n's
  // acknowledgment of our pushes to it (the seq it expects next); [2M + n*kMailbox + i] the
  // mailbox node n pushes to us (demand mode across the nodes).
  std::vector<std::uint64_t> progress;
  // 2 words per op (entry reads), then one per node (progress writes), one per push in
  // flight, one per node (acknowledgments).
  std::vector<std::uint64_t> scratch;
  fabric::Region buf_mr, prog_mr, scratch_mr;
  std::vector<Remote> remote;
  std::vector<Op> ops = std::vector<Op>(kInFlight);
  std::vector<WriteCtx> writes;
  std::vector<WriteCtx> push_writes = std::vector<WriteCtx>(kPushInFlight);
  std::vector<bool> push_busy = std::vector<bool>(kPushInFlight);
  std::vector<WriteCtx> ack_writes;
  // [t]: (sample, reader) for the reads other nodes make from us at step t.
  std::vector<std::vector<std::pair<std::uint32_t, std::uint32_t>>> served;
  std::vector<std::deque<std::pair<std::uint64_t, std::uint32_t>>> pins;  // [reader]: (t, sample)
  std::uint64_t progress_cursor = 0;  // our peer jobs of every step before it are done
  bool disabled = false;              // after a read that never completed: all to storage
  std::string card_path;
  ~State() {
    if (!card_path.empty()) ::unlink(card_path.c_str());
  }
};

}  // namespace solar::agent

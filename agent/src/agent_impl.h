// Agent::Impl: the agent's state and the methods of its parts, each part in its own file:
//   agent.cpp        start-up (plan, source, buffer, socket), run, stop
//   buffer_layout.*  slot counts, rings and the transparent index's place (a pure function)
//   slot_table.*     free list, pins, evictions, zombies, index entries (no threads, no I/O)
//   prefetcher.cpp   the plan → storage reads → slots, and copies of batches into the rings
//   serving.cpp      batches handed to ranks (batch mode for libsolar)
//   control.cpp      the Unix socket: sessions, hellos (libsolar and interposer), messages
//   transparent.cpp  the shared sample index (extent mode for the interposer) and pacing
//   node_stats.*     what the agent measured (per epoch, head start, start-up) and its JSON
//   stats.cpp        the stats document (the node's state and NodeStats), reply, --stats-out
//   peers.cpp        peer sharing: other agents' buffers read over libfabric RMA, ours served
// Internal to solar-agent.
#pragma once

#include <sys/uio.h>

#include <utility>  // before asio: with g++ 12 and C++20, Boost.Asio 1.74 uses std::exchange unincluded
#include <boost/asio.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "agent.h"
#include "buffer_layout.h"
#include "node_stats.h"
#include "request_reader.h"
#include "slot_table.h"
#include "solar/protocol.h"
#include "solar/transparent.h"

namespace solar::agent {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;
using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// --stats-out: the folder exists and a file can be created in it; throws AgentError.
void check_stats_out(const std::string& path);

// One message of the protocol: header and body (control.cpp).
std::vector<std::uint8_t> frame(protocol::Op op, const void* body, std::size_t n);
// An error frame written at once, without waiting (the connection is closed next).
void send_error_now(int fd, std::string_view why);

// Limits of the control socket (agent/README.md, "Connections and limits"): what a flood of
// connections from the agent's own user can make it hold.
// How often the agent checks that its dataset file is still the one it opened (watch_loop).
inline constexpr std::chrono::milliseconds kWatchPeriod{200};
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

class Agent::Impl {
 public:
  explicit Impl(const AgentOptions& o);
  ~Impl();
  int run();
  void stop() {
    asio::post(io_, [this] { shutdown_io(); });
  }

 private:
  struct Session;
  struct RankState {
    std::shared_ptr<Session> session;
    bool attached = false;
    bool gone = false;        // disconnected: its uses are no longer counted
    bool end_owed = false;    // asked for the step after the last: `end` once all are served
    bool assembling = false;  // a reader-pool job is copying its step `assembled` into its ring
    std::uint64_t assembled = 0;  // steps < assembled are in its ring (its uses dropped)
    std::uint64_t cursor = 0;    // next step to hand out
    std::uint64_t asked = 0;     // steps < asked were asked for (next); cursor..asked-1 wait
    std::uint64_t released = 0;  // steps < released are released
    double begun_at = -1;        // transparent: when step `released` was first seen begun
    double stall_seconds = 0;
    // When the rank began to wait for step `released` (it had released every earlier step and
    // asked for this one): the later of that release and that request. A step handed out
    // before the rank released the one before (asked ahead) was not waited for.
    Clock::time_point wait_since;
  };

  // Ring slot i of rank r's batch of step t (see the buffer layout, buffer_layout.cpp).
  std::uint32_t ring_slot(std::uint32_t r, std::uint64_t t, std::size_t i) const {
    return buf_.ring_slot(r, t, i);
  }
  std::byte* slot_ptr(std::uint64_t slot) const { return base_ + buf_.slot_offset(slot); }
  std::byte* label_ptr(std::uint64_t slot) const { return base_ + buf_.label_offset(slot); }
  // What the hello tells ranks (protocol::HelloOk): steps to ask ahead (small batches: half
  // the ring less the step held, see kSmallBatchRingBytes; other rings: all of it), and whether
  // they hold their releases back until their next write (rings deep enough for both).
  std::uint32_t ask_ahead() const {
    if (buf_.ring_depth < 2) return 1;
    const std::uint64_t a = buf_.inline_copy ? buf_.ring_depth / 2 - 1 : buf_.ring_depth - 1;
    return static_cast<std::uint32_t>(std::min<std::uint64_t>(a, protocol::kMaxStepsAsked - 1));
  }
  bool defer_releases() const { return buf_.ring_depth >= 2 * (std::uint64_t{ask_ahead()} + 1); }
  // The step rank rs waits for once it asks for it: the one after those it released, or with
  // deferred releases, after the one it holds (released, if handed out: its release comes
  // with its next write, which it sends only when it has no other reply left).
  std::uint64_t waits_for(const RankState& rs) const {
    return rs.released + (defer_releases() && rs.cursor > rs.released ? 1 : 0);
  }

  // Plan access.
  std::span<const std::uint32_t> accesses(std::uint64_t t, std::uint32_t r) const {
    const std::uint64_t i = t * R_ + r;
    return {plan_.accesses.data() + plan_.rank_offsets[i],
            plan_.rank_offsets[i + 1] - plan_.rank_offsets[i]};
  }

  // Prefetch engine (its own thread).
  void prefetch_loop();
  void reader_loop();
  // The sample's bytes into `slot` (through the memfd), and its label (if any) into the labels.
  void write_slot(std::uint32_t slot, const std::byte* sample, const std::byte* label);
  // on_io: called on the io thread (serve at once instead of posting).
  void schedule_assembly_locked(bool on_io = false);
  void assemble(std::uint64_t t, std::uint32_t r);
  void add_copies_locked(std::uint64_t t, std::uint32_t r, std::vector<std::uint32_t>& dst,
                         std::vector<std::uint32_t>& src) const;
  void copy_slots(std::span<const std::uint32_t> dst, std::span<const std::uint32_t> src) const;
  // Small batches copied inline (schedule_assembly_locked): scratch, with mu_ held.
  std::vector<std::pair<std::uint64_t, std::uint32_t>> inline_jobs_;  // (step, rank)
  std::vector<std::uint32_t> inline_dst_, inline_src_;
  void finish_assembly_locked(std::uint64_t t, std::uint32_t r);
  void complete_steps_locked();
  void post_serve();
  void fail(const std::string& what);
  // The slot table's calls that may free a slot wake the prefetch engine once as many slots
  // are free as its step needs (slots_wanted_), not for each: woken for one, it would find too
  // few and sleep again, having waited for the lock of the thread that woke it (the io thread:
  // a wake-up per batch served, a third of its time in all-hit epochs with four ranks).
  void slot_freed_locked() {
    if (slots_wanted_ > 0) slot_wait_since_ = Clock::now();  // a stall is no slot for a while
    if (table_.free_slots() >= slots_wanted_) slot_freed_.notify_all();
  }
  void free_slot_locked(std::uint32_t sample) {
    if (table_.free_slot(sample)) slot_freed_locked();
  }
  void drop_use_locked(std::uint32_t sample) {
    if (table_.drop_use(sample)) slot_freed_locked();
  }

  // Control server (the io thread).
  void accept();
  void accept_failed(const boost::system::error_code& ec);
  bool shed_one(int err);
  std::string refuse_without_fd(int fd);
  void unlist(Session& s);
  void on_message(const std::shared_ptr<Session>& s, protocol::Op op,
                  const std::vector<std::uint8_t>& payload);
  void on_hello(const std::shared_ptr<Session>& s, const std::vector<std::uint8_t>& payload);
  void on_xhello(const std::shared_ptr<Session>& s, const std::vector<std::uint8_t>& payload);
  void put_layout(protocol::HelloOk& ok) const;
  bool send_with_buffer_fd(const std::shared_ptr<Session>& s, const std::vector<std::uint8_t>& msg);

  // Transparent mode (opt_.transparent): the shared index of resident samples (its entries are
  // published and cleared by the slot table).
  void setup_index();
  void pace_loop();
  // Batch mode over an HDF5 file: checks the open file and its path every kWatchPeriod; a file
  // rewritten, truncated, replaced (renamed over), renamed away or deleted stops the agent
  // (fail: the ranks are told why and read directly, where the same checks refuse the file).
  void watch_loop();
  std::thread watch_;
  std::condition_variable watch_wake_;
  bool withdraw_if_changed();
  solar_xindex* xindex_ = nullptr;
  std::uint32_t* xconsumed_ = nullptr;
  std::vector<std::uint32_t> need_;   // per plan access: uses of its sample on this node so far
  std::uint64_t paced_steps_ = 0;     // steps every rank has consumed
  std::thread pace_;
  void serve_waiting_locked();
  void put_batch_locked(RankState& rs, std::uint32_t r, std::vector<std::uint8_t>& msg);
  void detach(const std::shared_ptr<Session>& s);
  // Rank r will not be served (it left, or was refused): its admitted uses are dropped so that
  // its cache slots can be reused.
  void drop_rank_locked(std::uint32_t r);
  void read_more(const std::shared_ptr<Session>& s);
  // Io thread: a `next` or a release was read; served or copied once the whole read is handled.
  bool serve_due_ = false, assembly_due_ = false;
  // Queues a message; writes go out in order, one at a time. A connection with more than
  // kMaxQueuedBytes queued is closed instead.
  void send(const std::shared_ptr<Session>& s, std::vector<std::uint8_t> msg);
  // The same, from bytes the caller keeps: written at once when nothing is queued (one send,
  // no allocation), the rest (if the socket is full) copied into the queue.
  void send(const std::shared_ptr<Session>& s, std::span<const std::uint8_t> msg);
  void write_front(const std::shared_ptr<Session>& s);  // io thread; s->out not empty
  // The stats document (stats.cpp): the node's state (ranks, slots, peers, error) and what
  // stats_ measured (the run totals, the per-epoch records, the head start and their totals).
  // The stats reply is it, cut to fit one message; the log's last line ("stopped: {...}") is
  // all of it; --stats-out writes its measured part to a file.
  nlohmann::json stats_document();
  std::string stats_reply() { return NodeStats::reply(stats_document()); }
  void write_stats_out(const nlohmann::json& doc);
  void shutdown_io();

  AgentOptions opt_;
  PlanHeader header_;
  NodePlan plan_;
  std::unique_ptr<storage::SampleSource> source_;
  std::uint32_t R_ = 0;
  std::uint64_t T_ = 0;
  std::uint64_t sample_bytes_ = 0, label_bytes_ = 0;
  BufferLayout buf_;  // slots, rings, and where the transparent index goes

  int memfd_ = -1;
  std::byte* base_ = nullptr;

  std::mutex mu_;
  std::condition_variable slot_freed_;
  SlotTable table_;  // the cache slots: free, resident, pinned, zombie
  std::uint64_t start_ = 0;     // --start-step: the first step read and served
  std::uint64_t admitted_ = 0;  // steps < admitted_ have slots and count their uses
  std::uint64_t ready_ = 0;     // steps < ready_ are read and servable
  struct ReadJob {
    std::uint64_t step = 0;
    int assemble_rank = -1;                // >= 0: copy this rank's batch into its ring
    std::vector<storage::SampleRun> runs;  // coalesced, ascending
    std::vector<std::uint32_t> slots;      // the slot of each sample, in run order
  };
  std::deque<ReadJob> jobs_;
  std::vector<std::uint32_t> outstanding_;  // per step: read jobs not finished
  std::condition_variable job_ready_;
  std::vector<std::thread> readers_;
  std::vector<RankState> ranks_;
  bool stopping_ = false;

  // Peer sharing (opt_.peer_dir; peers.cpp). The prefetch engine hands the plan's peer reads
  // to the peer thread as PeerJobs (their slots placed, counted in outstanding_); a job that
  // cannot be read from its peer becomes a storage ReadJob of the same slot. As a source, the
  // agent pins each sample another node reads from it at step t (before that step's
  // evictions) until that node's progress counter, which it writes into our memory, passes t.
  struct PeerState;
  struct PeerJob {
    std::uint64_t step = 0;
    std::uint32_t sample = 0, slot = 0, from = 0;
  };
  struct PeerStateDelete {  // PeerState is defined in peers.cpp only
    void operator()(PeerState* p) const;
  };
  std::unique_ptr<PeerState, PeerStateDelete> peers_;
  std::deque<PeerJob> peer_jobs_;            // queued for the peer thread (mu_)
  std::vector<std::uint32_t> peer_pending_;  // per step: peer jobs not read or handed to storage
  std::uint64_t peer_samples_ = 0, peer_fallbacks_ = 0, peer_torn_ = 0;
  std::uint64_t peer_pins_released_early_ = 0;  // samples a stalled reader lost (see peers.cpp)
  Clock::time_point slot_wait_since_{};  // the prefetch engine waits, no slot freed since then
  std::size_t slots_wanted_ = 0;  // the free slots the prefetch engine waits for (0: it doesn't)
  std::thread peer_;
  std::condition_variable peer_wake_;  // peer jobs queued, or stopping
  // Constructor: endpoint, registrations, card, the others' cards; `pf` is the plan the
  // constructor opened (the other nodes' sections say what they read from this one).
  void setup_peers(const PlanFile& pf);
  void peer_loop();
  void wake_peer_locked();  // peer jobs queued (or stopping): the peer thread looks now
  // At step t, before its evictions: pins the samples other nodes read from us in step t.
  void pin_served_locked(std::uint64_t t);
  bool peer_usable_locked(std::uint32_t node) const;
  void peer_done_locked(const PeerJob& j, bool ok);
  nlohmann::json peers_json() const;
  std::string fatal_;  // set when prefetching failed

  // What the agent measured (node_stats.h): noted with mu_ held by every thread that works
  // (readers, io thread, pacer, peer thread); the stats document copies it under mu_.
  NodeStats stats_;

  asio::io_context io_;
  stream::acceptor acceptor_;
  asio::steady_timer accept_retry_{io_};  // accepting again after an error
  // After a failure: the error frame is queued to every rank, and the connections close once
  // it is written (shutdown_io, close_when_written; io thread).
  bool last_words_sent_ = false;
  Clock::time_point closing_deadline_{};
  asio::steady_timer closing_timer_{io_};
  void close_when_written();
  // Kept open to be given up when the agent runs out of descriptors: the connection it then
  // accepts is answered at once (its rank reads directly) instead of waiting unseen.
  int reserve_fd_ = -1;
  // Connections that are not an attached rank, oldest first (kMaxUnattached).
  std::list<std::weak_ptr<Session>> unattached_;
  // Io thread only.
  ThrottledLog fd_log_, accept_log_, stranger_log_, bad_request_log_, cap_log_, queue_log_;
  // An interposer refused (a transparent script on a batch agent): one per worker process is
  // normal, a flood is not.
  ThrottledLog xhello_log_{64};
  std::thread prefetch_;
  int exit_code_ = 0;
};

struct Agent::Impl::Session : std::enable_shared_from_this<Session> {
  explicit Session(asio::io_context& io) : sock(io) {}
  stream::socket sock;
  RequestReader reader;  // received, not yet handled
  std::vector<std::uint8_t> payload;
  std::deque<std::vector<std::uint8_t>> out;
  std::vector<std::uint8_t> scratch;  // a reply being built (send_batch_locked)
  int rank = -1;  // local rank once attached
  bool closed = false;
  std::size_t out_bytes = 0;  // queued in `out`
  bool dropping = false;      // too much queued: being closed
  bool listed = false;        // in unattached_ at `where`
  bool xhello_answered = false;  // an interposer's connection asks once (on_xhello)
  std::list<std::weak_ptr<Session>>::iterator where;
};

}  // namespace solar::agent

#include "agent.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <utility>  // before asio: g++ 12 + C++20 (see shared/notes/io.md)
#include <boost/asio.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "solar/protocol.h"
#include "solar/storage/hdf5_source.h"
#include "solar/transparent.h"

namespace solar::agent {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;
using Clock = std::chrono::steady_clock;

namespace {

std::uint64_t mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::uint64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return ~std::uint64_t{0};
}

// Batches up to this size are copied into a ring by whichever thread makes them ready.
constexpr std::uint64_t kInlineCopyBytes = 512 * 1024;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

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
    bool waiting = false;     // a next request waits for its step
    bool assembling = false;  // a job is copying its step `assembled` into its ring
    std::uint64_t assembled = 0;  // steps < assembled are in its ring (its uses dropped)
    std::uint64_t cursor = 0;    // next step to hand out
    std::uint64_t released = 0;  // steps < released are released
    double stall_seconds = 0;
    Clock::time_point wait_since;
  };

  // Ring slot i of rank r's batch of step t (see the buffer layout in the constructor).
  std::uint32_t ring_slot(std::uint32_t r, std::uint64_t t, std::size_t i) const {
    const std::uint64_t entry = std::uint64_t{r} * ring_depth_ + t % ring_depth_;
    return static_cast<std::uint32_t>(cache_slots_ + entry * ring_batch_ + i);
  }
  std::byte* slot_ptr(std::uint64_t slot) const { return base_ + slot * slot_bytes_; }

  // Plan access.
  std::span<const std::uint32_t> accesses(std::uint64_t t, std::uint32_t r) const {
    const std::uint64_t i = t * R_ + r;
    return {plan_.accesses.data() + plan_.rank_offsets[i],
            plan_.rank_offsets[i + 1] - plan_.rank_offsets[i]};
  }

  // Prefetch engine (its own thread).
  void prefetch_loop();
  void reader_loop();
  void write_slot(std::uint32_t slot, struct iovec* iov, int n);
  // on_io: called on the io thread (serve at once instead of posting).
  void schedule_assembly_locked(bool on_io = false);
  void assemble(std::uint64_t t, std::uint32_t r);
  std::vector<std::uint32_t> batch_slots_locked(std::uint64_t t, std::uint32_t r) const;
  void copy_batch(std::uint64_t t, std::uint32_t r, const std::vector<std::uint32_t>& from);
  void finish_assembly_locked(std::uint64_t t, std::uint32_t r);
  void complete_steps_locked();
  void post_serve();
  void fail(const std::string& what);
  void free_slot_locked(std::uint32_t sample);
  void drop_use_locked(std::uint32_t sample);

  // Control server (the io thread).
  void accept();
  void on_message(const std::shared_ptr<Session>& s, protocol::Op op,
                  const std::vector<std::uint8_t>& payload);
  void on_hello(const std::shared_ptr<Session>& s, const std::vector<std::uint8_t>& payload);
  void on_xhello(const std::shared_ptr<Session>& s, const std::vector<std::uint8_t>& payload);
  bool send_with_buffer_fd(const std::shared_ptr<Session>& s, const std::vector<std::uint8_t>& msg);

  // Transparent mode (opt_.transparent): the shared index of resident samples.
  void setup_index(std::uint64_t index_offset);
  void publish_locked(std::uint32_t sample, std::uint32_t slot);
  void unpublish_locked(std::uint32_t sample);
  void pace_loop();
  solar_xindex* xindex_ = nullptr;
  std::uint64_t* xentries_ = nullptr;
  std::uint32_t* xconsumed_ = nullptr;
  std::uint64_t xgen_ = 0;
  std::uint64_t map_bytes_ = 0;       // the whole memfd: slots, then the index
  std::vector<std::uint32_t> need_;   // per plan access: uses of its sample on this node so far
  std::uint64_t paced_steps_ = 0;     // steps every rank has consumed
  std::thread pace_;
  void serve_waiting_locked();
  void send_batch_locked(RankState& rs, std::uint32_t r);
  void detach(const std::shared_ptr<Session>& s);
  void read_more(const std::shared_ptr<Session>& s);
  // Queues a message; writes go out in order, one at a time.
  static void send(const std::shared_ptr<Session>& s, std::vector<std::uint8_t> msg);
  std::string stats_json();
  nlohmann::json transparent_json() const;
  void shutdown_io();

  AgentOptions opt_;
  PlanHeader header_;
  NodePlan plan_;
  std::unique_ptr<storage::SampleSource> source_;
  std::uint32_t R_ = 0;
  std::uint64_t T_ = 0;
  std::uint64_t sample_bytes_ = 0, label_bytes_ = 0, slot_bytes_ = 0, slots_ = 0;
  std::uint64_t cache_slots_ = 0;  // the plan's resident set
  std::uint64_t ring_depth_ = 0;   // batches per rank's ring
  std::uint64_t ring_batch_ = 0;   // slots per ring batch (b + δ)
  bool inline_copy_ = false;       // batches small enough to copy without a thread hop

  int memfd_ = -1;
  std::byte* base_ = nullptr;

  std::mutex mu_;
  std::condition_variable slot_freed_;
  std::vector<std::uint32_t> free_;
  std::unordered_map<std::uint32_t, std::uint32_t> slot_of_;  // resident or zombie
  std::unordered_map<std::uint32_t, std::uint32_t> pending_;  // admitted uses + reads in flight
  std::unordered_set<std::uint32_t> zombie_;                  // evicted by plan, still in use
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
  std::string fatal_;  // set when prefetching failed

  // Metrics.
  std::uint64_t hits_ = 0, fetched_ = 0, bytes_read_ = 0, reads_ = 0;
  double read_seconds_ = 0, slot_wait_seconds_ = 0;
  Clock::time_point started_ = Clock::now();

  asio::io_context io_;
  stream::acceptor acceptor_;
  std::thread prefetch_;
  int exit_code_ = 0;
};

struct Agent::Impl::Session : std::enable_shared_from_this<Session> {
  explicit Session(asio::io_context& io) : sock(io) {}
  stream::socket sock;
  std::vector<std::uint8_t> in;  // received, not yet handled: in[0, have)
  std::size_t have = 0;
  std::vector<std::uint8_t> payload;
  std::deque<std::vector<std::uint8_t>> out;
  int rank = -1;  // local rank once attached
  bool closed = false;
};

Agent::Impl::Impl(const AgentOptions& o) : opt_(o), acceptor_(io_) {
  // Plan: the header and this node's section only.
  PlanFile pf = [&] {
    try {
      return PlanFile::open(o.plan);
    } catch (const PlanFileError& e) {
      throw AgentError(e.what());
    }
  }();
  header_ = pf.header();
  if (o.node >= header_.config.nodes)
    throw AgentError(fmt::format("--node {}: the plan {} has nodes 0..{}", o.node, o.plan,
                                 header_.config.nodes - 1));
  try {
    plan_ = pf.node(o.node);
  } catch (const PlanFileError& e) {
    throw AgentError(e.what());
  }
  R_ = header_.config.ranks_per_node;
  T_ = std::uint64_t{header_.layout.steps} * header_.config.epochs;

  // Source: must match the plan.
  storage::SourceOptions so;
  so.io_threads = o.io_threads;
  so.label_dataset = o.labels;
  so.direct = o.direct_io;
  so.expect_identity = header_.dataset_identity;
  try {
    source_ = storage::open_source(o.dataset, so);
  } catch (const std::exception& e) {
    throw AgentError(e.what());
  }
  const auto& info = source_->info();
  if (info.samples != header_.config.samples || info.sample_bytes != header_.config.sample_bytes)
    throw AgentError(fmt::format(
        "{} has {} samples of {} bytes but the plan {} was computed for {} samples of {} bytes; "
        "recompute the plan for this dataset",
        source_->describe(), info.samples, info.sample_bytes, o.plan, header_.config.samples,
        header_.config.sample_bytes));
  sample_bytes_ = info.sample_bytes;
  label_bytes_ = info.has_labels ? info.label_bytes : 0;
  slot_bytes_ = agent_slot_bytes(sample_bytes_, label_bytes_);

  // Buffer: the plan's resident set (cache slots), then one ring per rank of `staging_steps`
  // batches. A step's batch is copied into the rank's ring ahead of its request, and the rank
  // reads only there: its page faults stay within its ring (a few batches, touched once)
  // instead of spreading over the whole buffer, its batch is contiguous, and the cache slots
  // it used are free for the plan's evictions as soon as the copy is done.
  if (!o.zero_copy && o.staging_steps == 0)
    throw AgentError("--staging-steps must be at least 1 (batches in each rank's ring)");
  ring_batch_ = std::uint64_t{header_.config.batch} + header_.config.imbalance;
  if (o.zero_copy || o.transparent) {
    // No rings: ranks read the cache slots; the staging slots hold samples the plan evicted
    // while ranks still use them.
    ring_depth_ = 0;
    cache_slots_ = header_.config.buffer_samples() +
                   std::uint64_t{o.staging_steps} * R_ * ring_batch_;
  } else {
    ring_depth_ = o.staging_steps;
    // A plan of policy `none` may hold less than a step; its samples still need slots.
    cache_slots_ = std::max(header_.config.buffer_samples(), std::uint64_t{R_} * ring_batch_);
  }
  slots_ = cache_slots_ + std::uint64_t{R_} * ring_depth_ * ring_batch_;
  inline_copy_ = ring_batch_ * slot_bytes_ <= kInlineCopyBytes;
  // Transparent mode: the sample index follows the slots, page-aligned.
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t index_offset = (slots_ * slot_bytes_ + page - 1) / page * page;
  const std::uint64_t N = header_.config.samples;
  const std::uint64_t bytes =
      o.transparent ? index_offset + sizeof(solar_xindex) + N * 8 + (N * 4 + 7) / 8 * 8 +
                          N * sizeof(solar_xextent)
                    : slots_ * slot_bytes_;
  map_bytes_ = bytes;
  const std::uint64_t avail = mem_available_bytes();
  if (bytes > avail)
    throw AgentError(fmt::format("the buffer needs {} ({} slots of {}) but only {} of memory is "
                                 "available; plan with a smaller --buffer",
                                 format_bytes(bytes), slots_, format_bytes(slot_bytes_),
                                 format_bytes(avail)));
  if (slots_ > 0xffffffffULL)
    throw AgentError(fmt::format("the buffer would have {} slots; at most 2^32 are supported: "
                                 "plan with a smaller --buffer",
                                 slots_));
  memfd_ = ::memfd_create(fmt::format("solar-buffer-node{}", o.node).c_str(),
                          MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memfd_ < 0) throw AgentError(fmt::format("memfd_create: {}", std::strerror(errno)));
  if (::ftruncate(memfd_, static_cast<off_t>(bytes)) != 0)
    throw AgentError(fmt::format("sizing the {} buffer: {}", format_bytes(bytes),
                                 std::strerror(errno)));
  ::fcntl(memfd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  // Readers write cache slots with pwritev (no page faults on fresh memory); the mapping is
  // for copying batches into the rings.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd_, 0);
  if (p == MAP_FAILED) throw AgentError(fmt::format("mapping the buffer: {}", std::strerror(errno)));
  base_ = static_cast<std::byte*>(p);
  if (o.transparent) setup_index(index_offset);
  free_.resize(cache_slots_);
  for (std::uint64_t i = 0; i < cache_slots_; ++i)
    free_[i] = static_cast<std::uint32_t>(cache_slots_ - 1 - i);
  ranks_.resize(R_);

  // Socket: private to this user. A stale socket file (a crashed agent) is replaced.
  namespace fs = std::filesystem;
  std::error_code ec;
  boost::system::error_code bec;
  if (fs::exists(o.socket, ec)) {
    stream::socket probe(io_);
    probe.connect(stream::endpoint(o.socket), bec);
    if (!bec) throw AgentError(fmt::format("{}: another agent is serving this socket", o.socket));
    fs::remove(o.socket, ec);
    spdlog::warn("removed stale socket {}", o.socket);
  }
  const mode_t old = ::umask(0077);
  acceptor_.open();
  acceptor_.bind(stream::endpoint(o.socket), bec);
  ::umask(old);
  if (bec) throw AgentError(fmt::format("{}: cannot bind: {}", o.socket, bec.message()));
  ::chmod(o.socket.c_str(), 0600);
  acceptor_.listen();
  spdlog::info("node {}: {} steps, buffer {} slots × {} = {} ({} cache, {} ranks × {} batches "
               "of {} in rings), source {}",
               o.node, T_, slots_, format_bytes(slot_bytes_), format_bytes(bytes), cache_slots_,
               R_, ring_depth_, ring_batch_, source_->describe());
}

Agent::Impl::~Impl() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  slot_freed_.notify_all();
  job_ready_.notify_all();
  if (prefetch_.joinable()) prefetch_.join();
  for (auto& r : readers_) r.join();
  std::error_code ec;
  std::filesystem::remove(opt_.socket, ec);
  if (pace_.joinable()) pace_.join();
  if (base_) ::munmap(base_, map_bytes_);
  if (memfd_ >= 0) ::close(memfd_);
}

int Agent::Impl::run() {
  outstanding_.assign(T_, 0);
  prefetch_ = std::thread([this] { prefetch_loop(); });
  for (unsigned i = 0; i < std::max(1U, opt_.readers); ++i)
    readers_.emplace_back([this] { reader_loop(); });
  if (opt_.transparent) pace_ = std::thread([this] { pace_loop(); });
  asio::signal_set signals(io_, SIGTERM, SIGINT);
  signals.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    spdlog::info("signal {}: stopping", sig);
    shutdown_io();
  });
  accept();
  io_.run();
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  slot_freed_.notify_all();
  job_ready_.notify_all();
  prefetch_.join();
  for (auto& r : readers_) r.join();
  readers_.clear();
  if (pace_.joinable()) pace_.join();
  spdlog::info("stopped: {}", stats_json());
  return exit_code_;
}

void Agent::Impl::shutdown_io() {
  boost::system::error_code ec;
  acceptor_.close(ec);
  {
    std::lock_guard lk(mu_);
    for (auto& rs : ranks_)
      if (rs.session) rs.session->sock.close(ec);
  }
  io_.stop();
}

// ---- prefetch engine -------------------------------------------------------------------

void Agent::Impl::free_slot_locked(std::uint32_t sample) {
  auto it = slot_of_.find(sample);
  if (it == slot_of_.end()) return;
  unpublish_locked(sample);  // before the slot can take another sample's bytes
  free_.push_back(it->second);
  slot_of_.erase(it);
  zombie_.erase(sample);
  slot_freed_.notify_all();
}

void Agent::Impl::drop_use_locked(std::uint32_t sample) {
  auto it = pending_.find(sample);
  if (it == pending_.end()) return;
  if (--it->second == 0) {
    pending_.erase(it);
    if (zombie_.count(sample)) free_slot_locked(sample);
  }
}

// The prefetch engine: one thread walks the plan in step order — evictions, slot allocation
// (waiting for free slots), admission of the step's uses — and queues the step's reads; a pool
// of reader threads executes them, several steps in flight. A step becomes servable once its
// reads and all earlier steps' are done.
void Agent::Impl::prefetch_loop() {
  std::vector<std::uint32_t> incoming, slots;
  try {
    for (std::uint64_t t = 0; t < T_; ++t) {
      incoming.clear();
      std::unique_lock lk(mu_);
      if (stopping_ || !fatal_.empty()) return;
      // The plan's evictions: free now, or once the ranks still using them release them.
      for (std::uint32_t y : plan_.schedule.evicts_at(t)) {
        if (pending_.count(y)) zombie_.insert(y);
        else free_slot_locked(y);
      }
      auto want = [&](std::uint32_t x) {
        if (zombie_.erase(x)) return;  // still here: resurrect instead of re-reading
        incoming.push_back(x);
      };
      for (const FetchRun& run : plan_.schedule.fetches_at(t))
        for (std::uint32_t x = run.first; x < run.first + run.count; ++x) want(x);
      // Peer transfers between agents are not implemented yet: read those from storage.
      for (const PeerFetch& pf : plan_.schedule.peers_at(t)) want(pf.sample);
      slots.clear();
      const auto wait_from = Clock::now();
      for (std::size_t i = 0; i < incoming.size(); ++i) {
        slot_freed_.wait(lk, [&] { return stopping_ || !fatal_.empty() || !free_.empty(); });
        if (stopping_ || !fatal_.empty()) return;
        slots.push_back(free_.back());
        free_.pop_back();
      }
      slot_wait_seconds_ += seconds_since(wait_from);
      // A sample being read is pinned like a use: were it evicted before its read lands (its
      // only user may be a rank that has left), its slot must not be handed to another sample
      // whose read could then be overwritten by this one.
      for (std::size_t i = 0; i < incoming.size(); ++i) {
        slot_of_[incoming[i]] = slots[i];
        ++pending_[incoming[i]];
      }
      fetched_ += incoming.size();
      // Admit the step's uses now, before later steps' evictions are looked at.
      for (std::uint32_t r = 0; r < R_; ++r) {
        if (ranks_[r].gone) continue;
        for (std::uint32_t a : accesses(t, r)) {
          ++pending_[a & kSampleMask];
          if (a & kHitBit) ++hits_;
        }
      }
      admitted_ = t + 1;
      // The step's reads: one request list of coalesced runs (a source keeps many of them in
      // flight), executed by a reader thread while this one goes on to the next steps.
      std::vector<std::size_t> idx(incoming.size());
      for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
      std::sort(idx.begin(), idx.end(), [&](auto a, auto b) { return incoming[a] < incoming[b]; });
      // Split into about one job per reader thread, whole runs each, so that a step's reads
      // run in parallel too (sources also parallelise within a job).
      const std::size_t per_job =
          std::max<std::size_t>(1, (idx.size() + opt_.readers - 1) / std::max(1U, opt_.readers));
      std::uint32_t jobs = 0;
      ReadJob job;
      job.step = t;
      for (std::size_t i = 0; i < idx.size();) {
        std::size_t j = i + 1;
        while (j < idx.size() && incoming[idx[j]] == incoming[idx[j - 1]] + 1) ++j;
        job.runs.push_back({incoming[idx[i]], j - i});
        for (std::size_t k = i; k < j; ++k) job.slots.push_back(slots[idx[k]]);
        i = j;
        if (job.slots.size() >= per_job || i == idx.size()) {
          jobs_.push_back(std::move(job));
          job = ReadJob{};
          job.step = t;
          ++jobs;
        }
      }
      outstanding_[t] = jobs;
      if (jobs) job_ready_.notify_all();
      else complete_steps_locked();
    }
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

// ---- transparent mode ---------------------------------------------------------------------

void Agent::Impl::setup_index(std::uint64_t index_offset) {
  const auto* h5 = dynamic_cast<const storage::Hdf5Source*>(source_.get());
  if (!h5 || !h5->sample_offset(0))
    throw AgentError(fmt::format(
        "--transparent serves reads of an HDF5 dataset whose samples lie in the file as raw "
        "bytes (contiguous, or unfiltered chunks of whole samples); {} is not one (compressed "
        "datasets and solar-stored are not served transparently: use solar's loader, or "
        "rewrite the dataset with `h5repack -l CONTI`)",
        source_->describe()));
  struct stat st {};
  if (::stat(h5->path().c_str(), &st) != 0 || storage::file_identity(st) != h5->identity())
    throw AgentError(fmt::format("{}: the file changed while the agent opened it; start again",
                                 h5->path()));
  auto* x = reinterpret_cast<solar_xindex*>(base_ + index_offset);
  const std::uint64_t N = header_.config.samples;
  x->samples = N;
  x->sample_bytes = sample_bytes_;
  x->slot_bytes = slot_bytes_;
  x->data_offset = h5->raw_offset().value_or(0);
  x->file_dev = st.st_dev;
  x->file_ino = st.st_ino;
  x->file_size = static_cast<std::uint64_t>(st.st_size);
  x->file_mtime_sec = st.st_mtim.tv_sec;
  x->file_mtime_nsec = st.st_mtim.tv_nsec;
  x->entries_offset = index_offset + sizeof(solar_xindex);
  x->consumed_offset = x->entries_offset + N * sizeof(std::uint64_t);
  x->extents_offset = x->consumed_offset + (N * 4 + 7) / 8 * 8;
  x->extents = 0;
  if (!h5->raw_offset()) {  // chunked: where each sample is, sorted by file offset
    auto* ext = reinterpret_cast<solar_xextent*>(base_ + x->extents_offset);
    for (std::uint64_t i = 0; i < N; ++i) ext[i] = {*h5->sample_offset(i), i};
    std::sort(ext, ext + N, [](const solar_xextent& a, const solar_xextent& b) {
      return a.offset < b.offset;
    });
    x->extents = N;
  }
  xentries_ = reinterpret_cast<std::uint64_t*>(base_ + x->entries_offset);
  xconsumed_ = reinterpret_cast<std::uint32_t*>(base_ + x->consumed_offset);
  std::atomic_ref<std::uint64_t>(x->magic).store(SOLAR_XINDEX_MAGIC, std::memory_order_release);
  xindex_ = x;
  // need_[i]: how many times access i's sample has been used on this node up to and including
  // access i, in plan order; once its consumed counter reaches that, access i has happened.
  std::vector<std::uint32_t> count(N, 0);
  need_.resize(plan_.accesses.size());
  for (std::size_t i = 0; i < plan_.accesses.size(); ++i)
    need_[i] = ++count[plan_.accesses[i] & kSampleMask];
}

void Agent::Impl::publish_locked(std::uint32_t sample, std::uint32_t slot) {
  const std::uint64_t e = (++xgen_ << 32) | (std::uint64_t{slot} + 1);
  std::atomic_ref<std::uint64_t>(xentries_[sample]).store(e, std::memory_order_release);
}

void Agent::Impl::unpublish_locked(std::uint32_t sample) {
  if (xentries_)
    std::atomic_ref<std::uint64_t>(xentries_[sample]).store(0, std::memory_order_release);
}

// Unmodified ranks send no requests: a rank's step counts as done (its uses are dropped, so
// the plan's evictions may proceed) once every sample of its batch has been read as often as
// the plan says it will have been by then. A script that reads another order never completes
// a step: the agent then keeps what it has and the reads it misses go to the file.
void Agent::Impl::pace_loop() {
  for (;;) {
    {
      std::lock_guard lk(mu_);
      if (stopping_ || !fatal_.empty()) return;
      std::uint64_t least = T_;
      for (std::uint32_t r = 0; r < R_; ++r) {
        RankState& rs = ranks_[r];
        while (rs.released < admitted_) {
          const std::uint64_t at = plan_.rank_offsets[rs.released * R_ + r];
          const auto acc = accesses(rs.released, r);
          bool done = true;
          for (std::size_t k = 0; k < acc.size() && done; ++k)
            done = std::atomic_ref<std::uint32_t>(xconsumed_[acc[k] & kSampleMask])
                       .load(std::memory_order_relaxed) >= need_[at + k];
          if (!done) break;
          for (std::uint32_t a : acc) drop_use_locked(a & kSampleMask);
          rs.cursor = ++rs.released;
        }
        least = std::min(least, rs.released);
      }
      paced_steps_ = least;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Agent::Impl::fail(const std::string& what) {
  spdlog::error("prefetch failed: {}", what);
  {
    std::lock_guard lk(mu_);
    if (!fatal_.empty()) return;
    fatal_ = what;
    exit_code_ = 1;
  }
  slot_freed_.notify_all();
  job_ready_.notify_all();
  asio::post(io_, [this] { shutdown_io(); });
}

void Agent::Impl::complete_steps_locked() {
  const std::uint64_t before = ready_;
  while (ready_ < admitted_ && outstanding_[ready_] == 0) ++ready_;
  if (ready_ != before) schedule_assembly_locked();
}

// A rank's next batch is copied into its ring once its step is read and the ring entry it
// reuses (step − depth) has been released; one copy per rank in flight, by the reader pool.
void Agent::Impl::schedule_assembly_locked(bool on_io) {
  if (ring_depth_ == 0) {  // zero copy: a ready step is servable as it is
    if (!on_io) post_serve();
    return;
  }
  bool queued = false, copied = false;
  for (bool again = true; again;) {
    again = false;
    for (std::uint32_t r = 0; r < R_; ++r) {
      RankState& rs = ranks_[r];
      if (rs.gone || rs.assembling || rs.assembled >= T_ || rs.assembled >= ready_ ||
          rs.assembled >= rs.released + ring_depth_)
        continue;
      if (inline_copy_) {  // small batches: a thread hop would cost more than the copy
        copy_batch(rs.assembled, r, batch_slots_locked(rs.assembled, r));
        finish_assembly_locked(rs.assembled, r);
        copied = again = true;
        continue;
      }
      rs.assembling = true;
      ReadJob job;
      job.step = rs.assembled;
      job.assemble_rank = static_cast<int>(r);
      jobs_.push_front(std::move(job));  // before reads of later steps: ranks wait on it
      queued = true;
    }
  }
  if (queued) job_ready_.notify_all();
  if (copied && on_io) serve_waiting_locked();
  else if (copied) post_serve();
}

// Serves waiting ranks from the io thread (sessions are only touched there).
void Agent::Impl::post_serve() {
  asio::post(io_, [this] {
    std::lock_guard lk(mu_);
    serve_waiting_locked();
  });
}

// Where rank r's batch of step t is in the cache (the step's uses pin those slots).
std::vector<std::uint32_t> Agent::Impl::batch_slots_locked(std::uint64_t t,
                                                            std::uint32_t r) const {
  const auto acc = accesses(t, r);
  std::vector<std::uint32_t> from(acc.size());
  for (std::size_t i = 0; i < acc.size(); ++i) from[i] = slot_of_.at(acc[i] & kSampleMask);
  return from;
}

void Agent::Impl::copy_batch(std::uint64_t t, std::uint32_t r,
                             const std::vector<std::uint32_t>& from) {
  for (std::size_t i = 0; i < from.size(); ++i)
    std::memcpy(slot_ptr(ring_slot(r, t, i)), slot_ptr(from[i]), slot_bytes_);
}

void Agent::Impl::finish_assembly_locked(std::uint64_t t, std::uint32_t r) {
  RankState& rs = ranks_[r];
  for (std::uint32_t a : accesses(t, r)) drop_use_locked(a & kSampleMask);
  rs.assembling = false;
  if (!rs.gone) rs.assembled = t + 1;
}

void Agent::Impl::assemble(std::uint64_t t, std::uint32_t r) {
  std::vector<std::uint32_t> from;
  {
    std::lock_guard lk(mu_);
    from = batch_slots_locked(t, r);
  }
  copy_batch(t, r, from);  // unlocked: neither the cache slots nor the ring entry can change
  std::lock_guard lk(mu_);
  finish_assembly_locked(t, r);
  schedule_assembly_locked();
  post_serve();
}

void Agent::Impl::write_slot(std::uint32_t slot, struct iovec* iov, int n) {
  off_t at = static_cast<off_t>(std::uint64_t{slot} * slot_bytes_);
  while (n > 0) {
    const ssize_t w = ::pwritev(memfd_, iov, n, at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw std::runtime_error(fmt::format("writing slot {} of the buffer: {}", slot,
                                                     std::strerror(w < 0 ? errno : ENOSPC)));
    at += w;
    auto left = static_cast<std::size_t>(w);
    while (n > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --n;
    }
    if (n > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
}

void Agent::Impl::reader_loop() {
  // Grown, never zero-filled: a std::vector would clear every byte it grows by.
  struct Scratch {
    std::unique_ptr<std::byte[]> p;
    std::size_t cap = 0;
    std::byte* get(std::size_t n) {
      if (n > cap) {
        p = std::make_unique_for_overwrite<std::byte[]>(n);
        cap = n;
      }
      return p.get();
    }
  } staging_buf, label_buf;
  for (;;) {
    ReadJob job;
    {
      std::unique_lock lk(mu_);
      job_ready_.wait(lk, [&] { return stopping_ || !fatal_.empty() || !jobs_.empty(); });
      if (stopping_ || !fatal_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    try {
      if (job.assemble_rank >= 0) {
        assemble(job.step, static_cast<std::uint32_t>(job.assemble_rank));
        continue;
      }
      const std::size_t n = job.slots.size();
      const auto t0 = Clock::now();
      std::byte* staging = staging_buf.get(n * sample_bytes_);
      std::byte* label_staging = label_buf.get(n * label_bytes_);
      source_->read(job.runs, staging);
      if (label_bytes_) source_->read_labels(job.runs, label_staging);
      // Into the slots through the memfd: the kernel fills its pages directly, without a page
      // fault per 4 KiB of a mapping touched for the first time.
      for (std::size_t i = 0; i < n; ++i) {
        struct iovec iov[2] = {{staging + i * sample_bytes_, sample_bytes_},
                               {label_staging + i * label_bytes_, label_bytes_}};
        write_slot(job.slots[i], iov, label_bytes_ ? 2 : 1);
      }
      const double secs = seconds_since(t0);
      std::lock_guard lk(mu_);
      if (xindex_) {  // the bytes are in place: readers may copy them from now on
        std::size_t i = 0;
        for (const auto& run : job.runs)
          for (std::uint64_t x = run.first; x < run.first + run.count; ++x, ++i)
            publish_locked(static_cast<std::uint32_t>(x), job.slots[i]);
      }
      read_seconds_ += secs;
      reads_ += job.runs.size();
      bytes_read_ += job.slots.size() * sample_bytes_;
      for (const auto& run : job.runs)  // read: the read pins go (see prefetch_loop)
        for (std::uint64_t x = run.first; x < run.first + run.count; ++x)
          drop_use_locked(static_cast<std::uint32_t>(x));
      if (--outstanding_[job.step] == 0) complete_steps_locked();
    } catch (const std::exception& e) {
      fail(e.what());
      return;
    }
  }
}

// ---- control server ------------------------------------------------------------------------

void Agent::Impl::accept() {
  auto s = std::make_shared<Session>(io_);
  acceptor_.async_accept(s->sock, [this, s](const boost::system::error_code& ec) {
    if (ec) return;  // closed
    struct ucred cred {};
    socklen_t len = sizeof cred;
    if (::getsockopt(s->sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        cred.uid != ::geteuid()) {
      spdlog::warn("refused a connection from uid {} pid {} (only uid {} may attach)", cred.uid,
                   cred.pid, ::geteuid());
      boost::system::error_code ignored;
      s->sock.close(ignored);
    } else {
      read_more(s);
    }
    accept();
  });
}

// Reads whatever has arrived and handles every complete frame in it: a rank's release and next
// requests, sent together, cost one read.
void Agent::Impl::read_more(const std::shared_ptr<Session>& s) {
  std::size_t need = s->have + 4096;
  if (s->have >= sizeof(protocol::Header)) {
    protocol::Header h;
    std::memcpy(&h, s->in.data(), sizeof h);
    if (protocol::acceptable(h)) need = std::max(need, sizeof h + h.length);
  }
  if (s->in.size() < need) s->in.resize(std::max(need, s->in.size() * 2));
  s->sock.async_read_some(
      asio::buffer(s->in.data() + s->have, s->in.size() - s->have),
      [this, s](const boost::system::error_code& e, std::size_t n) {
        if (e) return detach(s);
        s->have += n;
        std::size_t off = 0;
        while (!s->closed && s->have - off >= sizeof(protocol::Header)) {
          protocol::Header h;
          std::memcpy(&h, s->in.data() + off, sizeof h);
          if (!protocol::acceptable(h)) {
            spdlog::warn("malformed message (magic {:#x}, version {}, length {}): closing",
                         h.magic, h.version, h.length);
            return detach(s);
          }
          if (s->have - off < sizeof h + h.length) break;
          s->payload.assign(s->in.begin() + static_cast<std::ptrdiff_t>(off + sizeof h),
                            s->in.begin() + static_cast<std::ptrdiff_t>(off + sizeof h + h.length));
          off += sizeof h + h.length;
          on_message(s, static_cast<protocol::Op>(h.op), s->payload);
        }
        if (s->closed) return;
        std::memmove(s->in.data(), s->in.data() + off, s->have - off);
        s->have -= off;
        read_more(s);
      });
}

namespace {
std::vector<std::uint8_t> frame(protocol::Op op, const void* body, std::size_t n) {
  std::vector<std::uint8_t> out(sizeof(protocol::Header) + n);
  protocol::put_frame(out.data(), op, body, n);
  return out;
}

template <class T>
bool parse(const std::vector<std::uint8_t>& p, T& out) {
  if (p.size() != sizeof(T)) return false;
  std::memcpy(&out, p.data(), sizeof(T));
  return true;
}
}  // namespace


void Agent::Impl::on_message(const std::shared_ptr<Session>& s, protocol::Op op,
                             const std::vector<std::uint8_t>& payload) {
  auto refuse = [&](const std::string& why) {
    spdlog::warn("rank {}: {}", s->rank, why);
    send(s, frame(protocol::Op::error, why.data(), why.size()));
  };
  switch (op) {
    case protocol::Op::hello:
      return on_hello(s, payload);
    case protocol::Op::xhello:
      return on_xhello(s, payload);
    case protocol::Op::next: {
      protocol::Next n;
      if (!parse(payload, n) || s->rank < 0) return refuse("next before hello, or malformed");
      std::lock_guard lk(mu_);
      RankState& rs = ranks_[static_cast<std::size_t>(s->rank)];
      if (n.step != rs.cursor)
        return refuse(fmt::format("asked for step {} but its next step is {}", n.step, rs.cursor));
      if (rs.cursor >= T_) {
        send(s, frame(protocol::Op::end, nullptr, 0));
        return;
      }
      rs.waiting = true;
      rs.wait_since = Clock::now();
      serve_waiting_locked();
      return;
    }
    case protocol::Op::release: {
      protocol::Release rl;
      if (!parse(payload, rl) || s->rank < 0) return refuse("release before hello, or malformed");
      std::lock_guard lk(mu_);
      RankState& rs = ranks_[static_cast<std::size_t>(s->rank)];
      if (rl.step != rs.released || rl.step >= rs.cursor)
        return refuse(fmt::format("release of step {} out of order (next to release: {}, handed "
                                  "out: {})",
                                  rl.step, rs.released, rs.cursor));
      if (ring_depth_ == 0)  // zero copy: the rank no longer reads those cache slots
        for (std::uint32_t a : accesses(rl.step, static_cast<std::uint32_t>(s->rank)))
          drop_use_locked(a & kSampleMask);
      ++rs.released;  // its ring entry can take a later batch
      schedule_assembly_locked(true);
      return;
    }
    case protocol::Op::stats: {
      const std::string j = stats_json();
      send(s, frame(protocol::Op::stats_reply, j.data(), j.size()));
      return;
    }
    case protocol::Op::shutdown:
      spdlog::info("shutdown requested");
      asio::post(io_, [this] { shutdown_io(); });
      return;
    default:
      spdlog::warn("unknown op {}: closing the connection", static_cast<unsigned>(op));
      detach(s);
  }
}

void Agent::Impl::on_hello(const std::shared_ptr<Session>& s,
                           const std::vector<std::uint8_t>& payload) {
  protocol::Hello h;
  auto refuse = [&](const std::string& why) {
    spdlog::warn("hello refused: {}", why);
    send(s, frame(protocol::Op::error, why.data(), why.size()));
  };
  if (!parse(payload, h)) return refuse("malformed hello");
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
  protocol::HelloOk ok;
  ok.node = opt_.node;
  ok.ranks_per_node = R_;
  ok.samples = header_.config.samples;
  ok.sample_bytes = sample_bytes_;
  ok.label_bytes = label_bytes_;
  ok.slot_bytes = slot_bytes_;
  ok.slots = slots_;
  ok.total_steps = T_;
  ok.steps_per_epoch = header_.layout.steps;
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
    spdlog::warn("interposer refused: {}", why);
    send(s, frame(protocol::Op::error, why.data(), why.size()));
  };
  if (!parse(payload, h)) return refuse("malformed hello");
  if (!xindex_)
    return refuse("this agent serves batches, not file reads (start it with --transparent)");
  static_assert(static_cast<int>(protocol::Op::xhello) == SOLAR_OP_XHELLO &&
                static_cast<int>(protocol::Op::xhello_ok) == SOLAR_OP_XHELLO_OK);
  const solar_xhello_ok ok{
      map_bytes_, static_cast<std::uint64_t>(reinterpret_cast<std::byte*>(xindex_) - base_)};
  if (!send_with_buffer_fd(s, frame(protocol::Op::xhello_ok, &ok, sizeof ok)))
    return detach(s);
  spdlog::debug("interposer attached (pid {})", h.pid);
}

// The buffer's fd travels with the reply (SCM_RIGHTS); written synchronously, before any queued
// message, since it is the session's first.
bool Agent::Impl::send_with_buffer_fd(const std::shared_ptr<Session>& s,
                                      const std::vector<std::uint8_t>& msg) {
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
  s->sock.non_blocking(false);
  const ssize_t n = ::sendmsg(s->sock.native_handle(), &mh, MSG_NOSIGNAL);
  s->sock.non_blocking(true);
  return n == static_cast<ssize_t>(msg.size());
}

void Agent::Impl::send_batch_locked(RankState& rs, std::uint32_t r) {
  const std::uint64_t t = rs.cursor;
  const auto acc = accesses(t, r);
  // The reply: header, BatchHead, then one BatchEntry per sample, built in place.
  constexpr std::size_t kHead = sizeof(protocol::Header) + sizeof(protocol::BatchHead);
  std::vector<std::uint8_t> msg(kHead + acc.size() * sizeof(protocol::BatchEntry));
  protocol::BatchHead bh;
  bh.step = t;
  bh.count = static_cast<std::uint32_t>(acc.size());
  const std::size_t at =
      protocol::put_header(msg.data(), protocol::Op::batch, msg.size() - sizeof(protocol::Header));
  std::memcpy(msg.data() + at, &bh, sizeof bh);
  for (std::size_t i = 0; i < acc.size(); ++i) {
    const std::uint32_t x = acc[i] & kSampleMask;
    const protocol::BatchEntry e{x, ring_depth_ ? ring_slot(r, t, i) : slot_of_.at(x)};
    std::memcpy(msg.data() + kHead + i * sizeof e, &e, sizeof e);
  }
  send(rs.session, std::move(msg));
  rs.stall_seconds += seconds_since(rs.wait_since);
  rs.waiting = false;
  ++rs.cursor;
}

void Agent::Impl::serve_waiting_locked() {
  for (std::uint32_t r = 0; r < R_; ++r) {
    RankState& rs = ranks_[r];
    if (rs.waiting && rs.session && rs.cursor < (ring_depth_ ? rs.assembled : ready_))
      send_batch_locked(rs, r);
  }
}

void Agent::Impl::detach(const std::shared_ptr<Session>& s) {
  if (s->closed) return;
  s->closed = true;
  boost::system::error_code ec;
  s->sock.close(ec);
  if (s->rank < 0) return;
  std::lock_guard lk(mu_);
  RankState& rs = ranks_[static_cast<std::size_t>(s->rank)];
  // Its cache slots are reclaimed: every admitted use not yet copied to its ring is dropped
  // (a copy in flight drops its own).
  const std::uint64_t from =
      ring_depth_ ? rs.assembled + (rs.assembling ? 1 : 0) : rs.released;
  for (std::uint64_t t = from; t < admitted_; ++t)
    for (std::uint32_t a : accesses(t, static_cast<std::uint32_t>(s->rank)))
      drop_use_locked(a & kSampleMask);
  rs.gone = true;
  rs.session.reset();
  rs.waiting = false;
  if (rs.cursor < T_)
    spdlog::warn("local rank {} left at step {} of {}; its slots are reclaimed", s->rank,
                 rs.cursor, T_);
  else
    spdlog::info("local rank {} finished", s->rank);
}

void Agent::Impl::send(const std::shared_ptr<Session>& s, std::vector<std::uint8_t> msg) {
  const bool idle = s->out.empty();
  s->out.push_back(std::move(msg));
  if (!idle || s->closed) return;
  auto pump = std::make_shared<std::function<void()>>();
  *pump = [s, pump] {
    asio::async_write(s->sock, asio::buffer(s->out.front()),
                      [s, pump](const boost::system::error_code& ec, std::size_t) {
                        if (ec) {
                          s->out.clear();
                          return;
                        }
                        s->out.pop_front();
                        if (!s->out.empty()) (*pump)();
                      });
  };
  (*pump)();
}

nlohmann::json Agent::Impl::transparent_json() const {
  auto get = [](const std::uint64_t& v) {
    return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(v)).load(std::memory_order_relaxed);
  };
  const solar_xstats& x = xindex_->stats;
  return {{"hit_reads", get(x.hit_reads)},   {"hit_bytes", get(x.hit_bytes)},
          {"miss_reads", get(x.miss_reads)}, {"miss_bytes", get(x.miss_bytes)},
          {"torn", get(x.torn)},             {"attached", get(x.attached)},
          {"consumed_steps", paced_steps_}};
}

std::string Agent::Impl::stats_json() {
  std::lock_guard lk(mu_);
  nlohmann::json ranks = nlohmann::json::array();
  std::uint64_t min_cursor = T_;
  for (std::uint32_t r = 0; r < R_; ++r) {
    const RankState& rs = ranks_[r];
    ranks.push_back({{"local_rank", r},
                     {"attached", rs.attached && !rs.gone},
                     {"step", rs.cursor},
                     {"released", rs.released},
                     {"stall_seconds", rs.stall_seconds}});
    if (!rs.gone) min_cursor = std::min(min_cursor, rs.cursor);
  }
  const nlohmann::json j = {
      {"node", opt_.node},
      {"total_steps", T_},
      {"steps_per_epoch", header_.layout.steps},
      {"epochs", header_.config.epochs},
      {"ready_steps", ready_},
      {"ahead_steps", static_cast<std::int64_t>(ready_) - static_cast<std::int64_t>(min_cursor)},
      {"hits", hits_},
      {"fetched_samples", fetched_},
      {"bytes_read", bytes_read_},
      {"storage_reads", reads_},
      {"read_seconds", read_seconds_},
      {"slot_wait_seconds", slot_wait_seconds_},
      {"slots", slots_},
      {"cache_slots", cache_slots_},
      {"free_slots", free_.size()},
      {"uptime_seconds", seconds_since(started_)},
      {"error", fatal_},
      {"transparent", xindex_ ? transparent_json() : nlohmann::json()},
      {"ranks", ranks}};
  return j.dump();
}

Agent::Agent(const AgentOptions& options) : impl_(std::make_unique<Impl>(options)) {}
Agent::~Agent() = default;
int Agent::run() { return impl_->run(); }
void Agent::stop() { impl_->stop(); }

}  // namespace solar::agent

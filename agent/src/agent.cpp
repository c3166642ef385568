// SPDX-License-Identifier: Apache-2.0
// Start-up (plan part, source, buffer, socket), run and stop; the parts are in the files
// agent_impl.h lists.
#include "agent.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>

#include "agent_impl.h"
#include "solar/core/extents.h"
#include "solar/core/plan_stream.h"
#include "solar/storage/dataset_files.h"
#include "solar/sys/meminfo.h"
#include "solar/unix_socket.h"

namespace solar::agent {

namespace {

const char* what_is(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a folder";
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  return "something else";
}

// --socket: the path must be free, or hold the stale socket of a crashed agent (a socket file of
// this user on which nobody answers), which is removed. Anything else stops the agent and is left
// as it is: a file, a folder, a link, another user's socket, a socket another agent serves.
void prepare_socket_path(const std::string& path) {
  if (path.empty() || path.size() > protocol::max_unix_path())
    throw AgentError(fmt::format("--socket {}: a Unix socket path has 1 to {} bytes, this one {}",
                                 path, protocol::max_unix_path(), path.size()));
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw AgentError(fmt::format("--socket {}: {}", path, std::strerror(errno)));
  }
  if (!S_ISSOCK(st.st_mode))
    throw AgentError(fmt::format("--socket {}: {} is there; the agent only replaces a stale "
                                 "socket: remove it or choose another path",
                                 path, what_is(st.st_mode)));
  if (st.st_uid != ::geteuid())
    throw AgentError(fmt::format("--socket {}: a socket of uid {} is there, not this user's; "
                                 "left as it is: choose another path",
                                 path, st.st_uid));
  // Does anyone answer? Without blocking: a listener whose backlog is full answers EAGAIN.
  const protocol::UnixConnection conn = protocol::connect_unix(path, {.nonblocking = true});
  if (conn.failed == protocol::UnixConnection::Failed::socket)
    throw AgentError(fmt::format("socket: {}", std::strerror(conn.error)));
  if (conn) ::close(conn.fd);
  const int err = conn.error;
  if (err == 0 || err == EAGAIN || err == EINPROGRESS)
    throw AgentError(fmt::format("{}: another agent is serving this socket", path));
  if (err != ECONNREFUSED)
    throw AgentError(fmt::format("--socket {}: cannot tell whether this socket is in use ({}); "
                                 "left as it is",
                                 path, std::strerror(err)));
  if (::unlink(path.c_str()) != 0)
    throw AgentError(fmt::format("--socket {}: removing the stale socket: {}", path,
                                 std::strerror(errno)));
  spdlog::warn("removed stale socket {} (nobody answered on it)", path);
}

}  // namespace

Agent::Impl::Impl(const AgentOptions& o) : opt_(o) {
  const auto started = Clock::now();
  check_stats_out(o.stats_out);  // now, not at exit
  prepare_socket_path(o.socket);  // before anything is allocated
  // Plan: the header and this node's section (with --peer-dir, peers_.setup reads what the
  // other nodes read from this one in their sections too).
  PlanFile pf = [&] {
    try {
      return PlanFile::open(o.plan);
    } catch (const PlanFileError& e) {
      throw AgentError(e.what());
    }
  }();
  header_ = pf.header();
  const bool sized = header_.config.sized();
  // Batch mode over samples of differing sizes (whole files): the ranks read each sample in
  // its own extent of the cache (zero copy): a ring's slots would all have to be of the largest.
  const bool zero_copy = o.zero_copy || (sized && !o.transparent);
  if (sized && !o.peer_dir.empty())
    throw AgentError(fmt::format("the plan {} is of samples of differing sizes, which agents do "
                                 "not share between nodes yet; drop --peer-dir",
                                 o.plan));
  if (o.max_buffer && header_.config.buffer_bytes > o.max_buffer)
    throw AgentError(fmt::format(
        "the plan {} buffers {} per node, above this agent's limit of {} (--max-buffer, the "
        "site's max_buffer=): it is not the plan that was checked at the step's start",
        o.plan, format_bytes(header_.config.buffer_bytes), format_bytes(o.max_buffer)));
  if (o.node >= header_.config.nodes)
    throw AgentError(fmt::format("--node {}: the plan {} has nodes 0..{}", o.node, o.plan,
                                 header_.config.nodes - 1));
  // A streamed plan is computed here a window of steps ahead (plan_steps.h), unless the agent
  // needs the node's whole schedule up front: the extents of samples of differing sizes, and
  // what peers read from this node.
  try {
    if (header_.streamed && !sized && o.peer_dir.empty()) {
      steps_.open_streamed(header_.config, o.node);
    } else if (header_.streamed) {  // with what the other nodes read from this one, one pass
      std::vector<std::vector<PeerFetch>> served;
      NodePlan np = collect_node_plan(header_.config, o.node, &served);
      steps_.open_whole(std::move(np), header_.config.ranks_per_node, header_.config.samples,
                        std::move(served));
    } else {
      steps_.open_whole(pf.node(o.node), header_.config.ranks_per_node, header_.config.samples);
    }
  } catch (const PlanFileError& e) {
    throw AgentError(e.what());
  } catch (const ConfigError& e) {
    throw AgentError(fmt::format("the plan {}: {}", o.plan, e.what()));
  }
  if (header_.streamed)
    spdlog::info("node {}: the plan is streamed: {}", o.node,
                 steps_.streamed() ? "its steps are computed here as the run goes"
                                   : "its whole share is computed here first (samples of "
                                     "differing sizes or peer sharing need it)");
  R_ = header_.config.ranks_per_node;
  T_ = std::uint64_t{header_.layout.steps} * header_.config.epochs;
  if (o.start_step > T_)
    throw AgentError(fmt::format("--start-step {} is beyond the end of the plan {} ({} steps: {} "
                                 "epoch{} of {})",
                                 o.start_step, o.plan, T_, header_.config.epochs,
                                 header_.config.epochs == 1 ? "" : "s", header_.layout.steps));
  if (o.order_unknown && !o.transparent)
    throw AgentError("--order-unknown is for unmodified ranks, whose order the agent cannot "
                     "ask: add --transparent (libsolar's ranks read the plan's order)");
  if (o.start_step > 0 && o.transparent)
    throw AgentError(fmt::format("--start-step {}: an unmodified script (--transparent) reads "
                                 "its own order from its first step; resuming it is not "
                                 "supported",
                                 o.start_step));
  start_ = o.start_step;
  NodeStats::Config sc;
  sc.node = o.node;
  sc.mode = o.transparent ? "transparent" : zero_copy ? "zero_copy" : "ring";
  sc.epochs = header_.config.epochs;
  sc.steps_per_epoch = header_.layout.steps;
  sc.ranks = R_;
  sc.total_steps = T_;
  sc.sample_bytes = header_.config.sample_bytes;
  sc.start_step = start_;
  stats_ = NodeStats(sc, started);
  stats_.mark(NodeStats::Stage::plan_read);

  // Source: must match the plan.
  storage::SourceOptions so;
  so.io_threads = o.io_threads;
  so.label_dataset = o.labels;
  so.direct = o.direct_io;
  so.read_gap = o.read_gap;
  so.expect_identity = header_.dataset_identity;
  so.index_path = o.dataset_index;
  // Unmodified ranks read whatever the path holds (the interposer serves only the file the
  // agent holds); batch ranks depend on this agent, which stops when the path changes.
  so.check_path = !o.transparent;
  source_options_ = so;
  try {
    source_ = storage::open_source(o.dataset, so);
  } catch (const std::exception& e) {
    throw AgentError(e.what());
  }
  const auto& info = source_->info();
  // Transparent over filtered chunks: slots hold each sample's bytes as stored (the program
  // decodes them), and the plan counts slots of the longest. Whole files are read so in batch
  // mode too: a sample is its file's bytes (the rank's transform decodes them).
  const std::uint64_t stored =
      o.transparent || info.whole_files ? storage::stored_sample_bytes(*source_) : 0;
  stored_mode_ = stored > 0;
  const std::uint64_t slot_sample = stored_mode_ ? stored : info.sample_bytes;
  if (sized) {
    // Each sample's bytes as stored, as the plan counted them (rounded up to 64).
    const std::vector<std::uint64_t> sizes = storage::stored_sample_sizes(*source_);
    const std::vector<std::uint64_t>& planned = *header_.config.sample_sizes;
    const std::size_t differ = first_size_unlike_planned(sizes, planned);
    if (sizes.empty())
      throw AgentError(fmt::format("the plan {} is of samples of differing sizes as stored, but "
                                   "{} holds samples of one size; recompute the plan for this "
                                   "dataset",
                                   o.plan, source_->describe()));
    if (sizes.size() != planned.size() || differ != sizes.size())
      throw AgentError(fmt::format(
          "{} has {} samples{} but the plan {} was computed for {} samples{}; recompute the "
          "plan for this dataset",
          source_->describe(), info.samples,
          differ < sizes.size() ? fmt::format(", sample {} of {} bytes as stored", differ,
                                              sizes[differ])
                                : std::string(),
          o.plan, header_.config.samples,
          differ < planned.size() ? fmt::format(", sample {} of {} bytes", differ, planned[differ])
                                  : std::string()));
  } else if (info.samples != header_.config.samples ||
             slot_sample != header_.config.sample_bytes)
    throw AgentError(fmt::format(
        "{} has {} samples of {} bytes{} but the plan {} was computed for {} samples of {} "
        "bytes; recompute the plan for this dataset",
        source_->describe(), info.samples, slot_sample,
        !stored_mode_      ? ""
        : info.whole_files ? " (whole files)"
                           : " as stored (filtered chunks, served as they are)",
        o.plan,
        header_.config.samples, header_.config.sample_bytes));
  sample_bytes_ = slot_sample;
  // Sized: the transparent mode serves samples only (a script reads its labels itself).
  label_bytes_ = info.has_labels && !sized ? info.label_bytes : 0;
  read_all_labels();
  stats_.mark(NodeStats::Stage::source_opened);

  // Buffer: the plan's resident set, then the ranks' rings (see buffer_layout.cpp).
  if (!zero_copy && o.staging_steps == 0)
    throw AgentError("--staging-steps must be at least 1 (batches in each rank's ring)");
  BufferOptions bo;
  bo.staging_steps = o.staging_steps;
  bo.zero_copy = zero_copy;
  bo.transparent = o.transparent;
  bo.peers = !o.peer_dir.empty();
  bo.page_bytes = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  if (o.transparent) count_file_tables(*source_, bo);
  // Sized: the arena this node's schedule needs as extents (fragmentation, with the best fit
  // the slot table allocates with; agent/README.md "The buffer").
  if (sized) bo.arena_bytes = arena_for_node(steps_.whole().schedule, header_.config, T_, ExtentFit::best);
  arena_bytes_ = bo.arena_bytes;
  buf_ = buffer_layout(header_.config, label_bytes_, bo);
  const std::uint64_t bytes = buf_.map_bytes;
  const std::uint64_t avail = sys::mem_available_bytes();
  if (bytes > avail)
    throw AgentError(fmt::format("the buffer needs {} ({} slots of {}) but only {} of memory is "
                                 "available; plan with a smaller --buffer",
                                 format_bytes(bytes), buf_.slots, format_bytes(buf_.slot_bytes),
                                 format_bytes(avail)));
  if (buf_.slots > 0xffffffffULL)
    throw AgentError(fmt::format("the buffer would have {} slots; at most 2^32 are supported: "
                                 "plan with a smaller --buffer",
                                 buf_.slots));
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
  if (sized) {
    std::vector<std::uint32_t> units(header_.config.samples);
    for (std::size_t x = 0; x < units.size(); ++x)
      units[x] = static_cast<std::uint32_t>((*header_.config.sample_sizes)[x] / 64);
    table_ = SlotTable(buf_.cache_slots, std::move(units));
  } else {
    table_ = SlotTable(buf_.cache_slots, header_.config.samples);
  }
  local_.setup(o.local_dir);
  if (o.transparent) pacer_.setup();
  else if (bo.peers)  // the entries only: other agents look samples up there (peer_sharing.cpp)
    table_.attach_index(reinterpret_cast<std::uint64_t*>(base_ + buf_.entries_offset));
  ranks_.resize(R_);
  for (RankState& rs : ranks_) rs.cursor = rs.asked = rs.released = rs.assembled = start_;
  admitted_ = ready_ = start_;
  populate_rings();
  prefetch_.prepare(opt_.readers);
  stats_.mark(NodeStats::Stage::buffer_ready);

  // Socket: private to this user (its path was checked above).
  control_.listen(o.socket);
  stats_.mark(NodeStats::Stage::listening);
  if (bo.peers) peers_.setup(pf);
  control_.keep_reserve_fd();
  if (start_ > 0)
    spdlog::info("node {}: starting at step {} (epoch {}, step {} of it): steps before it are "
                 "not read or served",
                 o.node, start_, start_ / header_.layout.steps, start_ % header_.layout.steps);
  if (sized)
    spdlog::info("node {}: {} steps, buffer {} for samples of differing sizes: the plan's {} "
                 "as extents in {} ({:.3f}x: fragmentation), {} of staging, index {}; source {}",
                 o.node, T_, format_bytes(bytes), format_bytes(header_.config.buffer_bytes),
                 format_bytes(bo.arena_bytes),
                 static_cast<double>(bo.arena_bytes) /
                     static_cast<double>(std::max<std::uint64_t>(1, header_.config.buffer_bytes)),
                 format_bytes(sized_staging_bytes(header_.config)),
                 format_bytes(bytes - buf_.index_offset), source_->describe());
  else
    spdlog::info("node {}: {} steps, buffer {} slots × {} = {} ({} cache, {} ranks × {} batches "
                 "of {} in rings), source {}",
                 o.node, T_, buf_.slots, format_bytes(buf_.slot_bytes), format_bytes(bytes),
                 buf_.cache_slots, R_, buf_.ring_depth, buf_.ring_batch, source_->describe());
}

// Every label at once, where the labels are one array (a solar-stored export's, one file's
// dataset) of at most 64 MiB: otherwise each read job's labels are a request of their own after
// its samples, one more round trip at the back of the source's queue. Over the demo's emulated
// link (800 MB/s, 1 ms a request) that was 8-20 ms of each 20 ms job, and 80 ms of the first
// step's. A dataset of many files keeps reading them with the samples (each file's labels lie
// in that file: reading them all would open every file at start).
void Agent::Impl::read_all_labels() {
  constexpr std::uint64_t kMaxLabelBytes = 64ULL << 20;
  const std::uint64_t n = source_->info().samples;
  if (label_bytes_ == 0 || n == 0 || n > kMaxLabelBytes / label_bytes_) return;
  if (const storage::DatasetFiles* files = source_->file_set(); files && files->files().size() > 1)
    return;
  labels_.resize(n * label_bytes_);
  const storage::SampleRun all{0, n};
  source_->read_labels({&all, 1}, labels_.data());
}

// The rings are written through the mapping (copy_slots), every step, from the first: their
// pages are made now, before the ranks ask, instead of one page fault per 4 KiB during the first
// steps (the cache slots are written with pwrite, which needs no mapping's pages). Bounded: the
// node's ranks' batches, staging_steps deep. A kernel without MADV_POPULATE_WRITE (before 5.14)
// faults them in as they are first copied, as before.
// Demand mode fills the cache slots through the mapping (Prefetcher::fill_slots): their pages
// made in one call, not a page fault per 4 KiB while the ranks read. The pages the plan wrote
// are there already.
void Agent::Impl::populate_cache_slots() {
  const std::uint64_t to = std::min(buf_.map_bytes, buf_.slot_offset(buf_.cache_slots));
#ifdef MADV_POPULATE_WRITE
  if (to > 0 && ::madvise(base_, to, MADV_POPULATE_WRITE) != 0)
    spdlog::debug("node {}: the cache slots' pages not made ahead ({}): made as first filled",
                  opt_.node, std::strerror(errno));
#else
  (void)to;
#endif
}

void Agent::Impl::populate_rings() {
  if (buf_.ring_depth == 0 || buf_.slots <= buf_.cache_slots) return;
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t from = buf_.slot_offset(buf_.cache_slots) / page * page;
  const std::uint64_t to = std::min(buf_.map_bytes, buf_.slot_offset(buf_.slots));
  if (to <= from) return;
#ifdef MADV_POPULATE_WRITE
  if (::madvise(base_ + from, to - from, MADV_POPULATE_WRITE) != 0)
    spdlog::debug("node {}: the rings' pages not made ahead ({}): made as first copied",
                  opt_.node, std::strerror(errno));
#endif
}

Agent::Impl::~Impl() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  prefetch_.wake_all();
  local_.wake_all();
  prefetch_.join();
  local_.join();
  std::error_code ec;
  std::filesystem::remove(opt_.socket, ec);
  pacer_.join();
  watch_.wake();
  watch_.join();
  peers_.wake_all();
  peers_.join();
  peers_.reset();  // its registrations of the buffer go before the buffer
  if (base_) ::munmap(base_, buf_.map_bytes);
  if (memfd_ >= 0) ::close(memfd_);
}

int Agent::Impl::run() {
  stats_.set_ready();
  local_.start();
  prefetch_.start();
  peers_.start();
  if (opt_.transparent) pacer_.start();
  else watch_.start();
  control_.run();
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  prefetch_.wake_all();
  local_.wake_all();
  watch_.wake();
  peers_.wake_all();
  prefetch_.join();
  local_.join();
  peers_.join();
  pacer_.join();
  watch_.join();
  // Nobody watches the file from now on: ranks still running read it themselves.
  pacer_.withdraw_stopped();
  // The last line of the log: `srun --solar-*` reads each node's final stats from it.
  const nlohmann::json doc = stats_document();
  if (!opt_.stats_out.empty()) write_stats_out(doc);
  spdlog::info("stopped: {}", doc.dump());
  return exit_code_;
}

void Agent::Impl::fail(const std::string& what) {
  {
    std::lock_guard lk(mu_);
    if (fatal_.empty()) spdlog::error("prefetch failed: {}", what);  // the first cause only
    else spdlog::debug("also failed: {}", what);
  }
  // Nobody watches the file once this agent is gone: the interposers stop serving its buffer.
  pacer_.withdraw_failed();
  {
    std::lock_guard lk(mu_);
    if (!fatal_.empty()) return;
    fatal_ = what;
    exit_code_ = 1;
  }
  prefetch_.wake_all();
  local_.wake_all();
  watch_.wake();
  control_.stop();
}

Agent::Agent(const AgentOptions& options) : impl_(std::make_unique<Impl>(options)) {}
Agent::~Agent() = default;
int Agent::run() { return impl_->run(); }
void Agent::stop() { impl_->stop(); }

}  // namespace solar::agent

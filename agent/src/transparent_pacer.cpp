// SPDX-License-Identifier: Apache-2.0
// Transparent mode: the shared sample index the interposer serves reads from (extent mode),
// and eviction paced on the samples unmodified ranks consume. See transparent_pacer.h.
#include "transparent_pacer.h"

#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <thread>

#include "agent_impl.h"
#include "solar/storage/dataset_files.h"

namespace solar::agent {

namespace {
std::uint64_t monotonic_ns() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ULL +
         static_cast<std::uint64_t>(ts.tv_nsec);
}
}  // namespace

// ---- transparent mode ---------------------------------------------------------------------

namespace {
// A chunked file's entries in the extent table: a stored (filtered) chunk, or a raw one, a sample.
std::uint64_t extents_of(const storage::DatasetFile& f) {
  return f.stored() ? f.stored_offsets.size() : f.sample_offsets.size();
}
}  // namespace

void count_file_tables(const storage::SampleSource& source, BufferOptions& o) {
  o.files = o.extents = 0;
  if (const storage::DatasetFiles* set = source.file_set())
    for (const storage::DatasetFile& f : set->files()) {
      ++o.files;
      if (!f.data_offset) o.extents += extents_of(f);
    }
}

void TransparentPacer::setup() {
  const storage::DatasetFiles* set = a_.source_->file_set();
  const auto files = set ? set->files() : std::span<const storage::DatasetFile>{};
  const auto cooked = std::find_if(files.begin(), files.end(), [](const storage::DatasetFile& f) {
    return !f.raw() && !f.stored();
  });
  if (files.empty() || cooked != files.end())
    throw AgentError(fmt::format(
        "--transparent serves reads of HDF5 files whose samples lie in the file as extents of "
        "their own (contiguous, unfiltered chunks of whole samples, or filtered chunks of one "
        "sample: gzip, shuffle, lzf, served as stored); {}{} is not one (chunks of several "
        "compressed samples, and solar-stored, are not served transparently: use solar's "
        "loader, or rewrite the files with `h5repack -l CHUNK=1x...` or `-l CONTI`)",
        a_.source_->describe(),
        cooked != files.end() ? fmt::format(": its file {}", cooked->path) : std::string()));
  if (files.size() != a_.buf_.files)
    throw AgentError(fmt::format("{} has {} files but its buffer was laid out for {}",
                                 a_.source_->describe(), files.size(), a_.buf_.files));
  auto* x = reinterpret_cast<solar_xindex*>(a_.base_ + a_.buf_.index_offset);
  const std::uint64_t N = a_.header_.config.samples;
  x->samples = N;
  // S for the contiguous files' arithmetic; a dataset of filtered chunks only has none.
  const bool some_raw = std::any_of(files.begin(), files.end(),
                                    [](const storage::DatasetFile& f) { return f.raw(); });
  x->sample_bytes = some_raw ? a_.source_->info().sample_bytes : a_.sample_bytes_;
  x->slot_bytes = a_.buf_.slot_bytes;
  // The file table: each file as this agent stats it (the device number is this host's; the
  // rest must be the file the source indexed and checked against the plan), sorted by
  // (dev, ino) for the interposer's lookup at open. 10^5 files: 10^5 stats, once.
  auto* table = reinterpret_cast<solar_xfile*>(a_.base_ + a_.buf_.files_offset);
  auto* ext = reinterpret_cast<solar_xextent*>(a_.base_ + a_.buf_.extents_offset);
  std::uint64_t extents = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const storage::DatasetFile& f = files[i];
    struct stat st {};
    if (::stat(f.path.c_str(), &st) != 0)
      throw AgentError(fmt::format("{} (of {}): {}; a dataset must stay as it was indexed while "
                                   "a job reads it",
                                   f.path, a_.source_->describe(), std::strerror(errno)));
    if (const std::string why = f.differs(st); !why.empty())
      throw AgentError(fmt::format("{} (of {}) is not the file indexed: {}; a dataset must stay "
                                   "as it was indexed while a job reads it",
                                   f.path, a_.source_->describe(), why));
    solar_xfile& t = table[i];
    t = solar_xfile{};
    t.dev = st.st_dev;
    t.ino = st.st_ino;
    t.size = static_cast<std::uint64_t>(st.st_size);
    t.mtime_sec = st.st_mtim.tv_sec;
    t.mtime_nsec = st.st_mtim.tv_nsec;
    t.ctime_sec = st.st_ctim.tv_sec;
    t.ctime_nsec = st.st_ctim.tv_nsec;
    t.first = f.first;
    t.count = f.count;
    if (f.data_offset) {
      t.data_offset = *f.data_offset;
      continue;
    }
    // Chunked: where each sample is, sorted by file offset (chunks lie in any order), with its
    // length: S raw, a filtered chunk's stored bytes.
    const std::uint64_t count = extents_of(f);
    if (extents + count > a_.buf_.extents)
      throw AgentError(fmt::format("{} has more chunk extents than its buffer was laid out for",
                                   a_.source_->describe()));
    t.extents_first = extents;
    t.extents = count;
    for (std::uint64_t k = 0; k < t.extents; ++k) {
      const auto [off, len] = f.stored_extent(k, a_.source_->info().sample_bytes);
      ext[extents + k] = {off, f.first + k, len};
    }
    std::sort(ext + extents, ext + extents + t.extents,
              [](const solar_xextent& a, const solar_xextent& b) { return a.offset < b.offset; });
    extents += t.extents;
  }
  std::sort(table, table + files.size(), [](const solar_xfile& a, const solar_xfile& b) {
    return a.dev != b.dev ? a.dev < b.dev : a.ino < b.ino;
  });
  x->files = files.size();
  x->files_offset = a_.buf_.files_offset;
  x->extents = extents;
  x->extents_offset = a_.buf_.extents_offset;
  // The source checked the files against the plan just now: the first lease (loop renews).
  x->lease_until_ns = monotonic_ns() + SOLAR_XINDEX_LEASE_NS;
  x->entries_offset = a_.buf_.entries_offset;
  x->consumed_offset = a_.buf_.consumed_offset;
  a_.table_.attach_index(reinterpret_cast<std::uint64_t*>(a_.base_ + x->entries_offset));
  xconsumed_ = reinterpret_cast<std::uint32_t*>(a_.base_ + x->consumed_offset);
  std::atomic_ref<std::uint64_t>(x->magic).store(SOLAR_XINDEX_MAGIC, std::memory_order_release);
  xindex_ = x;
  // need(t, r)[k]: how many times the access's sample has been used on this node up to and
  // including it, in plan order; once its consumed counter reaches that, the access has
  // happened.
  a_.stats_.attach_xstats(&x->stats);
  a_.stats_.track_landing();
  a_.steps_.count_uses();
  demand_.setup(xconsumed_, a_.opt_.order_unknown);
}

void TransparentPacer::start() {
  thread_ = std::thread([this] { loop(); });
}

void TransparentPacer::join() {
  if (thread_.joinable()) thread_.join();
}

void TransparentPacer::withdraw_failed() {
  if (!withdraw_if_changed() && xindex_)
    std::atomic_ref<std::uint64_t>(xindex_->withdrawn)
        .store(SOLAR_XINDEX_AGENT_STOPPED, std::memory_order_release);
}

void TransparentPacer::withdraw_stopped() {
  if (xindex_) {
    std::uint64_t none = 0;  // keep a FILE_CHANGED already there
    std::atomic_ref<std::uint64_t>(xindex_->withdrawn)
        .compare_exchange_strong(none, SOLAR_XINDEX_AGENT_STOPPED);
  }
}

bool TransparentPacer::withdraw_if_changed() {
  const storage::DatasetFiles* set = xindex_ ? a_.source_->file_set() : nullptr;
  if (!set) return false;
  if (std::atomic_ref<std::uint64_t>(xindex_->withdrawn).load(std::memory_order_acquire) ==
      SOLAR_XINDEX_FILE_CHANGED)
    return true;
  // Many files: one changed is refused by the interposers' identity check of every read they
  // serve (its ctime moved), and the others keep being served; withdrawing the whole buffer
  // for it would send every rank to storage. One file: it is the whole dataset.
  if (set->files().size() != 1) return false;
  try {
    set->check_file(0, false);
    return false;
  } catch (const storage::StorageError& e) {
    std::atomic_ref<std::uint64_t>(xindex_->withdrawn)
        .store(SOLAR_XINDEX_FILE_CHANGED, std::memory_order_release);
    spdlog::error("{}; the unmodified ranks read the file from now on", e.what());
    return true;
  }
}

// Unmodified ranks send no requests: a rank's step counts as done (its uses are dropped, so
// the plan's evictions may proceed) once every sample of its batch has been read as often as
// the plan says it will have been by then. A script that reads another order never completes
// a step: the agent then keeps what it has and the reads it misses go to the file.
//
// It also keeps the watch's lease (solar_xindex::lease_until_ns): every SOLAR_XINDEX_RENEW_NS
// it checks the file (one file; many are checked by the interposers on every read they serve)
// and, when it is unchanged, vouches for it until SOLAR_XINDEX_LEASE_NS after the moment before
// the check. An agent killed (SIGKILL, the OOM killer) or stopped renews
// nothing, and its readers stop serving within the lease: nobody watches the file then.
void TransparentPacer::loop() {
  std::uint64_t next_check = 0;
  for (;;) {
    if (const std::uint64_t before = monotonic_ns(); before >= next_check) {
      if (withdraw_if_changed()) {  // the file rewritten in place: stop serving its old bytes
        a_.fail("the dataset file changed during the run; the buffer no longer serves it");
        return;
      }
      std::atomic_ref<std::uint64_t>(xindex_->lease_until_ns)
          .store(before + SOLAR_XINDEX_LEASE_NS, std::memory_order_release);
      next_check = before + SOLAR_XINDEX_RENEW_NS;
    }
    {
      std::lock_guard lk(a_.mu_);
      if (a_.stopping_ || !a_.fatal_.empty()) return;
      std::uint64_t least = a_.T_;
      for (std::uint32_t r = 0; r < a_.R_; ++r) {
        RankState& rs = a_.ranks_[r];
        while (rs.released < a_.admitted_) {
          const auto acc = a_.accesses(rs.released, r);
          const auto need = a_.steps_.need(rs.released, r);
          bool done = true;
          for (std::size_t k = 0; k < acc.size() && done; ++k)
            done = std::atomic_ref<std::uint32_t>(xconsumed_[acc[k] & kSampleMask])
                       .load(std::memory_order_relaxed) >= need[k];
          if (!done) break;
          // Begun and done within one pass: begun now, as far as we can tell.
          a_.stats_.note_begun(rs.released,
                               rs.begun_at >= 0 ? rs.begun_at : a_.stats_.since_ready());
          rs.begun_at = -1;
          std::uint64_t hits = 0;
          for (std::uint32_t a : acc) {
            a_.drop_use_locked(a & kSampleMask);
            hits += a >> 31;
          }
          // The rank's consumption of the step is its request, service and release at once
          // (no request to time: stall is not measured in this mode).
          const auto now = Clock::now();
          a_.stats_.note_request(rs.released, now, a_.ready_);
          a_.stats_.note_served(rs.released, r, acc.size(), hits, -1);
          a_.stats_.note_released(rs.released, now);
          rs.cursor = ++rs.released;
          demand_.step_completed_locked();
        }
        // A step begun (any of its samples consumed) starts its epoch and the head start, and
        // is the moment its lead is measured at.
        if (rs.released < a_.T_ && rs.begun_at < 0 && a_.steps_.has_locked(rs.released)) {
          const auto acc = a_.accesses(rs.released, r);
          const auto need = a_.steps_.need(rs.released, r);
          for (std::size_t k = 0; k < acc.size(); ++k)
            if (std::atomic_ref<std::uint32_t>(xconsumed_[acc[k] & kSampleMask])
                    .load(std::memory_order_relaxed) >= need[k]) {
              const auto now = Clock::now();
              rs.begun_at = a_.stats_.since_ready();
              a_.stats_.note_request(rs.released, now, a_.ready_);
              break;
            }
        }
        least = std::min(least, rs.released);
      }
      paced_steps_ = least;
    }
    demand_.poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace solar::agent

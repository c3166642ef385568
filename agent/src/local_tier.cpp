// SPDX-License-Identifier: Apache-2.0
// The local-disk tier: the node's moves between memory and a file on the local disk, executed
// ahead of the ranks. See local_tier.h.
#include "local_tier.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <memory>

#include "agent_impl.h"
#include "solar/core/tiers.h"

namespace solar::agent {

namespace {

constexpr std::uint64_t kAlign = 4096;  // O_DIRECT: offsets, lengths and memory

std::uint32_t crc_of(const std::byte* p, std::size_t n) {
  return static_cast<std::uint32_t>(
      ::crc32_z(::crc32_z(0L, nullptr, 0), reinterpret_cast<const Bytef*>(p), n));
}

}  // namespace

void LocalTier::setup(const std::string& dir) {
  const PlanConfig& c = a_.header_.config;
  if (!c.tiered()) {
    if (!dir.empty())
      throw AgentError(fmt::format("--local-dir {}: the plan {} has no local tier; plan with "
                                   "--local-buffer to use one, or drop --local-dir",
                                   dir, a_.opt_.plan));
    return;
  }
  if (dir.empty())
    throw AgentError(fmt::format("the plan {} keeps {} per node on a local disk "
                                 "(--local-buffer): give the agent --local-dir, a folder for "
                                 "it on that disk",
                                 a_.opt_.plan, format_bytes(c.local_bytes)));
  if (a_.opt_.max_local_buffer && c.local_bytes > a_.opt_.max_local_buffer)
    throw AgentError(fmt::format("the plan {} keeps {} per node on the local disk, above this "
                                 "agent's limit of {} (--max-local-buffer, the site's "
                                 "max_local_buffer=)",
                                 a_.opt_.plan, format_bytes(c.local_bytes),
                                 format_bytes(a_.opt_.max_local_buffer)));
  if (a_.table_.sized())
    throw AgentError("a local tier (--local-dir) holds samples of one size only; plan samples "
                     "of differing sizes without --local-buffer");
  if (!a_.opt_.peer_dir.empty())
    throw AgentError("a local tier (--local-dir) and peer sharing (--peer-dir) do not go "
                     "together yet; plan with one of --local-buffer and --peers");
  // The node's moves, from its own section: what place_in_tiers gives this node.
  const std::uint32_t R = a_.R_;
  try {
    moves_ = place_node_in_tiers(
        a_.steps_.whole().schedule, a_.T_, R,
        [&](std::uint64_t t, std::uint32_t k) { return a_.accesses(t, k); },
        a_.header_.layout.steps, c.buffer_samples(), c.local_samples(), a_.opt_.node);
  } catch (const std::logic_error& e) {
    throw AgentError(fmt::format("the plan {} cannot be placed in the tiers: {}", a_.opt_.plan,
                                 e.what()));
  }
  // The folder: new, this user's only. Its parent must exist (the disk's mount point, a
  // launcher's per-job folder).
  const std::filesystem::path p(dir);
  if (::mkdir(dir.c_str(), 0700) != 0) {
    const int err = errno;
    if (err == EEXIST)
      throw AgentError(fmt::format("--local-dir {}: it exists already; the agent makes this "
                                   "folder itself (for this job step only) and removes it at "
                                   "exit: remove it, or name a new one",
                                   dir));
    throw AgentError(fmt::format("--local-dir {}: creating the folder: {}{}", dir,
                                 std::strerror(err),
                                 err == ENOENT ? fmt::format(" (does {} exist?)",
                                                             p.parent_path().string())
                                               : std::string()));
  }
  dir_ = dir;
  ::chmod(dir.c_str(), 0700);  // whatever the umask
  file_ = (p / "tier").string();
  copy_bytes_ = a_.sample_bytes_ + a_.label_bytes_;
  stride_ = (copy_bytes_ + kAlign - 1) / kAlign * kAlign;
  // The tier, and room for the copies two steps' reads hold (held_).
  const std::uint64_t extra = 2 * std::uint64_t{R} * (std::uint64_t{c.batch} + c.imbalance);
  const std::uint64_t slots = c.local_samples() + extra;
  fd_ = ::open(file_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
  direct_ = fd_ >= 0;
  if (fd_ < 0 && errno == EINVAL)  // tmpfs and others: no O_DIRECT
    fd_ = ::open(file_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd_ < 0) {
    const int err = errno;
    remove_files();
    throw AgentError(fmt::format("--local-dir {}: creating {}: {}", dir, file_,
                                 std::strerror(err)));
  }
  const std::uint64_t bytes = slots * stride_;
  if (const int err = ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes)); err != 0) {
    // No room (or no such call): degrade, as a disk failing later does.
    spdlog::warn("node {}: local tier: allocating {} in {} failed ({}): the local tier is off, "
                 "its samples are read from storage instead",
                 a_.opt_.node, format_bytes(bytes), file_, std::strerror(err));
    broken_ = true;
    ++errors_;
    // What it did allocate goes back to the disk.
    if (::ftruncate(fd_, 0) != 0)
      spdlog::debug("local tier: truncating {}: {}", file_, std::strerror(errno));
  }
  free_disk_.resize(slots);
  for (std::uint64_t d = 0; d < slots; ++d)
    free_disk_[d] = static_cast<std::uint32_t>(slots - 1 - d);  // taken from the back: 0 first
  disk_of_.assign(c.samples, kNone);
  arrived_.assign(c.samples, 0);
  holder_.assign(slots, kNone);
  crc_.assign(slots, 0);
  on_ = true;
  spdlog::info("node {}: local tier {} ({} slots of {}, {} of them for reads in flight; {}): "
               "{} reads back, {} writes planned",
               a_.opt_.node, file_, slots, format_bytes(stride_), extra,
               direct_ ? "O_DIRECT" : "through the page cache", moves_.reads.size(),
               moves_.writes.size());
}

void LocalTier::start() {
  if (!on_) return;
  for (unsigned i = 0; i < kThreads; ++i) threads_.emplace_back([this] { loop(); });
}

void LocalTier::join() {
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

bool LocalTier::take_job_locked(Job& job) {
  // Slots an earlier job (queued, running, or a write waiting for its step) holds back (a
  // member reused: this runs under the agent's lock at every wake-up).
  std::vector<std::uint32_t>& held = scan_;
  held.assign(busy_.begin(), busy_.end());
  for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
    const bool slot_free =
        it->disk == kNone || std::find(held.begin(), held.end(), it->disk) == held.end();
    const bool landed = !it->write || a_.ready_ > it->step;
    if (slot_free && landed) {
      job = *it;
      jobs_.erase(it);
      if (job.disk != kNone) busy_.push_back(job.disk);
      return true;
    }
    if (it->disk != kNone) held.push_back(it->disk);
  }
  return false;
}

void LocalTier::remove_files() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!file_.empty()) ::unlink(file_.c_str());
  if (!dir_.empty() && ::rmdir(dir_.c_str()) != 0 && errno != ENOENT)
    spdlog::warn("local tier: removing {}: {}", dir_, std::strerror(errno));
  file_.clear();
  dir_.clear();
}

void LocalTier::evict_locked(std::uint32_t sample) {
  if (!on_ || sample >= disk_of_.size() || disk_of_[sample] == kNone) return;
  free_disk_.push_back(disk_of_[sample]);
  disk_of_[sample] = kNone;
}

void LocalTier::moves_locked(std::uint64_t t) {
  if (!on_) return;
  held_.clear();
  const auto reads = moves_.reads_at(t);
  for (std::uint32_t x : moves_.discards_at(t)) {
    if (disk_of_[x] != kNone && std::find(reads.begin(), reads.end(), x) != reads.end()) {
      held_.emplace_back(x, disk_of_[x]);  // freed after its read (queue_read_locked)
      disk_of_[x] = kNone;
      continue;
    }
    evict_locked(x);
  }
  bool queued = false;
  for (std::uint32_t y : moves_.writes_at(t)) {
    // Not in memory: an agent started later (--start-step) never read it. Its reads back
    // then come from storage.
    if (!a_.table_.resident(y) || disk_of_[y] != kNone || free_disk_.empty()) continue;
    const std::uint32_t d = free_disk_.back();
    free_disk_.pop_back();
    disk_of_[y] = d;
    a_.table_.add_use(y);  // the memory slot stays until the copy is made
    jobs_.push_back({true, false, arrived_[y], y, a_.table_.slot_of(y), d});
    queued = true;
  }
  for (std::uint32_t y : moves_.drops_at(t))
    if (a_.table_.evict(y)) a_.prefetch_.slot_freed_locked();
  if (queued) cv_.notify_all();
}

void LocalTier::queue_read_locked(std::uint64_t t, std::uint32_t sample, std::uint32_t slot) {
  Job j{false, false, t, sample, slot, disk_of_[sample]};
  for (auto& [x, d] : held_)
    if (x == sample && d != kNone) {
      j.disk = d;
      j.free_after = true;
      d = kNone;  // the read frees it
    }
  jobs_.push_back(j);
  cv_.notify_all();
}

void LocalTier::step_queued_locked() {
  for (const auto& [x, d] : held_)
    if (d != kNone) free_disk_.push_back(d);
  held_.clear();
}

bool LocalTier::write_copy(const Job& j, std::byte* staging, int& err) {
  std::memcpy(staging, a_.slot_ptr(j.slot), a_.sample_bytes_);
  if (a_.label_bytes_)
    std::memcpy(staging + a_.sample_bytes_, a_.label_ptr(j.slot), a_.label_bytes_);
  std::memset(staging + copy_bytes_, 0, stride_ - copy_bytes_);
  const std::uint32_t crc = crc_of(staging, copy_bytes_);
  const off_t at = static_cast<off_t>(std::uint64_t{j.disk} * stride_);
  for (std::uint64_t done = 0; done < stride_;) {
    const ssize_t w = ::pwrite(fd_, staging + done, stride_ - done, at + static_cast<off_t>(done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      err = w < 0 ? errno : ENOSPC;
      return false;
    }
    done += static_cast<std::uint64_t>(w);
  }
  holder_[j.disk] = j.sample;
  crc_[j.disk] = crc;
  return true;
}

bool LocalTier::read_copy(const Job& j, std::byte* staging, int& err, bool& corrupt) {
  const off_t at = static_cast<off_t>(std::uint64_t{j.disk} * stride_);
  for (std::uint64_t done = 0; done < stride_;) {
    const ssize_t r = ::pread(fd_, staging + done, stride_ - done, at + static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      err = r < 0 ? errno : EIO;  // 0: the file is shorter than it was made
      return false;
    }
    done += static_cast<std::uint64_t>(r);
  }
  corrupt = crc_of(staging, copy_bytes_) != crc_[j.disk];
  return !corrupt;
}

void LocalTier::disk_failed(bool writing, std::uint32_t sample, int err) {
  // mu_ held by the caller.
  ++errors_;
  if (writing && err == ENOSPC) {
    // Full (a copy-on-write or thin-provisioned file system beneath the preallocated file):
    // what is on the disk is still good, so only the writes stop.
    full_ = true;
    if (warned_full_) return;
    warned_full_ = true;
    spdlog::warn("node {}: local tier: writing sample {} in {}: {}; the local tier writes "
                 "nothing more (the copies already on it are still read back) and the samples "
                 "it would have held are read from storage instead",
                 a_.opt_.node, sample, file_, std::strerror(err));
    return;
  }
  broken_ = true;
  if (warned_error_) return;
  warned_error_ = true;
  spdlog::warn("node {}: local tier: {} sample {} in {}: {}; the local tier writes nothing more "
               "and its samples are read from storage instead",
               a_.opt_.node, writing ? "writing" : "reading", sample, file_,
               std::strerror(err));
}

void LocalTier::loop() {
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> staging(
      static_cast<std::byte*>(std::aligned_alloc(kAlign, stride_)));
  if (!staging) {
    a_.fail("local tier: no memory for its staging buffer");
    return;
  }
  for (;;) {
    Job j;
    {
      // (A write copies a sample read into memory for an earlier step: once that step is
      // read, take_job_locked.)
      std::unique_lock lk(a_.mu_);
      ++waiting_;
      cv_.wait(lk, [&] { return a_.stopping_ || !a_.fatal_.empty() || take_job_locked(j); });
      --waiting_;
      if (a_.stopping_ || !a_.fatal_.empty()) return;
    }
    const auto t0 = Clock::now();
    int err = 0;
    bool corrupt = false, ok = false;
    if (j.write) {
      ok = !broken_ && !full_ && write_copy(j, staging.get(), err);
      if (!ok) holder_[j.disk] = kNone;  // its reads back go to storage
    } else {
      ok = j.disk != kNone && !broken_ && holder_[j.disk] == j.sample &&
           read_copy(j, staging.get(), err, corrupt);
      if (ok) a_.prefetch_.write_slot(j.slot, staging.get(), a_.sample_bytes_,
                                      staging.get() + a_.sample_bytes_);
    }
    const double secs = seconds_since(t0);
    std::lock_guard lk(a_.mu_);
    if (j.disk != kNone) {  // later jobs on its slot may start
      busy_.erase(std::find(busy_.begin(), busy_.end(), j.disk));
      cv_.notify_all();
    }
    if (j.free_after) {  // discarded in its step: free once read (held_)
      holder_[j.disk] = kNone;
      free_disk_.push_back(j.disk);
    }
    if (err) disk_failed(j.write, j.sample, err);
    if (corrupt) {
      ++corrupt_;
      holder_[j.disk] = kNone;
      if (!warned_corrupt_) {
        warned_corrupt_ = true;
        spdlog::warn("node {}: local tier: the copy of sample {} in {} is not what was written "
                     "(CRC-32 mismatch); read from storage instead (so is any other)",
                     a_.opt_.node, j.sample, file_);
      }
    }
    if (j.write) {
      if (ok) {
        ++writes_;
        bytes_written_ += copy_bytes_;
        write_seconds_ += secs;
      }
      a_.drop_use_locked(j.sample);  // the memory slot may go now
      continue;
    }
    if (!ok) {  // from storage, as the step's read: it ends the step's count there
      ++from_storage_;
      a_.prefetch_.read_from_storage_locked(j.step, j.sample, j.slot);
      continue;
    }
    // Transparent mode: the bytes are in place, the interposers may copy them from now on.
    if (a_.table_.indexed()) a_.table_.publish(j.sample, j.slot);
    ++reads_;
    bytes_read_ += copy_bytes_;
    read_seconds_ += secs;
    a_.stats_.note_local_read(j.step);
    a_.drop_use_locked(j.sample);  // its read pin (SlotTable::place)
    a_.prefetch_.read_done_locked(j.step);
  }
}

nlohmann::json LocalTier::stats_json_locked() const {
  if (!on_) return nullptr;
  return {{"dir", dir_},
          {"direct_io", direct_},
          {"slots", holder_.size()},
          {"planned_reads", moves_.reads.size()},
          {"planned_writes", moves_.writes.size()},
          {"reads", reads_},
          {"writes", writes_},
          {"bytes_read", bytes_read_},
          {"bytes_written", bytes_written_},
          {"read_seconds", read_seconds_},
          {"write_seconds", write_seconds_},
          {"from_storage", from_storage_},
          {"corrupt", corrupt_},
          {"errors", errors_},
          {"off", broken_.load()},
          {"full", full_.load()}};
}

}  // namespace solar::agent

// SPDX-License-Identifier: Apache-2.0
// Emulated shared storage for `solar bench loader --throttle`: the calling process (and all it
// starts afterwards) joins a fresh cgroup whose reads of the disk holding a file are capped by
// the kernel (cgroup v1 blkio.throttle.read_{bps,iops}_device, or cgroup v2 io.max), and the
// cgroup's own counters say what was read from that disk. The same mechanism as
// bench/slow_storage.py (scripts/slow-storage), which the Python benchmarks use: a child
// cgroup whose throttle caps every process in it, children and buffered reads included, but
// not page-cache hits.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace solar::cli {

// Why reads cannot be capped here (not root, no controller, data not on a block device).
class ThrottleUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DiskCounters {
  std::uint64_t bytes = 0, requests = 0;
};

class Throttle {
 public:
  // Caps reads of the disk holding `data_path` at bps bytes/s (and iops requests/s, 0 = none)
  // and moves this process into the cgroup. Throws ThrottleUnavailable.
  Throttle(const std::string& data_path, std::uint64_t bps, std::uint64_t iops);
  // Moves this process back to the cgroup it came from and removes the cgroup (children must
  // have exited by then; a cgroup that still holds processes is left, with a warning).
  ~Throttle();
  Throttle(const Throttle&) = delete;
  Throttle& operator=(const Throttle&) = delete;

  DiskCounters counters() const;  // read from the disk by the cgroup's processes so far
  std::string describe() const;   // "reads of disk 8:0 capped at 400 MiB/s, 2000 IOPS (...)"
  std::uint64_t bps() const { return bps_; }
  std::uint64_t iops() const { return iops_; }

 private:
  void write(const std::string& name, const std::string& text) const;
  std::string majmin_, dir_, back_to_, kind_;
  std::uint64_t bps_ = 0, iops_ = 0;
  bool v1_ = false;
};

// "400M" or "400M,2000": bytes/s and optional requests/s. Throws ConfigError naming `flag`.
std::pair<std::uint64_t, std::uint64_t> parse_throttle(const std::string& text,
                                                       const std::string& flag);

}  // namespace solar::cli

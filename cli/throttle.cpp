// SPDX-License-Identifier: Apache-2.0
// See throttle.h. Mirrors bench/slow_storage.py's Throttle class (the Python benchmarks' copy),
// so both put the same cap on the same counters.
#include "throttle.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "solar/core/config.h"

namespace solar::cli {

namespace {
namespace fs = std::filesystem;
constexpr const char* kV1Root = "/sys/fs/cgroup/blkio";
constexpr const char* kV2Roots[] = {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"};

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// MAJ:MIN of the whole disk holding `path` (throttles apply to disks, not partitions).
std::string disk_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw ThrottleUnavailable(fmt::format("{}: {}", path, std::strerror(errno)));
  std::string majmin = fmt::format("{}:{}", major(st.st_dev), minor(st.st_dev));
  const fs::path sysdev = fs::path("/sys/dev/block") / majmin;
  std::error_code ec;
  if (!fs::exists(sysdev, ec))
    throw ThrottleUnavailable(fmt::format(
        "{} is on device {}, which is not a block device (tmpfs, overlay or a network file "
        "system?): its reads cannot be capped; put the data on a local disk",
        path, majmin));
  if (fs::exists(sysdev / "partition", ec)) {
    std::string parent = read_file(fs::canonical(sysdev / "..", ec) / "dev");
    while (!parent.empty() && std::isspace(static_cast<unsigned char>(parent.back())))
      parent.pop_back();
    if (!parent.empty()) majmin = parent;
  }
  return majmin;
}

// This process's cgroup path in the v1 blkio hierarchy (`v1`) or the v2 one, from /proc.
std::string own_cgroup(bool v1) {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string ctrls = line.substr(a + 1, b - a - 1);
    if (v1 ? (ctrls.find("blkio") != std::string::npos) : (line.compare(0, 3, "0::") == 0))
      return line.substr(b + 1);
  }
  return "/";
}
}  // namespace

std::pair<std::uint64_t, std::uint64_t> parse_throttle(const std::string& text,
                                                       const std::string& flag) {
  const auto comma = text.find(',');
  const std::uint64_t bps = parse_bytes(text.substr(0, comma), flag);
  if (bps == 0) throw ConfigError(flag, "the bandwidth must be at least 1 byte/s (e.g. 400M)");
  std::uint64_t iops = 0;
  if (comma != std::string::npos)
    iops = parse_count(text.substr(comma + 1), flag + " (requests/s after the comma)", 1,
                       std::uint64_t{1} << 40);
  return {bps, iops};
}

Throttle::Throttle(const std::string& data_path, std::uint64_t bps, std::uint64_t iops)
    : bps_(bps), iops_(iops) {
  if (::geteuid() != 0)
    throw ThrottleUnavailable("capping reads needs root (it creates a cgroup); run as root or "
                              "without --throttle");
  majmin_ = disk_of(data_path);
  std::error_code ec;
  fs::path root;
  if (fs::exists(fs::path(kV1Root) / "blkio.throttle.read_bps_device", ec)) {
    v1_ = true;
    kind_ = "cgroup v1 blkio";
    root = kV1Root;
  } else {
    for (const char* r : kV2Roots) {
      const std::string ctl = read_file(fs::path(r) / "cgroup.controllers");
      std::istringstream words(ctl);
      for (std::string w; words >> w;)
        if (w == "io") root = r;
      if (!root.empty()) break;
    }
    if (root.empty())
      throw ThrottleUnavailable(fmt::format(
          "no cgroup controller can cap reads here: neither cgroup v1 blkio ({}) nor cgroup v2 "
          "io (cgroup.controllers under {} or {}) is available",
          kV1Root, kV2Roots[0], kV2Roots[1]));
    kind_ = "cgroup v2 io.max";
    std::ofstream(root / "cgroup.subtree_control") << "+io";
  }
  back_to_ = (root / fs::path(own_cgroup(v1_)).relative_path()).string();
  dir_ = (root / fmt::format("solar-bench-{}", ::getpid())).string();
  if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST)
    throw ThrottleUnavailable(fmt::format("cannot create the cgroup {}: {}", dir_, std::strerror(errno)));
  try {
    if (v1_) {
      write("blkio.throttle.read_bps_device", fmt::format("{} {}", majmin_, bps_));
      if (iops_) write("blkio.throttle.read_iops_device", fmt::format("{} {}", majmin_, iops_));
    } else {
      write("io.max", fmt::format("{} rbps={}{}", majmin_, bps_,
                                  iops_ ? fmt::format(" riops={}", iops_) : std::string()));
    }
    write("cgroup.procs", std::to_string(::getpid()));
  } catch (...) {
    ::rmdir(dir_.c_str());
    throw;
  }
}

Throttle::~Throttle() {
  std::ofstream(fs::path(back_to_) / "cgroup.procs") << ::getpid();
  if (::rmdir(dir_.c_str()) != 0)
    spdlog::warn("could not remove the cgroup {}: {} (processes left in it?)", dir_,
                 std::strerror(errno));
}

void Throttle::write(const std::string& name, const std::string& text) const {
  std::ofstream f(fs::path(dir_) / name);
  f << text;
  f.close();
  if (!f)
    throw ThrottleUnavailable(fmt::format("cannot write '{}' to {}/{} (is {} a disk this "
                                          "controller can throttle?)",
                                          text, dir_, name, majmin_));
}

DiskCounters Throttle::counters() const {
  DiskCounters c;
  if (v1_) {
    auto stat = [&](const char* name) {
      std::ifstream f(fs::path(dir_) / name);
      std::string dev, op;
      std::uint64_t v = 0;
      while (f >> dev >> op >> v)
        if (dev == majmin_ && op == "Read") return v;
      return std::uint64_t{0};
    };
    c.bytes = stat("blkio.throttle.io_service_bytes_recursive");
    c.requests = stat("blkio.throttle.io_serviced_recursive");
    return c;
  }
  std::ifstream f(fs::path(dir_) / "io.stat");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream words(line);
    std::string dev, kv;
    if (!(words >> dev) || dev != majmin_) continue;
    while (words >> kv) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos) continue;
      const std::uint64_t v = std::strtoull(kv.c_str() + eq + 1, nullptr, 10);
      if (kv.compare(0, eq, "rbytes") == 0) c.bytes = v;
      if (kv.compare(0, eq, "rios") == 0) c.requests = v;
    }
  }
  return c;
}

std::string Throttle::describe() const {
  return fmt::format("reads of disk {} capped at {:.0f} MiB/s{} ({})", majmin_,
                     double(bps_) / (1 << 20), iops_ ? fmt::format(", {} IOPS", iops_) : "", kind_);
}

}  // namespace solar::cli

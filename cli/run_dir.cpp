// SPDX-License-Identifier: Apache-2.0
#include "run_dir.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "solar/sys/remove_tree.h"

namespace solar::cli {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

std::string read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

// A process's start time (clock ticks after boot, /proc/PID/stat field 22); "" if it is gone.
std::string start_time(pid_t pid) {
  const std::string stat = read_first_line(fmt::format("/proc/{}/stat", pid));
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos) return {};
  std::istringstream rest(stat.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22 && (rest >> field); ++i) {
    if (i == 3 && field == "Z") return {};  // a zombie is gone
    if (i == 22) return field;
  }
  return {};
}

// The watchdog's side: waits on `in` for the agents' pids; at the all-clear (pid 0) it exits,
// at end-of-file (the launcher died) it waits for the agents to stop, then removes `dir`.
[[noreturn]] void watch_run_dir(int in, const std::string& dir) {
  // Ctrl-C and the like are for the launcher, which cleans up itself and gives the all-clear.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::signal(sig, SIG_IGN);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Hold nothing of the launcher's: not its caller's pipes, not the ranks' output.
  ::dup2(in, 3);
  const int null = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd < 3; ++fd)
    if (null >= 0 && null != fd) ::dup2(null, fd);
  if (::syscall(SYS_close_range, 4U, ~0U, 0U) != 0)
    for (int fd = 4; fd < 65536; ++fd) ::close(fd);
  ::prctl(PR_SET_NAME, "solar-run-watch");
  std::vector<pid_t> agents;
  std::vector<int> pidfds;
  for (;;) {
    std::int32_t pid = 0;
    const ssize_t n = ::recv(3, &pid, sizeof pid, MSG_WAITALL);
    if (n < 0 && errno == EINTR) continue;
    if (n != sizeof pid) break;  // the launcher is gone
    if (pid == 0) ::_exit(0);    // all clear: it removes the folder itself, or keeps it
    agents.push_back(pid);
    pidfds.push_back(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  }
  // The agents got SIGTERM with their parent's death; they write into the folder until they stop.
  auto gone = [&](std::size_t i) {
    if (pidfds[i] >= 0) {
      pollfd p{pidfds[i], POLLIN, 0};
      return ::poll(&p, 1, 0) == 1;
    }
    return ::kill(agents[i], 0) != 0 || start_time(agents[i]).empty();
  };
  const auto until = Clock::now() + std::chrono::seconds(10);
  for (std::size_t i = 0; i < agents.size(); ++i) {
    while (!gone(i) && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!gone(i)) {
      if (pidfds[i] >= 0)
        ::syscall(SYS_pidfd_send_signal, pidfds[i], SIGKILL, nullptr, 0U);
      else
        ::kill(agents[i], SIGKILL);
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  remove_run_dir(dir);
  ::_exit(0);
}

}  // namespace

void remove_run_dir(const fs::path& dir) {
  std::ifstream list(dir / kLocalDirsFile);
  const std::string prefix = dir.filename().string() + "-node";
  for (std::string line; std::getline(list, line);) {
    const fs::path p(line);
    struct stat st {};
    if (p.filename().string().rfind(prefix, 0) != 0 || ::lstat(p.c_str(), &st) != 0 ||
        !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    sys::remove_tree(p);
  }
  sys::remove_tree(dir);
}

// Who owns a run folder: this boot, this pid namespace, this process and its start time (a pid
// alone may be reused).
std::string owner_line(pid_t pid) {
  std::error_code ec;
  return fmt::format("boot={} pidns={} pid={} start={}",
                     read_first_line("/proc/sys/kernel/random/boot_id"),
                     fs::read_symlink("/proc/self/ns/pid", ec).string(), pid, start_time(pid));
}

// Removes the run folders under `base` that a killed `solar run` of this user left: only those
// with an owner file naming a process of this boot and pid namespace that no longer runs.
void sweep_leftover_run_dirs(const fs::path& base) {
  std::error_code ec;
  const std::string mine = owner_line(::getpid());
  const std::string here = mine.substr(0, mine.find(" pid="));
  for (const auto& e : fs::directory_iterator(base, ec)) {
    const std::string name = e.path().filename().string();
    struct stat st {};
    if (name.rfind("solar-run-", 0) != 0 || ::lstat(e.path().c_str(), &st) != 0 ||
        !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    const std::string owner = read_first_line((e.path() / kOwnerFile).string());
    const auto at = owner.find(" pid=");
    if (at == std::string::npos || owner.substr(0, at) != here) continue;
    pid_t pid = 0;
    char start[64] = {};
    if (std::sscanf(owner.c_str() + at, " pid=%d start=%63s", &pid, start) < 1 || pid <= 0)
      continue;
    if (start[0] && start_time(pid) == start) continue;  // still running
    if (!start[0] && ::kill(pid, 0) == 0) continue;
    remove_run_dir(e.path());
  }
}

RunDirWatch::RunDirWatch(const fs::path& dir) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw std::runtime_error(fmt::format("socketpair: {}", std::strerror(errno)));
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(sv[0]);
    ::close(sv[1]);
    throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
  }
  if (pid == 0) {
    ::close(sv[0]);
    watch_run_dir(sv[1], dir.string());
  }
  ::close(sv[1]);
  pid_ = pid;
  fd_ = sv[0];
}

RunDirWatch::~RunDirWatch() {
  agent(0);  // all clear
  ::close(fd_);
  ::waitpid(pid_, nullptr, 0);  // exits at once (unless the run loop reaped it already)
}

void RunDirWatch::agent(pid_t pid) {
  const std::int32_t v = pid;
  [[maybe_unused]] const ssize_t n = ::send(fd_, &v, sizeof v, MSG_NOSIGNAL);
}

}  // namespace solar::cli

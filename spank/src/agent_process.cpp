// SPDX-License-Identifier: Apache-2.0
#include "agent_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <stdexcept>
#include <utility>

#include "solar/unix_socket.h"
#include "step_folder.h"

namespace solar::spank {
namespace {

using Clock = std::chrono::steady_clock;

int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }
int pidfd_signal(int fd, int sig) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, fd, sig, nullptr, 0));
}

// True when the process behind `pidfd` has exited (waits up to `ms`).
bool exited(int pidfd, int ms) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, ms) > 0;
}

bool socket_accepts(const std::string& path) {
  const protocol::UnixConnection conn = protocol::connect_unix(path);
  if (conn) ::close(conn.fd);
  return static_cast<bool>(conn);
}

// What the child reports through the pipe when it fails before exec.
struct ChildFailure {
  int stage;
  int error;
};
enum Stage : int { kRuntimeDir, kRuntimeDirUnsafe, kStepDir, kGroups, kUid, kLog, kExec };
const char* describe(int stage) {
  switch (stage) {
    case kRuntimeDir: return "creating runtime_dir";
    case kRuntimeDirUnsafe: return "runtime_dir must be a folder owned by root, not writable by "
                                   "others";
    case kStepDir: return "creating the step's folder in runtime_dir";
    case kGroups: return "switching to the job's group";
    case kUid: return "switching to the job's user";
    case kLog: return "opening the agent's log";
    default: return "running the agent binary";
  }
}

[[noreturn]] void child_fail(int fd, int stage) {
  const ChildFailure f{stage, errno};
  [[maybe_unused]] ssize_t w = ::write(fd, &f, sizeof f);
  ::_exit(127);
}

// Runs in the forked child of a multi-threaded slurmstepd: async-signal-safe calls only.
[[noreturn]] void child(const AgentLaunch& l, char* const* argv, char* const* envp, int report) {
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) ::sigaction(s, &dfl, nullptr);  // fails harmlessly for KILL/STOP
  ::setsid();

  // Privileged part: folders and the OOM score (slurmstepd runs at -1000; its user must not).
  [[maybe_unused]] int ignored = ::seteuid(0);
  if (::mkdir(l.runtime_dir.c_str(), 0755) != 0 && errno != EEXIST) child_fail(report, kRuntimeDir);
  struct stat st {};
  if (::lstat(l.runtime_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != 0 ||
      (st.st_mode & 0022)) {
    errno = EPERM;
    child_fail(report, kRuntimeDirUnsafe);
  }
  if (::mkdir(l.dir.c_str(), 0700) != 0) child_fail(report, kStepDir);
  if (::chown(l.dir.c_str(), l.uid, l.gid) != 0) child_fail(report, kStepDir);
  if (const int fd = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC); fd >= 0) {
    ignored = static_cast<int>(::write(fd, "0", 1));
    ::close(fd);
  }
  // Fully the user: real, effective and saved ids (supplementary groups are already the user's,
  // set by slurmstepd).
  if (::setresgid(l.gid, l.gid, l.gid) != 0) child_fail(report, kGroups);
  if (::setresuid(l.uid, l.uid, l.uid) != 0) child_fail(report, kUid);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // after the uid change, which clears it

  const int null = ::open("/dev/null", O_RDWR);
  // A new file only (the step's folder is the user's, so nobody else can have placed one, but
  // never an existing name: a FIFO there would block this open).
  const int log = create_new_file(l.log, O_APPEND);  // close-on-exec: dup2 below keeps it
  if (null < 0 || log < 0) child_fail(report, kLog);
  ::dup2(null, 0);
  ::dup2(log, 1);
  ::dup2(log, 2);
  // Every other inherited fd (the tasks' pipes, slurmstepd's sockets) goes at exec; `report`
  // is already close-on-exec and tells the parent that exec happened by closing.
  if (::syscall(SYS_close_range, 3U, ~0U, 4U /* CLOSE_RANGE_CLOEXEC */) != 0) {
    for (int fd = 3; fd < 65536; ++fd)
      if (fd != report) ::close(fd);
  }
  ::execve(argv[0], argv, envp);
  child_fail(report, kExec);
}

}  // namespace

AgentProcess::AgentProcess(AgentProcess&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)), pidfd_(std::exchange(o.pidfd_, -1)) {}
AgentProcess& AgentProcess::operator=(AgentProcess&& o) noexcept {
  if (this != &o) {
    stop(0);
    pid_ = std::exchange(o.pid_, -1);
    pidfd_ = std::exchange(o.pidfd_, -1);
  }
  return *this;
}
AgentProcess::~AgentProcess() { stop(0); }

AgentProcess AgentProcess::start(const AgentLaunch& l, double timeout_s) {
  std::vector<std::string> args{l.agent};
  args.insert(args.end(), l.args.begin(), l.args.end());
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& e : l.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0)
    throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(report[0]);
    ::close(report[1]);
    throw std::runtime_error(fmt::format("fork: {}", std::strerror(e)));
  }
  if (pid == 0) child(l, argv.data(), envp.data(), report[1]);

  ::close(report[1]);
  AgentProcess p;
  p.pid_ = pid;
  p.pidfd_ = pidfd_open(pid);  // nobody else waits for it yet: this thread is slurmstepd's main
  // The child reports a failure, or closes the pipe by exec, within the start-up limit: a
  // child stuck before exec (in an open, on a hung file system) must not hold slurmstepd.
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  ChildFailure failure{};
  ssize_t n = -1;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd pf{report[0], POLLIN, 0};
    const int r = left > 0 ? ::poll(&pf, 1, static_cast<int>(std::min<long long>(left, 1000)))
                           : 0;
    if (r < 0 && errno == EINTR) continue;
    if (r > 0) {
      do n = ::read(report[0], &failure, sizeof failure);
      while (n < 0 && errno == EINTR);
      break;
    }
    if (r < 0 || Clock::now() >= deadline) break;
  }
  ::close(report[0]);
  if (n < 0) {
    p.stop(1);
    throw std::runtime_error(fmt::format("the agent's process did not get to run {} within {:.0f} "
                                         "s (timeout= in plugstack.conf)",
                                         l.agent, timeout_s));
  }
  if (n == static_cast<ssize_t>(sizeof failure)) {
    p.stop(1);
    throw std::runtime_error(fmt::format("{} {}: {}", describe(failure.stage),
                                         failure.stage == kExec ? l.agent
                                         : failure.stage <= kRuntimeDirUnsafe ? l.runtime_dir
                                         : failure.stage == kLog ? l.log : l.dir,
                                         std::strerror(failure.error)));
  }
  if (p.pidfd_ < 0) {
    p.stop(1);
    throw std::runtime_error(fmt::format("pidfd_open: {}", std::strerror(errno)));
  }
  for (;;) {
    if (socket_accepts(l.socket)) return p;
    if (exited(p.pidfd_, 10)) {
      int status = 0;
      std::string how;
      if (::waitpid(pid, &status, WNOHANG) == pid)
        how = WIFEXITED(status) ? fmt::format(" with status {}", WEXITSTATUS(status))
                                : fmt::format(" on signal {}", WTERMSIG(status));
      p.stop(0);
      throw std::runtime_error(fmt::format("the agent exited{} before it was ready; {}:\n{}", how,
                                           l.log, tail_of(l.log)));
    }
    if (Clock::now() > deadline) {
      p.stop(2);
      throw std::runtime_error(fmt::format("the agent was not ready within {:.0f} s (timeout= in "
                                           "plugstack.conf); {}:\n{}",
                                           timeout_s, l.log, tail_of(l.log)));
    }
  }
}

bool AgentProcess::running() const { return pidfd_ >= 0 && !exited(pidfd_, 0); }

void AgentProcess::stop(double grace_s) {
  if (pidfd_ < 0) return;
  if (!exited(pidfd_, 0)) {
    pidfd_signal(pidfd_, SIGTERM);
    if (!exited(pidfd_, static_cast<int>(grace_s * 1000))) {
      pidfd_signal(pidfd_, SIGKILL);
      exited(pidfd_, 5000);
    }
  }
  ::waitpid(pid_, nullptr, WNOHANG);  // unless slurmstepd reaped it already
  ::close(pidfd_);
  pidfd_ = -1;
  pid_ = -1;
}

std::string tail_of(const std::string& file, std::size_t lines) {
  std::ifstream f(file);
  std::vector<std::string> all;
  for (std::string l; std::getline(f, l);) all.push_back(l);
  std::string out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += (out.empty() ? "    " : "\n    ") + all[i];
  return out;
}

bool kill_if_agent(pid_t pid, uid_t uid, const std::string& agent, const std::string& socket) {
  if (pid <= 1) return false;
  // The pidfd first: what is checked below is then the process it names, or that process is
  // gone and the signal fails (a pid reused meanwhile is never the one signalled).
  const int fd = pidfd_open(pid);
  if (fd < 0) return false;
  const std::string proc = fmt::format("/proc/{}", pid);
  bool is_agent = false;
  struct stat st {};
  if (::stat(proc.c_str(), &st) == 0 && st.st_uid == uid) {
    std::ifstream f(proc + "/cmdline");
    std::vector<std::string> argv;
    for (std::string a; std::getline(f, a, '\0');) argv.push_back(a);
    for (std::size_t i = 0; !argv.empty() && argv[0] == agent && i + 1 < argv.size(); ++i)
      if (argv[i] == "--socket" && argv[i + 1] == socket) is_agent = true;
  }
  const bool killed = is_agent && pidfd_signal(fd, SIGKILL) == 0;
  ::close(fd);
  return killed;
}

}  // namespace solar::spank

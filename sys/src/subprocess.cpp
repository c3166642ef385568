// SPDX-License-Identifier: Apache-2.0
#include "solar/sys/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace solar::sys {
namespace {

using Clock = std::chrono::steady_clock;

// spawn without the throw: -1 with errno set when fork fails.
pid_t start(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            const SpawnOptions& opts) {
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(128 + SIGTERM);  // it died before the line above
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGPIPE, SIG_DFL);
  if (!opts.log.empty()) {
    const int fd = ::open(opts.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
  }
  if (opts.in >= 0) ::dup2(opts.in, 0);
  if (opts.out >= 0) ::dup2(opts.out, 1);
  if (opts.err >= 0) ::dup2(opts.err, 2);
  if (opts.search_path)
    ::execvpe(args[0], args.data(), envp.data());
  else
    ::execve(args[0], args.data(), envp.data());
  if (opts.who && *opts.who)
    std::fprintf(stderr, "%s: cannot run %s: %s\n", opts.who, args[0], std::strerror(errno));
  else if (opts.who)
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
  ::_exit(127);
}

std::string seconds_text(double s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", s);
  return buf;
}

}  // namespace

pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            const SpawnOptions& opts) {
  const pid_t pid = start(argv, env, opts);
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  return pid;
}

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  return env;
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool wait_for(pid_t pid, double seconds, int* status) {
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    const pid_t r = ::waitpid(pid, status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return true;
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int run_captured(const std::vector<std::string>& argv, double timeout_s, std::string& out,
                 std::string& err) {
  int po[2], pe[2];
  if (::pipe2(po, O_CLOEXEC) != 0) return err = std::strerror(errno), -1;
  if (::pipe2(pe, O_CLOEXEC) != 0) {
    ::close(po[0]);
    ::close(po[1]);
    return err = std::strerror(errno), -1;
  }
  const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  SpawnOptions opts;
  opts.in = null;
  opts.out = po[1];
  opts.err = pe[1];
  opts.who = "";
  opts.search_path = false;
  const pid_t pid = start(argv, current_environment(), opts);
  const int fork_errno = errno;
  if (null >= 0) ::close(null);
  ::close(po[1]);
  ::close(pe[1]);
  if (pid < 0) {
    ::close(po[0]);
    ::close(pe[0]);
    return err = std::strerror(fork_errno), -1;
  }
  const Clock::time_point deadline =
      Clock::now() +
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  pollfd fds[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
  std::string* sinks[2] = {&out, &err};
  int open_fds = 2;
  bool killed = false;
  while (open_fds > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      ::kill(pid, SIGKILL);
      killed = true;
      break;
    }
    if (::poll(fds, 2, static_cast<int>(std::min<long long>(left, 1000))) < 0 && errno != EINTR) {
      ::kill(pid, SIGKILL);
      killed = true;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  // Reaped within the deadline (plus a grace period after a kill).
  const auto reap_until = std::max(deadline, Clock::now()) + std::chrono::seconds(5);
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return err += "(lost track of it)", -1;
    if (Clock::now() >= reap_until) {
      ::kill(pid, SIGKILL);
      return err += "(did not finish within " + seconds_text(timeout_s) + " s)", -1;
    }
    if (r == 0 && !killed && Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (killed) return err += "(stopped after " + seconds_text(timeout_s) + " s)", -1;
  return status;
}

}  // namespace solar::sys

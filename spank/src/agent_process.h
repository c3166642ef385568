// SPDX-License-Identifier: Apache-2.0
// One node's solar-agent, started from slurmstepd: launched as the job's user in a private
// folder, watched through a pidfd (slurmstepd reaps every child itself, so waitpid cannot be
// relied on), stopped with SIGTERM then SIGKILL.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace solar::spank {

struct AgentLaunch {
  std::string agent;        // binary
  std::string runtime_dir;  // root-owned parent folder (created 0755 if missing)
  std::string dir;          // the step's private folder, created 0700 for the user
  std::string socket;       // inside `dir`
  std::string log;          // the agent's stdout/stderr (created new, by the user)
  std::vector<std::string> args;  // after the binary
  std::vector<std::string> env;   // NAME=VALUE
  uid_t uid = 0;
  gid_t gid = 0;
};

class AgentProcess {
 public:
  AgentProcess() = default;
  AgentProcess(AgentProcess&& o) noexcept;
  AgentProcess& operator=(AgentProcess&& o) noexcept;
  AgentProcess(const AgentProcess&) = delete;
  AgentProcess& operator=(const AgentProcess&) = delete;
  ~AgentProcess();

  // Forks and execs the agent: signals unblocked and reset, fds 0-2 to /dev/null and the log,
  // every other fd closed, new session, oom_score_adj 0, uid/gid fully dropped to the user.
  // Must be called with euid = the user and ruid = 0 (slurmstepd's user_init) or as root.
  // Then waits until its socket accepts a connection. Throws std::runtime_error naming the
  // cause (with the log's last lines) if it cannot start, has not exec'ed or is not ready in
  // `timeout_s` (each bounded by it); the process is gone by then. The log is created new
  // (O_EXCL): an existing name there fails the start.
  static AgentProcess start(const AgentLaunch& launch, double timeout_s);

  pid_t pid() const { return pid_; }
  bool running() const;
  // SIGTERM, up to `grace_s` for it to exit, then SIGKILL. Idempotent.
  void stop(double grace_s);

 private:
  pid_t pid_ = -1;
  int pidfd_ = -1;
};

// The last `lines` lines of a text file, each prefixed with four spaces ("" if unreadable).
std::string tail_of(const std::string& file, std::size_t lines = 4);

// Sends SIGKILL to `pid` only if it is a process of `uid` running `agent` with `socket` on its
// command line (a pid recorded in a user-writable folder is never trusted alone). The pidfd is
// opened before those checks and the signal goes through it, so a pid reused meanwhile is never
// signalled. True if it was such a process.
bool kill_if_agent(pid_t pid, uid_t uid, const std::string& agent, const std::string& socket);

}  // namespace solar::spank

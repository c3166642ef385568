// SPDX-License-Identifier: Apache-2.0
// Child processes (platform code): fork + exec with the steps every child needs, waiting with a
// time limit, running one with its output captured, and exit statuses as shells report them.
// Used by the launcher (agents and ranks), `solar bench loader` (its solar-stored) and srun's
// `solar dataset-info` child (spank/src/srun_side.cpp).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace solar::sys {

struct SpawnOptions {
  std::string log;                // stdout and stderr appended to this file ("" = inherited)
  int in = -1, out = -1, err = -1;  // descriptors to put at the child's fd 0 / 1 / 2 (>= 0; after log)
  // The child's "WHO: cannot run PROGRAM: why" on stderr when exec fails (nullptr: silent;
  // "": "cannot run PROGRAM: why").
  const char* who = "solar run";
  bool search_path = true;  // argv[0] searched on PATH (execvpe), else taken as it is (execve)
};

// fork + exec with `env` as the environment, signals unblocked and SIGPIPE at its default. The
// child gets SIGTERM when the calling thread dies (PR_SET_PDEATHSIG): nothing started here
// outlives a solar tool that was killed. An exec that fails exits 127. Throws
// std::runtime_error ("fork: why") if fork fails.
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            const SpawnOptions& opts = {});

// This process's environment, as NAME=VALUE strings.
std::vector<std::string> current_environment();

// A wait status as a shell's $?: the exit code, or 128+N for signal N.
int exit_code_of(int status);

// Waits for `pid` up to `seconds`; true when it exited (status stored).
bool wait_for(pid_t pid, double seconds, int* status);

// Runs argv as spawn does (this process's environment; argv[0] a path, not searched; exec
// failure: "cannot run PROGRAM: why" on its stderr) with stdin on /dev/null, its stdout and
// stderr captured into `out` and `err`. Killed (SIGKILL) after `timeout_s`, and reaped within
// 5 s more at the most: a child stuck in the kernel (a hung file system) does not hold the
// caller. Returns the wait status; -1 if it could not start ("err" is then the system's
// reason), or was stopped or lost ("err" ends with "(stopped after N s)", "(did not finish
// within N s)" or "(lost track of it)").
int run_captured(const std::vector<std::string>& argv, double timeout_s, std::string& out,
                 std::string& err);

}  // namespace solar::sys

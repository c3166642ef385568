// Child processes of the solar tool (platform code): fork + exec with the steps every child
// needs, waiting with a time limit, and exit statuses as shells report them. Used by the
// launcher (agents and ranks) and `solar bench loader` (its solar-stored).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace solar::cli {

struct SpawnOptions {
  std::string log;           // stdout and stderr appended to this file ("" = inherited)
  int out = -1, err = -1;    // descriptors to put at the child's fd 1 / fd 2 (>= 0; after log)
  // The child's "WHO: cannot run PROGRAM: why" on stderr when exec fails (nullptr: silent).
  const char* who = "solar run";
};

// fork + exec (argv[0] searched on PATH) with `env` as the environment, signals unblocked and
// SIGPIPE at its default. The child gets SIGTERM when the calling thread dies
// (PR_SET_PDEATHSIG): nothing started here outlives a solar tool that was killed. An exec
// that fails exits 127. Throws std::runtime_error if fork fails.
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            const SpawnOptions& opts = {});

// This process's environment, as NAME=VALUE strings.
std::vector<std::string> current_environment();

// A wait status as a shell's $?: the exit code, or 128+N for signal N.
int exit_code_of(int status);

// Waits for `pid` up to `seconds`; true when it exited (status stored).
bool wait_for(pid_t pid, double seconds, int* status);

}  // namespace solar::cli

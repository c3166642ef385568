// SPDX-License-Identifier: Apache-2.0
// The run folder after a kill (used by the launcher).
//
// `solar run` removes its folder (plan, sockets, logs) when it ends, also after Ctrl-C or
// SIGTERM. When it is killed outright (SIGKILL, the OOM killer) its agents and ranks get SIGTERM
// (spawn's PR_SET_PDEATHSIG) and a watchdog, forked when the folder is made, removes the folder
// once they are gone. A folder left anyway (the whole process group killed, the watchdog too)
// carries its owner in solar-run.owner, and the next `solar run` of the same user with the same
// TMPDIR removes it if that owner is dead.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>

namespace solar::cli {

inline constexpr const char* kOwnerFile = "solar-run.owner";
// The local tier's folders a run keeps outside its folder (solar run --local-dir), one a line:
// removed with the run folder by the watchdog and by the sweep below, each only if it is a
// folder of this user named after the run folder (RUNFOLDER-nodeM).
inline constexpr const char* kLocalDirsFile = "local-dirs";

// Removes a run folder and the local tier's folders it lists (kLocalDirsFile).
void remove_run_dir(const std::filesystem::path& dir);

// Who owns a run folder: this boot, this pid namespace, this process and its start time (a pid
// alone may be reused).
std::string owner_line(pid_t pid);

// Removes the run folders under `base` that a killed `solar run` of this user left: only those
// with an owner file naming a process of this boot and pid namespace that no longer runs.
void sweep_leftover_run_dirs(const std::filesystem::path& base);

// The launcher's side of the watchdog: forked at once (the process has one thread here).
class RunDirWatch {
 public:
  explicit RunDirWatch(const std::filesystem::path& dir);
  ~RunDirWatch();
  RunDirWatch(const RunDirWatch&) = delete;
  RunDirWatch& operator=(const RunDirWatch&) = delete;
  void agent(pid_t pid);

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
};

}  // namespace solar::cli

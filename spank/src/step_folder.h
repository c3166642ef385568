// SPDX-License-Identifier: Apache-2.0
// Where one step's files live, and how slurmstepd and the epilog open what the job's user (or
// another user) can place there. plan_dir is 1777 and shared: every step gets a private folder
// in it, made by srun under a name nobody could take beforehand, and found again by the nodes
// and the epilog from the job and step ids and its owner, never from the job's environment.
// runtime_dir's per-step folders are root's choice of name but the user's to fill. Nothing
// here follows a link at the name it opens, blocks on a FIFO, or trusts a file it has not
// checked through the descriptor it opened.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace solar::spank {

// The prefix every step folder of job J, step S in plan_dir starts with: "solar-J.S.".
std::string step_folder_prefix(std::uint32_t job, std::uint32_t step);

// Makes the step's folder plan_dir/solar-J.S.XXXXXX (mkdtemp: a fresh name, created 0700 and
// the caller's, never an existing one). Throws std::runtime_error naming plan_dir and the
// system error.
std::string create_step_folder(const std::string& plan_dir, std::uint32_t job,
                               std::uint32_t step);

// The step's folder that `uid` made: the entry of plan_dir named solar-J.S.* that is a folder
// (not a link), owned by `uid`, mode 0700. Another user can create such names but not such
// folders. nullopt if there is none; throws std::runtime_error if there are several (only the
// user can have made them).
std::optional<std::string> find_step_folder(const std::string& plan_dir, std::uint32_t job,
                                            std::uint32_t step, uid_t uid);

// Every folder of job J (solar-J.*) in `dir` that is a folder (not a link) owned by `uid`
// (the epilog's sweep of plan_dir and runtime_dir).
std::vector<std::string> job_folders(const std::string& dir, const std::string& prefix,
                                     uid_t uid);

// The files in a step folder.
std::string plan_in(const std::string& folder);                          // plan
std::string agent_log_in(const std::string& folder, std::uint32_t node);  // nodeN.log
std::string peer_dir_in(const std::string& folder);                      // peers/
std::string index_in(const std::string& folder);  // dataset.index (a dataset of many files)

// Opens `path` read-only if it is a regular file owned by `uid`: O_NOFOLLOW (a link at the
// name is refused), O_NONBLOCK (a FIFO there cannot block the open), O_CLOEXEC; type and owner
// are checked with fstat on the descriptor. -1 with errno set otherwise (EPERM: not such a
// file).
int open_owned_file(const std::string& path, uid_t uid);

// The first `max_bytes` at most of such a file; nullopt if open_owned_file refuses it.
std::optional<std::string> read_owned_file(const std::string& path, uid_t uid,
                                           std::size_t max_bytes);

// Creates `path` for writing, 0600, only if no entry of that name exists (O_EXCL, O_NOFOLLOW,
// O_CLOEXEC, and `flags`, e.g. O_APPEND). -1 with errno set otherwise. Only open(2): safe in a
// forked child.
int create_new_file(const std::string& path, int flags = 0);

}  // namespace solar::spank

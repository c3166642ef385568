// SPDX-License-Identifier: Apache-2.0
#include "step_folder.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace solar::spank {
namespace {

// The entries of `dir` whose name starts with `prefix` and that are folders of `uid` (lstat:
// a link is not one), with their mode.
std::vector<std::pair<std::string, mode_t>> owned_folders(const std::string& dir,
                                                          const std::string& prefix, uid_t uid) {
  std::vector<std::pair<std::string, mode_t>> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (const dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) != 0) continue;
    const std::string path = dir + "/" + e->d_name;
    struct stat st {};
    // The permission bits only: in a setgid plan_dir (a group project space) mkdtemp's folder
    // inherits S_ISGID, which grants nobody access.
    if (::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == uid)
      out.emplace_back(path, st.st_mode & 0777);
  }
  ::closedir(d);
  return out;
}

}  // namespace

std::string step_folder_prefix(std::uint32_t job, std::uint32_t step) {
  return fmt::format("solar-{}.{}.", job, step);
}

std::string create_step_folder(const std::string& plan_dir, std::uint32_t job,
                               std::uint32_t step) {
  std::string name = plan_dir + "/" + step_folder_prefix(job, step) + "XXXXXX";
  if (!::mkdtemp(name.data()))
    throw std::runtime_error(fmt::format("cannot create the step's folder in plan_dir {}: {}",
                                         plan_dir, std::strerror(errno)));
  return name;
}

std::optional<std::string> find_step_folder(const std::string& plan_dir, std::uint32_t job,
                                            std::uint32_t step, uid_t uid) {
  std::optional<std::string> found;
  for (const auto& [path, mode] : owned_folders(plan_dir, step_folder_prefix(job, step), uid)) {
    if (mode != 0700) continue;
    if (found)
      throw std::runtime_error(fmt::format("plan_dir holds two folders of this step, {} and {}: "
                                           "only srun makes them",
                                           *found, path));
    found = path;
  }
  return found;
}

std::vector<std::string> job_folders(const std::string& dir, const std::string& prefix,
                                     uid_t uid) {
  std::vector<std::string> out;
  for (auto& [path, mode] : owned_folders(dir, prefix, uid)) out.push_back(std::move(path));
  return out;
}

std::string plan_in(const std::string& folder) { return folder + "/plan"; }
std::string index_in(const std::string& folder) { return folder + "/dataset.index"; }
std::string agent_log_in(const std::string& folder, std::uint32_t node) {
  return fmt::format("{}/node{}.log", folder, node);
}
std::string peer_dir_in(const std::string& folder) { return folder + "/peers"; }

int open_owned_file(const std::string& path, uid_t uid) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != uid) {
    ::close(fd);
    errno = EPERM;
    return -1;
  }
  return fd;
}

std::optional<std::string> read_owned_file(const std::string& path, uid_t uid,
                                           std::size_t max_bytes) {
  const int fd = open_owned_file(path, uid);
  if (fd < 0) return std::nullopt;
  std::string out(max_bytes, '\0');
  std::size_t got = 0;
  while (got < max_bytes) {
    const ssize_t n = ::read(fd, out.data() + got, max_bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

int create_new_file(const std::string& path, int flags) {
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | flags, 0600);
}

}  // namespace solar::spank

// SPDX-License-Identifier: Apache-2.0
#include "solar/sys/remove_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

namespace solar::sys {
namespace {

// Empties the folder `p` (see remove_tree); false if it could not.
bool empty_tree(const std::filesystem::path& p,
                std::chrono::steady_clock::time_point deadline) noexcept {
  int cur = ::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (cur < 0) return errno == ENOENT;
  std::vector<std::pair<dev_t, ino_t>> path;  // the folders from `p` down to `cur`
  struct stat st {};
  if (::fstat(cur, &st) != 0) {
    ::close(cur);
    return false;
  }
  path.emplace_back(st.st_dev, st.st_ino);
  bool ok = true;
  while (ok) {
    if (std::chrono::steady_clock::now() > deadline) {
      ok = false;
      break;
    }
    // A listing of its own (openat "."): a dup would share the offset of the last one.
    const int list_fd = ::openat(cur, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR* d = list_fd >= 0 ? ::fdopendir(list_fd) : nullptr;
    if (!d) {
      if (list_fd >= 0) ::close(list_fd);
      ok = false;
      break;
    }
    int child = -1;
    while (const dirent* e = ::readdir(d)) {
      const char* n = e->d_name;
      if (std::strcmp(n, ".") == 0 || std::strcmp(n, "..") == 0) continue;
      if (::unlinkat(cur, n, 0) == 0 || errno == ENOENT) continue;
      if (errno != EISDIR && errno != EPERM) {
        ok = false;
        break;
      }
      if (::unlinkat(cur, n, AT_REMOVEDIR) == 0 || errno == ENOENT) continue;
      if (errno != ENOTEMPTY && errno != EEXIST) {
        ok = false;
        break;
      }
      child = ::openat(cur, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (child >= 0) break;
      if (errno != ENOENT && errno != ENOTDIR && errno != ELOOP) ok = false;  // else: replaced
      if (!ok) break;
    }
    ::closedir(d);
    if (!ok) break;
    if (child >= 0) {  // down into a folder that is not empty, then list it from its start
      if (::fstat(child, &st) != 0) {
        ::close(child);
        ok = false;
        break;
      }
      path.emplace_back(st.st_dev, st.st_ino);
      ::close(cur);
      cur = child;
      continue;
    }
    // `cur` is empty: back up, where the next listing removes it.
    if (path.size() == 1) break;
    const int up = ::openat(cur, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    path.pop_back();
    if (up < 0 || ::fstat(up, &st) != 0 || st.st_dev != path.back().first ||
        st.st_ino != path.back().second) {
      if (up >= 0) ::close(up);
      ok = false;  // moved out of the tree meanwhile: never follow it there
      break;
    }
    ::close(cur);
    cur = up;
  }
  ::close(cur);
  return ok;
}

}  // namespace

bool remove_tree(const std::filesystem::path& p,
                 std::chrono::steady_clock::duration budget) noexcept {
  const auto deadline = std::chrono::steady_clock::now() + budget;
  for (;;) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) return errno == ENOENT;
    if (!S_ISDIR(st.st_mode)) return ::unlink(p.c_str()) == 0 || errno == ENOENT;
    if (!empty_tree(p, deadline)) return false;
    if (::rmdir(p.c_str()) == 0 || errno == ENOENT) return true;
    // Something was added since the last listing: list again, while there is time.
    if ((errno != ENOTEMPTY && errno != EEXIST) || std::chrono::steady_clock::now() > deadline)
      return false;
  }
}

}  // namespace solar::sys

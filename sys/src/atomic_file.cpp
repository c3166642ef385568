// SPDX-License-Identifier: Apache-2.0
#include "solar/sys/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <string>

namespace solar::sys {

const char* write_file_atomically(const std::filesystem::path& path, std::string_view bytes,
                                  mode_t mode) {
  // Beside it, hidden, unique in this process (and O_EXCL against anyone else's).
  static std::atomic<std::uint64_t> serial{0};
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  std::string temp;
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 16; ++tries) {
    temp = (dir / ("." + path.filename().string() + "." + std::to_string(::getpid()) + "." +
                   std::to_string(serial++)))
               .string();
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return "cannot create a temporary file beside it";
  auto fail = [&](const char* what) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(temp.c_str());
    errno = err;
    return what;
  };
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = ENOSPC;
      return fail("writing");
    }
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0) return fail("writing");
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) return fail("writing");
  if (::rename(temp.c_str(), path.c_str()) != 0) return fail("renaming the temporary file over it");
  return nullptr;
}

}  // namespace solar::sys

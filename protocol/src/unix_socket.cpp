// SPDX-License-Identifier: Apache-2.0
#include "solar/unix_socket.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace solar::protocol {

std::size_t max_unix_path() { return sizeof(sockaddr_un::sun_path) - 1; }

UnixConnection connect_unix(std::string_view path, const UnixConnectOptions& o) {
  UnixConnection c;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() > max_unix_path()) {
    c.failed = UnixConnection::Failed::path_too_long;
    c.error = ENAMETOOLONG;
    return c;
  }
  std::memcpy(addr.sun_path, path.data(), path.size());  // addr{} holds the NUL
  const int fd =
      ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (o.nonblocking ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) {
    c.failed = UnixConnection::Failed::socket;
    c.error = errno;
    return c;
  }
  if (o.timeout_s > 0) {
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(o.timeout_s);
    tv.tv_usec = static_cast<suseconds_t>((o.timeout_s - static_cast<double>(tv.tv_sec)) * 1e6);
    if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;  // {0, 0} would mean no limit
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    c.failed = UnixConnection::Failed::connect;
    c.error = errno;
    ::close(fd);
    errno = c.error;
    return c;
  }
  c.fd = fd;
  return c;
}

}  // namespace solar::protocol

// SPDX-License-Identifier: Apache-2.0
// connect_unix (protocol/include/solar/unix_socket.h): which step failed, with its errno, and
// the options every caller relies on.
#include "solar/unix_socket.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace fs = std::filesystem;
using solar::protocol::connect_unix;
using solar::protocol::UnixConnection;

namespace {

// A listening socket in a fresh folder, gone with the object.
struct Listener {
  fs::path dir;
  std::string path;
  int fd = -1;
  explicit Listener(int backlog = 4) {
    char tmpl[] = "/tmp/solar-unix-XXXXXX";
    dir = ::mkdtemp(tmpl);
    path = (dir / "s").string();
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd, backlog), 0);
  }
  ~Listener() {
    if (fd >= 0) ::close(fd);
    fs::remove_all(dir);
  }
};

}  // namespace

TEST(UnixSocket, ConnectsCloseOnExec) {
  Listener l;
  const UnixConnection c = connect_unix(l.path);
  ASSERT_TRUE(c);
  EXPECT_EQ(c.failed, UnixConnection::Failed::nothing);
  EXPECT_NE(::fcntl(c.fd, F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_EQ(::fcntl(c.fd, F_GETFL) & O_NONBLOCK, 0);
  ::close(c.fd);
}

TEST(UnixSocket, NonblockingStaysNonblocking) {
  Listener l;
  const UnixConnection c = connect_unix(l.path, {.nonblocking = true});
  ASSERT_TRUE(c);
  EXPECT_NE(::fcntl(c.fd, F_GETFL) & O_NONBLOCK, 0);
  ::close(c.fd);
}

TEST(UnixSocket, TimeoutSetsBothDirections) {
  Listener l;
  const UnixConnection c = connect_unix(l.path, {.timeout_s = 2.5});
  ASSERT_TRUE(c);
  for (const int opt : {SO_RCVTIMEO, SO_SNDTIMEO}) {
    timeval tv{};
    socklen_t n = sizeof tv;
    ASSERT_EQ(::getsockopt(c.fd, SOL_SOCKET, opt, &tv, &n), 0);
    EXPECT_EQ(tv.tv_sec, 2);
    EXPECT_NEAR(static_cast<double>(tv.tv_usec), 500000, 10000);
  }
  ::close(c.fd);
}

TEST(UnixSocket, NobodyThereIsAConnectError) {
  const UnixConnection missing = connect_unix("/nonexistent/solar/socket");
  EXPECT_FALSE(missing);
  EXPECT_EQ(missing.failed, UnixConnection::Failed::connect);
  EXPECT_EQ(missing.error, ENOENT);

  Listener l;
  ::close(l.fd);  // the socket file stays, nobody listens
  l.fd = -1;
  const UnixConnection refused = connect_unix(l.path);
  EXPECT_EQ(refused.failed, UnixConnection::Failed::connect);
  EXPECT_EQ(refused.error, ECONNREFUSED);
}

TEST(UnixSocket, APathThatDoesNotFitIsRefusedBeforeAnySocket) {
  EXPECT_EQ(solar::protocol::max_unix_path(), sizeof(sockaddr_un::sun_path) - 1);
  const std::string fits(solar::protocol::max_unix_path(), 'x');
  EXPECT_EQ(connect_unix(fits).failed, UnixConnection::Failed::connect);
  const UnixConnection c = connect_unix(fits + "x");
  EXPECT_FALSE(c);
  EXPECT_EQ(c.failed, UnixConnection::Failed::path_too_long);
  EXPECT_EQ(c.error, ENAMETOOLONG);
}

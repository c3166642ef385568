// SPDX-License-Identifier: Apache-2.0
// Passing an fd with a message (protocol/include/solar/fd_passing.h), over a socketpair.
#include "solar/fd_passing.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

using solar::protocol::recv_with_fd;
using solar::protocol::send_with_fd;

TEST(FdPassing, TheFdComesWithTheBytesCloseOnExec) {
  int sv[2], p[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ASSERT_EQ(::pipe(p), 0);
  ASSERT_EQ(send_with_fd(sv[0], "hello", 5, p[1], MSG_NOSIGNAL), 5);
  char got[5] = {};
  int fd = -1;
  ASSERT_EQ(recv_with_fd(sv[1], got, sizeof got, &fd, MSG_WAITALL), 5);
  EXPECT_EQ(std::memcmp(got, "hello", 5), 0);
  ASSERT_GE(fd, 0);
  EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  ASSERT_EQ(::write(fd, "x", 1), 1);  // the pipe's write end, received
  char c = 0;
  ASSERT_EQ(::read(p[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  // Bytes without an fd leave *fd as it is.
  ASSERT_EQ(::send(sv[0], "ab", 2, MSG_NOSIGNAL), 2);
  int none = -7;
  EXPECT_EQ(recv_with_fd(sv[1], got, 2, &none, 0), 2);
  EXPECT_EQ(none, -7);
  // The peer gone: 0, no fd.
  ::close(sv[0]);
  EXPECT_EQ(recv_with_fd(sv[1], got, 1, &none, 0), 0);
  EXPECT_EQ(none, -7);
  for (int f : {sv[1], p[0], p[1], fd}) ::close(f);
}

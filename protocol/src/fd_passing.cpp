// SPDX-License-Identifier: Apache-2.0
#include "solar/fd_passing.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace solar::protocol {
namespace {

// One buffer and room for one fd, as sendmsg and recvmsg take them.
struct OneFdMessage {
  struct iovec iov;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr mh {};
  OneFdMessage(const OneFdMessage&) = delete;  // mh points into it
  OneFdMessage(void* data, std::size_t n) : iov{data, n} {
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
  }
};

}  // namespace

ssize_t send_with_fd(int sock, const void* data, std::size_t n, int fd, int flags) {
  OneFdMessage m(const_cast<void*>(data), n);
  struct msghdr& mh = m.mh;
  struct cmsghdr* cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  ssize_t r;
  do r = ::sendmsg(sock, &mh, flags);
  while (r < 0 && errno == EINTR);
  return r;
}

ssize_t recv_with_fd(int sock, void* data, std::size_t n, int* fd, int flags) {
  OneFdMessage m(data, n);
  struct msghdr& mh = m.mh;
  ssize_t r;
  do r = ::recvmsg(sock, &mh, flags | MSG_CMSG_CLOEXEC);
  while (r < 0 && errno == EINTR);
  const int err = errno;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
      std::memcpy(fd, CMSG_DATA(cm), sizeof(int));
  errno = err;
  return r;
}

}  // namespace solar::protocol

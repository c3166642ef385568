// SPDX-License-Identifier: Apache-2.0
// Passing one file descriptor with a message over a Unix stream socket (SCM_RIGHTS): the agent
// sends its buffer's memfd with the hello reply, libsolar receives it. (The interposer, plain C,
// keeps its own recv_all.)
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace solar::protocol {

// Sends `n` bytes of `data` with `fd` attached to them; sendmsg's result (EINTR retried): the
// bytes sent (the fd goes with the first), or -1 and errno. `flags`: sendmsg's (MSG_DONTWAIT,
// MSG_NOSIGNAL, ...).
ssize_t send_with_fd(int sock, const void* data, std::size_t n, int fd, int flags);

// Receives up to `n` bytes into `data` and the fd that came with them into *fd (close-on-exec;
// left as it is when none came); recvmsg's result (EINTR retried). `flags`: recvmsg's
// (MSG_WAITALL, ...).
ssize_t recv_with_fd(int sock, void* data, std::size_t n, int* fd, int flags);

}  // namespace solar::protocol

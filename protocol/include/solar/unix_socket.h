// SPDX-License-Identifier: Apache-2.0
// Connecting to a node-local Unix stream socket: the agent's control socket, asked by the
// launcher (is the agent up, its stats), the SPANK plugin (does it answer yet), libsolar (the
// rank's session) and the agent itself (is another agent serving this path). One function, so
// the path's limit, close-on-exec and the timeouts are decided once. The interposer
// (interpose/src/preload.c, plain C, libc only) keeps its own few lines.
#pragma once

#include <cstddef>
#include <string_view>

namespace solar::protocol {

struct UnixConnectOptions {
  // SOCK_NONBLOCK: connect answers at once (EAGAIN when the listener's backlog is full,
  // EINPROGRESS) instead of waiting; the socket stays non-blocking.
  bool nonblocking = false;
  // > 0: SO_RCVTIMEO and SO_SNDTIMEO of that many seconds, set before connecting (the send
  // timeout bounds connect too: EAGAIN when it runs out). 0: no limit.
  double timeout_s = 0;
};

// A connected socket, or which step failed and its errno. The caller closes `fd`.
struct UnixConnection {
  enum class Failed { nothing, path_too_long, socket, connect };
  int fd = -1;
  Failed failed = Failed::nothing;
  int error = 0;  // errno of the failed step (ENAMETOOLONG for a path that does not fit)
  explicit operator bool() const { return fd >= 0; }
};

// The longest path a Unix socket address holds (sun_path less its terminating NUL).
std::size_t max_unix_path();

// Connects a close-on-exec stream socket to `path`; never leaves an fd open on failure.
UnixConnection connect_unix(std::string_view path, const UnixConnectOptions& options = {});

}  // namespace solar::protocol

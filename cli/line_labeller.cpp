// SPDX-License-Identifier: Apache-2.0
#include "line_labeller.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fmt/format.h>
#include <optional>
#include <stdexcept>

namespace solar::cli {
namespace {

using Clock = std::chrono::steady_clock;

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // EPIPE (SIGPIPE is blocked in this thread) and the like: drop it
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace

LineLabeller::LineLabeller() {
  if (::pipe2(stop_, O_CLOEXEC) != 0)
    throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
}

LineLabeller::~LineLabeller() {
  finish(0);
  for (auto& s : streams_)
    if (s.fd >= 0) ::close(s.fd);
  ::close(stop_[0]);
  ::close(stop_[1]);
}

int LineLabeller::add(int dest, std::string label) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0)
    throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
  streams_.push_back({p[0], dest, std::move(label), {}});
  return p[1];
}

void LineLabeller::start() {
  thread_ = std::thread([this] { loop(); });
}

void LineLabeller::finish(double grace) {
  if (!thread_.joinable()) return;
  {
    std::lock_guard g(mu_);
    grace_ = grace;
  }
  const char x = 0;
  [[maybe_unused]] const ssize_t w = ::write(stop_[1], &x, 1);
  thread_.join();
}

void LineLabeller::emit(Stream& s, std::string_view line) {
  std::string out;
  out.reserve(s.label.size() + line.size() + 1);
  out.append(s.label).append(line).push_back('\n');
  write_all(s.dest, out.data(), out.size());
}

LineLabeller::Got LineLabeller::pump(Stream& s) {
  char buf[65536];
  const ssize_t n = ::read(s.fd, buf, sizeof buf);
  if (n < 0) return errno == EINTR || errno == EAGAIN ? Got::nothing : Got::end;
  if (n == 0) return Got::end;
  s.partial.append(buf, static_cast<std::size_t>(n));
  std::size_t from = 0;
  for (std::size_t nl; (nl = s.partial.find('\n', from)) != std::string::npos; from = nl + 1)
    emit(s, std::string_view(s.partial).substr(from, nl - from));
  s.partial.erase(0, from);
  if (s.partial.size() >= kMaxLine) {
    emit(s, s.partial);
    s.partial.clear();
  }
  return Got::data;
}

void LineLabeller::close_stream(Stream& s) {
  if (!s.partial.empty()) emit(s, s.partial);
  s.partial.clear();
  ::close(s.fd);
  s.fd = -1;
}

void LineLabeller::loop() {
  sigset_t pipe_sig;
  sigemptyset(&pipe_sig);
  sigaddset(&pipe_sig, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_sig, nullptr);
  std::optional<Clock::time_point> until;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Stream*> who;
    for (auto& s : streams_)
      if (s.fd >= 0) {
        fds.push_back({s.fd, POLLIN, 0});
        who.push_back(&s);
      }
    if (fds.empty()) return;
    if (!until) fds.push_back({stop_[0], POLLIN, 0});
    int timeout = -1;
    if (until) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(*until - Clock::now());
      if (left.count() <= 0) break;
      timeout = static_cast<int>(left.count());
    }
    if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) break;
    for (std::size_t i = 0; i < who.size(); ++i)
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR))
        if (pump(*who[i]) == Got::end) close_stream(*who[i]);
    if (!until && (fds.back().revents & POLLIN)) {
      std::lock_guard g(mu_);
      until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(grace_));
    }
  }
  // Past the grace period: take what is in the pipes now and stop.
  for (auto& s : streams_) {
    if (s.fd < 0) continue;
    ::fcntl(s.fd, F_SETFL, ::fcntl(s.fd, F_GETFL) | O_NONBLOCK);
    while (pump(s) == Got::data) {
    }
    close_stream(s);
  }
}

}  // namespace solar::cli

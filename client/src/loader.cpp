// SPDX-License-Identifier: Apache-2.0
#include "loader.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>

#include "cuda_runtime.h"
#include "direct_source.h"
#include "solar/core/agent_budget.h"
#include "solar/storage/dataset_files.h"
#include "solar/fd_passing.h"
#include "solar/unix_socket.h"

using solar::client::ClientError;
#ifdef SOLAR_WITH_CUDA
using solar::client::cuda;
#endif

namespace {

// Exactly n bytes or an error (EINTR retried); errno is 0 when the peer closed the connection.
bool write_all(int fd, const void* p, std::size_t n) {
  const auto* c = static_cast<const char*>(p);
  while (n) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* p, std::size_t n) {
  auto* c = static_cast<char*>(p);
  while (n) {
    const ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) errno = 0;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

// What a rank says of a reply in another protocol version than its own.
std::string other_version_text(const solar::protocol::Header& h) {
  return fmt::format("the agent speaks protocol version {}, this libsolar ({}) version {}: the "
                     "agent and libsolar come from different solar builds; install both from one",
                     h.version, SOLAR_VERSION_STRING, solar::protocol::kVersion);
}

}  // namespace

void solar_loader::open_source() {
  if (source) return;
  solar::storage::SourceOptions so;
  so.label_dataset = where.labels;
  so.expect_identity = header.dataset_identity;  // never another file's bytes
  // The plan was made from this dataset: a solar-stored restarting right now (the moment
  // this rank's agent is gone) is waited for, as a lost server is, not an error at once.
  so.wait_for_server = true;
  source = solar::client::open_direct_source(where.dataset, so);
  const auto& info = source->info();
  // A sized plan counts each sample's bytes (read_lengths checks them); others one size.
  if (info.samples != header.config.samples ||
      (!header.config.sized() && info.sample_bytes != header.config.sample_bytes))
    throw ClientError(fmt::format("{} has {} samples of {} bytes, the plan expects {} of {}",
                                  source->describe(), info.samples, info.sample_bytes,
                                  header.config.samples, header.config.sample_bytes));
  if (format.sample_bytes == 0) {
    format.sample_bytes = info.sample_bytes;
    format.label_bytes = info.has_labels ? info.label_bytes : 0;
    format.dtype = solar::storage::to_string(info.dtype);
    format.label_dtype = info.has_labels ? std::string(solar::storage::to_string(info.label_dtype)) : "";
    format.shape = info.sample_shape;
  } else if (format.label_bytes != (info.has_labels ? info.label_bytes : 0)) {
    throw ClientError(fmt::format("{}: label size differs from the agent's", source->describe()));
  }
}

std::uint64_t solar_batch::bytes() const {
  if (loader->lengths.empty()) return samples.size() * loader->format.sample_bytes;
  std::uint64_t n = 0;
  for (std::uint32_t x : samples) n += loader->lengths[x];
  return n;
}

void solar_loader::read_lengths() {
  open_source();
  lengths = solar::storage::stored_sample_sizes(*source);
  const std::vector<std::uint64_t>& planned = *header.config.sample_sizes;
  const std::size_t x = solar::first_size_unlike_planned(lengths, planned);
  if (lengths.size() != planned.size() || x != planned.size())
    throw ClientError(fmt::format(
        "{} does not hold the samples the plan was made for ({}); recompute the plan for this "
        "dataset",
        source->describe(),
        lengths.size() != planned.size()
            ? fmt::format("{} samples of differing sizes, the plan {}", lengths.size(),
                          planned.size())
            : fmt::format("sample {} is {} bytes, the plan counts {}", x, lengths[x], planned[x])));
}

void solar_loader::read_directly(const std::vector<std::size_t>& which) {
  open_source();
  const bool stored = !lengths.empty() || source->info().whole_files;
  std::uint64_t need = 0;
  for (std::size_t i : which) need += length_of(batch.samples[i]);
  batch.own.resize(need);
  std::uint64_t at = 0;
  for (std::size_t i : which) {
    const std::uint32_t x = batch.samples[i];
    const solar::storage::SampleRun one[] = {{x, 1}};
    if (stored) source->read_stored(one, batch.own.data() + at, length_of(x));
    else source->read(one, batch.own.data() + at);
    batch.data[i] = batch.own.data() + at;
    at += length_of(x);
  }
}

void solar_loader::drop_agent(const std::string& why) {
  if (sock >= 0) {
    ::close(sock);
    sock = -1;
    std::fprintf(stderr,
                 "solar: rank %u: %s; continuing from step %llu by reading %s directly "
                 "(same samples, same order)\n",
                 header.config.ranks_per_node * node + local_rank, why.c_str(),
                 static_cast<unsigned long long>(cursor), where.dataset.c_str());
  }
}

std::string solar_loader::agent_gone(int err) const {
  if (err == EAGAIN || err == EWOULDBLOCK)
    return fmt::format("the agent did not answer within {:g} s (SOLAR_AGENT_TIMEOUT)",
                       agent_timeout);
  return "the agent went away";
}

void solar_loader::attach() {
  using solar::protocol::UnixConnection;
  const UnixConnection conn =
      solar::protocol::connect_unix(where.socket_path, {.timeout_s = agent_timeout});
  if (conn.failed == UnixConnection::Failed::path_too_long ||
      conn.failed == UnixConnection::Failed::socket) {
    std::fprintf(stderr, "solar: SOLAR_SOCKET path too long; reading directly\n");
    return;
  }
  if (!conn) {
    const int err = conn.error;
    if (err == EAGAIN)
      std::fprintf(stderr,
                   "solar: the agent at %s accepted no connection within %g s "
                   "(SOLAR_AGENT_TIMEOUT); reading %s directly\n",
                   where.socket_path.c_str(), agent_timeout, where.dataset.c_str());
    else
      std::fprintf(stderr, "solar: no agent at %s (%s); reading %s directly\n",
                   where.socket_path.c_str(), std::strerror(err), where.dataset.c_str());
    return;
  }
  const int fd = conn.fd;
  sock = fd;
  const solar::protocol::Hello hi{local_rank, static_cast<std::uint32_t>(::getpid())};
  char out[sizeof(solar::protocol::Header) + sizeof hi];
  if (!write_all(fd, out, solar::protocol::put_frame(out, solar::protocol::Op::hello, &hi, sizeof hi)))
    return drop_agent(errno == EAGAIN ? agent_gone(errno) : "the agent closed the connection");
  // The reply's header carries the buffer's fd; then its payload.
  solar::protocol::Header rh;
  int memfd = -1;
  const ssize_t n = solar::protocol::recv_with_fd(fd, &rh, sizeof rh, &memfd, MSG_WAITALL);
  const int err = n < 0 ? errno : 0;
  auto refused = [&](const std::string& why) {
    if (memfd >= 0) ::close(memfd);
    drop_agent(why);
  };
  if (n != static_cast<ssize_t>(sizeof rh))
    return refused(err == EAGAIN || err == EWOULDBLOCK
                       ? agent_gone(err)
                       : std::string("the agent closed the connection without answering (see "
                                     "its log)"));
  if (solar::protocol::other_version(rh)) {
    // An agent of another build: its error frame (an agent of version 2 or later sends one)
    // says why; either way this libsolar cannot read its replies.
    std::string why;
    if (rh.op == static_cast<std::uint16_t>(solar::protocol::Op::error) &&
        rh.length <= 4096) {
      std::vector<char> text(rh.length);
      if (read_all(fd, text.data(), text.size())) why = std::string(text.begin(), text.end());
    }
    return refused(why.empty() ? other_version_text(rh)
                               : "the agent refused this rank: " + why);
  }
  std::vector<std::uint8_t> body(solar::protocol::acceptable(rh) ? rh.length : 0);
  if (!solar::protocol::acceptable(rh) || !read_all(fd, body.data(), body.size()))
    return refused(solar::protocol::acceptable(rh) ? agent_gone(errno)
                                                   : "unexpected reply from the agent");
  if (rh.op == static_cast<std::uint16_t>(solar::protocol::Op::error))
    return refused("the agent refused this rank: " + std::string(body.begin(), body.end()));
  if (rh.op != static_cast<std::uint16_t>(solar::protocol::Op::hello_ok) ||
      body.size() != sizeof hello || memfd < 0)
    return refused("unexpected reply from the agent");
  std::memcpy(&hello, body.data(), sizeof hello);
  if (hello.total_steps != T || hello.ranks_per_node != R || hello.samples != header.config.samples) {
    ::close(memfd);
    return drop_agent("the agent serves a different plan");
  }
  if (hello.start_step > T) {
    ::close(memfd);
    return drop_agent("the agent's start step is beyond the plan");
  }
  if (!start_given) {
    cursor = hello.start_step;  // the agent serves steps from its start on
  } else if (hello.start_step > cursor) {
    ::close(memfd);
    return drop_agent(fmt::format("the agent starts at step {} but this rank at step {} "
                                  "(SOLAR_START_EPOCH/SOLAR_START_STEP): it does not serve the "
                                  "steps in between",
                                  hello.start_step, cursor));
  }
  // Samples in slots, then the labels (version 4); a layout that does not add up is not
  // mapped.
  const std::uint64_t samples_end = hello.slots * hello.slot_bytes;
  // A sized plan: 64-byte units of one arena, each sample over its own length (version 8).
  if ((header.config.sized() ? hello.slot_bytes != 64 || hello.label_bytes
                             : hello.slot_bytes < hello.sample_bytes) ||
      (hello.label_bytes && hello.labels_offset < samples_end)) {
    ::close(memfd);
    return drop_agent("the agent's buffer layout is inconsistent");
  }
  map_bytes = hello.label_bytes ? hello.labels_offset + hello.slots * hello.label_bytes
                                : samples_end;
  // Not MAP_POPULATE: populating the whole buffer up front costs more than it saves (on
  // shadow-paged VMs, 3x more on the first pass over the buffer).
  void* p = ::mmap(nullptr, map_bytes, PROT_READ, MAP_SHARED, memfd, 0);
  ::close(memfd);
  if (p == MAP_FAILED) return drop_agent(fmt::format("mapping the buffer failed: {}",
                                                     std::strerror(errno)));
  base = static_cast<std::byte*>(p);
  format.sample_bytes = hello.sample_bytes;
  format.label_bytes = hello.label_bytes;
  ask_ahead = std::clamp<std::uint64_t>(hello.ask_ahead, 1, kMaxAskAhead);
  format.dtype.assign(hello.dtype, strnlen(hello.dtype, sizeof hello.dtype));
  format.label_dtype.assign(hello.label_dtype, strnlen(hello.label_dtype, sizeof hello.label_dtype));
  if (hello.shape_dims <= solar::protocol::HelloOk::kMaxShapeDims)
    format.shape.emplace(hello.shape, hello.shape + hello.shape_dims);
  // This rank starts after the agent's start: the agent runs its plan in order, so the
  // steps in between are taken and released (read by the agent, not copied here).
  const std::uint64_t want = cursor;
  cursor = asked = hello.start_step;
  skip_with_agent(want);
}

void solar_loader::skip_with_agent(std::uint64_t step) {
  while (cursor < step && sock >= 0) {
    if (!next_from_agent()) break;
    releases.note(cursor);
    ++cursor;
  }
  cursor = std::max(cursor, step);
}

std::optional<std::string> solar_loader::last_words() {
  for (;;) {  // whatever has arrived, without waiting
    if (rx.bytes.size() - rx.end < 16384) rx.bytes.resize(rx.end + 16384);
    const ssize_t r = ::recv(sock, rx.bytes.data() + rx.end, rx.bytes.size() - rx.end, MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    rx.end += static_cast<std::size_t>(r);
  }
  solar::protocol::Header rh;
  for (std::size_t at = rx.begin; rx.end - at >= sizeof rh;) {
    std::memcpy(&rh, rx.bytes.data() + at, sizeof rh);
    if (!solar::protocol::acceptable(rh) || rx.end - at < sizeof rh + rh.length) break;
    if (rh.op == static_cast<std::uint16_t>(solar::protocol::Op::error))
      return "the agent refused: " +
             std::string(rx.bytes.begin() + static_cast<std::ptrdiff_t>(at + sizeof rh),
                         rx.bytes.begin() + static_cast<std::ptrdiff_t>(at + sizeof rh + rh.length));
    at += sizeof rh + rh.length;
  }
  return std::nullopt;
}

bool solar_loader::receive(solar::protocol::Header& h, std::span<const std::uint8_t>& payload,
                           std::string& bad) {
  for (;;) {
    const std::size_t have = rx.end - rx.begin;
    std::size_t need = sizeof h;
    if (have >= sizeof h) {
      std::memcpy(&h, rx.bytes.data() + rx.begin, sizeof h);
      if (!solar::protocol::acceptable(h)) {
        bad = solar::protocol::other_version(h) ? other_version_text(h)
                                                : std::string("unexpected reply from the agent");
        errno = EPROTO;
        return false;
      }
      need += h.length;
      if (have >= need) {
        payload = {rx.bytes.data() + rx.begin + sizeof h, h.length};
        rx.begin += need;
        if (rx.begin == rx.end) rx.begin = rx.end = 0;
        return true;
      }
    }
    if (rx.begin > 0) {  // keep the partial frame at the front
      std::memmove(rx.bytes.data(), rx.bytes.data() + rx.begin, have);
      rx.begin = 0;
      rx.end = have;
    }
    if (rx.bytes.size() < std::max<std::size_t>(need, 16384)) rx.bytes.resize(std::max<std::size_t>(need, 16384));
    const ssize_t r = receive_some();
    if (r == 0) errno = 0;
    if (r <= 0) return false;
    rx.end += static_cast<std::size_t>(r);
  }
}

ssize_t solar_loader::receive_some() {
  for (;;) {
    const ssize_t r = ::recv(sock, rx.bytes.data() + rx.end, rx.bytes.size() - rx.end, MSG_DONTWAIT);
    if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return r;
    if (errno == EINTR) continue;
    pollfd p{sock, POLLIN, 0};
    const int ms = agent_timeout > 0
                       ? static_cast<int>(std::min(std::ceil(agent_timeout * 1000), 2e9))
                       : -1;
    const int n = ::poll(&p, 1, ms);
    if (n == 0) {
      errno = EAGAIN;
      return -1;
    }
    if (n < 0 && errno != EINTR) return -1;
  }
}

bool solar_loader::next_from_agent() {
  if (sock < 0) return false;
  constexpr std::size_t kFrame = sizeof(solar::protocol::Header) + 8;
  char out[(2 + 2 * kMaxAskAhead) * kFrame];
  const std::size_t here = hello.defer_releases ? replies_received() : 0;
  const bool ask = asked <= cursor || !hello.defer_releases || releases.count > ask_ahead ||
                   here == 1;
  // Nothing here to take: the releases it holds say that it waits now (the agent measures
  // the ranks' waits from there), without asking for more.
  const bool waits = here == 0 && releases.count > 0;
  if (ask || waits) {
    std::size_t len = put_releases(out);
    asked = std::max(asked, cursor);
    for (const std::uint64_t upto = std::min(T, cursor + 1 + ask_ahead); ask && asked < upto;
         ++asked) {
      const solar::protocol::Next nx{asked};
      len += solar::protocol::put_frame(out + len, solar::protocol::Op::next, &nx, sizeof nx);
    }
    if (len && !write_all(sock, out, len)) {
      const int err = errno;
      drop_agent(last_words().value_or(agent_gone(err)));
      return false;
    }
  }
  solar::protocol::Header rh;
  std::span<const std::uint8_t> payload;
  std::string bad;
  if (!receive(rh, payload, bad)) {
    drop_agent(errno == EPROTO ? bad : agent_gone(errno));
    return false;
  }
  const auto op = static_cast<solar::protocol::Op>(rh.op);
  if (op == solar::protocol::Op::error) {
    drop_agent("the agent refused: " + std::string(payload.begin(), payload.end()));
    return false;
  }
  solar::protocol::BatchHead bh;
  if (op != solar::protocol::Op::batch || payload.size() < sizeof bh) {
    drop_agent("unexpected reply from the agent");
    return false;
  }
  std::memcpy(&bh, payload.data(), sizeof bh);
  // A streamed plan: the batch is the agent's (the plan is not computed here while it serves),
  // within the plan's bounds: the step's batch size b ± δ, samples of the dataset.
  const bool agents_batch = header.streamed;
  const std::uint32_t bj =
      header.layout.rank_batch(static_cast<std::uint32_t>(cursor % header.layout.steps));
  const std::uint32_t lo = bj > header.config.imbalance ? bj - header.config.imbalance : 1;
  const auto want = agents_batch ? std::span<const std::uint32_t>() : planned(cursor);
  if (bh.step != cursor ||
      (agents_batch ? bh.count < lo || bh.count > bj + header.config.imbalance
                    : bh.count != want.size()) ||
      payload.size() != sizeof bh + bh.count * sizeof(solar::protocol::BatchEntry)) {
    drop_agent("the agent's batch does not match the plan");
    return false;
  }
  if (agents_batch) batch.samples.resize(bh.count);
  batch.data.resize(bh.count);
  batch.labels.resize(bh.count);
  std::vector<std::size_t>& mine = scratch_mine;
  mine.clear();
  for (std::uint32_t i = 0; i < bh.count; ++i) {
    solar::protocol::BatchEntry e;
    std::memcpy(&e, payload.data() + sizeof bh + i * sizeof e, sizeof e);
    const bool yours = e.slot == solar::protocol::kReadItYourself && header.config.sized();
    if (agents_batch) batch.samples[i] = e.sample;
    if ((agents_batch ? e.sample >= header.config.samples
                      : e.sample != (want[i] & solar::kSampleMask)) ||
        (!yours && e.slot >= hello.slots) ||
        (!yours && header.config.sized() &&
         (e.slot + (length_of(e.sample) + 63) / 64 > hello.slots))) {
      drop_agent("the agent's batch does not match the plan");
      return false;
    }
    if (yours) {
      mine.push_back(i);
      continue;
    }
    batch.data[i] = base + std::uint64_t{e.slot} * hello.slot_bytes;
    batch.labels[i] =
        format.label_bytes ? base + hello.labels_offset + std::uint64_t{e.slot} * format.label_bytes : nullptr;
  }
  // Samples of differing sizes the agent had no room for in time: read here, as without it.
  if (!mine.empty()) {
    for (std::size_t i : mine) batch.labels[i] = nullptr;
    read_directly(mine);
  }
  return true;
}

void solar_loader::next_direct() {
  open_source();
  const std::size_t n = batch.samples.size();
  batch.data.resize(n);
  batch.labels.resize(n);
  if (!lengths.empty() || source->info().whole_files) {  // each sample its own bytes, no labels
    std::vector<std::size_t> all(n);
    for (std::size_t i = 0; i < n; ++i) all[i] = i;
    std::fill(batch.labels.begin(), batch.labels.end(), nullptr);
    read_directly(all);
    return;
  }
  std::vector<std::uint64_t> ids(batch.samples.begin(), batch.samples.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  const auto runs = solar::storage::coalesce(ids);
  batch.own.resize(ids.size() * format.sample_bytes);
  source->read(runs, batch.own.data());
  if (format.label_bytes) {
    batch.own_labels.resize(ids.size() * format.label_bytes);
    source->read_labels(runs, batch.own_labels.data());
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(
        std::lower_bound(ids.begin(), ids.end(), batch.samples[i]) - ids.begin());
    batch.data[i] = batch.own.data() + k * format.sample_bytes;
    batch.labels[i] = format.label_bytes ? batch.own_labels.data() + k * format.label_bytes : nullptr;
  }
}

std::size_t solar_loader::put_releases(char* out) {
  std::size_t len = 0;
  for (; releases.count > 0; --releases.count, ++releases.first) {
    const solar::protocol::Release rl{releases.first};
    len += solar::protocol::put_frame(out + len, solar::protocol::Op::release, &rl, sizeof rl);
  }
  return len;
}

solar_loader::~solar_loader() {
#ifdef SOLAR_WITH_CUDA
  if (pin.registered) cuda().HostUnregister(base);
#endif
  if (sock >= 0 && releases.count) {
    char out[(kMaxAskAhead + 1) * (sizeof(solar::protocol::Header) + 8)];
    write_all(sock, out, put_releases(out));
  }
  if (sock >= 0) ::close(sock);
  if (base) ::munmap(base, map_bytes);
}

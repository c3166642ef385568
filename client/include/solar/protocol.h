// The agent ⇄ rank control protocol over a Unix stream socket. Versioned, length-prefixed,
// little-endian, fixed-layout messages. The data itself never crosses the socket: the agent
// passes its shared-memory buffer (a memfd) once, with SCM_RIGHTS, in the hello reply, and a
// batch is a list of (sample id, slot) pairs into it.
//
//   rank → agent   hello {local_rank, pid}       agent → rank   hello_ok {..., start_step} + the
//                                                               buffer fd
//   rank → agent   next {step}                   agent → rank   batch {step, n, n×{sample, slot}}
//                                                               or end (no more steps)
//   rank → agent   release {step}                (no reply)
//   any  → agent   stats                         agent → any    stats_reply {JSON text}
//   any  → agent   shutdown                      (agent stops)
//   interposer → agent  xhello {pid}         agent → it     xhello_ok {map_bytes, index
//                                                               offset} + the buffer fd
//                  (job-transparent mode, solar/transparent.h)
//   agent → rank   error {text}: the request was refused; the connection stays usable unless
//                  the request was malformed, in which case the agent closes it.
// Only processes of the agent's own user may connect (SO_PEERCRED is checked).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace solar::protocol {

inline constexpr std::uint32_t kMagic = 0x524c4f53;  // "SOLR"
inline constexpr std::uint16_t kVersion = 1;
inline constexpr std::uint32_t kMaxPayload = 1U << 20;

enum class Op : std::uint16_t {
  hello = 1,
  hello_ok = 2,
  next = 3,
  batch = 4,
  end = 5,
  release = 6,
  stats = 7,
  stats_reply = 8,
  shutdown = 9,
  error = 10,
  xhello = 11,     // an interposer (solar/transparent.h): the buffer and its sample index
  xhello_ok = 12,
};

struct Header {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kVersion;
  std::uint16_t op = 0;
  std::uint32_t length = 0;  // payload bytes after the header
  std::uint32_t reserved = 0;
};
static_assert(sizeof(Header) == 16);

// A header every reader accepts: our magic and version, a payload within kMaxPayload.
inline bool acceptable(const Header& h) {
  return h.magic == kMagic && h.version == kVersion && h.length <= kMaxPayload;
}

// Writes the header of a message with `length` payload bytes to `out`; returns its size.
inline std::size_t put_header(void* out, Op op, std::size_t length) {
  Header h;
  h.op = static_cast<std::uint16_t>(op);
  h.length = static_cast<std::uint32_t>(length);
  std::memcpy(out, &h, sizeof h);
  return sizeof h;
}

// Writes header + body (n bytes) to `out` (sizeof(Header) + n bytes); returns the bytes written.
inline std::size_t put_frame(void* out, Op op, const void* body, std::size_t n) {
  const std::size_t at = put_header(out, op, n);
  if (n) std::memcpy(static_cast<char*>(out) + at, body, n);
  return at + n;
}

struct Hello {
  std::uint32_t local_rank = 0;
  std::uint32_t pid = 0;
};

struct HelloOk {
  std::uint32_t node = 0;
  std::uint32_t ranks_per_node = 0;
  std::uint64_t samples = 0;
  std::uint64_t sample_bytes = 0;
  std::uint64_t label_bytes = 0;   // 0: no labels
  std::uint64_t slot_bytes = 0;    // sample_bytes + label_bytes, rounded up to 64
  std::uint64_t slots = 0;
  std::uint64_t total_steps = 0;
  std::uint32_t steps_per_epoch = 0;
  std::uint32_t reserved = 0;
  // The global step the agent starts at (solar-agent --start-step; 0 for a whole run): it
  // serves steps from there on only, so a rank's first `next` is for this step.
  std::uint64_t start_step = 0;
};

struct Next {
  std::uint64_t step = 0;  // the step the rank expects (its cursor); checked by the agent
};

struct BatchHead {
  std::uint64_t step = 0;
  std::uint32_t count = 0;
  std::uint32_t reserved = 0;
};

struct BatchEntry {
  std::uint32_t sample = 0;
  std::uint32_t slot = 0;
};

struct Release {
  std::uint64_t step = 0;
};

}  // namespace solar::protocol

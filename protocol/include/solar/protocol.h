// SPDX-License-Identifier: Apache-2.0
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
// A rank may ask for steps ahead (version 3): up to kMaxStepsAsked `next` requests may be
// unanswered, each for the step after the previous request's; the agent answers them in order,
// each as soon as its batch is ready (which, on the ring path, may need the release of an
// earlier step). libsolar sends the release of the step it is done with and the request for
// the step after the one it takes now in one write, then reads the reply it asked for the call
// before, usually already there: one send and one receive per batch, and no wait.
//   any  → agent   stats                         agent → any    stats_reply {JSON text}
//   any  → agent   shutdown                      (agent stops)
//   interposer → agent  xhello {pid}         agent → it     xhello_ok {map_bytes, index
//                                                               offset} + the buffer fd
//                  (job-transparent mode, solar/transparent.h)
//   agent → rank   error {text}: the request was refused; the connection stays usable unless
//                  the request was malformed, in which case the agent closes it.
// Only processes of the agent's own user may connect (SO_PEERCRED is checked).
//
// Versions (Header::version; both sides must speak the same one):
//   1  the first.
//   2  hello_ok also says what a sample's bytes are: dtype, label dtype and sample shape
//      (HelloOk's layout fields), so a rank needs no HDF5 of its own to view them.
//   3  a rank may have up to kMaxStepsAsked `next` requests unanswered (asking ahead); the
//      agent checks each against the step after the last one asked for, not the last served.
//   4  labels apart: a slot holds a sample only (slot_bytes: its bytes rounded up to 64), and
//      slot s's label is at HelloOk::labels_offset + s × label_bytes, so that a 4 KiB sample
//      fills one page of the buffer instead of straddling two; and kMaxStepsAsked 8, not 4.
// An agent that receives a frame of another version answers it with one error frame in its
// own version, naming both versions, and closes the connection; libsolar reports a reply of
// another version as such (never as a malformed reply) and reads directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace solar::protocol {

inline constexpr std::uint32_t kMagic = 0x524c4f53;  // "SOLR"
inline constexpr std::uint16_t kVersion = 8;
// Version 5: the transparent mode's index (solar/transparent.h) carries the file's ctime and the
// watch's lease. Version 6: a table of the dataset's files (solar_xfile) instead of one file's
// identity, and solar_xstats::opens. Version 8: batches of samples of differing sizes (whole
// files; a sized plan): HelloOk::slot_bytes is 64, a sample lies at slot × 64 over its own
// length (the rank knows each one's from the dataset), and BatchEntry::slot kReadItYourself
// means the agent holds no copy of it: the rank reads that sample from the dataset itself.
// `next` requests one rank may have unanswered (version 3; 8 since version 4); a further one
// is refused.
inline constexpr std::uint32_t kMaxStepsAsked = 8;
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
  xfetch = 13,  // an interposer's miss of a sample another node keeps (demand mode, peers)
  xfetch_ok = 14,
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

// A frame of this protocol in another version (an agent or a libsolar of another build).
inline bool other_version(const Header& h) { return h.magic == kMagic && h.version != kVersion; }

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
  std::uint64_t slot_bytes = 0;    // sample_bytes rounded up to 64 (version 4: labels apart)
  std::uint64_t slots = 0;
  std::uint64_t total_steps = 0;
  std::uint32_t steps_per_epoch = 0;
  // How many steps past the one it takes a rank should ask for (at most kMaxStepsAsked - 1):
  // with rings, their depth minus one, so that its next batches are copied while it works on
  // this one. 0 (an agent that does not say, as before this field): 1.
  std::uint32_t ask_ahead = 0;
  // The global step the agent starts at (solar-agent --start-step; 0 for a whole run): it
  // serves steps from there on only, so a rank's first `next` is for this step.
  std::uint64_t start_step = 0;
  // The layout of a sample's bytes (version 2), from the agent's source: dtype and label dtype
  // by name ("int16", "float32", ...; NUL-padded; "" when unknown or, for the label, when there
  // are no labels) and one sample's shape (the dataset's shape without its first dimension):
  // shape_dims dimensions in shape[], or kShapeUnknown when it has more than kMaxShapeDims or
  // is not known.
  static constexpr std::uint32_t kMaxShapeDims = 8;
  static constexpr std::uint32_t kShapeUnknown = 0xffffffffU;
  char dtype[16] = {};
  char label_dtype[16] = {};
  std::uint32_t shape_dims = kShapeUnknown;
  // 1: the rank may take up to ask_ahead + 1 batches between writes, its releases held back:
  // it asks for more when the reply it takes is the last one received, and sends only its
  // releases when it finds none (it waits from then on). The rings are deep enough for the
  // agent to copy ahead meanwhile (small batches). 0 (as before this field): a write per batch.
  std::uint32_t defer_releases = 0;
  std::uint64_t shape[kMaxShapeDims] = {};
  // Version 4: where the labels are in the buffer: slot s's at labels_offset + s × label_bytes
  // (after the slots; 0 without labels).
  std::uint64_t labels_offset = 0;
};
static_assert(sizeof(HelloOk) == 72 + 32 + 8 + 64 + 8);  // version 1 was the first 72 bytes

struct Next {
  // The step asked for: the one after the rank's previous request (its cursor when nothing is
  // asked ahead); checked by the agent.
  std::uint64_t step = 0;
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
// BatchEntry::slot of a sample the rank reads itself (version 8, sized plans only: the agent's
// cache found no extent for it in time).
inline constexpr std::uint32_t kReadItYourself = 0xFFFFFFFFU;

struct Release {
  std::uint64_t step = 0;
};

}  // namespace solar::protocol

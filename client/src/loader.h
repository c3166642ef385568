// SPDX-License-Identifier: Apache-2.0
// One rank's loader (solar.h's solar_loader) and the batch it hands out: the node plan's part
// for this rank, its session with the node agent (hello, batches from the shared buffer asked
// ahead, releases) or, without an agent or once it is gone, the same samples read directly.
// client.cpp is the C API over it; loader.cpp holds the how.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "environment.h"
#include "solar/core/plan_file.h"
#include "solar/core/plan_stream.h"
#include "solar/protocol.h"
#include "solar/solar.h"
#include "solar/storage/sample_source.h"

struct solar_batch {
  solar_loader* loader = nullptr;
  std::uint64_t step = 0;
  std::uint32_t epoch = 0;
  double mean_size = 0;
  std::vector<std::uint32_t> samples;
  std::vector<const std::byte*> data;
  std::vector<const std::byte*> labels;
  std::vector<std::byte> own, own_labels;  // the direct path's memory
  std::uint64_t bytes() const;             // its samples' bytes in all (solar_batch_bytes)
};

struct solar_loader {
  using ClientError = solar::client::ClientError;
  solar::PlanHeader header;
  solar::NodePlan plan;  // a whole plan: the node's section
  // A streamed plan (PlanHeader::streamed): with an agent, each batch is the agent's (its
  // sample ids; the agent computed the plan); without one, or once it is gone, the node's
  // steps are computed here as the cursor reaches them (plan_stream.h), and the one at the
  // cursor kept.
  std::unique_ptr<solar::NodePlanStream> stream;
  solar::NodeStep step_here;
  bool have_step = false;
  std::uint32_t node = 0, local_rank = 0, R = 0;
  std::uint64_t T = 0;
  // Where the samples are: the dataset spec and labels dataset (direct reads) and the agent's socket.
  struct Where {
    std::string dataset, labels, socket_path;
  } where;
  std::unique_ptr<solar::storage::SampleSource> source;  // direct path, opened on first use
  // What a sample's bytes are (sizes; solar_sample_shape, solar_sample_dtype, solar_label_dtype):
  // from the agent's hello, or the source when reading directly. Empty names / no shape: unknown.
  struct SampleFormat {
    std::uint64_t sample_bytes = 0, label_bytes = 0;
    std::string dtype, label_dtype;
    std::optional<std::vector<std::uint64_t>> shape;
  } format;
  // Samples of differing sizes (a sized plan: whole files): each sample's length, by id, from
  // the dataset (its files' sizes); empty when every sample is format.sample_bytes long.
  std::vector<std::uint64_t> lengths;
  std::uint64_t length_of(std::uint32_t sample) const {
    return lengths.empty() ? format.sample_bytes : lengths[sample];
  }

  int sock = -1;
  double agent_timeout = solar::client::kDefaultAgentTimeout;  // seconds, 0: none (SOLAR_AGENT_TIMEOUT)
  std::byte* base = nullptr;
  std::size_t map_bytes = 0;
  solar::protocol::HelloOk hello{};

  std::uint64_t cursor = 0;
  // Resume: SOLAR_START_EPOCH / SOLAR_START_STEP were set (the launcher's or the plugin's start);
  // without them the rank starts where its agent does (the hello reply's start_step).
  bool start_given = false;
  std::uint64_t first = 0;  // the step the loader started at
  bool holding = false;
  bool holding_from_agent = false;
  // Releases owed to the agent, sent with the next write to it (steps first .. first + count
  // - 1, in order); close() flushes them.
  struct ReleasesOwed {
    std::uint64_t count = 0;
    std::uint64_t first = 0;
    void note(std::uint64_t step) {
      if (count++ == 0) first = step;
    }
  } releases;
  // Asking ahead (protocol version 3): steps < asked were asked of the agent. Each write asks
  // for the steps after the one the rank takes, as many as the agent's hello says (its ring
  // depth minus one; 1 from an agent that does not say), so that their replies are there by
  // the next calls, with the releases owed. With the hello's defer_releases (small batches),
  // only a call that finds exactly one reply left to take (the one it takes now) asks: the
  // replies come back together while the rank uses this batch, one write, one receive and one
  // wake-up per ask_ahead + 1 batches instead of per batch, and no wait when the agent keeps
  // up. A call that finds none sends only the releases it holds (the agent counts the rank's
  // wait from there) and waits for the reply it asked for. Otherwise every call writes.
  static constexpr std::uint64_t kMaxAskAhead = solar::protocol::kMaxStepsAsked - 1;
  std::uint64_t ask_ahead = 1;
  std::uint64_t asked = 0;
  // Replies received, not yet taken: bytes[begin, end). One receive takes whatever has
  // arrived (a header and its payload together, or several replies).
  struct Received {
    std::vector<std::uint8_t> bytes;
    std::size_t begin = 0, end = 0;
  } rx;
  solar_batch batch;
  std::vector<std::size_t> scratch_mine;  // next_from_agent: the samples left to this rank

  // This rank's batch of step t; a streamed plan's steps are asked in order (t never goes back).
  std::span<const std::uint32_t> planned(std::uint64_t t) {
    if (header.streamed) {
      if (!stream) stream = std::make_unique<solar::NodePlanStream>(header.config, node);
      while (!have_step || step_here.t < t) {
        step_here = stream->next();
        have_step = true;
      }
      return step_here.ranks[local_rank];
    }
    const std::uint64_t i = t * R + local_rank;
    return {plan.accesses.data() + plan.rank_offsets[i],
            plan.rank_offsets[i + 1] - plan.rank_offsets[i]};
  }

  void open_source();
  // A sized plan: opens the source now and takes each sample's length from it, checked against
  // the plan's sizes.
  void read_lengths();
  // Reads samples batch.samples[i] for each i of `which` from the dataset into batch.own and
  // points batch.data there (the direct path's reads, and a sized plan's samples the agent
  // left to the rank).
  void read_directly(const std::vector<std::size_t>& which);

  void drop_agent(const std::string& why);

  // Why the agent stopped answering, from the errno of a failed send or receive.
  std::string agent_gone(int err) const;

  // Connects and says hello; on any failure stays on the direct path. Every wait for the agent
  // (the connection, each reply) is bounded by SOLAR_AGENT_TIMEOUT: a stopped or overloaded
  // agent makes the rank read directly, never hang.
  void attach();

  // Takes and releases the agent's steps from the cursor up to `step` (the agent runs its plan
  // in order); once the agent is gone the rest is a cursor move.
  void skip_with_agent(std::uint64_t step);

  // An agent that stops after a failure (e.g. its dataset file changed) sends one error frame
  // before it closes the connection: its reason, when it is there to read without waiting.
  // Replies to steps asked ahead (next_from_agent) may come before it: every whole frame
  // received is looked at. Only for a connection being dropped (it consumes what it reads).
  std::optional<std::string> last_words();

  // The next reply frame: true with its header and payload (valid until the next call), false
  // with errno set when the connection failed (0: closed by the agent) or, with errno EPROTO,
  // when the bytes are not a reply of this protocol version (`bad` says what they are).
  bool receive(solar::protocol::Header& h, std::span<const std::uint8_t>& payload,
               std::string& bad);

  // One recv into rx, waiting at most SOLAR_AGENT_TIMEOUT (errno EAGAIN past it). It waits in
  // poll for POLLIN, not in a blocking recv: a task blocked in recv on a Unix socket sleeps on
  // the queue that the agent's reading of this rank's requests wakes for write space
  // (unix_write_space), so each request the agent took would wake the rank for nothing, an
  // interrupt and two context switches; poll's wait is woken only for the events it asked for.
  ssize_t receive_some();

  // Whole frames received and not yet taken (each a reply to one step asked, or `end`).
  std::size_t replies_received() const {
    std::size_t n = 0;
    solar::protocol::Header h;
    for (std::size_t at = rx.begin; rx.end - at >= sizeof h; ++n) {
      std::memcpy(&h, rx.bytes.data() + at, sizeof h);
      if (rx.end - at - sizeof h < h.length) break;
      at += sizeof h + h.length;
    }
    return n;
  }

  // The agent path: true with the batch filled, false if the agent is gone (fall back). One
  // write (see asked above for when): the releases owed, and the requests for this step
  // (unless asked already) and for ask_ahead steps after it within the plan; then this step's
  // reply, usually already received.
  bool next_from_agent();

  void next_direct();

  // The releases owed, as frames at `out` (room for ask_ahead + 1 of them); their length.
  std::size_t put_releases(char* out);

  // The shared buffer registered with CUDA (registered), or tried once and failed (copies go
  // unpinned).
  struct CudaPin {
    bool registered = false;
    bool failed = false;
  } pin;

  ~solar_loader();
};

// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: what a connection sends solar-agent (agent/src/request_reader.h), cut into
// reads of the sizes the input's first byte picks. Every frame handed out must be one the
// agent reads (request_acceptable, its payload exactly the header's length), a malformed header
// must stop the connection, and what is held stays within one read plus one frame. The frames
// then go through the agent's payload decoding and the checks its handlers make of a rank's
// next and release steps (agent/src/control_messages.cpp), on a model of one rank's cursor.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "request_reader.h"
#include "solar/protocol.h"
#include "solar/transparent.h"

namespace {

using solar::agent::RequestReader;
namespace protocol = solar::protocol;

void check(bool ok) {
  if (!ok) std::abort();
}

// One rank's session, as on_message sees it: attached or not, its cursor and releases.
struct RankModel {
  bool attached = false;
  std::uint64_t cursor = 0, released = 0;
  static constexpr std::uint32_t kRanks = 4;
  static constexpr std::uint64_t kSteps = 64;

  void on_frame(const protocol::Header& h, const std::vector<std::uint8_t>& payload) {
    const std::span<const std::uint8_t> p(payload);
    switch (static_cast<protocol::Op>(h.op)) {
      case protocol::Op::hello: {
        protocol::Hello hello;
        if (!solar::agent::decode_payload(p, hello)) return;
        if (!attached && hello.local_rank < kRanks) attached = true;
        return;
      }
      case protocol::Op::xhello: {
        solar_xhello x{};
        (void)solar::agent::decode_payload(p, x);
        return;
      }
      case protocol::Op::xfetch: {
        solar_xfetch x{};
        (void)solar::agent::decode_payload(p, x);
        return;
      }
      case protocol::Op::next: {
        protocol::Next n;
        if (!solar::agent::decode_payload(p, n) || !attached || n.step != cursor) return;
        if (cursor < kSteps) ++cursor;  // served (the agent answers end past the last step)
        return;
      }
      case protocol::Op::release: {
        protocol::Release rl;
        if (!solar::agent::decode_payload(p, rl) || !attached) return;
        if (rl.step != released || rl.step >= cursor) return;  // refused: out of order
        ++released;
        check(released <= cursor);
        return;
      }
      case protocol::Op::stats:
      case protocol::Op::shutdown:
        check(payload.empty());
        return;
      default:
        std::abort();  // request_acceptable lets no other op through
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  // Read sizes: 1..16 bytes, or whatever space() offers.
  const std::size_t chunk = data[0] % 17;
  ++data;
  --size;
  RequestReader reader;
  RankModel rank;
  protocol::Header h;
  std::vector<std::uint8_t> payload;
  std::size_t at = 0;
  while (at < size) {
    const auto space = reader.space();
    check(space.size() >= 4096);
    const std::size_t n = std::min({space.size(), size - at, chunk ? chunk : space.size()});
    std::copy_n(data + at, n, space.data());
    reader.received(n);
    at += n;
    for (;;) {
      const auto got = reader.next(h, payload);
      if (got == RequestReader::Next::more) break;
      if (got == RequestReader::Next::malformed) {
        check(!solar::agent::request_acceptable(h));
        check(reader.next(h, payload) == RequestReader::Next::malformed);
        return 0;  // the agent closes the connection
      }
      check(solar::agent::request_acceptable(h));
      check(payload.size() == h.length && h.length <= solar::agent::max_request_payload(h.op));
      rank.on_frame(h, payload);
    }
    // What waits is less than one frame: a header, and a payload of at most kMaxPayload.
    check(reader.pending() < sizeof(protocol::Header) + protocol::kMaxPayload);
  }
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
// The bytes a connection sends the agent, cut into request frames (solar/protocol.h). No socket
// and no agent state: the control server (control_server.cpp) feeds it what it reads, and so does a
// fuzzer (tests/fuzz/agent_requests_fuzz.cpp) with any bytes at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "solar/protocol.h"

namespace solar::agent {

// A request's payload may not exceed its op's size (checked on the header, before any
// allocation): 8 bytes for hello/next/release, 0 for stats/shutdown, an xhello's size; 0 for an
// op the agent does not take (the connection is closed).
std::uint32_t max_request_payload(std::uint16_t op);

// A header the agent reads the payload of: ours, a request's op, no longer than that op takes.
bool request_acceptable(const protocol::Header& h);

// One connection's received bytes, handed out a frame at a time. Nothing is allocated for a
// frame before its header is checked against its op's size, and what a connection can make it
// hold is one read (4 KiB) plus one frame of at most kMaxPayload.
class RequestReader {
 public:
  enum class Next {
    frame,      // a complete frame: its header and payload are filled in
    more,       // no complete frame yet: read more (into space())
    malformed,  // the header (filled in) is one request_acceptable refuses: close the connection
  };

  // Where the next read goes: room for 4 KiB at least, and for the rest of a frame whose header
  // has arrived. Frames already handed out are dropped first. Valid until the next call.
  std::span<std::uint8_t> space();
  // `n` bytes were read into space().
  void received(std::size_t n);
  // The next frame of what was received. After `malformed` the reader keeps answering it.
  Next next(protocol::Header& h, std::vector<std::uint8_t>& payload);
  // Bytes received and not yet handed out.
  std::size_t pending() const { return end_ - begin_; }

 private:
  std::vector<std::uint8_t> in_;
  std::size_t begin_ = 0, end_ = 0;  // in_[begin_, end_): received, not yet handed out
};

// A fixed-size payload (Hello, Next, Release, solar_xhello): false unless it is exactly T's size.
template <class T>
bool decode_payload(std::span<const std::uint8_t> payload, T& out) {
  if (payload.size() != sizeof(T)) return false;
  std::memcpy(&out, payload.data(), sizeof(T));
  return true;
}

}  // namespace solar::agent

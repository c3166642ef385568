// SPDX-License-Identifier: Apache-2.0
// The agent's request frames (agent/src/request_reader.h): what a connection's bytes are cut
// into, whatever the reads' sizes, and which headers close the connection.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "request_reader.h"
#include "solar/protocol.h"
#include "solar/transparent.h"

namespace solar::agent {
namespace {

std::vector<std::uint8_t> frame(std::uint16_t op, const void* body, std::size_t n,
                                std::uint32_t length) {
  protocol::Header h;
  h.op = op;
  h.length = length;
  std::vector<std::uint8_t> out(sizeof h + n);
  std::memcpy(out.data(), &h, sizeof h);
  if (n) std::memcpy(out.data() + sizeof h, body, n);
  return out;
}

std::vector<std::uint8_t> frame(protocol::Op op, const void* body = nullptr, std::size_t n = 0) {
  return frame(static_cast<std::uint16_t>(op), body, n, static_cast<std::uint32_t>(n));
}

// Feeds `bytes` in reads of `chunk` bytes; returns the ops handed out and whether a malformed
// header ended it.
std::pair<std::vector<std::uint16_t>, bool> feed(const std::vector<std::uint8_t>& bytes,
                                                 std::size_t chunk) {
  RequestReader r;
  std::vector<std::uint16_t> ops;
  protocol::Header h;
  std::vector<std::uint8_t> payload;
  for (std::size_t at = 0; at < bytes.size();) {
    const auto space = r.space();
    EXPECT_GE(space.size(), 4096u);
    const std::size_t n = std::min({chunk, space.size(), bytes.size() - at});
    std::memcpy(space.data(), bytes.data() + at, n);
    r.received(n);
    at += n;
    for (;;) {
      const auto got = r.next(h, payload);
      if (got == RequestReader::Next::more) break;
      if (got == RequestReader::Next::malformed) return {ops, true};
      EXPECT_EQ(payload.size(), h.length);
      ops.push_back(h.op);
    }
  }
  return {ops, false};
}

TEST(RequestReader, FramesWhateverTheReadSizes) {
  const protocol::Hello hello{1, 77};
  const protocol::Next next{0};
  const protocol::Release release{0};
  std::vector<std::uint8_t> bytes;
  for (const auto& f : {frame(protocol::Op::hello, &hello, sizeof hello),
                        frame(protocol::Op::next, &next, sizeof next),
                        frame(protocol::Op::release, &release, sizeof release),
                        frame(protocol::Op::stats), frame(protocol::Op::shutdown)})
    bytes.insert(bytes.end(), f.begin(), f.end());
  const std::vector<std::uint16_t> want = {1, 3, 6, 7, 9};
  for (std::size_t chunk : {std::size_t{1}, std::size_t{5}, std::size_t{16}, std::size_t{4096}}) {
    const auto [ops, malformed] = feed(bytes, chunk);
    EXPECT_FALSE(malformed) << chunk;
    EXPECT_EQ(ops, want) << chunk;
  }
}

TEST(RequestReader, OversizedPayloadClosesBeforeItArrives) {
  const auto [ops, malformed] = feed(frame(1, nullptr, 0, protocol::kMaxPayload), 4096);
  EXPECT_TRUE(malformed);
  EXPECT_TRUE(ops.empty());
  EXPECT_EQ(max_request_payload(static_cast<std::uint16_t>(protocol::Op::xhello)),
            sizeof(solar_xhello));
}

TEST(RequestReader, OpsThatAreNotRequestsClose) {
  // fuzz.agent_requests: an op the agent does not take, with no payload, passed the size check
  // (0 bytes allowed for it) and reached on_message's branch marked "not reached".
  for (std::uint16_t op : std::initializer_list<std::uint16_t>{0, 2, 4, 5, 8, 10, 12, 14, 15, 0xffff}) {
    const auto [ops, malformed] = feed(frame(op, nullptr, 0, 0), 4096);
    EXPECT_TRUE(malformed) << op;
    EXPECT_TRUE(ops.empty()) << op;
  }
}

TEST(RequestReader, PayloadsDecodeOnlyAtTheirSize) {
  const std::uint8_t bytes[16] = {5, 0, 0, 0, 0, 0, 0, 0, 9};
  protocol::Next n;
  EXPECT_TRUE(decode_payload(std::span(bytes, 8), n));
  EXPECT_EQ(n.step, 5u);
  EXPECT_FALSE(decode_payload(std::span(bytes, 7), n));
  EXPECT_FALSE(decode_payload(std::span(bytes, 16), n));
}

}  // namespace
}  // namespace solar::agent

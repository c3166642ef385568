// SPDX-License-Identifier: Apache-2.0
#include "request_reader.h"

#include <algorithm>

#include "solar/transparent.h"

static_assert(SOLAR_PROTO_VERSION == solar::protocol::kVersion,
              "solar/transparent.h and solar/protocol.h disagree on the protocol version");

namespace solar::agent {

std::uint32_t max_request_payload(std::uint16_t op) {
  switch (static_cast<protocol::Op>(op)) {
    case protocol::Op::hello:
      return sizeof(protocol::Hello);
    case protocol::Op::next:
      return sizeof(protocol::Next);
    case protocol::Op::release:
      return sizeof(protocol::Release);
    case protocol::Op::xhello:
      return sizeof(solar_xhello);
    case protocol::Op::xfetch:
      return sizeof(solar_xfetch);
    default:  // stats and shutdown carry nothing; other ops are not requests
      return 0;
  }
}

bool request_acceptable(const protocol::Header& h) {
  switch (static_cast<protocol::Op>(h.op)) {
    case protocol::Op::hello:
    case protocol::Op::next:
    case protocol::Op::release:
    case protocol::Op::stats:
    case protocol::Op::shutdown:
    case protocol::Op::xhello:
    case protocol::Op::xfetch:
      return protocol::acceptable(h) && h.length <= max_request_payload(h.op);
    default:  // a reply's op, or none at all, even with no payload (fuzz.agent_requests)
      return false;
  }
}

std::span<std::uint8_t> RequestReader::space() {
  if (begin_ > 0) {
    std::memmove(in_.data(), in_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  std::size_t need = end_ + 4096;
  if (end_ >= sizeof(protocol::Header)) {
    protocol::Header h;
    std::memcpy(&h, in_.data(), sizeof h);
    if (request_acceptable(h)) need = std::max(need, sizeof h + h.length);
  }
  if (in_.size() < need) in_.resize(std::max(need, in_.size() * 2));
  return {in_.data() + end_, in_.size() - end_};
}

void RequestReader::received(std::size_t n) { end_ += std::min(n, in_.size() - end_); }

RequestReader::Next RequestReader::next(protocol::Header& h, std::vector<std::uint8_t>& payload) {
  if (end_ - begin_ < sizeof h) return Next::more;
  std::memcpy(&h, in_.data() + begin_, sizeof h);
  if (!request_acceptable(h)) return Next::malformed;
  if (end_ - begin_ < sizeof h + h.length) return Next::more;
  const auto at = in_.begin() + static_cast<std::ptrdiff_t>(begin_ + sizeof h);
  payload.assign(at, at + h.length);
  begin_ += sizeof h + h.length;
  return Next::frame;
}

}  // namespace solar::agent

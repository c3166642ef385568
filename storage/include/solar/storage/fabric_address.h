// SPDX-License-Identifier: Apache-2.0
// Fabric addresses as text: solar-stored's hello reply (wire.h) and the agents' peer cards
// (agent/src/peer_setup.cpp) carry an endpoint's address (fabric::Endpoint::address) as
// lower-case hex. No libfabric needed to include it; defined in storage/src/wire.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace solar::storage::wire {

std::string to_hex(const std::vector<std::uint8_t>& bytes);
// The bytes again; throws StorageError ("protocol error: bad fabric address") for an odd
// length or a character that is not a lower-case hex digit.
std::vector<std::uint8_t> from_hex(const std::string& hex);

}  // namespace solar::storage::wire

// SPDX-License-Identifier: Apache-2.0
// The machine's memory as /proc/meminfo says it (platform code).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace solar::sys {

// The field `name` ("MemTotal", "MemAvailable", ...) of a /proc/meminfo text, in bytes (the
// file gives kB); nullopt if the text has no such field.
std::optional<std::uint64_t> meminfo_field(std::string_view text, std::string_view name);

// The field `name` of this machine's /proc/meminfo in bytes; nullopt where it cannot be read.
std::optional<std::uint64_t> meminfo_bytes(std::string_view name);

// MemAvailable in bytes: what the node can still give a new allocation without swapping. ~0
// where it cannot be read: every caller compares a size against it, and an unknown limit
// refuses nothing.
inline std::uint64_t mem_available_bytes() {
  return meminfo_bytes("MemAvailable").value_or(~std::uint64_t{0});
}

}  // namespace solar::sys

// SPDX-License-Identifier: Apache-2.0
// The user's numbers as text: counts, byte sizes, buffer sizes (bytes or a share of the
// dataset), and bytes for people.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "solar/core/config_error.h"

namespace solar {

// Parses a whole number in [lo, hi]. Throws ConfigError(flag, ...) naming the range on
// garbage, a sign, or a value out of range (including values that overflow 64 bits).
std::uint64_t parse_count(std::string_view text, const std::string& flag, std::uint64_t lo,
                          std::uint64_t hi);

// Parses "512", "16M", "1.5G", "2T" (binary multiples, B optional) into bytes. Throws
// ConfigError(flag, ...) on garbage, negative values or overflow of 64 bits.
std::uint64_t parse_bytes(std::string_view text, const std::string& flag);

// A buffer size as given by the user: bytes, or a percentage of the dataset ("22.5%").
struct BufferSpec {
  std::uint64_t bytes = 0;
  double percent = -1;  // >= 0 when given as a percentage
  static BufferSpec parse(std::string_view text, const std::string& flag);
  // Per-node bytes: a percentage means that share of the dataset's samples, rounded down to
  // whole samples.
  std::uint64_t resolve(std::uint64_t samples, std::uint64_t sample_bytes) const;
};

std::string format_bytes(std::uint64_t bytes);

}  // namespace solar

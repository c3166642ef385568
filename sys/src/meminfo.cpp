// SPDX-License-Identifier: Apache-2.0
#include "solar/sys/meminfo.h"

#include <charconv>
#include <fstream>
#include <sstream>
#include <string>

namespace solar::sys {

std::optional<std::uint64_t> meminfo_field(std::string_view text, std::string_view name) {
  // Lines "Name:   123 kB" (some without the unit).
  while (!text.empty()) {
    const auto end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    const auto colon = line.find(':');
    if (colon == std::string_view::npos || line.substr(0, colon) != name) continue;
    std::string_view rest = line.substr(colon + 1);
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
    std::uint64_t kb = 0;
    const auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), kb);
    if (ec != std::errc{} || p == rest.data()) return std::nullopt;
    return kb * 1024;
  }
  return std::nullopt;
}

std::optional<std::uint64_t> meminfo_bytes(std::string_view name) {
  std::ifstream f("/proc/meminfo");
  if (!f) return std::nullopt;
  std::ostringstream text;
  text << f.rdbuf();
  return meminfo_field(text.str(), name);
}

}  // namespace solar::sys

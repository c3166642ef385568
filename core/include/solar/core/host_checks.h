// What this machine allows a job: the memory it can still give, a writable output path.
// (Reads the system: not computation; kept in core until a platform module takes it.)
#pragma once

#include <cstdint>
#include <string>

#include "solar/core/config_error.h"

namespace solar {

// MemAvailable of /proc/meminfo in bytes: what the node can still give a new allocation
// without swapping. ~0 where it cannot be read (no limit known).
std::uint64_t mem_available_bytes();

// Throws ConfigError (flag) unless a file can be written at `path`: its folder exists and is
// writable, and it is not a folder itself. For output options checked before a job starts.
void check_output_file(const std::string& path, const std::string& flag);
}  // namespace solar

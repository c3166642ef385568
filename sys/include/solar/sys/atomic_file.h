// SPDX-License-Identifier: Apache-2.0
// Writing a file so that readers see all of it or none of it (platform code).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string_view>

namespace solar::sys {

// Writes `bytes` to `path` through a temporary file beside it (created with `mode` less the
// umask), written whole, fsync'ed, then renamed over `path`: a reader sees all of it or none.
// nullptr when done, else the step that failed (errno says why; the temporary file is
// removed). Plans (write_plan_file, mode 0644); the agent's statistics (--stats-out) and peer
// cards (mode 0600); `solar run --stats-out`, srun's --solar-stats, `solar report` and
// solar-stored's --ready-file (0666: what a plain open would give).
const char* write_file_atomically(const std::filesystem::path& path, std::string_view bytes,
                                  mode_t mode);

}  // namespace solar::sys

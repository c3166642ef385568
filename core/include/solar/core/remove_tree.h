// Removing a folder that other processes may be emptying at the same time.
#pragma once

#include <filesystem>
#include <system_error>

namespace solar {

// std::filesystem::remove_all(path, ec) stops at the first entry that is gone by the time it
// unlinks it (libstdc++ reports that ENOENT), leaving the entries after it and the folder: a
// `solar run` folder whose agent removed its own socket while the folder was being removed kept
// the agents' logs for good. This tries again while the failure is one of those races (an entry
// gone, or one added meanwhile), a few times; any other error (permissions) stops it.
inline void remove_tree(const std::filesystem::path& p) noexcept {
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::error_code ec;
    std::filesystem::remove_all(p, ec);
    if (!ec) return;
    if (ec != std::errc::no_such_file_or_directory && ec != std::errc::directory_not_empty) return;
  }
}

}  // namespace solar

// SPDX-License-Identifier: Apache-2.0
// Removing a folder that other processes may be emptying (or filling) at the same time, as
// root in a folder its user controls (platform code).
#pragma once

#include <chrono>
#include <filesystem>

namespace solar::sys {

// Removes `p` and everything below it; true when it is gone. Never follows a symbolic link (one
// at `p` itself is removed, as std::filesystem::remove_all does) and holds two descriptors at
// most, whatever the depth: std::filesystem::remove_all keeps one per level, so a tree deeper
// than the open-file limit (a user can make one in a folder of theirs that root removes) failed
// with EMFILE and stayed. It walks down by openat(O_NOFOLLOW) and back up by "..", checked
// against the (device, inode) it came down through: a folder moved elsewhere meanwhile stops
// the removal instead of leading it out of the tree. Entries that vanish meanwhile (an agent
// removing its own socket) are no error; entries added meanwhile are removed too, within
// `budget`: whoever keeps filling the folder cannot hold the caller. Any other error
// (permissions, a mount point) stops it, leaving the rest.
bool remove_tree(const std::filesystem::path& p,
                 std::chrono::steady_clock::duration budget = std::chrono::seconds(30)) noexcept;

}  // namespace solar::sys

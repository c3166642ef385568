// SPDX-License-Identifier: Apache-2.0
// solar::sys::remove_tree (sys/include/solar/sys/remove_tree.h): a folder is removed whole even
// when another process unlinks one of its entries while it is being removed (an agent removing
// its own socket as it stops, while `solar run` removes its run folder). Its own executable:
// the race is made here by interposing unlinkat/unlink (this program's definitions come before
// libc's), for entries whose name carries kVanishes only.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "solar/sys/remove_tree.h"

namespace fs = std::filesystem;

namespace {
constexpr const char* kVanishes = ".vanishes-while-removed";
std::atomic<int> vanished{0};  // entries unlinked "by someone else" just before their removal
fs::path moved_from, moved_to;  // set: moved there "by someone else" at that unlink, once
}  // namespace

// The entry disappears between the listing and the unlink: someone else removes it first.
extern "C" int unlinkat(int dirfd, const char* path, int flags) {
  using Real = int (*)(int, const char*, int);
  static const Real real = reinterpret_cast<Real>(::dlsym(RTLD_NEXT, "unlinkat"));
  if (std::strstr(path, kVanishes) && !moved_from.empty()) {
    std::error_code ec;
    fs::rename(moved_from, moved_to, ec);
    moved_from.clear();
  }
  if (std::strstr(path, kVanishes) && real(dirfd, path, flags) == 0) ++vanished;
  return real(dirfd, path, flags);
}
extern "C" int unlink(const char* path) {
  using Real = int (*)(const char*);
  static const Real real = reinterpret_cast<Real>(::dlsym(RTLD_NEXT, "unlink"));
  if (std::strstr(path, kVanishes) && real(path) == 0) ++vanished;
  return real(path);
}

TEST(RemoveTree, RemovesAFolderWhoseEntryVanishesWhileItIsRemoved) {
  char tmpl[] = "/tmp/solar-remove-tree-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path d = tmpl;
  for (const char* n : {"plan", "solar-run.owner", "node0.log", "node1.log", "sub"})
    std::ofstream(d / n) << "x";
  std::ofstream(d / (std::string("node0.sock") + kVanishes)) << "x";
  fs::create_directory(d / "peers");
  std::ofstream(d / "peers" / "node0.peer") << "x";
  vanished = 0;
  solar::sys::remove_tree(d);
  EXPECT_GE(vanished.load(), 1) << "the race was not made: this test checked nothing";
  EXPECT_FALSE(fs::exists(d)) << "left behind: " << d;
  std::error_code ec;
  fs::remove_all(d, ec);
}

TEST(RemoveTree, AFolderThatIsNotThereIsNoError) {
  solar::sys::remove_tree("/tmp/solar-remove-tree-never-made");
  EXPECT_FALSE(fs::exists("/tmp/solar-remove-tree-never-made"));
}

// Issue 32: a tree deeper than the open-file limit (a user can make one in a folder of theirs
// that root removes) is removed whole; std::filesystem::remove_all held a descriptor per level
// and stopped at EMFILE.
TEST(RemoveTree, RemovesATreeDeeperThanTheOpenFileLimit) {
  char tmpl[] = "/tmp/solar-remove-tree-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path d = tmpl;
  constexpr int kDepth = 600;
  int fd = ::open(tmpl, O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  for (int i = 0; i < kDepth; ++i) {  // d/d/d/...: deeper than PATH_MAX allows by name, too
    ASSERT_EQ(::mkdirat(fd, "dd", 0700), 0);
    const int next = ::openat(fd, "dd", O_RDONLY | O_DIRECTORY);
    if (i % 100 == 0) ::close(::openat(fd, "file", O_WRONLY | O_CREAT, 0600));
    ::close(fd);
    fd = next;
    ASSERT_GE(fd, 0);
  }
  ::close(fd);
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &before), 0);
  rlimit low = before;
  low.rlim_cur = 64;  // far fewer than the levels
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  const bool removed = solar::sys::remove_tree(d);
  ::setrlimit(RLIMIT_NOFILE, &before);
  EXPECT_TRUE(removed);
  EXPECT_FALSE(fs::exists(d)) << "left behind: " << d;
}

// A folder of the tree moved out of it while it is removed is not followed out: the removal
// stops rather than climb ".." into the folder it was moved to.
TEST(RemoveTree, DoesNotClimbOutOfAFolderMovedAway) {
  char tmpl[] = "/tmp/solar-remove-tree-XXXXXX", away[] = "/tmp/solar-remove-tree-away-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  ASSERT_NE(::mkdtemp(away), nullptr);
  const fs::path d = tmpl, a = away;
  fs::create_directories(d / "x" / "y");
  std::ofstream(d / "x" / "y" / (std::string("z") + kVanishes)) << "x";
  std::ofstream(a / "keep") << "x";
  moved_from = d / "x";
  moved_to = a / "x";
  EXPECT_FALSE(solar::sys::remove_tree(d));
  EXPECT_TRUE(moved_from.empty()) << "the move was not made: this test checked nothing";
  moved_from.clear();
  EXPECT_TRUE(fs::exists(a / "keep")) << "removed a file outside the tree";
  std::error_code ec;
  fs::remove_all(d, ec);
  fs::remove_all(a, ec);
}

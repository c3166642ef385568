// solar::remove_tree (core/include/solar/core/remove_tree.h): a folder is removed whole even
// when another process unlinks one of its entries while it is being removed (an agent removing
// its own socket as it stops, while `solar run` removes its run folder). Its own executable:
// the race is made here by interposing unlinkat/unlink (this program's definitions come before
// libc's), for entries whose name carries kVanishes only.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "solar/core/remove_tree.h"

namespace fs = std::filesystem;

namespace {
constexpr const char* kVanishes = ".vanishes-while-removed";
std::atomic<int> vanished{0};  // entries unlinked "by someone else" just before their removal
}  // namespace

// The entry disappears between the listing and the unlink: someone else removes it first.
extern "C" int unlinkat(int dirfd, const char* path, int flags) {
  using Real = int (*)(int, const char*, int);
  static const Real real = reinterpret_cast<Real>(::dlsym(RTLD_NEXT, "unlinkat"));
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
  solar::remove_tree(d);
  EXPECT_GE(vanished.load(), 1) << "the race was not made: this test checked nothing";
  EXPECT_FALSE(fs::exists(d)) << "left behind: " << d;
  std::error_code ec;
  fs::remove_all(d, ec);
}

TEST(RemoveTree, AFolderThatIsNotThereIsNoError) {
  solar::remove_tree("/tmp/solar-remove-tree-never-made");
  EXPECT_FALSE(fs::exists("/tmp/solar-remove-tree-never-made"));
}

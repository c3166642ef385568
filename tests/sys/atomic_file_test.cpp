// SPDX-License-Identifier: Apache-2.0
// solar::sys::write_file_atomically (sys/include/solar/sys/atomic_file.h): the whole file or
// the one before, never a part; no temporary file left behind, done or failed.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "solar/sys/atomic_file.h"

namespace solar::sys {
namespace {
namespace fs = std::filesystem;

class AtomicFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "solar-atomic-file-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string read(const fs::path& p) {
    std::ifstream f(p);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
  }
  std::size_t entries() {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++n;
    return n;
  }
  fs::path dir_;
};

TEST_F(AtomicFile, WritesAndReplacesWithTheModeLessTheUmask) {
  const fs::path p = dir_ / "out.json";
  ASSERT_EQ(write_file_atomically(p, "first", 0600), nullptr);
  EXPECT_EQ(read(p), "first");
  ASSERT_EQ(write_file_atomically(p, "second, longer", 0600), nullptr);
  EXPECT_EQ(read(p), "second, longer");
  struct stat st {};
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600U);
  EXPECT_EQ(entries(), 1U);  // no temporary file beside it
}

TEST_F(AtomicFile, EmptyBytesGiveAnEmptyFile) {
  ASSERT_EQ(write_file_atomically(dir_ / "e", "", 0644), nullptr);
  EXPECT_EQ(fs::file_size(dir_ / "e"), 0U);
}

TEST_F(AtomicFile, AMissingFolderSaysWhichStepFailed) {
  errno = 0;
  const char* failed = write_file_atomically(dir_ / "no" / "such" / "f", "x", 0644);
  ASSERT_NE(failed, nullptr);
  EXPECT_STREQ(failed, "cannot create a temporary file beside it");
  EXPECT_EQ(errno, ENOENT);
}

TEST_F(AtomicFile, RenamingOverAFolderFailsAndLeavesNoTemporaryFile) {
  fs::create_directory(dir_ / "taken");
  fs::create_directory(dir_ / "taken" / "full");  // rename(file, non-empty folder) fails
  const char* failed = write_file_atomically(dir_ / "taken", "x", 0644);
  ASSERT_NE(failed, nullptr);
  EXPECT_STREQ(failed, "renaming the temporary file over it");
  EXPECT_EQ(entries(), 1U);
}

}  // namespace
}  // namespace solar::sys

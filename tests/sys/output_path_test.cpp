// SPDX-License-Identifier: Apache-2.0
// solar::sys::output_file_problem (sys/include/solar/sys/output_path.h): what is wrong with an
// output path, as the sentence the front ends print after the option's name.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>

#include "solar/sys/output_path.h"

namespace solar::sys {
namespace {
namespace fs = std::filesystem;

TEST(OutputPath, AFileInAWritableFolderIsFine) {
  std::string tmpl = (fs::temp_directory_path() / "solar-output-path-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  EXPECT_EQ(output_file_problem(tmpl + "/stats.json"), "");
  EXPECT_EQ(output_file_problem(tmpl), tmpl + " is a folder; give a file name");
  EXPECT_EQ(output_file_problem(tmpl + "/no/stats.json"),
            "the folder " + tmpl + "/no does not exist; create it first");
  EXPECT_EQ(output_file_problem(""), "'' is not a usable path");
  if (::geteuid() != 0) {
    fs::permissions(tmpl, fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_EQ(output_file_problem(tmpl + "/stats.json"),
              "cannot write in " + tmpl + ": Permission denied");
    fs::permissions(tmpl, fs::perms::owner_all);
  }
  fs::remove_all(tmpl);
}

}  // namespace
}  // namespace solar::sys

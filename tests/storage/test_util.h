// SPDX-License-Identifier: Apache-2.0
// Helpers for storage tests: a temporary directory that is always removed, running programs,
// and a solar-stored process that is stopped by PID however the test ends.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "solar/storage/hdf5_writer.h"
#include "solar/storage/sample_source.h"

namespace solar::storage::test {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Runs argv to completion; returns the exit status (-1 if it could not start), output in `out`.
int run(const std::vector<std::string>& argv, std::string* out = nullptr);

// True when /usr/bin/python3 can import h5py and numpy.
bool have_h5py();

// A solar-stored child process. start() waits (by polling its ready file) until it accepts
// connections, or returns false with its log when it exits first.
class StoredProcess {
 public:
  StoredProcess(const TempDir& dir, std::vector<std::string> args);
  ~StoredProcess();
  bool start(std::uint16_t port = 0);
  void kill_now();  // SIGKILL and reap
  std::uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string uri(const std::string& name) const;
  std::string log() const;
  int wait_exit();  // reaps; returns the exit status

 private:
  std::string ready_, log_;
  std::vector<std::string> args_;
  pid_t pid_ = -1;
  std::uint16_t port_ = 0;
};

// A generated dataset NAME in `dir` (seed 5, content checkable with content::check_sample).
std::string write(const TempDir& dir, const std::string& name, Layout layout,
                  std::uint64_t samples = 48, std::vector<std::uint64_t> shape = {4, 16, 16, 16});

// Reads `runs` (samples and labels) through `src` and checks every byte against seed 5.
void expect_all(SampleSource& src, const std::vector<SampleRun>& runs);

// Whether `count` samples at `buf`, of `sample_bytes` each, are samples first.. of seed 5's
// content (content::check_sample); the failure names the first sample that is not.
::testing::AssertionResult holds_content(const std::byte* buf, std::uint64_t first,
                                         std::uint64_t count, std::uint64_t sample_bytes);

// The message of the StorageError f() throws, "(no error)" when it throws none.
std::string error_of(const std::function<void()>& f);

}  // namespace solar::storage::test

// SPDX-License-Identifier: Apache-2.0
// The error every check of the user's input throws: it names the flag.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace solar {

// A bad input: names the flag, what is wrong and the allowed range.
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string flag, const std::string& message)
      : std::runtime_error(flag + ": " + message), flag_(std::move(flag)) {}
  const std::string& flag() const { return flag_; }

 private:
  std::string flag_;
};

// Throws ConfigError (flag) unless a file can be written at `path`: its folder exists and is
// writable, and it is not a folder itself (sys::output_file_problem says what is wrong). For
// output options checked before a job starts.
void check_output_file(const std::string& path, const std::string& flag);
}  // namespace solar

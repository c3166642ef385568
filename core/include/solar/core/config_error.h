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
}  // namespace solar

// SPDX-License-Identifier: Apache-2.0
#include "solar/sys/output_path.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace solar::sys {

std::string output_file_problem(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(path, ec);
  if (ec || path.empty()) return "'" + path + "' is not a usable path";
  if (std::filesystem::is_directory(p, ec)) return path + " is a folder; give a file name";
  const std::filesystem::path dir = p.parent_path();
  if (!std::filesystem::is_directory(dir, ec))
    return "the folder " + dir.string() + " does not exist; create it first";
  if (::access(dir.c_str(), W_OK) != 0)
    return "cannot write in " + dir.string() + ": " + std::strerror(errno);
  return {};
}

}  // namespace solar::sys

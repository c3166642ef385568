// SPDX-License-Identifier: Apache-2.0
// Whether an output file can be written, checked before a job starts (platform code).
#pragma once

#include <string>

namespace solar::sys {

// "" when a file can be written at `path`: its folder exists and is writable, and it is not a
// folder itself; else what is wrong, as a sentence for the user ("the folder X does not exist;
// create it first"). check_output_file (core/config_error.h) throws it as a ConfigError.
std::string output_file_problem(const std::string& path);

}  // namespace solar::sys

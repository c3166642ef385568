// SPDX-License-Identifier: Apache-2.0
// The storage subcommands, each in a file of its own; add_storage_commands (cmd_storage.cpp)
// registers them and `solar dataset-info`.
#pragma once

#include <CLI/CLI.hpp>

namespace solar::cli {

void add_gen_command(CLI::App& app);         // gen (cmd_gen.cpp)
void add_verify_command(CLI::App& app);      // verify (cmd_verify.cpp)
void add_bench_io_command(CLI::App& bench);  // bench io, under `bench` (cmd_bench_io.cpp)

}  // namespace solar::cli

// SPDX-License-Identifier: Apache-2.0
// Each subcommand registers itself on the `solar` app; main.cpp calls these in order.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <vector>

namespace solar::cli {

// Exit codes shared by all subcommands.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the work failed (I/O, a corrupt file, a check)
inline constexpr int kExitUsage = 2;    // bad input: an option, a value, a missing file

// The subcommand that ran sets this; main returns it.
int& exit_code();

// The median of a benchmark's repeated measurements (0 for none): bench io, bench serve.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void add_plan_commands(CLI::App& app);     // plan, plan-dump (cmd_plan.cpp)
void add_storage_commands(CLI::App& app);  // gen, verify, bench io (cmd_storage.cpp)
void add_run_commands(CLI::App& app);      // run (cmd_run.cpp)
void add_stat_command(CLI::App& app);      // stat (cmd_stat.cpp)
void add_bench_loader_command(CLI::App& app);  // bench loader (cmd_bench_loader.cpp)
void add_bench_serve_command(CLI::App& app);   // bench serve (cmd_bench_serve.cpp)
void add_report_command(CLI::App& app);  // report (cmd_report.cpp)
void add_slurm_check_command(CLI::App& app);  // slurm-check (cmd_slurm_check.cpp)

}  // namespace solar::cli

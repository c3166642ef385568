// SPDX-License-Identifier: Apache-2.0
// solar report: one SVG picture from measured statistics and benchmark results (what it reads
// and draws: report.h).
#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "report.h"
#include "solar/sys/atomic_file.h"

namespace solar::cli {
namespace {

void run_report(const std::vector<std::string>& paths, const std::string& out_path,
                const std::string& title) {
  std::vector<ReportInput> inputs;
  for (const std::string& path : paths) {
    std::ifstream f(path);
    if (!f)
      throw BadInput(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
    std::ostringstream text;
    text << f.rdbuf();
    inputs.push_back({path, text.str()});
  }
  const Report report = report_svg(inputs, title);
  if (const char* failed = sys::write_file_atomically(out_path, report.svg, 0666))
    throw std::runtime_error(fmt::format("{}: {}: {}", out_path, failed, std::strerror(errno)));
  std::fprintf(stderr, "solar report: wrote %s (%zu panels)\n", out_path.c_str(),
               report.panels);
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "report", "Draw measured statistics and benchmark results as one SVG picture: per-epoch "
                "loading time against the storage's limit, hit rate and stall per epoch and "
                "node (with the plan's and the lower bound's), a sweep's speedups against their "
                "limits, MLPerf Storage accelerator utilisation against the number of "
                "accelerators. Overlapping lines keep apart by dashes and marker shapes; "
                "legends give each line's total");
  auto inputs = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>("solar-report.svg");
  auto title = std::make_shared<std::string>();
  cmd->add_option("inputs", *inputs,
                  "JSON files: solar run --stats-out / srun --solar-stats statistics, "
                  "bench/pytorch_io.py --json results, bench/sweep results, bench/au.py --json results")
      ->required()
      ->type_name("FILE...");
  cmd->add_option("-o,--output", *out, "The SVG file to write [solar-report.svg]")
      ->type_name("FILE");
  cmd->add_option("--title", *title,
                  "The picture's title [from the inputs: what ran and its headline figures, "
                  "e.g. \"solar run: 2 nodes, 3 epochs, hit rate 32.0%, plan 1.000x the lower "
                  "bound\"]")
      ->type_name("TEXT");
  cmd->callback([=] {
    try {
      run_report(*inputs, *out, *title);
    } catch (const BadInput& e) {
      std::fprintf(stderr, "solar report: %s\n", e.what());
      exit_code() = kExitUsage;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "solar report: %s\n", e.what());
      exit_code() = kExitFailure;
    }
  });
}

}  // namespace solar::cli

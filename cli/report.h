// SPDX-License-Identifier: Apache-2.0
// solar report's reading and drawing, without files or the command line (cmd_report.cpp): JSON
// texts in, one SVG picture out. What it recognises is listed at the top of report.cpp.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace solar::cli {

// One input: its file's path (named in errors and panel titles) and its text.
struct ReportInput {
  std::string name;
  std::string text;
};

// Bad input: one line naming the file and what is wrong with it (`solar report` exits 2).
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Report {
  std::string svg;         // the picture
  std::size_t panels = 0;  // how many panels it has
};

// The picture of `inputs`, one panel per kind each holds, under `title` (empty: one made from the
// inputs, what ran and its headline figure). Throws BadInput when an
// input is not JSON or not a stats file, a benchmark result or a sweep.
Report report_svg(const std::vector<ReportInput>& inputs, const std::string& title);

}  // namespace solar::cli

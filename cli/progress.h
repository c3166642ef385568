// SPDX-License-Identifier: Apache-2.0
// The progress bar of the `solar` tool: one line on stderr for long work (planning, writing
// and verifying datasets), drawn only when stderr is a terminal, and only once the work has
// taken longer than a moment, so short runs, pipes, logs and tests never see it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace solar::cli {

// "#####     " of `width` characters for done/total (full when total is 0). Also used by
// `solar stat` for its per-rank bars.
std::string bar_text(std::uint64_t done, std::uint64_t total, int width = 30);

class ProgressBar {
 public:
  // `enabled`: the user did not pass --no-progress. Drawn when that holds, stderr is a
  // terminal and `show_after` seconds have passed; redrawn at most 10 times a second; the line
  // is erased when the bar goes away.
  ProgressBar(std::string label, bool enabled, double show_after = 1.0);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void operator()(std::uint64_t done, std::uint64_t total);

 private:
  using Clock = std::chrono::steady_clock;
  std::string label_;
  bool on_;
  bool shown_ = false;
  double show_after_;
  Clock::time_point start_ = Clock::now(), last_draw_{};
};

}  // namespace solar::cli

// SPDX-License-Identifier: Apache-2.0
#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace solar::cli {

std::string bar_text(std::uint64_t done, std::uint64_t total, int width) {
  const std::uint64_t w = static_cast<std::uint64_t>(width > 0 ? width : 0);
  const std::uint64_t fill = total ? (done >= total ? w : w * done / total) : w;
  return std::string(fill, '#') + std::string(w - fill, ' ');
}

ProgressBar::ProgressBar(std::string label, bool enabled, double show_after)
    : label_(std::move(label)), on_(enabled && ::isatty(2) == 1), show_after_(show_after) {}

ProgressBar::~ProgressBar() {
  if (shown_) {
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
  }
}

void ProgressBar::operator()(std::uint64_t done, std::uint64_t total) {
  if (!on_) return;
  const auto now = Clock::now();
  const double s = std::chrono::duration<double>(now - start_).count();
  if (s < show_after_) return;
  if (shown_ && now - last_draw_ < std::chrono::milliseconds(100) && done < total) return;
  shown_ = true;
  last_draw_ = now;
  const int pct = total ? static_cast<int>(100 * (done >= total ? total : done) / total) : 100;
  std::fprintf(stderr, "\r%s [%s] %3d%%  %.0fs", label_.c_str(), bar_text(done, total).c_str(),
               pct, s);
  std::fflush(stderr);
}

}  // namespace solar::cli

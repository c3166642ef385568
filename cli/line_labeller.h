// SPDX-License-Identifier: Apache-2.0
// `solar run -l`: every line a rank writes goes to our stdout/stderr prefixed with its label,
// whole lines only (used by the launcher).
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace solar::cli {

// Reads every rank's stdout and stderr through pipes, on one thread, and writes each complete
// line to our stdout/stderr with the rank's label in one write, so lines are never cut or
// mixed. A line without its newline is written when the rank closes the pipe (with a newline
// added), or when it grows past kMaxLine bytes.
class LineLabeller {
 public:
  static constexpr std::size_t kMaxLine = 1 << 20;

  LineLabeller();
  ~LineLabeller();
  LineLabeller(const LineLabeller&) = delete;
  LineLabeller& operator=(const LineLabeller&) = delete;

  // A pipe whose write end goes to a rank as its fd 1 or 2; returns that write end (the
  // caller closes it once the rank is started).
  int add(int dest, std::string label);

  void start();

  // After the ranks exited: waits up to `grace` seconds for their pipes to close (a child
  // they left behind may hold them), then forwards whatever is buffered and stops.
  void finish(double grace);

 private:
  struct Stream {
    int fd;
    int dest;
    std::string label, partial;
  };

  void emit(Stream& s, std::string_view line);

  enum class Got { data, nothing, end };

  // Reads what is there and forwards its complete lines.
  Got pump(Stream& s);

  void close_stream(Stream& s);

  void loop();

  std::vector<Stream> streams_;
  int stop_[2] = {-1, -1};
  std::thread thread_;
  std::mutex mu_;  // guards grace_
  double grace_ = 0;
};

}  // namespace solar::cli

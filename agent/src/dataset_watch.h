// SPDX-License-Identifier: Apache-2.0
// DatasetWatch (batch mode over HDF5 files): checks the open file and its path every
// kWatchPeriod (a dataset of many files: kWatchSlice of them in turn, each with its path); a
// file rewritten, truncated, replaced (renamed over), renamed away or deleted stops the agent (Agent::Impl::fail: the ranks are told why and read directly, where the same
// checks refuse the file). In transparent mode the pacer watches the file instead
// (transparent_pacer.h). Internal to solar-agent.
//
// Contract:
// - One thread, started by start() (it returns at once for a source without files:
//   solar-stored);
//   it sleeps on its condition variable under the agent's lock `Agent::Impl::mu_` and stops
//   once the agent is stopping or has failed: whoever sets either calls wake() (with or without
//   the lock), then join().
// - The checks themselves run without the lock (the source's own checks are thread-safe).
// - It holds a back-reference to the agent (Agent::Impl), which owns it and outlives it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <thread>

#include "agent.h"

namespace solar::agent {

// How often the agent checks that its dataset file is still the one it opened, and how many of
// a dataset's files it checks each time (a stat each: 10^5 files are all checked in 80 s).
inline constexpr std::chrono::milliseconds kWatchPeriod{200};
inline constexpr std::size_t kWatchSlice = 256;

class DatasetWatch {
 public:
  explicit DatasetWatch(Agent::Impl& agent) : a_(agent) {}
  DatasetWatch(const DatasetWatch&) = delete;
  DatasetWatch& operator=(const DatasetWatch&) = delete;

  void start();
  void wake() { wake_.notify_all(); }
  void join();

 private:
  void loop();

  Agent::Impl& a_;  // the agent that owns this part
  std::thread thread_;
  std::condition_variable wake_;
};

}  // namespace solar::agent

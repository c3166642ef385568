// SPDX-License-Identifier: Apache-2.0
// The batch mode's checks of the dataset file. See dataset_watch.h.
#include "dataset_watch.h"

#include <fmt/format.h>

#include <algorithm>

#include "agent_impl.h"
#include "solar/storage/dataset_files.h"

namespace solar::agent {

void DatasetWatch::start() {
  thread_ = std::thread([this] { loop(); });
}

void DatasetWatch::join() {
  if (thread_.joinable()) thread_.join();
}

void DatasetWatch::loop() {
  const storage::DatasetFiles* set = a_.source_->file_set();
  if (!set || set->files().empty()) return;
  const std::size_t files = set->files().size();
  const std::size_t slice = std::min<std::size_t>(files, kWatchSlice);
  std::size_t next = 0;  // the next file to check
  for (;;) {
    {
      std::unique_lock lk(a_.mu_);
      wake_.wait_for(lk, kWatchPeriod, [&] { return a_.stopping_ || !a_.fatal_.empty(); });
      if (a_.stopping_ || !a_.fatal_.empty()) return;
    }
    try {
      for (std::size_t k = 0; k < slice; ++k, next = (next + 1) % files) set->check_file(next);
    } catch (const storage::StorageError& e) {
      a_.fail(fmt::format("{}; this agent stops serving it", e.what()));
      return;
    }
  }
}

}  // namespace solar::agent

// The batch mode's checks of the dataset file. See dataset_watch.h.
#include "dataset_watch.h"

#include <fmt/format.h>

#include "agent_impl.h"
#include "solar/storage/hdf5_source.h"

namespace solar::agent {

void DatasetWatch::start() {
  thread_ = std::thread([this] { loop(); });
}

void DatasetWatch::join() {
  if (thread_.joinable()) thread_.join();
}

void DatasetWatch::loop() {
  const auto* h5 = dynamic_cast<const storage::Hdf5Source*>(a_.source_.get());
  if (!h5) return;
  for (;;) {
    {
      std::unique_lock lk(a_.mu_);
      wake_.wait_for(lk, kWatchPeriod, [&] { return a_.stopping_ || !a_.fatal_.empty(); });
      if (a_.stopping_ || !a_.fatal_.empty()) return;
    }
    try {
      h5->check_unchanged();
      h5->check_path();
    } catch (const storage::StorageError& e) {
      a_.fail(fmt::format("{}; this agent stops serving it", e.what()));
      return;
    }
  }
}

}  // namespace solar::agent

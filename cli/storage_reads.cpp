// SPDX-License-Identifier: Apache-2.0
#include "storage_reads.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace solar::cli {

// Splits sorted runs into batches of at most `max_bytes` (at least one sample each).
std::vector<std::vector<SampleRun>> batches(const std::vector<SampleRun>& runs,
                                            std::uint64_t sample_bytes, std::uint64_t max_bytes) {
  const std::uint64_t per = std::max<std::uint64_t>(1, max_bytes / std::max<std::uint64_t>(1, sample_bytes));
  std::vector<std::vector<SampleRun>> out(1);
  std::uint64_t n = 0;
  for (SampleRun r : runs) {
    while (r.count) {
      if (n == per) {
        out.emplace_back();
        n = 0;
      }
      const std::uint64_t take = std::min(r.count, per - n);
      out.back().push_back({r.first, take});
      r.first += take;
      r.count -= take;
      n += take;
    }
  }
  if (out.back().empty()) out.pop_back();
  return out;
}

// Reads every batch, two at a time (double buffering: one batch is being issued while the
// other completes, as the agent does), into `bufs`, two buffers of at least a batch each.
void read_all(storage::SampleSource& src, const std::vector<std::vector<SampleRun>>& parts,
              const Destination (&bufs)[2]) {
  std::atomic<std::size_t> next{0};
  std::exception_ptr err;
  std::mutex mu;
  auto reader = [&](const Destination& buf) {
    try {
      for (std::size_t i; (i = next.fetch_add(1)) < parts.size();) src.read(parts[i], buf.data());
    } catch (...) {
      std::lock_guard g(mu);
      if (!err) err = std::current_exception();
      next = parts.size();
    }
  };
  std::thread other(reader, std::cref(bufs[1]));
  reader(bufs[0]);
  other.join();
  if (err) std::rethrow_exception(err);
}

}  // namespace solar::cli

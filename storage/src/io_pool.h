// SPDX-License-Identifier: Apache-2.0
// A fixed set of threads that run the parts of a job in parallel: Boost.Asio's thread_pool,
// with the caller working on its own job too. Several callers may submit jobs at once; as each
// caller also takes parts of its own job, a busy pool (or a pool of no threads) never
// deadlocks it: the pool's threads only help.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

namespace boost::asio {
class thread_pool;
}

namespace solar::storage {

class IoPool {
 public:
  explicit IoPool(unsigned threads);  // 0: every part runs on the caller's thread
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  // Runs part(0) .. part(n-1), returns when all are done; rethrows the first exception (the
  // parts not started by then are skipped).
  void run(std::size_t n, const std::function<void(std::size_t)>& part);

 private:
  struct Job;
  static void work_on(Job& job);

  unsigned threads_;
  std::unique_ptr<boost::asio::thread_pool> pool_;  // null without threads
};

}  // namespace solar::storage

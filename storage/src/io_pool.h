// A fixed set of threads that run the parts of a job in parallel. Several callers may submit
// jobs at once; each caller also works on its own job, so a busy pool never deadlocks it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace solar::storage {

class IoPool {
 public:
  explicit IoPool(unsigned threads);
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  // Runs part(0) .. part(n-1), returns when all are done; rethrows the first exception.
  void run(std::size_t n, const std::function<void(std::size_t)>& part);

 private:
  struct Job;
  void worker();
  static void work_on(Job& job);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace solar::storage

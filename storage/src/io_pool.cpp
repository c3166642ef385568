// SPDX-License-Identifier: Apache-2.0
#include "io_pool.h"

#include <algorithm>
#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <condition_variable>
#include <exception>
#include <mutex>

namespace solar::storage {

// One run(): its parts are taken one at a time, by index, by the caller and by the pool's
// helpers alike. A helper that starts after the last part was taken finds nothing to do (it
// holds the job, never `part`, which only lives while run() does).
struct IoPool::Job {
  std::size_t n = 0;
  const std::function<void(std::size_t)>* part = nullptr;
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> done{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;
};

IoPool::IoPool(unsigned threads) : threads_(threads) {
  if (threads_ > 0) pool_ = std::make_unique<boost::asio::thread_pool>(threads_);
}

IoPool::~IoPool() {
  if (pool_) {
    pool_->stop();  // helpers still queued would find their jobs done: they need not run
    pool_->join();
  }
}

void IoPool::work_on(Job& job) {
  for (;;) {
    const std::size_t i = job.next.fetch_add(1);
    if (i >= job.n) return;
    if (!job.failed.load()) {
      try {
        (*job.part)(i);
      } catch (...) {
        std::lock_guard lock(job.mu);
        if (!job.error) job.error = std::current_exception();
        job.failed = true;
      }
    }
    if (job.done.fetch_add(1) + 1 == job.n) {
      std::lock_guard lock(job.mu);
      job.cv.notify_all();
    }
  }
}

void IoPool::run(std::size_t n, const std::function<void(std::size_t)>& part) {
  if (n == 0) return;
  auto job = std::make_shared<Job>();
  job->n = n;
  job->part = &part;
  // At most one helper per part beyond the caller's first, and no more than the pool has.
  if (n > 1 && pool_) {
    const std::size_t helpers = std::min<std::size_t>(threads_, n - 1);
    for (std::size_t h = 0; h < helpers; ++h)
      boost::asio::post(*pool_, [job] { work_on(*job); });
  }
  work_on(*job);
  {
    std::unique_lock lock(job->mu);
    job->cv.wait(lock, [&] { return job->done.load() == job->n; });
  }
  // Taken out of the job under its lock: a helper still holding the job must not be the one
  // that drops the last reference to the exception while this thread reads it (the count
  // lives in libstdc++, which TSan does not see: scripts/sanitize thread reported it).
  std::exception_ptr error;
  {
    std::lock_guard lock(job->mu);
    error = std::move(job->error);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace solar::storage

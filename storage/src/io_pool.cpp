#include "io_pool.h"

#include <atomic>

namespace solar::storage {

struct IoPool::Job {
  std::size_t n;
  const std::function<void(std::size_t)>* part;
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> done{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;
};

IoPool::IoPool(unsigned threads) {
  for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { worker(); });
}

IoPool::~IoPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
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

void IoPool::worker() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = jobs_.front();
      if (job->next.load() >= job->n) {
        jobs_.pop_front();
        continue;
      }
    }
    work_on(*job);
  }
}

void IoPool::run(std::size_t n, const std::function<void(std::size_t)>& part) {
  if (n == 0) return;
  auto job = std::make_shared<Job>();
  job->n = n;
  job->part = &part;
  if (n > 1 && !threads_.empty()) {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(job);
    }
    cv_.notify_all();
  }
  work_on(*job);
  {
    std::unique_lock lock(job->mu);
    job->cv.wait(lock, [&] { return job->done.load() == job->n; });
  }
  {
    std::lock_guard lock(mu_);
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it)
      if (*it == job) {
        jobs_.erase(it);
        break;
      }
  }
  // Taken out of the job under its lock: a worker still holding the job must not be the one
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

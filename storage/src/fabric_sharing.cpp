// SPDX-License-Identifier: Apache-2.0
// Several threads' reads on one session: a caller that finds no driver drives, else waits
// for its request to be finished; the engine thread drives what callers leave queued.
#include "fabric_source_impl.h"

namespace solar::storage {

void FabricSource::Impl::finish(Request& r, std::exception_ptr error) {
  r.local = fabric::Region();
  bool storage = false;
  std::optional<std::string> what;
  if (error) {
    what = "unknown error";
    try {
      std::rethrow_exception(error);
    } catch (const StorageError& e) {
      what = e.what();
      storage = true;
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
  }
  std::condition_variable& wake = wake_of(&r);
  {
    std::lock_guard g(mu);
    r.storage_error = storage;
    r.error = std::move(what);
    r.finished = true;
  }
  wake.notify_all();  // r may be gone already (its owner saw `finished`); `wake` is ours
}

void FabricSource::Impl::fail_all(std::exception_ptr error) {
  drop_session();
  std::vector<Request*> all;
  all.swap(active);
  {
    std::lock_guard g(mu);
    all.insert(all.end(), incoming.begin(), incoming.end());
    incoming.clear();
    has_incoming = false;
  }
  for (Request* r : all) finish(*r, error);  // each owner throws an exception of its own
}

void FabricSource::Impl::release_locked() {
  driving = false;
  if (exclusive_waiting) {
    exclusive_cv.notify_one();
    return;
  }
  if (active.empty() && incoming.empty()) return;
  // Others' reads are queued: the engine thread drives them (the session stays taken).
  try {
    if (!engine.joinable()) engine = std::thread([this] { engine_loop(); });
    driving = true;
    engine_wanted = true;
    engine_cv.notify_one();
  } catch (const std::system_error&) {  // no thread to be had: a waiting caller drives
    wake_of(active.empty() ? incoming.front() : active.front()).notify_all();
  }
}

void FabricSource::Impl::engine_loop() {
  std::unique_lock lk(mu);
  for (;;) {
    engine_cv.wait(lk, [&] { return engine_stop || engine_wanted; });
    if (engine_stop) return;
    engine_wanted = false;  // the session is ours (driving)
    lk.unlock();
    try {
      with_retries([&](Session& s) { pump(s, nullptr); });
    } catch (...) {
      fail_all(std::current_exception());
    }
    lk.lock();
    release_locked();
  }
}

void FabricSource::Impl::submit(Request& req) {
  req.left = req.pieces.size();
  req.done.assign(req.pieces.size(), 0);
  req.wake = caller_wake();
  if (req.left == 0) return;
  std::unique_lock lk(mu);
  incoming.push_back(&req);
  has_incoming = true;
  while (!req.finished) {
    if (driving) {
      wake_of(&req).wait(lk);
      continue;
    }
    driving = true;
    lk.unlock();
    try {
      with_retries([&](Session& s) { pump(s, &req); });
    } catch (...) {
      fail_all(std::current_exception());  // req among them
    }
    lk.lock();
    release_locked();
  }
  if (req.error) {
    if (req.storage_error) throw StorageError(*req.error);
    throw std::runtime_error(*req.error);
  }
}

}  // namespace solar::storage

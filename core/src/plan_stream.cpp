// SPDX-License-Identifier: Apache-2.0
#include "solar/core/plan_stream.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "plan_builder.h"
#include "policies.h"
#include "solar/core/config_error.h"

namespace solar {

struct NodePlanStream::State final : detail::StepSink {
  struct Stopped {};  // unwinds the planner when the reader goes away

  State(const PlanConfig& c, std::uint32_t n, std::uint64_t w)
      : config(c), node(n), window(w), total(std::uint64_t{EpochLayout::of(c).steps} * c.epochs) {}

  void step(std::uint64_t t, const detail::StepRecord& rec) override {
    const std::uint32_t R = config.ranks_per_node;
    NodeStep s;
    s.t = t;
    s.ranks.assign(rec.ranks.begin() + std::uint64_t{node} * R,
                   rec.ranks.begin() + std::uint64_t{node + 1} * R);
    s.evicts = rec.evicted[node];
    s.fetches = rec.runs[node];
    s.peers = rec.peers[node];
    for (std::uint32_t m = 0; m < config.nodes; ++m)
      if (m != node)
        for (const PeerFetch& f : rec.peers[m])
          if (f.from_node == node) s.serves.push_back({f.sample, m});
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return stop || ready.size() < window; });
    if (stop) throw Stopped{};
    ready.push_back(std::move(s));
    cv.notify_all();
  }

  void run() {
    try {
      const ProgressFn none;
      Plan p = detail::plan_by_policy(config, none, this);
      std::lock_guard lk(mu);
      metrics = std::move(p.metrics);
      finished = true;
    } catch (const Stopped&) {
      return;
    } catch (...) {
      std::lock_guard lk(mu);
      error = std::current_exception();
      finished = true;
    }
    cv.notify_all();
  }

  const PlanConfig config;
  const std::uint32_t node;
  const std::uint64_t window, total;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<NodeStep> ready;  // computed, not yet taken
  std::uint64_t taken = 0;
  bool stop = false, finished = false;
  std::exception_ptr error;
  Metrics metrics;
  std::thread thread;
};

NodePlanStream::NodePlanStream(const PlanConfig& config, std::uint32_t node,
                               std::uint64_t window) {
  config.validate();
  if (node >= config.nodes)
    throw ConfigError("--node", "node " + std::to_string(node) + " is not one of the plan's " +
                                    std::to_string(config.nodes) + " nodes (0.." +
                                    std::to_string(config.nodes - 1) + ")");
  if (window == 0) throw ConfigError("--window", "must be at least one step");
  if (config.tiered())
    throw ConfigError("--local-buffer",
                      "a plan with a local tier is not computed step by step yet (placing the "
                      "tiers needs the node's whole schedule): compute the whole plan");
  s_ = std::make_unique<State>(config, node, window);
  s_->thread = std::thread([s = s_.get()] { s->run(); });
}

NodePlanStream::~NodePlanStream() {
  {
    std::lock_guard lk(s_->mu);
    s_->stop = true;
  }
  s_->cv.notify_all();
  s_->thread.join();
}

std::uint64_t NodePlanStream::total_steps() const { return s_->total; }

std::uint64_t NodePlanStream::taken() const {
  std::lock_guard lk(s_->mu);
  return s_->taken;
}

std::uint64_t NodePlanStream::ready() const {
  std::lock_guard lk(s_->mu);
  return s_->ready.size();
}

NodeStep NodePlanStream::next() {
  std::unique_lock lk(s_->mu);
  if (s_->taken >= s_->total)
    throw std::out_of_range("the plan has " + std::to_string(s_->total) +
                            " steps; all were taken");
  s_->cv.wait(lk, [&] { return !s_->ready.empty() || s_->finished; });
  if (s_->ready.empty()) {
    if (s_->error) std::rethrow_exception(s_->error);
    throw std::logic_error("the planner ended before step " + std::to_string(s_->taken));
  }
  NodeStep s = std::move(s_->ready.front());
  s_->ready.pop_front();
  ++s_->taken;
  s_->cv.notify_all();
  return s;
}

const Metrics& NodePlanStream::metrics() {
  std::unique_lock lk(s_->mu);
  s_->cv.wait(lk, [&] { return s_->finished; });
  if (s_->error) std::rethrow_exception(s_->error);
  return s_->metrics;
}

}  // namespace solar

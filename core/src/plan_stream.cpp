// SPDX-License-Identifier: Apache-2.0
#include "solar/core/plan_stream.h"
#include "solar/core/plan_file.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "plan_builder.h"
#include "policies.h"
#include "solar/core/config_error.h"
#include "solar/core/planner.h"

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

bool can_stream(const PlanConfig& config) {
  return !config.tiered() && config.order != OrderMode::file;
}

void require_streamable(const PlanConfig& config) {
  if (config.tiered())
    throw ConfigError("--local-buffer", "a plan with a local tier is computed whole only (the "
                                        "tiers' placement needs each node's whole schedule)");
  if (config.order == OrderMode::file)
    throw ConfigError("--order-file", "a streamed plan does not carry an order file's order "
                                      "(every node would need the whole list): plan it whole");
}

Plan make_streamed_plan(const PlanConfig& config) {
  config.validate();
  require_streamable(config);
  Plan p;
  p.streamed = true;
  p.config = config;
  p.layout = EpochLayout::of(config);
  p.epoch_order = config.policy == Policy::solar_paper ? paper_epoch_order(config)
                                                       : detail::identity_order(config.epochs);
  p.metrics.per_epoch.resize(config.epochs);
  p.metrics.lower_bound_fetches = lower_bound_fetches(config);
  p.metrics.lower_bound_bytes = lower_bound_bytes(config);
  return p;
}

std::optional<PlanDelivery> parse_plan_delivery(std::string_view text) {
  if (text == "auto") return PlanDelivery::automatic;
  if (text == "whole") return PlanDelivery::whole;
  if (text == "streamed") return PlanDelivery::streamed;
  return std::nullopt;
}

Plan plan_for_job(const PlanConfig& config, PlanDelivery delivery, const ProgressFn& progress) {
  const std::uint64_t accesses = std::uint64_t{config.epochs} * EpochLayout::of(config).used();
  const bool stream =
      delivery == PlanDelivery::streamed ||
      (delivery == PlanDelivery::automatic && accesses > kStreamAboveAccesses && can_stream(config));
  return stream ? make_streamed_plan(config) : make_plan(config, progress);
}

NodePlan collect_node_plan(const PlanConfig& config, std::uint32_t node,
                           std::vector<std::vector<PeerFetch>>* serves) {
  NodePlanStream stream(config, node);
  const std::uint64_t T = stream.total_steps();
  if (serves) serves->assign(T, {});
  NodePlan np;
  np.node = node;
  NodeSchedule& ns = np.schedule;
  np.rank_offsets.reserve(T * config.ranks_per_node + 1);
  np.rank_offsets.push_back(0);
  for (auto* o : {&ns.fetch_offsets, &ns.peer_offsets, &ns.evict_offsets}) {
    o->reserve(T + 1);
    o->push_back(0);
  }
  for (std::uint64_t t = 0; t < T; ++t) {
    NodeStep s = stream.next();
    for (const auto& r : s.ranks) {
      np.accesses.insert(np.accesses.end(), r.begin(), r.end());
      np.rank_offsets.push_back(np.accesses.size());
    }
    detail::append_schedule_step(ns, s.fetches, s.peers, s.evicts);
    if (serves) (*serves)[t] = std::move(s.serves);
  }
  return np;
}

NodePlan node_plan(const PlanFile& file, std::uint32_t node) {
  if (!file.header().streamed) return file.node(node);
  if (node >= file.header().config.nodes)
    throw PlanFileError("no node " + std::to_string(node) + " (the plan has nodes 0.." +
                        std::to_string(file.header().config.nodes - 1) + ")");
  return collect_node_plan(file.header().config, node);
}

}  // namespace solar

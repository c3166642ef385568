// SPDX-License-Identifier: Apache-2.0
#include "solar/core/planner.h"
#include "solar/core/tiers.h"

#include <algorithm>
#include <numeric>

#include "plan_builder.h"
#include "policies.h"

namespace solar {
namespace detail {

EpochStream::EpochStream(const PlanConfig& c, const EpochLayout& layout,
                         std::span<const std::uint32_t> order, bool want_next_use)
    : c_(c), layout_(layout), order_(order), want_next_use_(want_next_use) {}

namespace {

// next[i]: index of the next occurrence of seq[i] in seq (none if none); head[x]: the first
// occurrence of sample x (none if none). One backward pass.
void occurrence_chains(std::span<const std::uint32_t> seq, std::uint64_t samples,
                       std::vector<std::uint32_t>& next, std::vector<std::uint32_t>& head) {
  const std::uint32_t none = ~std::uint32_t{0};
  head.assign(samples, none);
  next.assign(seq.size(), none);
  for (std::uint64_t i = seq.size(); i-- > 0;) {
    const std::uint32_t x = seq[i];
    next[i] = head[x];
    head[x] = static_cast<std::uint32_t>(i);
  }
}

}  // namespace

void EpochStream::load(std::uint32_t position) {
  const std::uint64_t used = layout_.used();
  const bool sequential = have_next_ && position == position_ + 1;
  if (sequential) {
    std::swap(cur_, next_);
  } else {
    epoch_sequence(c_, layout_, order_[position], cur_);
  }
  cur_.resize(used);
  position_ = position;
  have_next_ = false;
  if (!want_next_use_) return;

  // The chains of the epoch that was `next` are already known.
  if (sequential) {
    std::swap(next_in_cur_, next_in_next_);
    std::swap(first_in_cur_, first_in_next_);
  } else {
    occurrence_chains(cur_, c_.samples, next_in_cur_, first_in_cur_);
  }
  if (position + 1 < order_.size()) {
    epoch_sequence(c_, layout_, order_[position + 1], next_);
    next_.resize(used);
    occurrence_chains(next_, c_.samples, next_in_next_, first_in_next_);
    have_next_ = true;
  } else {
    first_in_next_.assign(c_.samples, ~std::uint32_t{0});
  }
}

std::uint64_t EpochStream::next_use(std::uint32_t step, std::uint64_t k) const {
  const std::uint32_t none = ~std::uint32_t{0};
  const std::uint64_t i = layout_.step_begin(step) + k;
  const std::uint64_t used = layout_.used();
  if (next_in_cur_[i] != none) return std::uint64_t{position_} * used + next_in_cur_[i];
  const std::uint32_t f = first_in_next_[cur_[i]];
  if (f != none) return std::uint64_t{position_ + 1} * used + f;
  return kNever;
}

void StepRecord::reset(std::uint64_t world, std::uint32_t nodes) {
  ranks.resize(world);
  for (auto& r : ranks) r.clear();
  misses.resize(nodes);
  peers.resize(nodes);
  evicted.resize(nodes);
  runs.resize(nodes);
  for (std::uint32_t m = 0; m < nodes; ++m) {
    misses[m].clear();
    peers[m].clear();
    evicted[m].clear();
    runs[m].clear();
  }
}

PlanRecorder::PlanRecorder(const PlanConfig& c, std::vector<std::uint32_t> epoch_order,
                           const ProgressFn& progress, StepSink* sink)
    : progress_(progress), sink_(sink) {
  plan_.config = c;
  plan_.layout = EpochLayout::of(c);
  plan_.epoch_order = std::move(epoch_order);
  plan_.metrics.per_epoch.resize(c.epochs);
  plan_.metrics.lower_bound_fetches = lower_bound_fetches(c);
  plan_.metrics.lower_bound_bytes = lower_bound_bytes(c);
  if (sink_) return;  // streamed: no per-step arrays
  const std::uint64_t steps = plan_.total_steps();
  plan_.rank_offsets.reserve(steps * plan_.layout.world + 1);
  plan_.rank_offsets.push_back(0);
  plan_.accesses.reserve(std::uint64_t{c.epochs} * plan_.layout.used());
  plan_.nodes.resize(c.nodes);
  for (auto& n : plan_.nodes) {
    n.fetch_offsets.assign(1, 0);
    n.peer_offsets.assign(1, 0);
    n.evict_offsets.assign(1, 0);
    n.fetch_offsets.reserve(steps + 1);
    n.peer_offsets.reserve(steps + 1);
    n.evict_offsets.reserve(steps + 1);
  }
}

void PlanRecorder::commit(std::uint32_t position, StepRecord& rec) {
  Metrics& m = plan_.metrics;
  EpochMetrics& em = m.per_epoch[position];
  const PlanConfig& c = plan_.config;
  for (const auto& r : rec.ranks) {
    em.accesses += r.size();
    for (std::uint32_t a : r)
      if (a & kHitBit) ++em.hits;
  }
  for (std::uint32_t node = 0; node < c.nodes; ++node) {
    auto& miss = rec.misses[node];
    std::sort(miss.begin(), miss.end());
    em.remote_fetches += miss.size();
    auto& runs = rec.runs[node];
    runs.clear();
    for (std::size_t i = 0; i < miss.size();) {
      std::size_t j = i + 1;
      while (j < miss.size() && miss[j] == miss[j - 1] + 1) ++j;
      runs.push_back({miss[i], static_cast<std::uint32_t>(j - i)});
      i = j;
    }
    m.remote_runs += runs.size();
    if (c.sized())
      for (std::uint32_t x : miss) m.remote_bytes += c.size_of(x);
    std::sort(rec.peers[node].begin(), rec.peers[node].end(),
              [](const PeerFetch& a, const PeerFetch& b) { return a.sample < b.sample; });
    em.peer_fetches += rec.peers[node].size();
  }
  if (sink_) {
    sink_->step(steps_done_, rec);
  } else {
    for (const auto& r : rec.ranks) {
      plan_.accesses.insert(plan_.accesses.end(), r.begin(), r.end());
      plan_.rank_offsets.push_back(plan_.accesses.size());
    }
    for (std::uint32_t node = 0; node < c.nodes; ++node)
      append_schedule_step(plan_.nodes[node], rec.runs[node], rec.peers[node], rec.evicted[node]);
  }
  ++steps_done_;
  if (progress_ && (steps_done_ % 64 == 0 || steps_done_ == plan_.total_steps()))
    progress_(steps_done_, plan_.total_steps());
}

Plan PlanRecorder::finish() {
  Metrics& m = plan_.metrics;
  for (const auto& e : m.per_epoch) {
    m.accesses += e.accesses;
    m.hits += e.hits;
    m.remote_fetches += e.remote_fetches;
    m.peer_fetches += e.peer_fetches;
  }
  // Sized plans summed each fetched sample's bytes as it was committed.
  if (!plan_.config.sized()) m.remote_bytes = m.remote_fetches * plan_.config.sample_bytes;
  return std::move(plan_);
}

}  // namespace detail

Plan detail::plan_by_policy(const PlanConfig& config, const ProgressFn& progress,
                            detail::StepSink* sink) {
  switch (config.policy) {
    case Policy::none: return detail::plan_none(config, progress, sink);
    case Policy::lru: return detail::plan_lru(config, progress, sink);
    case Policy::solar_paper: return detail::plan_solar_paper(config, progress, sink);
    case Policy::nopfs: return detail::plan_nopfs(config, progress, sink);
    case Policy::solar: return detail::plan_solar(config, progress, sink);
    case Policy::sampler: return detail::plan_sampler(config, progress, sink);
  }
  throw ConfigError("--policy", "unknown policy");
}

Plan make_plan(const PlanConfig& config, const ProgressFn& progress) {
  config.validate();
  if (!config.tiered()) return detail::plan_by_policy(config, progress);
  // A local tier: the policy plans the resident set as one buffer of both tiers' samples, then
  // the set is placed in memory and on the local disk (tiers.h).
  PlanConfig resident = config;
  resident.buffer_bytes = (config.buffer_samples() + config.local_samples()) * config.sample_bytes;
  resident.local_bytes = 0;
  Plan plan = detail::plan_by_policy(resident, progress);
  plan.config = config;
  place_in_tiers(plan);
  return plan;
}

}  // namespace solar

// SPDX-License-Identifier: Apache-2.0
// PlanSteps: the node's part of the plan as the agent reads it, step by step. Either the whole
// node section (a plan file's, or for a streamed plan the agent needs whole: samples of
// differing sizes, peer sharing, a local tier), or a streamed plan's steps computed on a
// thread of their own as the prefetch engine reaches them (core/plan_stream.h) and dropped
// once no rank can need them again: then the agent holds a window of steps, not the run.
//
// Threads: take() is the prefetch engine's alone and is called without Agent::Impl::mu_ (it
// may wait for the planner); add_locked, forget_before_locked and every accessor are called
// with mu_ held (with a whole plan the accessors need no lock: nothing changes but hit bits).
// Internal to solar-agent.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "solar/core/plan_file.h"
#include "solar/core/plan_stream.h"

namespace solar::agent {

class PlanSteps {
 public:
  // `served`: a streamed plan's, what other nodes read from this one per step (computed with
  // the node's share: collect_node_plan), so that peer sharing need not compute their shares.
  void open_whole(NodePlan plan, std::uint32_t ranks, std::uint64_t samples,
                  std::vector<std::vector<PeerFetch>> served = {}) {
    whole_ = std::move(plan);
    R_ = ranks;
    samples_ = samples;
    whole_served_ = std::move(served);
  }
  void open_streamed(const PlanConfig& c, std::uint32_t node) {
    stream_ = std::make_unique<NodePlanStream>(c, node);
    R_ = c.ranks_per_node;
    samples_ = c.samples;
  }
  bool streamed() const { return stream_ != nullptr; }
  // The whole node plan (not streamed only).
  const NodePlan& whole() const { return whole_; }
  // A streamed plan computed whole (open_whole's `served`): per step, {sample, reading node}.
  const std::vector<std::vector<PeerFetch>>& whole_served() const { return whole_served_; }

  // The transparent mode's per-access counts (need()): how many times the access's sample has
  // been used on this node up to and including it, in plan order from step 0. Before any step
  // is taken; O(the node's accesses) with a whole plan, O(N + window) streamed.
  void count_uses() {
    count_uses_ = true;
    if (streamed()) {
      uses_.assign(samples_, 0);
      return;
    }
    std::vector<std::uint32_t> count(samples_, 0);
    whole_need_.resize(whole_.accesses.size());
    for (std::size_t i = 0; i < whole_.accesses.size(); ++i)
      whole_need_[i] = ++count[whole_.accesses[i] & kSampleMask];
  }

  // Streamed: computes steps up to t (they come in order; those before t are counted and
  // dropped: a resumed agent's) and returns step t, to be added with add_locked. Without mu_.
  struct Taken {
    NodeStep step;
    std::vector<std::uint32_t> need;  // count_uses(): per access, rank after rank
  };
  Taken take(std::uint64_t t) {
    for (;;) {
      Taken k{stream_->next(), {}};
      if (count_uses_)
        for (const auto& r : k.step.ranks)
          for (std::uint32_t a : r) k.need.push_back(++uses_[a & kSampleMask]);
      if (k.step.t == t) return k;
    }
  }
  // Appends step k.step.t, the one after the last added (the first: any).
  void add_locked(Taken k) {
    if (!steps_.empty() && k.step.t != first_ + steps_.size())
      throw std::logic_error("PlanSteps: step " + std::to_string(k.step.t) + " added after " +
                             std::to_string(first_ + steps_.size() - 1));
    if (steps_.empty()) first_ = k.step.t;
    Entry e{std::move(k.step), std::move(k.need), {}};
    std::size_t at = 0;
    for (const auto& r : e.step.ranks) {
      e.need_at.push_back(at);
      at += r.size();
    }
    steps_.push_back(std::move(e));
  }
  // Streamed: drops the steps before t (no rank can need them again).
  void forget_before_locked(std::uint64_t t) {
    while (!steps_.empty() && first_ < t) {
      steps_.pop_front();
      ++first_;
    }
  }
  // Whether step t's records are here (with a whole plan: every step).
  bool has_locked(std::uint64_t t) const {
    return !streamed() || (t >= first_ && t - first_ < steps_.size());
  }

  std::span<const std::uint32_t> accesses(std::uint64_t t, std::uint32_t r) const {
    if (streamed()) return at(t).step.ranks[r];
    const std::uint64_t i = t * R_ + r;
    return {whole_.accesses.data() + whole_.rank_offsets[i],
            whole_.rank_offsets[i + 1] - whole_.rank_offsets[i]};
  }
  // The same records, writable (the prefetch engine rewrites the hit bits at admission).
  std::span<std::uint32_t> accesses_mut(std::uint64_t t, std::uint32_t r) {
    if (streamed()) return at_mut(t).step.ranks[r];
    const std::uint64_t i = t * R_ + r;
    return {whole_.accesses.data() + whole_.rank_offsets[i],
            whole_.rank_offsets[i + 1] - whole_.rank_offsets[i]};
  }
  // count_uses(): need(t, r)[k] for access k of rank r at step t.
  std::span<const std::uint32_t> need(std::uint64_t t, std::uint32_t r) const {
    if (streamed()) {
      const Entry& e = at(t);
      return {e.need.data() + e.need_at[r], e.step.ranks[r].size()};
    }
    const std::uint64_t i = t * R_ + r;
    return {whole_need_.data() + whole_.rank_offsets[i],
            whole_.rank_offsets[i + 1] - whole_.rank_offsets[i]};
  }
  std::span<const std::uint32_t> evicts_at(std::uint64_t t) const {
    return streamed() ? std::span<const std::uint32_t>(at(t).step.evicts)
                      : whole_.schedule.evicts_at(t);
  }
  std::span<const FetchRun> fetches_at(std::uint64_t t) const {
    return streamed() ? std::span<const FetchRun>(at(t).step.fetches)
                      : whole_.schedule.fetches_at(t);
  }
  std::span<const PeerFetch> peers_at(std::uint64_t t) const {
    return streamed() ? std::span<const PeerFetch>(at(t).step.peers)
                      : whole_.schedule.peers_at(t);
  }

 private:
  struct Entry {
    NodeStep step;
    std::vector<std::uint32_t> need;
    std::vector<std::size_t> need_at;  // per rank: where its counts begin in `need`
  };
  const Entry& at(std::uint64_t t) const {
    if (t < first_ || t - first_ >= steps_.size())
      throw std::logic_error("PlanSteps: step " + std::to_string(t) + " is not held (steps " +
                             std::to_string(first_) + ".." +
                             std::to_string(first_ + steps_.size()) + ")");
    return steps_[t - first_];
  }
  Entry& at_mut(std::uint64_t t) { return const_cast<Entry&>(std::as_const(*this).at(t)); }

  NodePlan whole_;
  std::vector<std::vector<PeerFetch>> whole_served_;
  std::vector<std::uint32_t> whole_need_;
  std::unique_ptr<NodePlanStream> stream_;
  std::uint32_t R_ = 0;
  std::uint64_t samples_ = 0;
  bool count_uses_ = false;
  std::vector<std::uint32_t> uses_;  // streamed count_uses(): per sample, its uses so far
  std::deque<Entry> steps_;          // streamed: steps first_ .. first_ + size - 1
  std::uint64_t first_ = 0;
};

}  // namespace solar::agent

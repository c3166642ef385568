// SPDX-License-Identifier: Apache-2.0
// The solar policy.
//
// Every sample is read once per epoch, so reuse is decided by which samples each node carries
// from one use to the next. One forward pass over the steps:
//  - steer: a sample resident at a node goes to that node, as long as the node stays within
//    R·(b+δ) samples for the step; node totals are balanced into [R·(b-δ), R·(b+δ)] with the
//    step total unchanged, losing as few hits as possible;
//  - place: each remaining sample (a miss) goes to the node, among those with room this step,
//    that has the fewest resident samples due at this sample's next-use step. A node can take
//    at most R·(b+δ) samples in that future step, so spreading the future demand now is what
//    keeps the steering above from overflowing later;
//  - evict clairvoyantly: the resident sample whose next use is farthest. Because steering
//    keeps a resident sample on its node, its next use there is its next global use, which the
//    epoch stream knows.
#include <algorithm>
#include <queue>

#include "plan_builder.h"
#include "policies.h"
#include "solar/core/rng.h"

namespace solar::detail {
namespace {

class SolarPlanner {
 public:
  SolarPlanner(const PlanConfig& c, const ProgressFn& progress, StepSink* sink)
      : c_(c),
        layout_(EpochLayout::of(c)),
        order_(identity_order(c.epochs)),
        stream_(c, layout_, order_, true),
        recorder_(c, order_, progress, sink),
        bufs_(make_buffers(c, effective_capacity(c))),
        M_(c.nodes),
        R_(c.ranks_per_node),
        W_(layout_.world),
        horizon_(2 * std::uint64_t{layout_.steps} + 1),
        live_(c.samples, Live{kNowhere, kNoSlot}),
        future_(std::uint64_t{M_} * horizon_, 0),
        demand_(M_),
        quota_(M_),
        node_pos_(M_),
        assignment_(W_) {}

  Plan run() {
    std::uint64_t t = 0;
    for (std::uint32_t p = 0; p < c_.epochs; ++p) {
      stream_.load(p);
      for (std::uint32_t j = 0; j < layout_.steps; ++j, ++t) step(p, j, t);
    }
    return recorder_.finish();
  }

 private:
  static constexpr std::int32_t kNowhere = -1;
  static constexpr std::uint32_t kNoSlot = ~std::uint32_t{0};

  // Global step of a global access time.
  std::uint64_t step_of(std::uint64_t time) const {
    const std::uint64_t used = layout_.used();
    return (time / used) * layout_.steps + (time % used) / (W_ * layout_.batch);
  }
  // Live copies at `node` due at the step whose ring slot is `slot` (= step mod horizon).
  std::uint32_t& future(std::uint32_t node, std::uint32_t slot) {
    return future_[std::uint64_t{node} * horizon_ + slot];
  }

  // x (batch position k) is read by `node` now; from here on its live copy is there, due
  // again at its next use.
  void account(std::uint32_t x, std::uint32_t node, std::uint32_t k) {
    Live& l = live_[x];
    if (l.due != kNoSlot) --future(static_cast<std::uint32_t>(l.node), l.due);
    l.node = static_cast<std::int32_t>(node);
    l.due = due_slot_[k];
    if (l.due != kNoSlot) ++future(node, l.due);
  }

  void compute_quotas(std::uint64_t size, std::uint64_t lo, std::uint64_t hi) {
    std::uint64_t total = 0;
    for (std::uint32_t m = 0; m < M_; ++m) total += quota_[m] = std::clamp(demand_[m], lo, hi);
    using Item = std::pair<std::uint64_t, std::int64_t>;
    if (total > size) {  // take from the fullest nodes
      std::priority_queue<Item> big;
      for (std::uint32_t m = 0; m < M_; ++m)
        if (quota_[m] > lo) big.emplace(quota_[m], -std::int64_t{m});
      for (; total > size; --total) {
        const auto [q, neg_m] = big.top();
        big.pop();
        const auto m = static_cast<std::uint32_t>(-neg_m);
        if (--quota_[m] > lo) big.emplace(quota_[m], neg_m);
      }
    } else if (total < size) {  // give to the emptiest nodes
      std::priority_queue<Item, std::vector<Item>, std::greater<>> small;
      for (std::uint32_t m = 0; m < M_; ++m)
        if (quota_[m] < hi) small.emplace(quota_[m], std::int64_t{m});
      for (; total < size; ++total) {
        const auto [q, mm] = small.top();
        small.pop();
        const auto m = static_cast<std::uint32_t>(mm);
        if (++quota_[m] < hi) small.emplace(quota_[m], mm);
      }
    }
  }

  // The node with room this step that has the least demand at `due` (ties: most room).
  std::uint32_t place(std::uint32_t x, std::uint32_t due, std::uint64_t t) {
    const std::size_t n_open = open_.size();
    auto better = [&](std::uint32_t a, std::uint32_t b) {
      const std::uint32_t fa = due == kNoSlot ? 0 : future(a, due);
      const std::uint32_t fb = due == kNoSlot ? 0 : future(b, due);
      if (fa != fb) return fa < fb;
      const std::uint64_t ra = quota_[a] - node_pos_[a].size();
      const std::uint64_t rb = quota_[b] - node_pos_[b].size();
      if (ra != rb) return ra > rb;
      return a < b;
    };
    std::uint32_t best = open_[0];
    if (n_open <= 8) {
      for (std::size_t i = 1; i < n_open; ++i)
        if (better(open_[i], best)) best = open_[i];
    } else {
      // Many nodes: the best of a few pseudo-random candidates (power of d choices).
      std::uint64_t h = (std::uint64_t{x} << 32) ^ t ^ c_.seed;
      for (int i = 0; i < 4; ++i) {
        const std::uint32_t cand = open_[splitmix64(h) % n_open];
        if (i == 0 || better(cand, best)) best = cand;
      }
    }
    return best;
  }

  void step(std::uint32_t p, std::uint32_t j, std::uint64_t t) {
    const auto batch = stream_.batch(j);
    const std::uint64_t size = batch.size();
    const std::uint32_t bj = layout_.rank_batch(j);
    const std::uint64_t lo = std::uint64_t{R_} * (bj > c_.imbalance ? bj - c_.imbalance : 1);
    const std::uint64_t hi = std::uint64_t{R_} * (bj + c_.imbalance);
    const std::uint64_t stamp = t + 1;

    // Who holds what.
    holder_.assign(size, kNowhere);
    std::fill(demand_.begin(), demand_.end(), 0);
    for (std::uint64_t k = 0; k < size; ++k) {
      // The batch is random: fetch sample state ahead of use (memory latency dominates).
      if (k + 16 < size) __builtin_prefetch(&live_[batch[k + 16]]);
      const std::int32_t h = live_[batch[k]].node;
      if (h != kNowhere && bufs_[h].contains(batch[k])) {
        holder_[k] = h;
        ++demand_[h];
      }
    }
    compute_quotas(size, lo, hi);
    next_.resize(size);
    due_slot_.resize(size);
    for (std::uint64_t k = 0; k < size; ++k) {
      next_[k] = stream_.next_use(j, k);
      due_slot_[k] = next_[k] == kNever ? kNoSlot
                                        : static_cast<std::uint32_t>(step_of(next_[k]) % horizon_);
    }

    // Steer resident samples home; the rest wait in `spare_`.
    for (auto& v : node_pos_) v.clear();
    spare_.clear();
    moved_.clear();
    for (std::uint64_t k = 0; k < size; ++k) {
      const std::int32_t h = holder_[k];
      if (h != kNowhere && node_pos_[h].size() < quota_[h]) {
        node_pos_[h].push_back(static_cast<std::uint32_t>(k));
        account(batch[k], static_cast<std::uint32_t>(h), static_cast<std::uint32_t>(k));
      } else {
        spare_.push_back(static_cast<std::uint32_t>(k));
        if (h != kNowhere) {
          moved_.emplace_back(batch[k], static_cast<std::uint32_t>(h));
          // A peer may serve this copy during the step; afterwards it is dead.
          if (c_.peer_fetch) bufs_[h].pin(batch[k], stamp);
        }
      }
    }
    open_.clear();
    for (std::uint32_t m = 0; m < M_; ++m)
      if (node_pos_[m].size() < quota_[m]) open_.push_back(m);
    for (std::uint32_t k : spare_) {
      const std::uint32_t x = batch[k];
      const std::uint32_t m = place(x, due_slot_[k], t);
      node_pos_[m].push_back(k);
      account(x, m, k);
      if (node_pos_[m].size() == quota_[m]) open_.erase(std::find(open_.begin(), open_.end(), m));
    }
    for (std::uint32_t m = 0; m < M_; ++m) {
      std::size_t i = 0;
      for (std::uint32_t r = 0; r < R_; ++r) {
        auto& ra = assignment_[std::uint64_t{m} * R_ + r];
        ra.clear();
        const std::uint64_t n = even_share(node_pos_[m].size(), R_, r);
        for (std::uint64_t e = 0; e < n; ++e) ra.push_back(node_pos_[m][i++]);
      }
    }

    rec_.reset(W_, M_);
    simulate_step(c_, batch, assignment_, bufs_, stamp,
                  [&](std::uint32_t, std::uint32_t k, std::uint32_t) {
                    // Farthest next use first: never-again and dead copies (key 0) lead.
                    return key_for_next_use(next_[k]);
                  },
                  rec_, /*parallel=*/true);
    for (std::uint32_t m = 0; m < M_; ++m) {
      for (std::uint32_t y : rec_.evicted[m]) {
        Live& l = live_[y];
        if (l.node == static_cast<std::int32_t>(m) && l.due != kNoSlot) {
          --future(m, l.due);
          l.due = kNoSlot;
        }
      }
      if (!c_.peer_fetch) continue;
      auto& miss = rec_.misses[m];
      std::size_t keep = 0;
      for (std::uint32_t x : miss) {
        auto it = std::find_if(moved_.begin(), moved_.end(),
                               [&](const auto& mv) { return mv.first == x && mv.second != m; });
        if (it != moved_.end()) rec_.peers[m].push_back({x, it->second});
        else miss[keep++] = x;
      }
      miss.resize(keep);
    }
    for (const auto& [x, h] : moved_) bufs_[h].rekey(x, kEvictFirst);  // dead: first to go
    recorder_.commit(p, rec_);
  }

  const PlanConfig& c_;
  const EpochLayout layout_;
  const std::vector<std::uint32_t> order_;
  EpochStream stream_;
  PlanRecorder recorder_;
  std::vector<NodeBuffer> bufs_;
  const std::uint32_t M_, R_;
  const std::uint64_t W_, horizon_;
  // Per sample: the node of its live copy (if resident there) and the ring slot of that
  // copy's next-use step. One 8-byte record: a single cache miss per lookup.
  struct Live {
    std::int32_t node;
    std::uint32_t due;
  };
  std::vector<Live> live_;
  std::vector<std::uint64_t> next_;     // this step: next use of each batch position
  std::vector<std::uint32_t> due_slot_;  // this step: ring slot of that next use
  std::vector<std::uint32_t> future_;  // per node × step (ring): live copies due then
  std::vector<std::uint64_t> demand_, quota_;
  std::vector<std::vector<std::uint32_t>> node_pos_;
  std::vector<std::int32_t> holder_;
  std::vector<std::uint32_t> spare_, open_;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> moved_;
  Assignment assignment_;
  StepRecord rec_;
};

}  // namespace

Plan plan_solar(const PlanConfig& c, const ProgressFn& progress, StepSink* sink) {
  return SolarPlanner(c, progress, sink).run();
}

}  // namespace solar::detail

// SPDX-License-Identifier: Apache-2.0
#include "solar/core/extents.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

namespace solar {

std::optional<std::uint64_t> ExtentArena::take(std::uint64_t len, ExtentFit fit) {
  std::uint64_t off = 0, have = 0;
  if (fit == ExtentFit::best) {
    const auto it = by_len_.lower_bound({len, 0});
    if (it == by_len_.end()) return std::nullopt;
    std::tie(have, off) = *it;
  } else {
    const auto it = std::find_if(by_off_.begin(), by_off_.end(),
                                 [&](const auto& e) { return e.second >= len; });
    if (it == by_off_.end()) return std::nullopt;
    std::tie(off, have) = *it;
  }
  remove(off, have);
  if (have > len) add(off + len, have - len);
  return off;
}

void ExtentArena::give(std::uint64_t off, std::uint64_t len) {
  if (const auto next = by_off_.find(off + len); next != by_off_.end()) {
    len += next->second;
    remove(next->first, next->second);
  }
  if (auto prev = by_off_.lower_bound(off); prev != by_off_.begin()) {
    --prev;
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      remove(prev->first, prev->second);
    }
  }
  add(off, len);
}

void ExtentArena::add(std::uint64_t off, std::uint64_t len) {
  if (len == 0) return;
  by_off_.emplace(off, len);
  by_len_.emplace(len, off);
  free_ += len;
}

void ExtentArena::remove(std::uint64_t off, std::uint64_t len) {
  by_off_.erase(off);
  by_len_.erase({len, off});
  free_ -= len;
}

namespace {

// The replay's arena: where each sample placed lies.
class Arena {
 public:
  explicit Arena(std::uint64_t bytes) : a_(bytes) {}

  bool place(std::uint32_t x, std::uint64_t len, ExtentFit fit) {
    const std::optional<std::uint64_t> off = a_.take(len, fit);
    if (!off) return false;
    where_[x] = {*off, len};
    return true;
  }

  void release(std::uint32_t x) {
    const auto w = where_.find(x);
    if (w == where_.end()) return;  // not placed here (a plan the replay would refuse)
    a_.give(w->second.first, w->second.second);
    where_.erase(w);
  }

 private:
  ExtentArena a_;
  std::unordered_map<std::uint32_t, std::pair<std::uint64_t, std::uint64_t>> where_;
};

}  // namespace

bool extents_fit(const NodeSchedule& s, const PlanConfig& c, std::uint64_t total_steps,
                 std::uint64_t arena, ExtentFit fit) {
  Arena a(arena);
  for (std::uint64_t t = 0; t < total_steps; ++t) {
    for (std::uint32_t x : s.evicts_at(t)) a.release(x);
    for (const FetchRun& r : s.fetches_at(t))
      for (std::uint32_t x = r.first; x < r.first + r.count; ++x)
        if (!a.place(x, c.size_of(x), fit)) return false;
    for (const PeerFetch& pf : s.peers_at(t))
      if (!a.place(pf.sample, c.size_of(pf.sample), fit)) return false;
  }
  return true;
}

bool extents_fit(const Plan& plan, std::uint32_t node, std::uint64_t arena, ExtentFit fit) {
  return extents_fit(plan.nodes.at(node), plan.config, plan.total_steps(), arena, fit);
}

std::uint64_t arena_for_node(const NodeSchedule& s, const PlanConfig& c,
                             std::uint64_t total_steps, ExtentFit fit) {
  const std::uint64_t buffer = std::max<std::uint64_t>(c.buffer_bytes, 1);
  const std::uint64_t step = std::max<std::uint64_t>(1, buffer / 1000);
  std::uint64_t lo = 0, hi = buffer;  // bisection: fits(hi), and lo = 0 or !fits(lo)
  while (!extents_fit(s, c, total_steps, hi, fit)) {
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > step) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    (extents_fit(s, c, total_steps, mid, fit) ? hi : lo) = mid;
  }
  return hi;
}

std::uint64_t arena_for_extents(const Plan& plan, ExtentFit fit) {
  const PlanConfig& c = plan.config;
  const std::uint64_t buffer = std::max<std::uint64_t>(c.buffer_bytes, 1);
  const std::uint64_t step = std::max<std::uint64_t>(1, buffer / 1000);
  std::uint64_t worst = 0;
  for (std::uint32_t n = 0; n < c.nodes; ++n)
    worst = std::max(worst, arena_for_node(plan.nodes.at(n), c, plan.total_steps(), fit));
  // First and best fit are not monotone in the arena's size (a larger arena can place an early
  // extent elsewhere and strand a later one): the worst node's arena is checked on every node.
  auto every_node_fits = [&] {
    for (std::uint32_t n = 0; n < c.nodes; ++n)
      if (!extents_fit(plan, n, worst, fit)) return false;
    return true;
  };
  while (!every_node_fits()) worst += step;
  return worst;
}

}  // namespace solar

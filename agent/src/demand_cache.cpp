// SPDX-License-Identifier: Apache-2.0
// Demand mode: the ranks' reads watched against the plan, and, once they diverge, the buffer
// filled with what they read. See demand_cache.h.
#include "demand_cache.h"

#include <algorithm>
#include <atomic>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "agent_impl.h"
#include "solar/storage/dataset_files.h"

namespace solar::agent {

namespace {
std::uint64_t relaxed(const std::uint64_t& v) {
  return std::atomic_ref<const std::uint64_t>(v).load(std::memory_order_relaxed);
}
constexpr std::uint64_t kSieveBytes = 64 << 10;  // HDF5's sieve buffer: one read, several rows
constexpr std::uint64_t kFillBytes = 64 << 20;   // copied into the buffer in one poll, at most
}  // namespace

void DemandCache::setup(const std::uint32_t* consumed, bool start_on) {
  consumed_ = consumed;
  const PlanConfig& c = a_.header_.config;
  seen_.assign(c.samples, 0);
  expected_.assign(c.samples, 0);
  // The node's samples in an epoch, as the plan gives them to its ranks.
  const std::uint64_t S = a_.header_.layout.steps;
  std::uint64_t per_epoch = 0;
  if (!a_.steps_.streamed())
    for (std::uint64_t t = 0; t < std::min<std::uint64_t>(S, a_.T_); ++t)
      for (std::uint32_t r = 0; r < a_.R_; ++r) per_epoch += a_.accesses(t, r).size();
  epoch_reads_ = per_epoch ? per_epoch : S * a_.R_ * c.batch;
  // One step of the node's reads, times the samples one read may bring in: HDF5 reads rows
  // of a contiguous array smaller than its sieve several at once (a chunk, or a file of one
  // sample, is read alone), and twice that: a sieve window is not aligned to the rows, and
  // the rows it brings in besides lie anywhere in the plan (a false switch in the plan's own
  // order, 2 nodes x 2 ranks of 4 KiB rows, DataLoader workers 2, counted 1075 such samples
  // against the 1024 of one sieve's worth).
  std::uint64_t per_read = 1;
  if (const storage::DatasetFiles* set = a_.source_->file_set())
    for (const storage::DatasetFile& f : set->files())
      if (f.data_offset && f.count > 1)
        per_read = std::max<std::uint64_t>(
            1, 2 * kSieveBytes / std::max<std::uint64_t>(1, a_.source_->info().sample_bytes));
  stall_reads_ = kStallSteps * std::uint64_t{a_.R_} * c.batch * per_read;
  can_switch_ = !a_.local_.on();
  // Across the nodes' buffers with peer sharing: samples of one size (a peer read is a slot).
  // (Peer sharing is set up after this: --peer-dir says it will be on.)
  if (!a_.opt_.peer_dir.empty() && !a_.table_.sized() && c.nodes > 1) {
    nodes_ = c.nodes;
    node_ = a_.opt_.node;
    reserve_units_ = std::clamp<std::uint64_t>(a_.buf_.cache_slots / 16, 2, kTransitSamples);
    fetch_reserve_ = std::max<std::uint64_t>(1, reserve_units_ / 3);
    push_transit_ = reserve_units_ - fetch_reserve_;
  }
  if (start_on) {
    a_.populate_cache_slots();  // before the agent is ready
    populated_ = true;
    std::lock_guard lk(a_.mu_);
    switch_locked("the order is unknown (--order unknown): the buffer keeps what the ranks read");
  }
}

void DemandCache::switch_locked(const std::string& why) {
  on_ = true;
  why_ = why;
  switched_at_ = a_.stats_.since_ready();
  reads_at_switch_ = reads_;
  plan_fetched_ = a_.stats_.fetched_samples();
  plan_bytes_ = a_.stats_.fetched_bytes();
  std::string ranks;
  for (const RankState& rs : a_.ranks_) ranks += fmt::format("{}{}", ranks.empty() ? "" : ",", rs.released);
  spdlog::info("node {}: demand mode from {:.3f} s: {}; the plan had read {} samples ({} bytes); "
               "steps admitted {}, read {}, completed by each rank {}; {} slots free",
               a_.opt_.node, switched_at_, why, plan_fetched_, plan_bytes_, a_.admitted_,
               a_.ready_, ranks, a_.table_.free_slots());
  if (pooled()) {
    a_.pacer_.ask_peers(nodes_, node_);
    drop_foreign_locked();  // the plan's reads of other nodes' samples go, before any fill
    spdlog::info("node {}: demand mode across the {} nodes' buffers: this node keeps the "
                 "samples placed on it, its ranks' other misses are read from their nodes",
                 a_.opt_.node, nodes_);
  } else if (!a_.opt_.peer_dir.empty()) {
    spdlog::info("node {}: demand mode stays within this node's buffer: {}", a_.opt_.node,
                 a_.table_.sized() ? "peer reads take samples of one size"
                                   : "the job has one node");
  }
  a_.prefetch_.wake_all();  // its wait for slots ends: it stops
}

// What the plan had read of other nodes' samples goes, once its read has landed: each sample
// is kept by one node only. Called on every poll until none is left.
void DemandCache::drop_foreign_locked() {
  bool left = false;
  const std::uint64_t N = seen_.size();
  for (std::uint64_t i = 0; i < N; ++i) {
    const auto x = static_cast<std::uint32_t>(i);
    if (mine(x) || !a_.table_.resident(x)) continue;
    if (std::any_of(transit_.begin(), transit_.end(),
                    [&](const Transit& t) { return t.sample == x; }))
      continue;
    // Its read in flight (a zombie's too: the plan may evict a sample before its read lands,
    // which then publishes it): once it has landed.
    if (!published_locked(x)) {
      left = true;
      continue;
    }
    // The plan's admitted uses pin it no more (no step of the plan is paced from here on); a
    // rank copying it now sees its entry change and reads the file.
    a_.table_.clear_uses(x);
    if (a_.table_.free_slot(x)) a_.prefetch_.slot_freed_locked();
    ++dropped_foreign_;
    full_ = false;  // room for this node's own again
  }
  foreign_left_ = left;
}

bool DemandCache::published_locked(std::uint32_t x) const {
  const auto* entries = reinterpret_cast<const std::uint64_t*>(a_.base_ + a_.buf_.entries_offset);
  return (std::atomic_ref<const std::uint64_t>(entries[x]).load(std::memory_order_acquire) &
          0xffffffffULL) != 0;
}

// A transit slot goes once its rank's read is counted (its consumed counter moved: the copy
// is done) or after kTransitHold (a rank that read the file after all).
// A push's slot stays until its home has looked (push_done_locked) or kTransitHold.
void DemandCache::release_transit_locked(Clock::time_point now) {
  std::erase_if(transit_, [&](const Transit& t) {
    const std::uint32_t c =
        std::atomic_ref<const std::uint32_t>(consumed_[t.sample]).load(std::memory_order_relaxed);
    if ((t.pushed || c == t.consumed) && now - t.at < kTransitHold) return false;
    if (t.pushed) --pushing_;
    if (a_.table_.uses(t.sample) == 0 && a_.table_.free_slot(t.sample))
      a_.prefetch_.slot_freed_locked();
    return true;
  });
}

void DemandCache::push_done_locked(std::uint32_t x) {
  const auto it = std::find_if(transit_.begin(), transit_.end(),
                               [&](const Transit& t) { return t.pushed && t.sample == x; });
  if (it == transit_.end()) return;  // gone after its hold already
  transit_.erase(it);
  --pushing_;
  if (a_.table_.uses(x) == 0 && a_.table_.free_slot(x)) a_.prefetch_.slot_freed_locked();
}

bool DemandCache::pull_locked(std::uint32_t x, std::uint32_t from, PeerJob& job) {
  if (!on_ || !pooled() || fill_failed_ || x >= a_.header_.config.samples || !mine(x) ||
      a_.table_.resident(x) || !a_.peers_.usable_locked(from))
    return false;
  fill_slots_scratch_.clear();
  const std::uint32_t one[] = {x};
  if (a_.table_.free_slots() < reserve_units_ + a_.table_.units_of(x) ||
      !a_.table_.take_room(one, fill_slots_scratch_)) {
    ++pull_no_room_;
    return false;
  }
  a_.table_.place(x, fill_slots_scratch_[0]);  // pinned until the read lands
  job = PeerJob{.step = 0,
                .sample = x,
                .slot = fill_slots_scratch_[0],
                .from = from,
                .fetch = true,
                .pull = true,
                .token = 0};
  return true;
}

DemandCache::Fetch DemandCache::fetch_locked(std::uint32_t x, std::uint64_t token) {
  if (!on_ || !pooled() || x >= a_.header_.config.samples) return Fetch::not_held;
  ++asked_;
  if (a_.table_.resident(x))  // published since the rank looked, or being read: not waited for
    return published_locked(x) ? Fetch::held : Fetch::not_held;
  const std::uint32_t home = solar_home_node(x, nodes_);
  if (home == node_ || !a_.peers_.usable_locked(home)) {
    ++not_held_;
    return Fetch::not_held;
  }
  fill_slots_scratch_.clear();
  const std::uint32_t one[] = {x};
  if (!a_.table_.take_room(one, fill_slots_scratch_)) {
    ++no_room_;
    return Fetch::not_held;
  }
  a_.table_.place(x, fill_slots_scratch_[0]);  // pinned until the read lands
  a_.peers_.fetch_locked(PeerJob{.step = 0,
                                 .sample = x,
                                 .slot = fill_slots_scratch_[0],
                                 .from = home,
                                 .fetch = true,
                                 .token = token});
  return Fetch::pending;
}

void DemandCache::fetch_done_locked(const PeerJob& j, bool ok) {
  if (j.pull) {  // kept here: a sample of ours another node's rank read
    if (ok) {
      a_.table_.publish(j.sample, j.slot);
      a_.drop_use_locked(j.sample);
      ++pulled_;
      pulled_bytes_ += a_.prefetch_.slot_length(j.sample);
    } else {
      ++pull_failed_;
      a_.table_.drop_use(j.sample);
      if (a_.table_.free_slot(j.sample)) a_.prefetch_.slot_freed_locked();
    }
    return;
  }
  if (ok) {
    a_.table_.publish(j.sample, j.slot);
    a_.drop_use_locked(j.sample);
    ++fetched_;
    fetched_bytes_ += a_.prefetch_.slot_length(j.sample);
    transit_.push_back({j.sample,
                        std::atomic_ref<const std::uint32_t>(consumed_[j.sample])
                            .load(std::memory_order_relaxed),
                        Clock::now()});
  } else {  // its home does not hold it (or cannot be read): the rank reads the file
    ++not_held_;
    a_.table_.drop_use(j.sample);
    if (a_.table_.free_slot(j.sample)) a_.prefetch_.slot_freed_locked();
  }
  a_.control_.post_fetch_reply(j.token, j.sample, ok);
}

// The plan's steps near the ranks': from the oldest step a rank has not completed to
// kWindowSteps past the furthest admitted or completed one; expected_ counts each sample's
// accesses there. Both ends only move forward, so each step is added and removed once.
void DemandCache::slide_window_locked() {
  std::uint64_t lo = a_.T_, furthest = a_.admitted_;
  for (const RankState& rs : a_.ranks_) {
    lo = std::min(lo, rs.released);
    furthest = std::max(furthest, rs.released);
  }
  const std::uint64_t hi = std::min(a_.T_, furthest + kWindowSteps);
  auto count = [&](std::uint64_t t, int by) {
    for (std::uint32_t r = 0; r < a_.R_; ++r)
      for (const std::uint32_t acc : a_.accesses(t, r)) expected_[acc & kSampleMask] += by;
  };
  if (lo > window_lo_) {
    for (std::uint64_t t = window_lo_; t < std::min(lo, window_hi_); ++t) count(t, -1);
    window_lo_ = lo;
    window_hi_ = std::max(window_hi_, lo);
  }
  for (; window_hi_ < hi; ++window_hi_) count(window_hi_, +1);
}

void DemandCache::close_epochs_locked() {
  while (epoch_reads_ && reads_ >= (epochs_.size() + 1) * epoch_reads_) {
    const solar_xstats* x = &a_.pacer_.index()->stats;
    const std::uint64_t now[4] = {relaxed(x->hit_reads), relaxed(x->hit_bytes),
                                  relaxed(x->miss_reads), relaxed(x->miss_bytes)};
    epochs_.push_back({epoch_reads_, now[0] - epoch_start_x_[0], now[1] - epoch_start_x_[1],
                       now[2] - epoch_start_x_[2], now[3] - epoch_start_x_[3],
                       a_.stats_.since_ready()});
    std::copy(now, now + 4, epoch_start_x_);
  }
}

void DemandCache::poll() {
  const auto t0 = Clock::now();
  if (t0 < next_scan_) return;
  // A scan reads 4 bytes a sample: every 1 ms for up to 64 Ki samples, proportionally less
  // often for more; every 50 ms once the buffer is full (only the epochs are counted then).
  // (full_ is written on this thread alone: read here without the lock.)
  const std::uint64_t N = seen_.size();
  next_scan_ = t0 + (full_ && !pooled() ? std::chrono::milliseconds(50)
                           : std::chrono::milliseconds(std::max<std::uint64_t>(1, N >> 16)));
  fresh_.clear();
  fresh_reads_.clear();
  std::uint64_t reads = 0;
  for (std::uint64_t x = 0; x < N; ++x) {
    const std::uint32_t c =
        std::atomic_ref<const std::uint32_t>(consumed_[x]).load(std::memory_order_relaxed);
    if (c == seen_[x]) continue;
    reads += c - seen_[x];
    fresh_reads_.push_back(c - seen_[x]);
    seen_[x] = c;
    fresh_.push_back(static_cast<std::uint32_t>(x));
  }
  if (on_ && pooled()) {  // on_ is written on this thread alone
    std::lock_guard lk(a_.mu_);
    release_transit_locked(t0);
    if (foreign_left_) drop_foreign_locked();
  }
  if (fresh_.empty()) return;
  fill_slots_.clear();
  {
    std::lock_guard lk(a_.mu_);
    if (a_.stopping_ || !a_.fatal_.empty()) return;
    reads_ += reads;
    close_epochs_locked();
    // Only while every rank has begun the step it is at: one that has not (still starting,
    // between epochs, far behind) holds the plan's admission back, and the others, reading on
    // in the plan's order, read steps past the window.
    // A node of one rank has no other to read on past the window: its reads tell alone (in an
    // order of its own it may not begin the plan's step for an epoch). And only while no rank
    // has completed the whole plan: one that has reads nothing more of it, and the others'
    // last steps are read out of step with it (a rank that diverges completes no step at all).
    const bool all_begun = std::all_of(a_.ranks_.begin(), a_.ranks_.end(), [&](const RankState& rs) {
      return rs.released < a_.T_ && (a_.R_ == 1 || rs.begun_at >= 0);
    });
    if (!on_ && !a_.steps_.streamed()) slide_window_locked();
    if (!on_ && !a_.steps_.streamed() && all_begun) {
      for (std::size_t i = 0; i < fresh_.size(); ++i)
        if (expected_[fresh_[i]] == 0) unexpected_since_progress_ += fresh_reads_[i];
      if (unexpected_since_progress_ >= stall_reads_) {
        if (can_switch_)
          switch_locked(fmt::format("the ranks read {} samples that no step of the plan near "
                                    "theirs holds, and completed no step meanwhile: their order "
                                    "is not the plan's",
                                    unexpected_since_progress_));
        else if (!warned_cannot_) {
          warned_cannot_ = true;
          spdlog::warn("node {}: the ranks read {} samples that no step of the plan near theirs "
                       "holds, and completed no step meanwhile: their order is not the plan's; "
                       "demand mode is not built for a local tier: the plan is kept, reads it "
                       "misses go to the files",
                       a_.opt_.node, unexpected_since_progress_);
        }
      }
    }
    // Pooled, a full buffer still pushes: the homes keep what other nodes' ranks read.
    if (on_ && (!full_ || pooled()) && !fill_failed_) {
      // At most kFillBytes a poll: the pacer's thread also renews the lease (a sample the
      // page cache no longer has comes from storage). The rest are filled when read again.
      std::uint64_t bytes = 0;
      for (const std::uint32_t x : fresh_) {
        if (a_.table_.resident(x)) continue;
        if (!mine(x)) {  // pooled: its home keeps it; pushed there while transit allows
          if (pushing_ >= push_transit_ || bytes >= kFillBytes ||
              !a_.peers_.usable_locked(solar_home_node(x, nodes_)) ||
              a_.table_.free_slots() < fetch_reserve_ + a_.table_.units_of(x))
            continue;
          const std::uint32_t one[] = {x};
          if (!a_.table_.take_room(one, fill_slots_)) continue;
          bytes += a_.prefetch_.slot_length(x);
          a_.table_.place(x, fill_slots_.back());
          queue_.emplace_back(x, fill_slots_.back());
          ++pushing_;
          ++pushes_;
          continue;
        }
        if (full_) continue;  // pooled: pushes only
        if (bytes >= kFillBytes) break;
        bytes += a_.prefetch_.slot_length(x);
        const std::uint32_t one[] = {x};
        // (Transit slots in use are part of the reserve kept.)
        const std::uint64_t in_transit = std::min<std::uint64_t>(reserve_units_, transit_.size());
        if (a_.table_.free_slots() + in_transit < reserve_units_ + a_.table_.units_of(x) ||
            !a_.table_.take_room(one, fill_slots_)) {
          full_ = true;
          spdlog::info("node {}: demand mode: the buffer is full ({} samples taken from the "
                       "ranks' reads); it keeps what it holds",
                       a_.opt_.node, taken_);
          if (pooled()) continue;  // the rest may still be pushed
          break;
        }
        a_.table_.place(x, fill_slots_.back());  // pinned until its bytes are in
        queue_.emplace_back(x, fill_slots_.back());
        ++taken_;
      }
    }
  }
  if (!fill_slots_.empty()) fill_queued();
}

// The samples poll() gave slots, copied in on the pacer's thread. (A thread of their own
// measured slower on 2 cores with 4 ranks: 0.99x, 0.94x and 1.07x plain at normal priority,
// nice 5 and SCHED_IDLE, against 1.18x and 1.22x so; bench/README.md "Demand mode".)
void DemandCache::fill_queued() {
  std::vector<std::uint32_t> samples, slots;
  {
    std::lock_guard lk(a_.mu_);
    if (a_.stopping_ || !a_.fatal_.empty() || queue_.empty()) return;
    for (const auto& [x, slot] : queue_) {
      samples.push_back(x);
      slots.push_back(slot);
    }
    queue_.clear();
  }
  try {
    if (!populated_) {  // the slots' pages in one go, not a fault per 4 KiB
      a_.populate_cache_slots();
      populated_ = true;
    }
    // The agent's own source reads with O_DIRECT under --direct-io: the ranks' reads went
    // through the page cache, and a source that does too finds the bytes there.
    if (a_.opt_.direct_io && !page_cache_source_) {
      storage::SourceOptions so = a_.source_options_;
      so.direct = false;
      page_cache_source_ = storage::open_source(a_.opt_.dataset, so);
    }
    a_.prefetch_.fill_slots(page_cache_source_ ? *page_cache_source_ : *a_.source_, samples,
                            slots);
  } catch (const std::exception& e) {
    // The ranks read these from the files as before; nothing more is filled.
    std::lock_guard lk(a_.mu_);
    spdlog::warn("node {}: demand mode: filling the buffer failed ({}); it keeps what it "
                 "holds, the rest is read from the files",
                 a_.opt_.node, e.what());
    full_ = fill_failed_ = true;
    for (const std::uint32_t x : samples) {
      if (!mine(x)) --pushing_;  // a push that never was
      a_.table_.drop_use(x);
      if (a_.table_.free_slot(x)) a_.prefetch_.slot_freed_locked();
    }
    return;
  }
  std::lock_guard lk(a_.mu_);
  const auto now = Clock::now();
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const std::uint32_t x = samples[i];
    a_.table_.publish(x, slots[i]);
    a_.drop_use_locked(x);
    if (!mine(x)) {  // a push: its home reads it from here
      transit_.push_back(
          {x, std::atomic_ref<const std::uint32_t>(consumed_[x]).load(std::memory_order_relaxed),
           now, true});
      a_.peers_.push_locked(x, solar_home_node(x, nodes_));
      continue;
    }
    filled_bytes_ += a_.prefetch_.slot_length(x);
    ++filled_;
  }
}

nlohmann::json DemandCache::json_locked() const {
  nlohmann::json epochs = nlohmann::json::array();
  for (const Epoch& e : epochs_)
    epochs.push_back({{"reads", e.reads},
                      {"hit_reads", e.hit_reads},
                      {"hit_bytes", e.hit_bytes},
                      {"miss_reads", e.miss_reads},
                      {"miss_bytes", e.miss_bytes},
                      {"end_seconds", e.end}});
  nlohmann::json j = {{"mode", on_ ? "demand" : "plan"},
                      {"sample_reads", reads_},
                      {"epoch_reads", epoch_reads_},
                      {"taken_samples", taken_},
                      {"filled_samples", filled_},
                      {"filled_bytes", filled_bytes_},
                      {"full", full_},
                      {"buffer_slots", a_.buf_.cache_slots},
                      {"epochs", epochs}};
  if (pooled()) {
    // What this node keeps of the samples placed on it; the ids too, for a dataset small
    // enough to list them (a test checks that no two nodes keep one).
    std::uint64_t held = 0;
    nlohmann::json ids = nlohmann::json::array();
    const bool list = seen_.size() <= 65536;
    for (std::uint64_t i = 0; i < seen_.size(); ++i) {
      const auto x = static_cast<std::uint32_t>(i);
      if (!a_.table_.resident(x) || !mine(x)) continue;
      ++held;
      if (list) ids.push_back(x);
    }
    j["pooled"] = {{"nodes", nodes_},
                   {"node", node_},
                   {"held_samples", held},
                   {"asked", asked_},
                   {"fetched_samples", fetched_},
                   {"fetched_bytes", fetched_bytes_},
                   {"not_held", not_held_},
                   {"no_room", no_room_},
                   {"dropped_foreign", dropped_foreign_},
                   {"pushed_samples", pushes_},
                   {"pulled_samples", pulled_},
                   {"pulled_bytes", pulled_bytes_},
                   {"pull_no_room", pull_no_room_},
                   {"pull_failed", pull_failed_},
                   {"transit", transit_.size()}};
    if (list) j["pooled"]["held"] = std::move(ids);
  }
  if (on_) {
    j["switched_at_seconds"] = switched_at_;
    j["switched_after_reads"] = reads_at_switch_;
    j["why"] = why_;
    j["plan_fetched_samples"] = plan_fetched_;
    j["plan_fetched_bytes"] = plan_bytes_;
  }
  return j;
}

}  // namespace solar::agent

// SPDX-License-Identifier: Apache-2.0
// The prefetch engine (plan → storage reads → slots) and the copies of batches into the
// ranks' rings. See prefetcher.h.
#include "prefetcher.h"

#include <spdlog/spdlog.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <stdexcept>

#include "agent_impl.h"

namespace solar::agent {

// ---- prefetch engine -------------------------------------------------------------------

void Prefetcher::prepare(unsigned readers) {
  scratch_.resize(std::max(1U, readers));
  // A reader's job is its share of a step's reads (prefetch_loop): at most the node's ranks'
  // batches, split among the readers. Merged jobs (--read-gap) and a larger step grow it later.
  const std::uint64_t step_samples =
      std::uint64_t{a_.R_} * std::max<std::uint64_t>(1, a_.buf_.ring_batch);
  const std::uint64_t per_job = (step_samples + scratch_.size() - 1) / scratch_.size();
  constexpr std::uint64_t kMaxTouched = 64ULL << 20;  // per reader
  const std::uint64_t bytes = std::min(per_job * a_.sample_bytes_, kMaxTouched);
  for (ReaderScratch& s : scratch_) {
    std::memset(s.samples.get(bytes), 0, bytes);
    // (Labels read at set-up are written into the slots from a_.labels_: no staging.)
    const std::uint64_t labels =
        a_.labels_.empty() ? std::min(per_job * a_.label_bytes_, kMaxTouched) : 0;
    if (labels) std::memset(s.labels.get(labels), 0, labels);
  }
}

void Prefetcher::start() {
  outstanding_.assign(a_.T_, 0);
  prefetch_ = std::thread([this] { prefetch_loop(); });
  for (ReaderScratch& s : scratch_) readers_.emplace_back([this, &s] { reader_loop(s); });
}

void Prefetcher::wake_all() {
  slot_freed_.notify_all();
  job_ready_.notify_all();
}

void Prefetcher::join() {
  if (prefetch_.joinable()) prefetch_.join();
  for (auto& r : readers_) r.join();
  readers_.clear();
}

void Prefetcher::slot_freed_locked() {
  if (slots_wanted_ > 0) slot_wait_since_ = Clock::now();  // a stall is no slot for a while
  // (Sized samples: enough units free together is necessary, not sufficient; the waiter tries.
  // It also gives up waiting once no evicted sample is in use: prefetch_loop.)
  if (a_.table_.free_slots() >= slots_wanted_ || (a_.table_.sized() && a_.table_.zombies() == 0))
    slot_freed_.notify_all();
}

void Prefetcher::read_from_storage_locked(std::uint64_t step, std::uint32_t sample,
                                          std::uint32_t slot) {
  ReadJob job;
  job.step = step;
  job.runs.push_back({sample, 1});
  job.slots.push_back(slot);
  jobs_.push_back(std::move(job));
  job_ready_.notify_one();
}

// The prefetch engine: one thread walks the plan in step order — evictions, slot allocation
// (waiting for free slots), admission of the step's uses — and queues the step's reads; a pool
// of reader threads executes them, several steps in flight. A step becomes servable once its
// reads and all earlier steps' are done.
void Prefetcher::prefetch_loop() {
  std::vector<std::uint32_t> incoming, slots, reading, unplaced;
  std::vector<std::uint32_t> from;  // per incoming sample: the peer node, or kStorage
  constexpr std::uint32_t kStorage = ~std::uint32_t{0}, kLocal = kStorage - 1;
  try {
    for (std::uint64_t t = a_.start_; t < a_.T_; ++t) {
      incoming.clear();
      // A streamed plan: step t is computed now (waiting for the planner, without the lock),
      // and the steps no rank can need again are dropped.
      std::optional<PlanSteps::Taken> taken;
      if (a_.steps_.streamed()) taken = a_.steps_.take(t);
      std::unique_lock lk(a_.mu_);
      if (a_.stopping_ || !a_.fatal_.empty()) return;
      if (a_.pacer_.demand_on_locked()) return;  // demand mode: the ranks' order is not the plan's
      if (taken) {
        a_.steps_.forget_before_locked(a_.oldest_step_needed_locked());
        a_.steps_.add_locked(std::move(*taken));
      }
      // What other nodes read from this one in step t stays until they are done (peer_sharing.cpp),
      // even when the plan evicts it now (a handover).
      if (a_.peers_.on()) a_.peers_.pin_served_locked(t);
      // The plan's evictions: free now, or once the ranks still using them release them.
      for (std::uint32_t y : a_.steps_.evicts_at(t)) {
        if (a_.table_.evict(y)) slot_freed_locked();
        a_.local_.evict_locked(y);
      }
      // A local tier: the disk's discards and writes, and the drops from memory that make room
      // (local_tier.h); the samples the step reads back from the disk come with the fetches.
      a_.local_.moves_locked(t);
      from.clear();
      auto want = [&](std::uint32_t x, std::uint32_t source) {
        if (a_.table_.resurrect(x)) return;  // still here: resurrect instead of re-reading
        incoming.push_back(x);
        from.push_back(source);
      };
      if (a_.local_.on())
        for (std::uint32_t x : a_.local_.reads_at(t)) want(x, kLocal);
      for (const FetchRun& run : a_.steps_.fetches_at(t))
        for (std::uint32_t x = run.first; x < run.first + run.count; ++x) want(x, kStorage);
      // Peer reads: from the peer's buffer (peer_sharing.cpp), or from storage without peer sharing
      // (or with that peer unreachable).
      for (const PeerFetch& pf : a_.steps_.peers_at(t))
        want(pf.sample, a_.peers_.usable_locked(pf.from_node) ? pf.from_node : kStorage);
      // Every sample the step uses must be here or coming. The plan guarantees it for a run
      // from step 0; an agent started later (--start-step) lacks what the plan kept from
      // earlier steps, and reads it now, for the first step that needs it. The plan's
      // resident set at this step contains it, so the slots suffice.
      for (std::uint32_t r = 0; r < a_.R_; ++r) {
        if (a_.ranks_[r].gone) continue;
        for (std::uint32_t a : a_.accesses(t, r)) {
          const std::uint32_t x = a & kSampleMask;
          if (a_.table_.resident(x)) {
            a_.table_.resurrect(x);
            continue;
          }
          if (std::find(incoming.begin(), incoming.end(), x) != incoming.end()) continue;
          incoming.push_back(x);
          from.push_back(kStorage);
          a_.stats_.note_unplanned();
        }
      }
      // The step's slots, all at once: its reads are queued only when it has all of them.
      slots.clear();
      unplaced.clear();
      const auto wait_from = Clock::now();
      if (!a_.table_.take_room(incoming, slots)) {
        slot_wait_since_ = wait_from;  // peer_sharing.cpp releases a stalled reader's pins after a while
        slots_wanted_ = a_.table_.units_for(incoming);
        // Samples of differing sizes: when no sample evicted is still in use, no slot comes
        // free before later steps' evictions, and room in pieces stays so. Then those that fit
        // are read, and the rest are left to the ranks' own reads of the files (the transparent
        // mode, the only one with such samples, serves what is resident).
        auto stuck = [&] { return a_.table_.sized() && a_.table_.zombies() == 0; };
        slot_freed_.wait(lk, [&] {
          return a_.stopping_ || !a_.fatal_.empty() || a_.pacer_.demand_on_locked() ||
                 a_.table_.take_room(incoming, slots) || stuck();
        });
        slots_wanted_ = 0;
        if (a_.stopping_ || !a_.fatal_.empty()) return;
        if (a_.pacer_.demand_on_locked()) {  // the slots it may have just taken go back
          a_.table_.give_room(incoming, slots);
          return;
        }
        if (slots.empty() && !incoming.empty()) leave_unplaced_locked(t, incoming, from, slots, unplaced);
      }
      a_.stats_.note_slot_wait(seconds_since(wait_from));
      // A sample being read is pinned like a use: were it evicted before its read lands (its
      // only user may be a rank that has left), its slot must not be handed to another sample
      // whose read could then be overwritten by this one.
      for (std::size_t i = 0; i < incoming.size(); ++i) {
        a_.table_.place(incoming[i], slots[i]);
        a_.local_.arriving_locked(incoming[i], t);
      }
      // Transparent mode: from now on the unmodified ranks' reads of these samples wait for
      // them (solar/transparent.h: at most SOLAR_XINDEX_WAIT_NS a read) rather than read the
      // file too: the same bytes from the same storage twice, which slows the agent's reads
      // as much as the rank's. Peer reads as well: they wait for the peer's own fetch.
      if (a_.pacer_.index())
        for (const std::uint32_t x : incoming) a_.table_.mark_in_flight(x);
      a_.stats_.note_fetching(
          static_cast<std::uint64_t>(std::count(from.begin(), from.end(), kStorage)));
      // Admit the step's uses now, before later steps' evictions are looked at. Each use's hit
      // bit becomes what this agent does (the per-epoch stats count it when the batch is
      // served): set when its sample is already here, clear when it is read for this step.
      reading.assign(incoming.begin(), incoming.end());
      std::sort(reading.begin(), reading.end());
      for (std::uint32_t r = 0; r < a_.R_; ++r) {
        if (a_.ranks_[r].gone) continue;
        for (std::uint32_t& a : a_.steps_.accesses_mut(t, r)) {
          const std::uint32_t x = a & kSampleMask;
          a_.table_.add_use(x);
          if (a & kHitBit) a_.stats_.note_plan_hit();  // the plan's
          // (A sample left unplaced is no hit either: the rank reads it from its file.)
          a = std::binary_search(reading.begin(), reading.end(), x) ||
                      std::find(unplaced.begin(), unplaced.end(), x) != unplaced.end()
                  ? x
                  : (x | kHitBit);
        }
      }
      a_.admitted_ = t + 1;
      // Peer reads go to the peer thread; the rest is the step's storage reads: one request
      // list of coalesced runs (a source keeps many of them in flight), executed by a reader
      // thread while this one goes on to the next steps.
      std::uint32_t peer_jobs = 0, local_jobs = 0;
      std::vector<std::size_t> idx;
      idx.reserve(incoming.size());
      for (std::size_t i = 0; i < incoming.size(); ++i) {
        if (from[i] == kStorage) {
          idx.push_back(i);
          continue;
        }
        if (from[i] == kLocal) {  // read back from the local disk by its own thread
          a_.local_.queue_read_locked(t, incoming[i], slots[i]);
          ++local_jobs;
          continue;
        }
        a_.peers_.queue_locked({t, incoming[i], slots[i], from[i]});
        ++peer_jobs;
      }
      std::sort(idx.begin(), idx.end(), [&](auto a, auto b) { return incoming[a] < incoming[b]; });
      // Split into about one job per reader thread, whole runs each, so that a step's reads
      // run in parallel too (sources also parallelise within a job).
      const std::size_t per_job = std::max<std::size_t>(
          1, (idx.size() + a_.opt_.readers - 1) / std::max(1U, a_.opt_.readers));
      std::uint32_t jobs = 0;
      ReadJob job;
      job.step = t;
      for (std::size_t i = 0; i < idx.size();) {
        std::size_t j = i + 1;
        while (j < idx.size() && incoming[idx[j]] == incoming[idx[j - 1]] + 1) ++j;
        job.runs.push_back({incoming[idx[i]], j - i});
        for (std::size_t k = i; k < j; ++k) job.slots.push_back(slots[idx[k]]);
        i = j;
        if (job.slots.size() >= per_job || i == idx.size()) {
          jobs_.push_back(std::move(job));
          job = ReadJob{};
          job.step = t;
          ++jobs;
        }
      }
      a_.local_.step_queued_locked();
      outstanding_[t] = jobs + peer_jobs + local_jobs;
      if (jobs) job_ready_.notify_all();
      if (peer_jobs) a_.peers_.step_queued_locked(t, peer_jobs);
      if (!jobs && !peer_jobs && !local_jobs) complete_steps_locked();
    }
  } catch (const std::exception& e) {
    a_.fail(e.what());
  }
}

void Prefetcher::leave_unplaced_locked(std::uint64_t step, std::vector<std::uint32_t>& incoming,
                                       std::vector<std::uint32_t>& from,
                                       std::vector<std::uint32_t>& slots,
                                       std::vector<std::uint32_t>& unplaced) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < incoming.size(); ++i) {
    const std::uint32_t one[] = {incoming[i]};
    if (!a_.table_.take_room(one, slots)) {
      unplaced.push_back(incoming[i]);
      continue;
    }
    incoming[kept] = incoming[i];
    from[kept] = from[i];
    ++kept;
  }
  const std::uint64_t left = incoming.size() - kept;
  incoming.resize(kept);
  from.resize(kept);
  unplaced_ += left;
  if (!warned_unplaced_) {
    warned_unplaced_ = true;
    spdlog::warn("node {}: step {}: {} samples find no free extent large enough in the buffer "
                 "(its free room is in pieces: {} units free, the largest run {}); the ranks "
                 "read them from the files (counted in stats as unplaced)",
                 a_.opt_.node, step, left, a_.table_.free_slots(), a_.table_.largest_free());
  }
}

void Prefetcher::complete_steps_locked() {
  const std::uint64_t before = a_.ready_;
  while (a_.ready_ < a_.admitted_ && outstanding_[a_.ready_] == 0) ++a_.ready_;
  if (a_.ready_ != before) {
    a_.local_.steps_ready_locked();
    schedule_assembly_locked();
  }
}

// A rank's next batch is copied into its ring once its step is read and the ring entry it
// reuses (step − depth) has been released: small batches at once by the calling thread, the
// others by the reader pool, one copy per rank in flight.
void Prefetcher::schedule_assembly_locked(bool on_io) {
  if (a_.buf_.ring_depth == 0) {  // zero copy: a ready step is servable as it is
    if (!on_io) a_.control_.post_serve();
    return;
  }
  if (a_.buf_.inline_copy) {  // small batches: a thread hop would cost more than the copy
    // Every batch that can be copied now, in one pass (copy_slots touches the pages ahead
    // across batches), then done in step order.
    inline_jobs_.clear();
    inline_dst_.clear();
    inline_src_.clear();
    for (std::uint32_t r = 0; r < a_.R_; ++r) {
      const RankState& rs = a_.ranks_[r];
      if (rs.gone) continue;
      const std::uint64_t upto = std::min({a_.T_, a_.ready_, rs.released + a_.buf_.ring_depth});
      for (std::uint64_t t = rs.assembled; t < upto; ++t) {
        inline_jobs_.emplace_back(t, r);
        add_copies_locked(t, r, inline_dst_, inline_src_);
      }
    }
    if (inline_jobs_.empty()) return;
    copy_slots(inline_dst_, inline_src_);
    for (const auto& [t, r] : inline_jobs_) finish_assembly_locked(t, r);
    if (on_io) a_.control_.serve_waiting_locked();
    else a_.control_.post_serve();
    return;
  }
  bool queued = false;
  for (std::uint32_t r = 0; r < a_.R_; ++r) {
    RankState& rs = a_.ranks_[r];
    if (rs.gone || rs.assembling || rs.assembled >= a_.T_ || rs.assembled >= a_.ready_ ||
        rs.assembled >= rs.released + a_.buf_.ring_depth)
      continue;
    rs.assembling = true;
    ReadJob job;
    job.step = rs.assembled;
    job.assemble_rank = static_cast<int>(r);
    jobs_.push_front(std::move(job));  // before reads of later steps: ranks wait on it
    queued = true;
  }
  if (queued) job_ready_.notify_all();
}

// The copies of rank r's batch of step t into its ring, appended to dst and src as slots (the
// step's uses pin those cache slots).
void Prefetcher::add_copies_locked(std::uint64_t t, std::uint32_t r,
                                   std::vector<std::uint32_t>& dst,
                                   std::vector<std::uint32_t>& src) const {
  const auto acc = a_.accesses(t, r);
  for (std::size_t i = 0; i < acc.size(); ++i) {
    src.push_back(a_.table_.slot_of(acc[i] & kSampleMask));
    dst.push_back(a_.ring_slot(r, t, i));
  }
}

// Copies slot src[k] → slot dst[k], samples and labels. Samples lie at random places in the
// buffer, on pages of their own (4 KiB pages: shared memory gets no huge pages by default), so
// each copy begins with address translations and memory reads the hardware cannot see coming;
// the pages of the copy kCopyAhead further on are touched (prefetched) first, so those overlap
// with this copy. 4 KiB samples, one pass over a 20000-slot memfd (a test program, 3 runs
// each): 4.7-5.4 GB/s plain, 6.3-8.2 GB/s so with 4160-byte slots (label inside, two pages
// per sample, before protocol version 4), 13.1-13.5 µs per batch of 16 with 4096-byte ones
// against 16.1-16.4. Large samples are no slower.
void Prefetcher::copy_slots(std::span<const std::uint32_t> dst,
                            std::span<const std::uint32_t> src) const {
  constexpr std::size_t kCopyAhead = 8;
  constexpr std::uintptr_t kPage = 4096;
  const std::size_t n = src.size(), bytes = a_.sample_bytes_;
  auto touch = [bytes](const std::byte* p) {
    __builtin_prefetch(p);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    for (std::uintptr_t q = (a & ~(kPage - 1)) + kPage; q < a + bytes; q += kPage)
      __builtin_prefetch(reinterpret_cast<const void*>(q));
  };
  for (std::size_t k = 0; k < std::min(n, kCopyAhead); ++k) touch(a_.slot_ptr(src[k]));
  for (std::size_t k = 0; k < n; ++k) {
    if (k + kCopyAhead < n) touch(a_.slot_ptr(src[k + kCopyAhead]));
    std::memcpy(a_.slot_ptr(dst[k]), a_.slot_ptr(src[k]), bytes);
  }
  if (a_.label_bytes_)
    for (std::size_t k = 0; k < n; ++k)
      std::memcpy(a_.label_ptr(dst[k]), a_.label_ptr(src[k]), a_.label_bytes_);
}

void Prefetcher::finish_assembly_locked(std::uint64_t t, std::uint32_t r) {
  RankState& rs = a_.ranks_[r];
  for (std::uint32_t a : a_.accesses(t, r)) a_.drop_use_locked(a & kSampleMask);
  rs.assembling = false;
  if (!rs.gone) rs.assembled = t + 1;
}

void Prefetcher::assemble(std::uint64_t t, std::uint32_t r) {
  std::vector<std::uint32_t> dst, src;
  {
    std::lock_guard lk(a_.mu_);
    add_copies_locked(t, r, dst, src);
  }
  copy_slots(dst, src);  // unlocked: neither the cache slots nor the ring entry can change
  std::lock_guard lk(a_.mu_);
  finish_assembly_locked(t, r);
  schedule_assembly_locked();
  a_.control_.post_serve();
}

void Prefetcher::write_slot(std::uint32_t slot, const std::byte* sample, std::size_t sample_len,
                            const std::byte* label) {
  auto put = [&](const std::byte* p, std::size_t n, off_t at) {
    for (std::size_t done = 0; done < n;) {
      const ssize_t w = ::pwrite(a_.memfd_, p + done, n - done, at);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw std::runtime_error(fmt::format("writing slot {} of the buffer: {}", slot,
                                                       std::strerror(w < 0 ? errno : ENOSPC)));
      done += static_cast<std::size_t>(w);
      at += w;
    }
  };
  put(sample, sample_len, static_cast<off_t>(a_.buf_.slot_offset(slot)));
  // A label under a page (usually a few bytes, many to a page) through the mapping, saving a
  // system call; a larger one, like the sample, without a page fault per page.
  constexpr std::uint64_t kPage = 4096;
  if (a_.label_bytes_ >= kPage)
    put(label, a_.label_bytes_, static_cast<off_t>(a_.buf_.label_offset(slot)));
  else if (a_.label_bytes_) std::memcpy(a_.label_ptr(slot), label, a_.label_bytes_);
}

std::size_t Prefetcher::slot_length(std::uint32_t sample) const {
  // (The sizes are the slot table's from its construction: read without the lock.)
  return a_.table_.sized()
             ? std::min<std::size_t>(std::size_t{a_.table_.units_of(sample)} * 64, a_.sample_bytes_)
             : a_.sample_bytes_;
}

void Prefetcher::fill_slots(storage::SampleSource& source, std::span<const std::uint32_t> samples,
                            std::span<const std::uint32_t> slots) {
  std::byte* staging = fill_scratch_.samples.get(a_.sample_bytes_);
  const std::byte* all_labels = a_.labels_.empty() ? nullptr : a_.labels_.data();
  std::byte* label = all_labels ? nullptr : fill_scratch_.labels.get(a_.label_bytes_);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const storage::SampleRun run[] = {{samples[i], 1}};
    // A slot of one size: the sample straight into it, one copy (its pages made first); a
    // sized one through staging (a read fills the whole stride, past the sample's units).
    const bool direct = !a_.table_.sized();
    std::byte* to = direct ? a_.slot_ptr(slots[i]) : staging;
    if (a_.stored_mode_) source.read_stored(run, to, a_.sample_bytes_);
    else source.read(run, to);
    if (a_.label_bytes_ && !all_labels) source.read_labels(run, label);
    write_slot(slots[i], to, direct ? 0 : slot_length(samples[i]),  // 0: the label alone
               all_labels ? all_labels + std::uint64_t{samples[i]} * a_.label_bytes_ : label);
  }
}

void Prefetcher::reader_loop(ReaderScratch& scratch) {
  Scratch& staging_buf = scratch.samples;
  Scratch& label_buf = scratch.labels;
  // With --read-gap (storage bound by requests), a reader takes the read jobs queued behind
  // its own as well, up to this many bytes, so that samples of several steps that lie close
  // together in the file become one request (the source merges them: Hdf5Options::read_gap).
  constexpr std::uint64_t kMergeBytes = 64ULL << 20;
  const std::uint64_t merge_samples =
      a_.opt_.read_gap ? std::max<std::uint64_t>(1, kMergeBytes / std::max<std::uint64_t>(
                                                                   1, a_.sample_bytes_))
                    : 0;
  std::vector<ReadJob> batch;
  std::vector<storage::SampleRun> runs;
  for (;;) {
    batch.clear();
    {
      std::unique_lock lk(a_.mu_);
      job_ready_.wait(lk, [&] { return a_.stopping_ || !a_.fatal_.empty() || !jobs_.empty(); });
      if (a_.stopping_ || !a_.fatal_.empty()) return;
      batch.push_back(std::move(jobs_.front()));
      jobs_.pop_front();
      std::uint64_t samples = batch.front().slots.size();
      while (batch.front().assemble_rank < 0 && !jobs_.empty() &&
             jobs_.front().assemble_rank < 0 &&
             samples + jobs_.front().slots.size() <= merge_samples) {
        samples += jobs_.front().slots.size();
        batch.push_back(std::move(jobs_.front()));
        jobs_.pop_front();
      }
    }
    try {
      if (batch.front().assemble_rank >= 0) {
        assemble(batch.front().step, static_cast<std::uint32_t>(batch.front().assemble_rank));
        continue;
      }
      runs.clear();
      std::size_t n = 0;
      for (const ReadJob& job : batch) {
        runs.insert(runs.end(), job.runs.begin(), job.runs.end());
        n += job.slots.size();
      }
      const auto t0 = Clock::now();
      std::byte* staging = staging_buf.get(n * a_.sample_bytes_);
      // Labels read at set-up (read_all_labels) go into the slots from there; others are read
      // after the samples.
      const std::byte* all_labels = a_.labels_.empty() ? nullptr : a_.labels_.data();
      std::byte* label_staging = all_labels ? nullptr : label_buf.get(n * a_.label_bytes_);
      if (a_.stored_mode_) a_.source_->read_stored(runs, staging, a_.sample_bytes_);
      else a_.source_->read(runs, staging);
      if (a_.label_bytes_ && !all_labels) a_.source_->read_labels(runs, label_staging);
      // Into the slots through the memfd: the kernel fills its pages directly, without a page
      // fault per 4 KiB of a mapping touched for the first time.
      // (Sized samples: each its own bytes, rounded up to 64 with the stride's zeros, into its
      // own units; the rest of the stride would be another sample's.)
      std::size_t i = 0;
      for (const ReadJob& job : batch) {
        std::size_t k = 0;
        for (const auto& run : job.runs)
          for (std::uint64_t x = run.first; x < run.first + run.count; ++x, ++k, ++i)
            write_slot(job.slots[k], staging + i * a_.sample_bytes_,
                       slot_length(static_cast<std::uint32_t>(x)),
                       all_labels ? all_labels + x * a_.label_bytes_
                                  : label_staging + i * a_.label_bytes_);
      }
      const double secs = seconds_since(t0);
      std::lock_guard lk(a_.mu_);
      for (const ReadJob& job : batch) {
        if (a_.table_.indexed()) {  // the bytes are in place: readers may copy them from now on
          std::size_t k = 0;
          for (const auto& run : job.runs)
            for (std::uint64_t x = run.first; x < run.first + run.count; ++x, ++k)
              a_.table_.publish(static_cast<std::uint32_t>(x), job.slots[k]);
        }
        // A merged read's time, shared by its jobs by their samples.
        const double share = secs * static_cast<double>(job.slots.size()) / static_cast<double>(n);
        a_.stats_.note_read(job.step, job.slots.size(), job.runs.size(), share);
        for (const auto& run : job.runs)  // read: the read pins go (see prefetch_loop)
          for (std::uint64_t x = run.first; x < run.first + run.count; ++x)
            a_.drop_use_locked(static_cast<std::uint32_t>(x));
        if (--outstanding_[job.step] == 0) complete_steps_locked();
      }
    } catch (const std::exception& e) {
      a_.fail(e.what());
      return;
    }
  }
}

}  // namespace solar::agent

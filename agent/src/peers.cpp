// Peer sharing: the plan's peer reads executed over libfabric RMA between the job's agents, and
// this agent's buffer served to them. See agent/README.md, "Peers", and agent_impl.h.
//
// Each agent registers its whole buffer for remote reads (slots and the sample index, whose
// entries say which slot holds a sample, with a generation: solar/transparent.h) and a small
// array of progress counters for remote writes, both under unguessable keys, and writes a card
// (fabric address, keys) into the job's private peer folder. A peer read of sample x from node
// s at step t: read s's index entry of x; read the slot it names into our own slot, then its
// label (labels lie apart, after the slots); read the entry again: the bytes are x's only if
// the entry did not change (a recycled slot changes the generation). A missing entry is
// retried until --peer-timeout, a changed one a few times; then the sample is read from
// storage instead, into the same slot. When our peer reads of every step before v are done,
// we write v into each source's counter for us; a source keeps the samples we read at step t
// pinned (evicted or not) until our counter passes t.
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>

#include "agent_impl.h"
#include "fabric.h"  // storage/src: the endpoint and registrations solar-stored uses
#include "wire.h"    // storage/src: fabric addresses in hex, as solar-stored sends them

namespace solar::agent {

namespace fabric = storage::fabric;

namespace {

constexpr std::size_t kInFlight = 32;  // peer reads in flight
constexpr int kMaxTorn = 3;            // changed entries before a sample goes to storage

std::string card_name(std::uint32_t node) { return fmt::format("node{}.peer", node); }

// What a card must name as a reader's own for its buffer to be read: the job (the plan file it
// was started with: its path and file identity, unique to one job step under solar run and the
// plugin), the plan (its header checksum, which covers every node's section) and the dataset
// (the identity of the source the agent opened). The same shape is not enough: an agent of
// another job, left in or copied into a reused --peer-dir, holds other bytes under the same
// sample ids.
struct CardIdentity {
  std::string job, plan, dataset;
};

// The fields of a card that differ from ours, in words ("" when none does).
std::string card_differences(const nlohmann::json& c, const CardIdentity& ours) {
  std::string out;
  for (const auto& [key, mine] :
       {std::pair<const char*, const std::string&>{"job", ours.job}, {"plan", ours.plan},
        {"dataset", ours.dataset}}) {
    const auto it = c.find(key);
    const std::string theirs =
        it != c.end() && it->is_string() ? it->get<std::string>() : std::string("(none)");
    if (theirs != mine)
      out += fmt::format("{}its {} is {} (this agent's: {})", out.empty() ? "" : "; ", key,
                         theirs, mine);
  }
  return out;
}

}  // namespace

struct Agent::Impl::PeerState {
  struct Remote {
    bool needed = false;   // we read from it, or it reads from us
    bool known = false;    // its card was read and its address inserted
    bool dead = false;     // unreachable: our reads from it go to storage
    fi_addr_t addr = FI_ADDR_UNSPEC;
    std::uint64_t buf_key = 0, buf_base = 0, prog_key = 0, prog_base = 0;
    std::uint64_t entries_offset = 0, slot_bytes = 0, labels_offset = 0;
    std::uint64_t written = 0;  // the progress value it has from us
    bool writing = false;       // a progress write to it is in flight
    // As a reader of ours: its counter as last seen, and since when; abandoned: its pins were
    // released because it stalled while we needed the slots.
    std::uint64_t seen = 0;
    Clock::time_point seen_at = Clock::now();
    bool abandoned = false;
  };
  struct Op {
    fi_context2 ctx;  // first: completions point here
    PeerJob job;
    // 0 post entry read, 1 entry read, 2 sample read, 4 label read (labels lie apart), 3 entry
    // re-read
    int phase = 0;
    int torn = 0;
    bool active = false;
    Clock::time_point since, retry_at;
    std::uint64_t e1 = 0;
  };
  struct WriteCtx {
    fi_context2 ctx;
    std::uint32_t node = 0;
  };
  // Declared before the registrations of their memory, so destroyed after them.
  std::unique_ptr<fabric::Endpoint> ep;
  std::vector<std::uint64_t> progress;  // [n]: node n's progress reading from us (remote-written)
  std::vector<std::uint64_t> scratch;   // 2 words per op (entry reads), then one per node (writes)
  fabric::Region buf_mr, prog_mr, scratch_mr;
  std::vector<Remote> remote;
  std::vector<Op> ops = std::vector<Op>(kInFlight);
  std::vector<WriteCtx> writes;
  // [t]: (sample, reader) for the reads other nodes make from us at step t.
  std::vector<std::vector<std::pair<std::uint32_t, std::uint32_t>>> served;
  std::vector<std::deque<std::pair<std::uint64_t, std::uint32_t>>> pins;  // [reader]: (t, sample)
  std::uint64_t progress_cursor = 0;  // our peer jobs of every step before it are done
  bool disabled = false;              // after a read that never completed: all to storage
  std::string card_path;
  ~PeerState() {
    if (!card_path.empty()) ::unlink(card_path.c_str());
  }
};

void Agent::Impl::PeerStateDelete::operator()(PeerState* p) const { delete p; }

void Agent::Impl::setup_peers(const PlanFile& pf) {
  const std::uint32_t M = header_.config.nodes, me = opt_.node;
  struct stat st {};
  if (::stat(opt_.peer_dir.c_str(), &st) != 0)
    throw AgentError(fmt::format("--peer-dir {}: {}", opt_.peer_dir, std::strerror(errno)));
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077))
    throw AgentError(fmt::format(
        "--peer-dir {}: must be a folder of this user that only it can open (mode 0700): the "
        "cards the agents leave there hold the keys to their buffers",
        opt_.peer_dir));
  std::unique_ptr<PeerState, PeerStateDelete> ps(new PeerState());
  try {
    ps->ep = fabric::Endpoint::open(opt_.peer_provider, "", /*wait=*/true, /*remote_write=*/true);
  } catch (const std::exception& e) {
    throw AgentError(fmt::format("--peer-provider {}: {}", opt_.peer_provider, e.what()));
  }
  ps->progress.assign(M, 0);
  ps->scratch.assign(2 * kInFlight + M, 0);
  ps->writes.resize(M);
  ps->remote.resize(M);
  ps->pins.resize(M);
  try {
    // Remote access is read-only for the buffer; only the progress counters take writes.
    ps->buf_mr = ps->ep->register_memory(base_, buf_.map_bytes, FI_REMOTE_READ | FI_READ);
    ps->prog_mr = ps->ep->register_memory(ps->progress.data(), M * sizeof(std::uint64_t),
                                          FI_REMOTE_WRITE);
    ps->scratch_mr = ps->ep->register_memory(
        ps->scratch.data(), ps->scratch.size() * sizeof(std::uint64_t), FI_READ | FI_WRITE);
  } catch (const std::exception& e) {
    throw AgentError(fmt::format("peer sharing: {}", e.what()));
  }
  // Who reads what from us (the other nodes' sections of the plan), and whom we read from.
  ps->served.resize(T_);
  try {
    for (std::uint32_t n = 0; n < M; ++n) {
      if (n == me) continue;
      const NodePlan np = pf.node(n);
      for (std::uint64_t t = 0; t < T_; ++t)
        for (const PeerFetch& f : np.schedule.peers_at(t))
          if (f.from_node == me) {
            ps->served[t].emplace_back(f.sample, n);
            ps->remote[n].needed = true;
          }
    }
  } catch (const PlanFileError& e) {
    throw AgentError(e.what());
  }
  for (std::uint64_t t = 0; t < T_; ++t)
    for (const PeerFetch& f : plan_.schedule.peers_at(t))
      if (f.from_node < M && f.from_node != me) ps->remote[f.from_node].needed = true;

  CardIdentity id;
  {
    const std::string plan_path =
        std::filesystem::absolute(opt_.plan).lexically_normal().string();
    struct stat plan_st {};
    id.job = ::stat(plan_path.c_str(), &plan_st) == 0
                 ? fmt::format("plan file {} ({})", plan_path, storage::file_identity(plan_st))
                 : fmt::format("plan file {}", plan_path);
    id.plan = fmt::format("crc32 {:08x}", header_.checksum);
    id.dataset = source_->identity();
  }
  // Our card, written atomically (mode 0600): a reader sees all of it or none.
  const nlohmann::json card = {{"node", me},
                               {"job", id.job},
                               {"plan", id.plan},
                               {"dataset", id.dataset},
                               {"pid", ::getpid()},
                               {"provider", ps->ep->provider()},
                               {"address", storage::wire::to_hex(ps->ep->address())},
                               {"buf_key", ps->buf_mr.key()},
                               {"buf_base", ps->buf_mr.base()},
                               {"prog_key", ps->prog_mr.key()},
                               {"prog_base", ps->prog_mr.base()},
                               {"entries_offset", buf_.entries_offset},
                               {"slot_bytes", buf_.slot_bytes},
                               {"labels_offset", buf_.labels_offset},
                               {"label_bytes", buf_.label_bytes},
                               {"samples", header_.config.samples}};
  const std::string path = (std::filesystem::path(opt_.peer_dir) / card_name(me)).string();
  if (const char* failed = write_file_atomically(path, card.dump(), 0600))
    throw AgentError(fmt::format("--peer-dir: writing {}: {}: {}", path, failed,
                                 std::strerror(errno)));
  ps->card_path = path;

  // The others' cards: they start at the same time; wait for them at most --peer-timeout.
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(opt_.peer_timeout));
  // A card of another job is not ours: as if missing (this job's agent may still write its own
  // over it), and the reason is kept for the warning once we stop waiting.
  std::vector<std::string> foreign(M);
  for (;;) {
    bool missing = false;
    for (std::uint32_t n = 0; n < M; ++n) {
      PeerState::Remote& r = ps->remote[n];
      if (n == me || !r.needed || r.known) continue;
      std::ifstream f(std::filesystem::path(opt_.peer_dir) / card_name(n));
      nlohmann::json c;
      if (f) c = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
      if (!f || c.is_discarded()) {
        missing = true;
        continue;
      }
      std::string differs = c.is_object() ? card_differences(c, id) : "it is not an object";
      if (differs.empty() && !(c.contains("node") && c.at("node") == n))
        differs = fmt::format("it names node {} (this agent looks for node {})",
                              c.contains("node") ? c.at("node").dump() : "(none)", n);
      if (!differs.empty()) {
        if (foreign[n] != differs)
          spdlog::warn("peer node {}: the card in {} is another job's ({}); not used: waiting "
                       "for this job's card",
                       n, opt_.peer_dir, differs);
        foreign[n] = std::move(differs);
        missing = true;
        continue;
      }
      foreign[n].clear();
      try {
        if (c.at("samples").get<std::uint64_t>() != header_.config.samples)
          throw std::invalid_argument("another plan's card");
        r.addr = ps->ep->insert(storage::wire::from_hex(c.at("address").get<std::string>()));
        r.buf_key = c.at("buf_key");
        r.buf_base = c.at("buf_base");
        r.prog_key = c.at("prog_key");
        r.prog_base = c.at("prog_base");
        r.entries_offset = c.at("entries_offset");
        r.slot_bytes = c.at("slot_bytes");
        if (r.slot_bytes != buf_.slot_bytes) throw std::invalid_argument("another slot size");
        r.labels_offset = c.at("labels_offset");
        if (c.at("label_bytes").get<std::uint64_t>() != buf_.label_bytes)
          throw std::invalid_argument("another label size");
        r.known = true;
      } catch (const std::exception& e) {
        spdlog::warn("peer node {}: its card in {} is unusable ({}); what this node would read "
                     "from it is read from storage",
                     n, opt_.peer_dir, e.what());
        r.dead = true;
        r.known = true;  // not waited for
      }
    }
    if (!missing) break;
    if (Clock::now() >= deadline) {
      for (std::uint32_t n = 0; n < M; ++n)
        if (n != me && ps->remote[n].needed && !ps->remote[n].known) {
          if (!foreign[n].empty())
            spdlog::warn("peer node {}: only another job's card in {} after {} s ({}); what "
                         "this node would read from it is read from storage",
                         n, opt_.peer_dir, opt_.peer_timeout, foreign[n]);
          else
            spdlog::warn("peer node {}: no card in {} after {} s (its agent did not start?); "
                         "what this node would read from it is read from storage",
                         n, opt_.peer_dir, opt_.peer_timeout);
          ps->remote[n].dead = true;
          ps->remote[n].abandoned = true;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::uint64_t reads = 0, serves = 0;
  for (std::uint64_t t = 0; t < T_; ++t) {
    reads += plan_.schedule.peers_at(t).size();
    serves += ps->served[t].size();
  }
  spdlog::info("node {}: peer sharing over {} ({}): {} peer reads planned from other nodes, {} "
               "from this node's buffer",
               me, ps->ep->provider(), opt_.peer_dir, reads, serves);
  peer_pending_.assign(T_, 0);
  peers_ = std::move(ps);
}

void Agent::Impl::wake_peer_locked() {
  peer_wake_.notify_one();
  if (peers_ && peers_->ep && peers_->ep->waitable()) fi_cq_signal(peers_->ep->cq());
}

bool Agent::Impl::peer_usable_locked(std::uint32_t node) const {
  return peers_ && !peers_->disabled && node < peers_->remote.size() &&
         peers_->remote[node].known && !peers_->remote[node].dead;
}

void Agent::Impl::pin_served_locked(std::uint64_t t) {
  for (const auto& [x, reader] : peers_->served[t]) {
    if (peers_->disabled || peers_->remote[reader].abandoned || !table_.resident(x)) continue;
    table_.add_use(x);
    peers_->pins[reader].emplace_back(t, x);
  }
}

void Agent::Impl::peer_done_locked(const PeerJob& j, bool ok) {
  if (ok) {
    table_.publish(j.sample, j.slot);
    ++peer_samples_;
    stats_.note_peer_read(j.step);
    drop_use_locked(j.sample);  // the read pin (prefetch_loop)
    if (--outstanding_[j.step] == 0) complete_steps_locked();
  } else {
    ++peer_fallbacks_;
    stats_.note_fetching(1);  // from storage after all
    ReadJob job;
    job.step = j.step;
    job.runs.push_back({j.sample, 1});
    job.slots.push_back(j.slot);
    jobs_.push_back(std::move(job));
    job_ready_.notify_one();
  }
  --peer_pending_[j.step];
}

void Agent::Impl::peer_loop() {
  PeerState& ps = *peers_;
  const std::uint32_t M = header_.config.nodes, me = opt_.node;
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(opt_.peer_timeout));
  fid_ep* ep = ps.ep->ep();
  fid_cq* cq = ps.ep->cq();
  std::uint64_t* scratch = ps.scratch.data();
  void* sdesc = ps.scratch_mr.desc();
  std::vector<std::pair<PeerJob, bool>> done;  // finished jobs, handed over under the lock
  std::deque<PeerJob> queue;                   // taken from peer_jobs_, not yet started
  std::vector<std::pair<void*, bool>> completed;  // one fi_cq_read's completions (reused)
  std::size_t active = 0;
  std::uint32_t writes_in_flight = 0;
  std::uint64_t torn = 0;  // changed entries seen, added to peer_torn_ under the lock
  bool block_next = false;
  std::string dead_why;

  auto post_entry = [&](PeerState::Op& op, std::uint64_t* into) {
    const PeerState::Remote& r = ps.remote[op.job.from];
    return fi_read(ep, into, sizeof(std::uint64_t), sdesc, r.addr,
                   r.buf_base + r.entries_offset + std::uint64_t{op.job.sample} * 8, r.buf_key,
                   &op.ctx) == 0;
  };
  // A peer that answered with an error: asked no more (the prefetch engine reads `dead`
  // under the lock, peer_usable_locked).
  auto mark_dead = [&](std::uint32_t node) {
    std::lock_guard lk(mu_);
    if (ps.remote[node].dead) return;
    ps.remote[node].dead = true;
    spdlog::warn("peer node {}: unreachable ({}); what this node would read from it is read "
                 "from storage",
                 node, dead_why);
  };
  auto finish = [&](PeerState::Op& op, bool ok) {
    done.emplace_back(op.job, ok);
    op.active = false;
    --active;
  };

  for (;;) {
    bool idle = true;
    // 1. New jobs; the sources' progress counters release pins; our own progress.
    std::uint64_t progress = 0;
    {
      std::unique_lock lk(mu_);
      for (auto& [job, ok] : done) peer_done_locked(job, ok);
      done.clear();
      peer_torn_ += torn;
      torn = 0;
      if (stopping_ || !fatal_.empty()) break;
      while (!peer_jobs_.empty()) {
        PeerJob j = peer_jobs_.front();
        peer_jobs_.pop_front();
        if (ps.disabled || ps.remote[j.from].dead) peer_done_locked(j, false);
        else queue.push_back(j);
        idle = false;
      }
      const auto now = Clock::now();
      for (std::uint32_t n = 0; n < M; ++n) {
        auto& pins = ps.pins[n];
        if (pins.empty()) continue;
        PeerState::Remote& r = ps.remote[n];
        const std::uint64_t v =
            std::atomic_ref<std::uint64_t>(ps.progress[n]).load(std::memory_order_acquire);
        if (v != r.seen) {
          r.seen = v;
          r.seen_at = now;
        }
        while (!pins.empty() && pins.front().first < v) {
          drop_use_locked(pins.front().second);
          pins.pop_front();
          idle = false;
        }
        // A reader that has not moved for --peer-timeout while we wait for slots: it lost
        // its turn (dead, stopped, or far behind); what it reads from us from now on may be
        // gone, and it then reads storage.
        if (!pins.empty() && slots_wanted_ > 0 && now - slot_wait_since_ > timeout &&
            now - r.seen_at > timeout) {
          spdlog::warn("peer node {} has read nothing from this node's buffer for {} s while "
                       "this node waits for slots: {} samples kept for it are released (it "
                       "reads them from storage)",
                       n, opt_.peer_timeout, pins.size());
          peer_pins_released_early_ += pins.size();
          for (const auto& [t, x] : pins) drop_use_locked(x);
          pins.clear();
          r.abandoned = true;
        }
      }
      while (ps.progress_cursor < admitted_ && peer_pending_[ps.progress_cursor] == 0)
        ++ps.progress_cursor;
      progress = ps.progress_cursor;
    }
    if (ps.disabled) {  // everything queued goes to storage (above); nothing is in flight
      std::unique_lock lk(mu_);
      job_ready_.notify_all();
      peer_wake_.wait_for(lk, std::chrono::milliseconds(50),
                          [&] { return stopping_ || !fatal_.empty() || !peer_jobs_.empty(); });
      continue;
    }
    // 2. Start queued jobs.
    for (std::size_t i = 0; i < ps.ops.size() && !queue.empty(); ++i) {
      PeerState::Op& op = ps.ops[i];
      if (op.active) continue;
      op = PeerState::Op{};
      op.job = queue.front();
      queue.pop_front();
      if (ps.remote[op.job.from].dead) {
        done.emplace_back(op.job, false);
        continue;
      }
      op.active = true;
      op.since = op.retry_at = Clock::now();
      ++active;
    }
    // 3. Post what is due: first entry reads and retries.
    const auto now = Clock::now();
    for (std::size_t i = 0; i < ps.ops.size(); ++i) {
      PeerState::Op& op = ps.ops[i];
      if (!op.active || op.phase != 0 || now < op.retry_at) continue;
      if (ps.remote[op.job.from].dead) {
        finish(op, false);
        continue;
      }
      if (post_entry(op, &scratch[2 * i])) op.phase = 1;
      idle = false;
    }
    // 4. Progress writes to the sources we read from.
    for (std::uint32_t n = 0; n < M; ++n) {
      PeerState::Remote& r = ps.remote[n];
      if (n == me || !r.known || r.dead || r.writing || r.written >= progress) continue;
      scratch[2 * kInFlight + n] = progress;
      ps.writes[n].node = n;
      if (fi_write(ep, &scratch[2 * kInFlight + n], sizeof(std::uint64_t), sdesc, r.addr,
                   r.prog_base + std::uint64_t{me} * 8, r.prog_key, &ps.writes[n].ctx) == 0) {
        r.writing = true;
        ++writes_in_flight;
        idle = false;
      }
    }
    // 5. Completions. After an idle pass, on a provider with a wait object (tcp), the first
    //    read blocks in the kernel until the provider has work or 1 ms has passed: serving
    //    the other agents' reads of our buffer needs this thread to progress the endpoint
    //    (tcp;ofi_rxm's progress is manual), promptly but without spinning.
    fi_cq_entry entries[16];
    for (;;) {
      const ssize_t n = block_next ? fi_cq_sread(cq, entries, 16, nullptr, 1)
                                   : fi_cq_read(cq, entries, 16);
      block_next = false;
      completed.clear();
      if (n > 0) {
        for (ssize_t k = 0; k < n; ++k) completed.emplace_back(entries[k].op_context, true);
      } else if (n == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        if (fi_cq_readerr(cq, &err, 0) > 0) {
          completed.emplace_back(err.op_context, false);
          dead_why = fabric::error_text(err.err);
        }
      } else {
        break;
      }
      idle = false;
      for (const auto& [ctx, ok] : completed) {
        auto* w = static_cast<PeerState::WriteCtx*>(ctx);
        if (w >= ps.writes.data() && w < ps.writes.data() + ps.writes.size()) {
          PeerState::Remote& r = ps.remote[w->node];
          r.writing = false;
          --writes_in_flight;
          if (ok) r.written = scratch[2 * kInFlight + w->node];
          else mark_dead(w->node);
          continue;
        }
        auto* op = static_cast<PeerState::Op*>(ctx);
        const std::size_t i = static_cast<std::size_t>(op - ps.ops.data());
        PeerState::Remote& r = ps.remote[op->job.from];
        if (!ok) {
          mark_dead(op->job.from);
          finish(*op, false);
          continue;
        }
        if (op->phase == 1) {
          op->e1 = scratch[2 * i];
          if ((op->e1 & 0xffffffffULL) == 0) {  // not there, or in flight: try again shortly
            if (Clock::now() - op->since > timeout) {
              finish(*op, false);
              continue;
            }
            op->phase = 0;
            op->retry_at = Clock::now() + std::chrono::microseconds(200);
            continue;
          }
          const std::uint64_t slot = (op->e1 & 0xffffffffULL) - 1;
          if (fi_read(ep, slot_ptr(op->job.slot), buf_.slot_bytes, ps.buf_mr.desc(), r.addr,
                      r.buf_base + slot * r.slot_bytes, r.buf_key, &op->ctx) == 0)
            op->phase = 2;
          else {  // queue full: start over after the completions
            op->phase = 0;
            op->retry_at = Clock::now();
          }
        } else if (op->phase == 2 && buf_.label_bytes) {
          const std::uint64_t slot = (op->e1 & 0xffffffffULL) - 1;
          if (fi_read(ep, label_ptr(op->job.slot), buf_.label_bytes, ps.buf_mr.desc(), r.addr,
                      r.buf_base + r.labels_offset + slot * buf_.label_bytes, r.buf_key,
                      &op->ctx) == 0)
            op->phase = 4;
          else {
            op->phase = 0;
            op->retry_at = Clock::now();
          }
        } else if (op->phase == 2 || op->phase == 4) {
          if (post_entry(*op, &scratch[2 * i + 1])) op->phase = 3;
          else {
            op->phase = 0;
            op->retry_at = Clock::now();
          }
        } else if (op->phase == 3) {
          if (scratch[2 * i + 1] == op->e1) {
            finish(*op, true);
          } else if (++op->torn >= kMaxTorn) {
            ++torn;
            finish(*op, false);
          } else {
            ++torn;
            op->phase = 0;
            op->retry_at = Clock::now();
          }
        }
      }
    }
    // 6. A read that never completes (a stopped peer): the provider may still write into our
    //    slots, so nothing it targets may be reused: peer sharing ends here for this agent
    //    (the endpoint is closed, which ends every operation), all of it from storage.
    const auto late = Clock::now();
    for (PeerState::Op& op : ps.ops)
      if (op.active && op.phase != 0 && late - op.since > 2 * timeout) {
        spdlog::warn("peer node {}: a read of sample {} did not complete in {} s; peer sharing "
                     "is off for the rest of the run (everything from storage)",
                     op.job.from, op.job.sample, 2 * opt_.peer_timeout);
        std::lock_guard lk(mu_);  // the prefetch engine reads it (peer_usable_locked)
        ps.disabled = true;
        break;
      }
    if (ps.disabled) {
      std::lock_guard lk(mu_);
      ps.buf_mr = fabric::Region();
      ps.prog_mr = fabric::Region();
      ps.scratch_mr = fabric::Region();
      ps.ep.reset();
      for (PeerState::Op& op : ps.ops)
        if (op.active) {
          op.active = false;
          peer_done_locked(op.job, false);
        }
      for (const PeerJob& j : queue) peer_done_locked(j, false);
      queue.clear();
      for (auto& pins : ps.pins) {
        for (const auto& [t, x] : pins) drop_use_locked(x);
        pins.clear();
      }
      continue;
    }
    if (idle) {
      if (ps.ep->waitable()) {
        block_next = true;  // step 5 waits in fi_cq_sread (woken early by wake_peer_locked)
      } else {  // shm: readers copy our memory themselves; poll for our own work
        std::unique_lock lk(mu_);
        peer_wake_.wait_for(lk, std::chrono::microseconds(100), [&] {
          return stopping_ || !fatal_.empty() || !peer_jobs_.empty();
        });
      }
    }
  }
}

nlohmann::json Agent::Impl::peers_json() const {
  if (!peers_) return nullptr;
  return {{"provider", opt_.peer_provider},
          {"samples", peer_samples_},
          {"bytes", peer_samples_ * sample_bytes_},
          {"fallbacks", peer_fallbacks_},
          {"torn", peer_torn_},
          {"released_early", peer_pins_released_early_},
          {"disabled", peers_->disabled}};
}

}  // namespace solar::agent

// SPDX-License-Identifier: Apache-2.0
// PeerSharing's start-up: the endpoint and registrations, this agent's card in the peer folder
// and the other agents' cards (who is who, and which of them belong to this job). See
// peer_sharing.h and peer_sharing.cpp.
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <thread>

#include "peer_state.h"
#include "solar/storage/fabric_address.h"  // in hex, as solar-stored sends them
#include "solar/sys/atomic_file.h"

namespace solar::agent {

namespace {

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

void PeerSharing::setup(const PlanFile& pf) {
  const std::uint32_t M = a_.header_.config.nodes, me = a_.opt_.node;
  struct stat st {};
  if (::stat(a_.opt_.peer_dir.c_str(), &st) != 0)
    throw AgentError(fmt::format("--peer-dir {}: {}", a_.opt_.peer_dir, std::strerror(errno)));
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077))
    throw AgentError(fmt::format(
        "--peer-dir {}: must be a folder of this user that only it can open (mode 0700): the "
        "cards the agents leave there hold the keys to their buffers",
        a_.opt_.peer_dir));
  std::unique_ptr<State, StateDelete> ps(new State());
  try {
    ps->ep = fabric::Endpoint::open(a_.opt_.peer_provider, "", /*wait=*/true, /*remote_write=*/true);
  } catch (const std::exception& e) {
    throw AgentError(fmt::format("--peer-provider {}: {}", a_.opt_.peer_provider, e.what()));
  }
  ps->progress.assign(2 * M + std::size_t{M} * kMailbox, 0);
  ps->scratch.assign(2 * kInFlight + M + kPushInFlight + M, 0);
  ps->writes.resize(M);
  ps->ack_writes.resize(M);
  ps->remote.resize(M);
  ps->pins.resize(M);
  try {
    // Remote access is read-only for the buffer; only the progress counters take writes.
    ps->buf_mr = ps->ep->register_memory(a_.base_, a_.buf_.map_bytes, FI_REMOTE_READ | FI_READ);
    ps->prog_mr = ps->ep->register_memory(
        ps->progress.data(), ps->progress.size() * sizeof(std::uint64_t), FI_REMOTE_WRITE);
    ps->scratch_mr = ps->ep->register_memory(
        ps->scratch.data(), ps->scratch.size() * sizeof(std::uint64_t), FI_READ | FI_WRITE);
  } catch (const std::exception& e) {
    throw AgentError(fmt::format("peer sharing: {}", e.what()));
  }
  // Who reads what from us (the other nodes' sections of the plan), and whom we read from.
  ps->served.resize(a_.T_);
  if (a_.header_.streamed) {  // computed with this node's share (PlanSteps::whole_served)
    const auto& served = a_.steps_.whole_served();
    for (std::uint64_t t = 0; t < a_.T_ && t < served.size(); ++t)
      for (const PeerFetch& f : served[t]) {
        ps->served[t].emplace_back(f.sample, f.from_node);
        ps->remote[f.from_node].needed = true;
      }
  }
  try {
    for (std::uint32_t n = 0; n < M && !a_.header_.streamed; ++n) {
      if (n == me) continue;
      const NodePlan np = pf.node(n);
      for (std::uint64_t t = 0; t < a_.T_; ++t)
        for (const PeerFetch& f : np.schedule.peers_at(t))
          if (f.from_node == me) {
            ps->served[t].emplace_back(f.sample, n);
            ps->remote[n].needed = true;
          }
    }
  } catch (const PlanFileError& e) {
    throw AgentError(e.what());
  }
  for (std::uint64_t t = 0; t < a_.T_; ++t)
    for (const PeerFetch& f : a_.steps_.whole().schedule.peers_at(t))
      if (f.from_node < M && f.from_node != me) ps->remote[f.from_node].needed = true;
  // Transparent mode: demand mode, if the ranks' order is not the plan's, reads any node's.
  if (a_.opt_.transparent)
    for (std::uint32_t n = 0; n < M; ++n) ps->remote[n].needed = n != me;

  CardIdentity id;
  {
    const std::string plan_path =
        std::filesystem::absolute(a_.opt_.plan).lexically_normal().string();
    struct stat plan_st {};
    id.job = ::stat(plan_path.c_str(), &plan_st) == 0
                 ? fmt::format("plan file {} ({})", plan_path, storage::file_identity(plan_st))
                 : fmt::format("plan file {}", plan_path);
    id.plan = fmt::format("crc32 {:08x}", a_.header_.checksum);
    id.dataset = a_.source_->identity();
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
                               {"entries_offset", a_.buf_.entries_offset},
                               {"slot_bytes", a_.buf_.slot_bytes},
                               {"labels_offset", a_.buf_.labels_offset},
                               {"label_bytes", a_.buf_.label_bytes},
                               {"samples", a_.header_.config.samples}};
  const std::string path = (std::filesystem::path(a_.opt_.peer_dir) / card_name(me)).string();
  if (const char* failed = sys::write_file_atomically(path, card.dump(), 0600))
    throw AgentError(fmt::format("--peer-dir: writing {}: {}: {}", path, failed,
                                 std::strerror(errno)));
  ps->card_path = path;

  // The others' cards: they start at the same time; wait for them at most --peer-timeout.
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(a_.opt_.peer_timeout));
  // A card of another job is not ours: as if missing (this job's agent may still write its own
  // over it), and the reason is kept for the warning once we stop waiting.
  std::vector<std::string> foreign(M);
  for (;;) {
    bool missing = false;
    for (std::uint32_t n = 0; n < M; ++n) {
      State::Remote& r = ps->remote[n];
      if (n == me || !r.needed || r.known) continue;
      std::ifstream f(std::filesystem::path(a_.opt_.peer_dir) / card_name(n));
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
                       n, a_.opt_.peer_dir, differs);
        foreign[n] = std::move(differs);
        missing = true;
        continue;
      }
      foreign[n].clear();
      try {
        if (c.at("samples").get<std::uint64_t>() != a_.header_.config.samples)
          throw std::invalid_argument("another plan's card");
        r.addr = ps->ep->insert(storage::wire::from_hex(c.at("address").get<std::string>()));
        r.buf_key = c.at("buf_key");
        r.buf_base = c.at("buf_base");
        r.prog_key = c.at("prog_key");
        r.prog_base = c.at("prog_base");
        r.entries_offset = c.at("entries_offset");
        r.slot_bytes = c.at("slot_bytes");
        if (r.slot_bytes != a_.buf_.slot_bytes) throw std::invalid_argument("another slot size");
        r.labels_offset = c.at("labels_offset");
        if (c.at("label_bytes").get<std::uint64_t>() != a_.buf_.label_bytes)
          throw std::invalid_argument("another label size");
        r.known = true;
      } catch (const std::exception& e) {
        spdlog::warn("peer node {}: its card in {} is unusable ({}); what this node would read "
                     "from it is read from storage",
                     n, a_.opt_.peer_dir, e.what());
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
                         n, a_.opt_.peer_dir, a_.opt_.peer_timeout, foreign[n]);
          else
            spdlog::warn("peer node {}: no card in {} after {} s (its agent did not start?); "
                         "what this node would read from it is read from storage",
                         n, a_.opt_.peer_dir, a_.opt_.peer_timeout);
          ps->remote[n].dead = true;
          ps->remote[n].abandoned = true;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::uint64_t reads = 0, serves = 0;
  for (std::uint64_t t = 0; t < a_.T_; ++t) {
    reads += a_.steps_.whole().schedule.peers_at(t).size();
    serves += ps->served[t].size();
  }
  spdlog::info("node {}: peer sharing over {} ({}): {} peer reads planned from other nodes, {} "
               "from this node's buffer",
               me, ps->ep->provider(), a_.opt_.peer_dir, reads, serves);
  pending_.assign(a_.T_, 0);
  state_ = std::move(ps);
}

}  // namespace solar::agent

// SPDX-License-Identifier: Apache-2.0
// Reading a plan file: decoding and checking the header and the node sections (writing:
// plan_file_write.cpp).
#include "solar/core/plan_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include "plan_file_layout.h"

namespace solar {
namespace {

using plan_layout::kMagic;
using plan_layout::kNodeMagic;

class Reader {
 public:
  Reader(const std::uint8_t* d, std::size_t n, const std::string& name, const char* part)
      : data_(d), size_(n), name_(name), part_(part) {}
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  template <class T>
  void get_array(std::vector<T>& v, std::uint64_t count) {
    if (count > (size_ - pos_) / sizeof(T)) truncated(count * sizeof(T));
    v.resize(count);
    if (count == 0) return;  // memcpy's pointers must be valid even for zero bytes
    std::memcpy(v.data(), data_ + pos_, count * sizeof(T));
    pos_ += count * sizeof(T);
  }
  void need(std::uint64_t n) {
    if (n > size_ - pos_) truncated(n);
  }
  void skip(std::uint64_t n) {
    need(n);
    pos_ += n;
  }
  std::size_t pos() const { return pos_; }
  [[noreturn]] void fail(const std::string& what) const {
    throw PlanFileError(fmt::format("{}: {}: {}; recompute it with `solar plan --out`", name_,
                                    part_, what));
  }

 private:
  [[noreturn]] void truncated(std::uint64_t n) const {
    fail(fmt::format("truncated (needs {} more bytes at offset {}, has {})", n, pos_,
                     size_ - pos_));
  }
  const std::uint8_t* data_;
  std::size_t size_, pos_ = 0;
  const std::string& name_;
  const char* part_;
};

void check_offsets(Reader& r, const std::vector<std::uint64_t>& off, std::uint64_t total,
                   const char* what) {
  for (std::size_t i = 0; i + 1 < off.size(); ++i)
    if (off[i] > off[i + 1]) r.fail(fmt::format("{} offsets decrease at step {}", what, i));
  if (off.empty() || off.front() != 0 || off.back() != total)
    r.fail(fmt::format("{} offsets do not cover the {} entries", what, total));
}

// The node's schedule as its agent executes it (see decode_node in plan_file.h): a replay of
// its buffer in one byte per sample, the sample's state in the low two bits and its uses in
// the current epoch above them. Sample ids are already known to be in range.
void check_schedule(Reader& rd, const PlanHeader& h, const NodePlan& np) {
  const PlanConfig& c = h.config;
  const EpochLayout& layout = h.layout;
  const NodeSchedule& s = np.schedule;
  const std::uint64_t R = c.ranks_per_node, first_rank = std::uint64_t{np.node} * R;
  const std::uint64_t cap = effective_capacity(c);
  // An epoch's sequence wraps the permutation of the samples to its length (order.h), so it
  // holds a sample at most this often.
  const std::uint64_t per_epoch = (layout.used() + c.samples - 1) / c.samples;
  const bool count_uses = per_epoch < 63;  // what the six bits hold; beyond: not counted
  enum : std::uint8_t {
    kAbsent = 0,
    kHeld = 1,     // resident (bit 0: a hit may use it)
    kFetched = 2,  // fetched in this step, not used yet: its first use is the miss
    kUsed = 3,     // fetched and used since: as kHeld
    kState = 3,
    kUse = 4,
  };
  const std::uint8_t use = count_uses ? kUse : 0;
  std::vector<std::uint8_t> st(c.samples, kAbsent);
  // held: in the capacity's units, samples or (sized samples) bytes; fetched: in this step.
  const std::vector<std::uint64_t>* sizes = c.sized() ? c.sample_sizes.get() : nullptr;
  auto units = [&](std::uint32_t x) -> std::uint64_t { return sizes ? (*sizes)[x] : 1; };
  std::uint64_t held = 0, fetched = 0, t = 0;
  auto set_state = [&](std::uint32_t x, std::uint8_t state) {
    st[x] = static_cast<std::uint8_t>((st[x] & ~kState) | state);
  };
  auto bring = [&](std::uint32_t x, const char* how) {
    if ((st[x] & kState) != kAbsent)
      rd.fail(fmt::format("schedule: step {} {} sample {}, which the node already holds", t, how,
                          x));
    set_state(x, kFetched);
    held += units(x);
    ++fetched;
  };
  auto access_error = [&](std::uint32_t p, std::uint64_t rank, std::uint32_t x, bool hit,
                          std::uint8_t v) {
    const std::string where = fmt::format("schedule: step {} rank {}: sample {}", t, rank, x);
    if ((v & kState) == kAbsent)
      rd.fail(where + " is not in the node's buffer (neither held nor fetched)");
    if (hit && (v & kState) == kFetched) rd.fail(where + " is flagged a hit but is fetched for it");
    if (!hit && (v & kState) != kFetched)
      rd.fail(where + " is flagged a miss but nothing fetches it for this use");
    rd.fail(fmt::format("schedule: epoch position {}: the node reads sample {} more than the {} "
                        "time(s) the epoch's order holds it",
                        p, x, per_epoch));
  };
  // Each miss used one sample fetched in the step, so fewer misses than fetches leave one
  // unused: named here (the rare path).
  auto unused_error = [&] {
    for (const FetchRun& run : s.fetches_at(t))
      for (std::uint32_t x = run.first; x < run.first + run.count; ++x)
        if ((st[x] & kState) == kFetched)
          rd.fail(fmt::format("schedule: step {} fetches sample {}, which no rank of the node "
                              "uses in it",
                              t, x));
    for (const PeerFetch& pf : s.peers_at(t))
      if ((st[pf.sample] & kState) == kFetched)
        rd.fail(fmt::format("schedule: step {} reads sample {} from a peer, which no rank of "
                            "the node uses in it",
                            t, pf.sample));
  };
  for (std::uint32_t p = 0; p < c.epochs; ++p) {
    const std::uint64_t epoch_begin = np.rank_offsets[t * R];
    for (std::uint32_t j = 0; j < layout.steps; ++j, ++t) {
      for (std::uint32_t x : s.evicts_at(t)) {
        if (!(st[x] & kHeld))
          rd.fail(fmt::format("schedule: step {} evicts sample {}, which the node does not hold",
                              t, x));
        set_state(x, kAbsent);
        held -= units(x);
      }
      fetched = 0;
      for (const FetchRun& run : s.fetches_at(t))
        for (std::uint32_t x = run.first; x < run.first + run.count; ++x) bring(x, "fetches");
      for (const PeerFetch& pf : s.peers_at(t)) bring(pf.sample, "reads from a peer");
      if (held > cap)
        rd.fail(fmt::format("schedule: step {} holds {} {}, over the buffer's {}", t, held,
                            sizes ? "bytes" : "samples", cap));
      const std::uint64_t bj = layout.rank_batch(j);
      const std::uint64_t lo = bj > c.imbalance ? bj - c.imbalance : 1, hi = bj + c.imbalance;
      std::uint64_t misses = 0;
      for (std::uint64_t r = 0; r < R; ++r) {
        const std::uint64_t b = np.rank_offsets[t * R + r], e = np.rank_offsets[t * R + r + 1];
        if (e - b < lo || e - b > hi)
          rd.fail(fmt::format("schedule: step {} rank {}: {} samples, outside the step's [{}, {}]",
                              t, first_rank + r, e - b, lo, hi));
        for (std::uint64_t i = b; i < e; ++i) {
          // Without branches in the usual case: a hit on a held sample (bit 0), or a miss on one
          // fetched for it (kFetched, which becomes kUsed); one more use this epoch.
          const std::uint32_t a = np.accesses[i], x = a & kSampleMask;
          const bool hit = (a & kHitBit) != 0;
          const std::uint8_t v = st[x];
          const bool ok = hit ? (v & kHeld) != 0 : (v & kState) == kFetched;
          const auto next = static_cast<std::uint8_t>((v | std::uint8_t{!hit}) + use);
          if (!ok || (next >> 2) > per_epoch) [[unlikely]]
            access_error(p, first_rank + r, x, hit, v);
          st[x] = next;
          misses += !hit;
        }
      }
      if (misses != fetched) unused_error();
    }
    // The uses start again: by the samples read, or all at once when that is fewer bytes.
    const std::uint64_t epoch_end = np.rank_offsets[t * R];
    if (!count_uses) continue;
    if (epoch_end - epoch_begin < c.samples / 8)
      for (std::uint64_t i = epoch_begin; i < epoch_end; ++i)
        st[np.accesses[i] & kSampleMask] &= kState;
    else
      for (std::uint8_t& v : st) v &= kState;
  }
}

}  // namespace

// CRC-32 (IEEE 802.3, reflected 0xedb88320): zlib's, linked statically (core/CMakeLists.txt),
// so nothing loads libz; it checks a plan of 10^8 accesses at ~2.3 GB/s (the sliced-by-8 table
// written here before: 1.2).
// crc32_z takes a size_t length; zlib answers 0 for a null buffer whatever the running value,
// so an empty range returns that value here.
std::uint32_t crc32(const std::uint8_t* data, std::size_t size, std::uint32_t crc) {
  if (size == 0) return crc;
  return static_cast<std::uint32_t>(::crc32_z(crc, data, size));
}

PlanHeader decode_header(const std::uint8_t* data, std::size_t size, const std::string& name) {
  Reader r(data, size, name, "header");
  r.need(16);
  if (std::memcmp(data, kMagic, 8) != 0) r.fail("not a solar plan file (bad magic)");
  Reader pre(data + 8, size - 8, name, "header");
  const auto version = pre.get<std::uint32_t>();
  if (version != kPlanFileVersion)
    r.fail(fmt::format("plan file version {} is not supported by this solar (reads version {})",
                       version, kPlanFileVersion));
  const auto header_size = pre.get<std::uint32_t>();
  if (header_size > size) r.fail(fmt::format("truncated (header says {} bytes, file has {})",
                                             header_size, size));
  r.get<std::uint64_t>();
  r.get<std::uint64_t>();
  PlanHeader h;
  PlanConfig& c = h.config;
  c.samples = r.get<std::uint64_t>();
  c.sample_bytes = r.get<std::uint64_t>();
  c.epochs = r.get<std::uint32_t>();
  c.nodes = r.get<std::uint32_t>();
  c.ranks_per_node = r.get<std::uint32_t>();
  c.batch = r.get<std::uint32_t>();
  c.imbalance = r.get<std::uint32_t>();
  c.drop_last = r.get<std::uint8_t>() != 0;
  const auto order = r.get<std::uint8_t>();
  const auto policy = r.get<std::uint8_t>();
  c.peer_fetch = r.get<std::uint8_t>() != 0;
  c.seed = r.get<std::uint64_t>();
  c.buffer_bytes = r.get<std::uint64_t>();
  if (order > static_cast<std::uint8_t>(OrderMode::file))
    r.fail(fmt::format("unknown order mode {}", order));
  if (policy > static_cast<std::uint8_t>(Policy::sampler))
    r.fail(fmt::format("unknown policy {}", policy));
  c.order = static_cast<OrderMode>(order);
  c.policy = static_cast<Policy>(policy);
  // The shape first (the layout below depends on it); the buffer's rules once the samples'
  // sizes, further on, are known.
  auto check_inputs = [&](PlanConfig checked) {
    try {
      checked.validate();
    } catch (const ConfigError& e) {
      r.fail(std::string("invalid inputs: ") + e.what());
    }
  };
  {
    PlanConfig shape = c;
    shape.policy = Policy::none;
    shape.peer_fetch = false;
    check_inputs(shape);
  }
  h.layout = EpochLayout::of(c);
  const auto per_rank = r.get<std::uint64_t>();
  const auto steps = r.get<std::uint32_t>();
  const auto last_batch = r.get<std::uint32_t>();
  if (per_rank != h.layout.per_rank || steps != h.layout.steps ||
      last_batch != h.layout.last_batch)
    r.fail("epoch layout does not match its inputs");
  Metrics& m = h.metrics;
  for (std::uint64_t* v : {&m.accesses, &m.hits, &m.remote_fetches, &m.remote_bytes,
                           &m.remote_runs, &m.peer_fetches, &m.lower_bound_fetches,
                           &m.lower_bound_bytes})
    *v = r.get<std::uint64_t>();
  r.get_array(h.epoch_order, c.epochs);
  std::vector<bool> seen(c.epochs, false);
  for (std::uint32_t e : h.epoch_order) {
    if (e >= c.epochs || seen[e]) r.fail("epoch order is not a permutation of the epochs");
    seen[e] = true;
  }
  m.per_epoch.resize(c.epochs);
  for (auto& e : m.per_epoch)
    for (std::uint64_t* v : {&e.accesses, &e.hits, &e.remote_fetches, &e.peer_fetches})
      *v = r.get<std::uint64_t>();
  const auto id_len = r.get<std::uint32_t>();
  if (id_len > kMaxIdentityBytes)
    r.fail(fmt::format("dataset identity of {} bytes (at most {})", id_len, kMaxIdentityBytes));
  std::vector<char> id;
  r.get_array(id, id_len);
  h.dataset_identity.assign(id.begin(), id.end());
  r.skip((8 - r.pos() % 8) % 8);
  // Sized samples (v3): one size per sample, or none (every sample is sample_bytes).
  const auto n_sizes = r.get<std::uint64_t>();
  if (n_sizes != 0) {
    if (n_sizes != c.samples)
      r.fail(fmt::format("{} sample sizes for {} samples", n_sizes, c.samples));
    auto sizes = std::make_shared<std::vector<std::uint64_t>>();
    r.get_array(*sizes, n_sizes);
    c.sample_sizes = std::move(sizes);
  }
  // The local tier (v4): the resident set is buffer + local bytes (a node's moves between the
  // tiers are not in the file: its agent computes them, tiers.h place_node_in_tiers).
  c.local_bytes = r.get<std::uint64_t>();
  check_inputs(c);
  const auto flags = r.get<std::uint64_t>();  // v5
  if (flags & ~plan_layout::kFlagStreamed) r.fail(fmt::format("unknown flags {:#x}", flags));
  h.streamed = (flags & plan_layout::kFlagStreamed) != 0;
  if (h.streamed && c.tiered()) r.fail("a streamed plan with a local tier");
  if (h.streamed && c.order == OrderMode::file) r.fail("a streamed plan of an order file");
  h.directory.resize(c.nodes);
  for (auto& d : h.directory) {
    d.offset = r.get<std::uint64_t>();
    d.length = r.get<std::uint64_t>();
    d.crc = r.get<std::uint32_t>();
    r.get<std::uint32_t>();
  }
  const std::size_t crc_at = r.pos();
  const auto stored = r.get<std::uint32_t>();
  if (crc32(data, crc_at) != stored) r.fail("header checksum mismatch (file is corrupt)");
  h.checksum = stored;
  if (r.pos() > header_size) r.fail("header is longer than its recorded size");
  for (std::uint32_t n = 0; n < c.nodes; ++n) {
    const auto& d = h.directory[n];
    if (h.streamed ? (d.offset || d.length || d.crc)
                   : (d.offset < header_size || d.length < 56 || d.offset % 8 != 0))
      r.fail(fmt::format("directory entry of node {} is malformed", n));
  }
  return h;
}

NodePlan decode_node(const PlanHeader& h, std::uint32_t node, const std::uint8_t* data,
                     std::size_t size, const std::string& name) {
  const std::string part = fmt::format("node {} section", node);
  Reader r(data, size, name, part.c_str());
  if (node >= h.config.nodes)
    r.fail(fmt::format("no such node (the plan has nodes 0..{})", h.config.nodes - 1));
  const auto& d = h.directory[node];
  if (size != d.length) r.fail(fmt::format("truncated ({} of {} bytes)", size, d.length));
  if (crc32(data, size) != d.crc) r.fail("checksum mismatch (file is corrupt)");
  r.need(16);
  if (std::memcmp(data, kNodeMagic, 8) != 0) r.fail("bad section magic");
  r.get<std::uint64_t>();
  NodePlan np;
  np.node = r.get<std::uint32_t>();
  r.get<std::uint32_t>();
  if (np.node != node) r.fail(fmt::format("section belongs to node {}", np.node));
  const std::uint64_t T = r.get<std::uint64_t>(), n_access = r.get<std::uint64_t>(),
                      n_runs = r.get<std::uint64_t>(), n_peers = r.get<std::uint64_t>(),
                      n_evicts = r.get<std::uint64_t>();
  const std::uint64_t R = h.config.ranks_per_node;
  if (T != std::uint64_t{h.layout.steps} * h.config.epochs) r.fail("wrong number of steps");
  std::vector<std::uint32_t> counts;
  r.get_array(counts, T * R);
  np.rank_offsets.resize(T * R + 1);
  np.rank_offsets[0] = 0;
  for (std::uint64_t i = 0; i < counts.size(); ++i)
    np.rank_offsets[i + 1] = np.rank_offsets[i] + counts[i];
  if (np.rank_offsets.back() != n_access) r.fail("access counts do not add up");
  r.get_array(np.accesses, n_access);
  for (std::uint32_t a : np.accesses)
    if ((a & kSampleMask) >= h.config.samples) r.fail("sample id out of range");
  auto skip_pad = [&] { r.skip((8 - r.pos() % 8) % 8); };
  skip_pad();
  NodeSchedule& s = np.schedule;
  r.get_array(s.fetch_offsets, T + 1);
  r.get_array(s.fetch_runs, n_runs);
  check_offsets(r, s.fetch_offsets, n_runs, "fetch");
  for (const auto& run : s.fetch_runs)
    if (run.count == 0 || std::uint64_t{run.first} + run.count > h.config.samples)
      r.fail("fetch run out of range");
  skip_pad();
  r.get_array(s.peer_offsets, T + 1);
  r.get_array(s.peer_fetches, n_peers);
  check_offsets(r, s.peer_offsets, n_peers, "peer");
  for (const auto& pf : s.peer_fetches)
    if (pf.sample >= h.config.samples || pf.from_node >= h.config.nodes || pf.from_node == node)
      r.fail("peer fetch out of range");
  skip_pad();
  r.get_array(s.evict_offsets, T + 1);
  r.get_array(s.evicts, n_evicts);
  check_offsets(r, s.evict_offsets, n_evicts, "evict");
  for (std::uint32_t x : s.evicts)
    if (x >= h.config.samples) r.fail("evicted sample out of range");
  check_schedule(r, h, np);
  return np;
}

namespace {
// What no single node's section shows (decode_plan in plan_file.h).
void check_across_nodes(const Plan& p, const std::string& name) {
  auto fail = [&](const std::string& what) {
    throw PlanFileError(fmt::format("{}: schedule: {}; recompute it with `solar plan --out`",
                                    name, what));
  };
  const std::uint64_t W = p.layout.world;
  Metrics m;
  m.per_epoch.resize(p.config.epochs);
  std::uint64_t t = 0;
  for (std::uint32_t e = 0; e < p.config.epochs; ++e) {
    EpochMetrics& em = m.per_epoch[e];
    for (std::uint32_t j = 0; j < p.layout.steps; ++j, ++t) {
      const std::uint64_t b = p.rank_offsets[t * W], end = p.rank_offsets[(t + 1) * W];
      if (end - b != p.layout.step_size(j))
        fail(fmt::format("step {}: the ranks read {} samples, the epoch layout's step has {}", t,
                         end - b, p.layout.step_size(j)));
      em.accesses += end - b;
      for (std::uint64_t i = b; i < end; ++i) em.hits += (p.accesses[i] & kHitBit) != 0;
      for (const NodeSchedule& ns : p.nodes) {
        for (const FetchRun& run : ns.fetches_at(t)) em.remote_fetches += run.count;
        em.peer_fetches += ns.peers_at(t).size();
      }
    }
    m.accesses += em.accesses;
    m.hits += em.hits;
    m.remote_fetches += em.remote_fetches;
    m.peer_fetches += em.peer_fetches;
  }
  for (const NodeSchedule& ns : p.nodes) m.remote_runs += ns.fetch_runs.size();
  m.remote_bytes = m.remote_fetches * p.config.sample_bytes;
  if (p.config.sized()) {
    m.remote_bytes = 0;
    for (const NodeSchedule& ns : p.nodes)
      for (const FetchRun& run : ns.fetch_runs)
        for (std::uint32_t x = run.first; x < run.first + run.count; ++x)
          m.remote_bytes += p.config.size_of(x);
  }
  m.lower_bound_fetches = lower_bound_fetches(p.config);
  m.lower_bound_bytes = lower_bound_bytes(p.config);
  if (!(m == p.metrics))
    fail(fmt::format("the metrics recounted from it differ from the header's (accesses {} vs {}, "
                     "hits {} vs {}, remote fetches {} vs {}, peer fetches {} vs {}, runs {} vs "
                     "{}, or per epoch)",
                     m.accesses, p.metrics.accesses, m.hits, p.metrics.hits, m.remote_fetches,
                     p.metrics.remote_fetches, m.peer_fetches, p.metrics.peer_fetches,
                     m.remote_runs, p.metrics.remote_runs));
}
}  // namespace

Plan decode_plan(const std::uint8_t* data, std::size_t size, const std::string& name) {
  PlanHeader h = decode_header(data, size, name);
  if (h.streamed)
    throw PlanFileError(fmt::format("{}: a streamed plan (each node computes its share): "
                                    "compute the whole plan with `solar plan` instead",
                                    name));
  Plan p;
  p.config = h.config;
  p.layout = h.layout;
  p.epoch_order = h.epoch_order;
  p.dataset_identity = h.dataset_identity;
  p.metrics = h.metrics;
  const std::uint64_t T = p.total_steps(), R = p.config.ranks_per_node, M = p.config.nodes;
  std::vector<NodePlan> parts;
  parts.reserve(M);
  for (std::uint32_t m = 0; m < M; ++m) {
    const auto& d = h.directory[m];
    if (d.offset > size || d.length > size - d.offset)
      throw PlanFileError(fmt::format("{}: node {} section: truncated (file has {} bytes, "
                                      "section ends at {}); recompute it with `solar plan --out`",
                                      name, m, size, d.offset + d.length));
    parts.push_back(decode_node(h, m, data + d.offset, d.length, name));
  }
  p.rank_offsets.reserve(T * R * M + 1);
  p.rank_offsets.push_back(0);
  for (std::uint64_t t = 0; t < T; ++t)
    for (std::uint32_t m = 0; m < M; ++m)
      for (std::uint64_t r = 0; r < R; ++r) {
        const NodePlan& np = parts[m];
        const std::uint64_t b = np.rank_offsets[t * R + r], e = np.rank_offsets[t * R + r + 1];
        p.accesses.insert(p.accesses.end(), np.accesses.begin() + static_cast<std::ptrdiff_t>(b),
                          np.accesses.begin() + static_cast<std::ptrdiff_t>(e));
        p.rank_offsets.push_back(p.accesses.size());
      }
  for (auto& np : parts) p.nodes.push_back(std::move(np.schedule));
  check_across_nodes(p, name);
  return p;
}

namespace {
std::vector<std::uint8_t> read_range(int fd, std::uint64_t offset, std::uint64_t length,
                                     const std::string& name) {
  std::vector<std::uint8_t> buf(length);
  std::uint64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd, buf.data() + done, length - done,
                              static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw PlanFileError(fmt::format("{}: read failed: {}", name, std::strerror(errno)));
    }
    if (n == 0) break;
    done += static_cast<std::uint64_t>(n);
  }
  buf.resize(done);
  return buf;
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

PlanFile PlanFile::open(const std::filesystem::path& path) {
  const std::string name = path.string();
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0)
    throw PlanFileError(fmt::format("{}: cannot open plan file: {}", name, std::strerror(errno)));
  auto head = read_range(f.fd, 0, 16, name);
  std::uint32_t header_size = 0;
  if (head.size() == 16) std::memcpy(&header_size, head.data() + 12, 4);
  if (header_size > (1u << 30)) header_size = 16;  // garbage: let decode_header report it
  auto bytes = read_range(f.fd, 0, std::max<std::uint32_t>(header_size, 16), name);
  PlanFile pf;
  pf.path_ = path;
  pf.header_ = decode_header(bytes.data(), bytes.size(), name);
  return pf;
}

NodePlan PlanFile::node(std::uint32_t node) const {
  const std::string name = path_.string();
  if (node >= header_.config.nodes)
    throw PlanFileError(fmt::format("{}: no node {} (the plan has nodes 0..{})", name, node,
                                    header_.config.nodes - 1));
  if (header_.streamed)
    throw PlanFileError(fmt::format("{}: a streamed plan has no node sections (each node "
                                    "computes its share: node_plan(), plan_stream.h)",
                                    name));
  Fd f{::open(path_.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0)
    throw PlanFileError(fmt::format("{}: cannot open plan file: {}", name, std::strerror(errno)));
  const auto& d = header_.directory[node];
  auto bytes = read_range(f.fd, d.offset, d.length, name);
  return decode_node(header_, node, bytes.data(), bytes.size(), name);
}

}  // namespace solar

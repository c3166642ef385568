// SPDX-License-Identifier: Apache-2.0
// Writing a plan file: the header, the directory and each node's section, then the checksums
// (reading: plan_file.cpp).
#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include "plan_file_layout.h"
#include "solar/core/plan_file.h"
#include "solar/sys/atomic_file.h"

namespace solar {
namespace {

using plan_layout::kMagic;
using plan_layout::kNodeMagic;

class Writer {
 public:
  template <class T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  template <class T>
  void put_array(const std::vector<T>& v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
    out.insert(out.end(), p, p + v.size() * sizeof(T));
  }
  void put_bytes(const char* p, std::size_t n) { out.insert(out.end(), p, p + n); }
  void align8() {
    while (out.size() % 8) out.push_back(0);
  }
  std::vector<std::uint8_t> out;
};

void encode_header_body(const Plan& p, bool streamed, Writer& w) {
  const PlanConfig& c = p.config;
  w.put_bytes(kMagic, 8);
  w.put<std::uint32_t>(kPlanFileVersion);
  w.put<std::uint32_t>(0);  // header size, patched below
  w.put<std::uint64_t>(c.samples);
  w.put<std::uint64_t>(c.sample_bytes);
  w.put<std::uint32_t>(c.epochs);
  w.put<std::uint32_t>(c.nodes);
  w.put<std::uint32_t>(c.ranks_per_node);
  w.put<std::uint32_t>(c.batch);
  w.put<std::uint32_t>(c.imbalance);
  w.put<std::uint8_t>(c.drop_last);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(c.order));
  w.put<std::uint8_t>(static_cast<std::uint8_t>(c.policy));
  w.put<std::uint8_t>(c.peer_fetch);
  w.put<std::uint64_t>(c.seed);
  w.put<std::uint64_t>(c.buffer_bytes);
  w.put<std::uint64_t>(p.layout.per_rank);
  w.put<std::uint32_t>(p.layout.steps);
  w.put<std::uint32_t>(p.layout.last_batch);
  const Metrics& m = p.metrics;
  for (std::uint64_t v : {m.accesses, m.hits, m.remote_fetches, m.remote_bytes, m.remote_runs,
                          m.peer_fetches, m.lower_bound_fetches, m.lower_bound_bytes})
    w.put(v);
  w.put_array(p.epoch_order);
  for (const auto& e : m.per_epoch)
    for (std::uint64_t v : {e.accesses, e.hits, e.remote_fetches, e.peer_fetches}) w.put(v);
  if (p.dataset_identity.size() > kMaxIdentityBytes)
    throw PlanFileError(fmt::format("dataset identity of {} bytes (at most {})",
                                    p.dataset_identity.size(), kMaxIdentityBytes));
  w.put<std::uint32_t>(static_cast<std::uint32_t>(p.dataset_identity.size()));
  w.put_bytes(p.dataset_identity.data(), p.dataset_identity.size());
  w.align8();
  if (c.sized()) {
    w.put<std::uint64_t>(c.sample_sizes->size());
    w.put_array(*c.sample_sizes);
  } else {
    w.put<std::uint64_t>(0);
  }
  w.put<std::uint64_t>(c.local_bytes);  // v4
  w.put<std::uint64_t>(streamed ? plan_layout::kFlagStreamed : 0);  // v5
}

// The directory (zeros, patched by the caller) and the header's end; returns where the
// directory starts.
std::size_t put_directory(std::uint32_t nodes, Writer& w) {
  const std::size_t dir_at = w.out.size();
  for (std::uint32_t m = 0; m < nodes; ++m) {
    w.put<std::uint64_t>(0);
    w.put<std::uint64_t>(0);
    w.put<std::uint32_t>(0);
    w.put<std::uint32_t>(0);
  }
  w.put<std::uint32_t>(0);  // header crc
  w.align8();
  const auto header_size = static_cast<std::uint32_t>(w.out.size());
  std::memcpy(&w.out[12], &header_size, 4);
  return dir_at;
}

void put_header_crc(std::size_t dir_at, std::uint32_t nodes, Writer& w) {
  const std::size_t crc_at = dir_at + std::size_t{nodes} * 24;
  const std::uint32_t hcrc = crc32(w.out.data(), crc_at);
  std::memcpy(&w.out[crc_at], &hcrc, 4);
}

void write_bytes(const std::vector<std::uint8_t>& bytes, const std::filesystem::path& path) {
  if (const char* failed = sys::write_file_atomically(
          path, {reinterpret_cast<const char*>(bytes.data()), bytes.size()}, 0644))
    throw PlanFileError(fmt::format("{}: {}: {}", path.string(), failed, std::strerror(errno)));
}

std::vector<std::uint8_t> encode_node(const Plan& p, std::uint32_t node) {
  Writer w;
  const std::uint64_t T = p.total_steps(), R = p.config.ranks_per_node;
  const NodeSchedule& ns = p.nodes[node];
  w.put_bytes(kNodeMagic, 8);
  w.put<std::uint32_t>(node);
  w.put<std::uint32_t>(0);
  std::vector<std::uint32_t> counts;
  counts.reserve(T * R);
  std::uint64_t n_access = 0;
  for (std::uint64_t t = 0; t < T; ++t)
    for (std::uint64_t r = 0; r < R; ++r) {
      const auto b = p.rank_batch(t, node * R + r);
      counts.push_back(static_cast<std::uint32_t>(b.size()));
      n_access += b.size();
    }
  for (std::uint64_t v : {T, n_access, std::uint64_t(ns.fetch_runs.size()),
                          std::uint64_t(ns.peer_fetches.size()), std::uint64_t(ns.evicts.size())})
    w.put(v);
  w.put_array(counts);
  for (std::uint64_t t = 0; t < T; ++t)
    for (std::uint64_t r = 0; r < R; ++r) {
      const auto b = p.rank_batch(t, node * R + r);
      const auto* q = reinterpret_cast<const std::uint8_t*>(b.data());
      w.out.insert(w.out.end(), q, q + b.size() * 4);
    }
  w.align8();
  w.put_array(ns.fetch_offsets);
  w.put_array(ns.fetch_runs);
  w.align8();
  w.put_array(ns.peer_offsets);
  w.put_array(ns.peer_fetches);
  w.align8();
  w.put_array(ns.evict_offsets);
  w.put_array(ns.evicts);
  w.align8();
  return std::move(w.out);
}

}  // namespace

std::vector<std::uint8_t> encode_plan(const Plan& p) {
  Writer w;
  encode_header_body(p, p.streamed, w);
  const std::size_t dir_at = put_directory(p.config.nodes, w);
  for (std::uint32_t m = 0; m < p.config.nodes && !p.streamed; ++m) {
    const std::uint64_t offset = w.out.size();
    auto section = encode_node(p, m);
    const std::uint64_t length = section.size();
    const std::uint32_t crc = crc32(section.data(), section.size());
    w.out.insert(w.out.end(), section.begin(), section.end());
    std::uint8_t* e = &w.out[dir_at + std::size_t{m} * 24];
    std::memcpy(e, &offset, 8);
    std::memcpy(e + 8, &length, 8);
    std::memcpy(e + 16, &crc, 4);
  }
  put_header_crc(dir_at, p.config.nodes, w);
  return std::move(w.out);
}

void write_plan_file(const Plan& plan, const std::filesystem::path& path) {
  write_bytes(encode_plan(plan), path);
}

}  // namespace solar

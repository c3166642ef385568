// SPDX-License-Identifier: Apache-2.0
// A computed plan: who reads what, when, and where it comes from.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "solar/core/config.h"
#include "solar/core/order.h"

namespace solar {

// An access record is a sample id (31 bits) with kHitBit set when the sample is already in the
// node's buffer at that step (no fetch needed).
inline constexpr std::uint32_t kHitBit = 0x80000000U;
inline constexpr std::uint32_t kSampleMask = 0x7fffffffU;

// A contiguous range of sample ids fetched together: one storage read.
struct FetchRun {
  std::uint32_t first = 0;
  std::uint32_t count = 0;
  bool operator==(const FetchRun&) const = default;
};

// A sample taken from another node's buffer instead of remote storage.
struct PeerFetch {
  std::uint32_t sample = 0;
  std::uint32_t from_node = 0;
  bool operator==(const PeerFetch&) const = default;
};

// One node's part of the plan, indexed by global step t = epoch_position·steps + step.
// Before step t runs, the node evicts evicts[evict_offsets[t]..evict_offsets[t+1]), then fetches
// the remote runs and the peer samples listed for t; after that every sample its ranks use in
// step t is resident, and the buffer holds at most buffer_samples() samples.
struct NodeSchedule {
  std::vector<std::uint64_t> fetch_offsets;  // total_steps + 1, into fetch_runs
  std::vector<FetchRun> fetch_runs;
  std::vector<std::uint64_t> peer_offsets;   // total_steps + 1, into peer_fetches
  std::vector<PeerFetch> peer_fetches;
  std::vector<std::uint64_t> evict_offsets;  // total_steps + 1, into evicts
  std::vector<std::uint32_t> evicts;

  std::span<const FetchRun> fetches_at(std::uint64_t t) const {
    return {fetch_runs.data() + fetch_offsets[t], fetch_offsets[t + 1] - fetch_offsets[t]};
  }
  std::span<const PeerFetch> peers_at(std::uint64_t t) const {
    return {peer_fetches.data() + peer_offsets[t], peer_offsets[t + 1] - peer_offsets[t]};
  }
  std::span<const std::uint32_t> evicts_at(std::uint64_t t) const {
    return {evicts.data() + evict_offsets[t], evict_offsets[t + 1] - evict_offsets[t]};
  }
};

struct EpochMetrics {
  std::uint64_t accesses = 0, hits = 0, remote_fetches = 0, peer_fetches = 0;
  bool operator==(const EpochMetrics&) const = default;
};

struct Metrics {
  std::uint64_t accesses = 0;
  std::uint64_t hits = 0;
  std::uint64_t remote_fetches = 0;
  std::uint64_t remote_bytes = 0;
  std::uint64_t remote_runs = 0;  // storage reads after coalescing
  std::uint64_t peer_fetches = 0;
  std::uint64_t lower_bound_fetches = 0;
  std::uint64_t lower_bound_bytes = 0;  // lower_bound_bytes(config): the bound on remote_bytes
  std::vector<EpochMetrics> per_epoch;  // by epoch position

  double hit_rate() const { return accesses ? double(hits) / double(accesses) : 0.0; }
  // Accesses served by a peer read (the sample came from another node's buffer).
  double peer_share() const { return accesses ? double(peer_fetches) / double(accesses) : 0.0; }
  double ratio_to_lower_bound() const {
    return lower_bound_fetches ? double(remote_fetches) / double(lower_bound_fetches) : 0.0;
  }
  double ratio_bytes_to_lower_bound() const {
    return lower_bound_bytes ? double(remote_bytes) / double(lower_bound_bytes) : 0.0;
  }
  bool operator==(const Metrics&) const = default;
};

// With a local tier (PlanConfig::local_bytes): one node's moves between its memory and its local
// disk. Before step t, after the node's evictions (of the resident set, from both tiers) and
// before its fetches, the node in this order: reads reads_at(t) from the local disk into memory
// (the disk keeps its copy, so dropping the sample again needs no write), discards
// discards_at(t) from the local disk (copies of samples in memory, or of samples it will not
// read again), writes writes_at(t) from memory to the local disk (a copy: the sample stays in
// memory until dropped) and drops drops_at(t) from memory (each one then on the disk, or never
// read again while held). Its fetches then land in memory. After that every sample its ranks
// use in step t is in memory, memory holds at most buffer_samples() and the local disk at most
// local_samples(). (In between, a step's reads may take memory that its drops give back: the
// agent stages them.)
// Offsets are total_steps + 1 long, into the four lists.
struct NodeTiers {
  std::vector<std::uint64_t> discard_offsets, write_offsets, drop_offsets, read_offsets;
  std::vector<std::uint32_t> discards, writes, drops, reads;

  static std::span<const std::uint32_t> at(const std::vector<std::uint64_t>& o,
                                           const std::vector<std::uint32_t>& v, std::uint64_t t) {
    return {v.data() + o[t], o[t + 1] - o[t]};
  }
  std::span<const std::uint32_t> discards_at(std::uint64_t t) const {
    return at(discard_offsets, discards, t);
  }
  std::span<const std::uint32_t> writes_at(std::uint64_t t) const {
    return at(write_offsets, writes, t);
  }
  std::span<const std::uint32_t> drops_at(std::uint64_t t) const {
    return at(drop_offsets, drops, t);
  }
  std::span<const std::uint32_t> reads_at(std::uint64_t t) const {
    return at(read_offsets, reads, t);
  }
};

// What the tiers did, over all nodes. An access is served from memory when its sample was in
// memory before the step's moves and fetches (memory_hits), else by a local read, a fetch from
// storage or a peer. local_reads_bound: at least this many local reads are needed by any
// placement of this plan's resident sets in the tiers (tiers.h: Belady's MIN on each node's
// memory misses, less the node's fetches).
struct TierMetrics {
  std::uint64_t memory_hits = 0;  // accesses
  std::uint64_t local_reads = 0, local_writes = 0, drops = 0, discards = 0;  // samples moved
  std::uint64_t local_reads_bound = 0;
  std::vector<std::uint64_t> local_reads_per_epoch;  // by epoch position
  double local_reads_ratio() const {
    return local_reads_bound ? double(local_reads) / double(local_reads_bound)
                             : (local_reads ? 0.0 : 1.0);
  }
  bool operator==(const TierMetrics&) const = default;
};

struct Plan {
  PlanConfig config;
  EpochLayout layout;
  std::vector<std::uint32_t> epoch_order;  // position p runs epoch permutation epoch_order[p]
  // rank_offsets[t·W + w] .. rank_offsets[t·W + w + 1] index `accesses` for rank w in step t.
  std::vector<std::uint64_t> rank_offsets;
  std::vector<std::uint32_t> accesses;  // sample id | kHitBit
  std::vector<NodeSchedule> nodes;
  Metrics metrics;
  // With a local tier only (config.tiered()): each node's moves between memory and local disk,
  // and what they come to. Not in the plan file yet (write_plan_file refuses such plans).
  std::vector<NodeTiers> tiers;
  TierMetrics tier_metrics;
  // What the plan's dataset was when it was computed (storage's SampleSource::identity(): the
  // file's inode, size and mtime, or a storage server's export). Every reader checks it before
  // reading, so a replaced or rewritten file is refused instead of mixed into training.
  // Empty: not tied to a dataset (`solar plan` on its own); no check.
  std::string dataset_identity;
  // A streamed plan (make_streamed_plan, plan_stream.h): the inputs, the epoch order and the
  // lower bounds only; no per-step arrays, no nodes. Its file is the header alone, and each
  // node computes its own share from the inputs.
  bool streamed = false;

  std::uint64_t total_steps() const { return std::uint64_t{layout.steps} * config.epochs; }
  std::span<const std::uint32_t> rank_batch(std::uint64_t t, std::uint64_t rank) const {
    const std::uint64_t i = t * layout.world + rank;
    return {accesses.data() + rank_offsets[i], rank_offsets[i + 1] - rank_offsets[i]};
  }
};

}  // namespace solar

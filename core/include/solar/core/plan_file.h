// SPDX-License-Identifier: Apache-2.0
// The plan file: how a plan travels from the planner (solar plan, solar run, the SPANK plugin)
// to the node agents.
//
// Layout (little-endian, version 5):
//   header     magic "SOLARPLN", version, header size, the PlanConfig, the epoch layout, the
//              metrics (total and per epoch), the epoch order, the dataset's identity (u32
//              length, bytes, padding to 8), the samples' sizes (u64 count, 0 or N, then one
//              u64 per sample: sized samples only), the local tier's bytes per node
//              (u64, 0: none; version 4), flags (u64; version 5: bit 0, streamed), and a
//              directory with one entry per node: {offset, length, crc32}; the header ends
//              with its own crc32.
//   node i     magic "SOLARNOD", node id, then for every global step t: each local rank's
//              access count and records (sample | kHitBit); and the node's fetch runs, peer
//              fetches and evictions with per-step offsets.
// A node section is self-contained and checksummed, so an agent reads the header and its own
// section only. A streamed plan (version 5) is the header alone, its directory zeros, its
// metrics the lower bounds only: each node computes its share itself (plan_stream.h), so
// nothing of the run's length is written. Nothing time- or host-dependent is stored: identical inputs give identical
// bytes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <sys/types.h>
#include <vector>

#include "solar/core/plan.h"

namespace solar {

inline constexpr std::uint32_t kPlanFileVersion = 5;
inline constexpr std::uint32_t kMaxIdentityBytes = 4096;

// A plan file that cannot be used: names the file and what is wrong with it.
class PlanFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Everything except the per-node sections.
struct PlanHeader {
  PlanConfig config;
  EpochLayout layout;
  Metrics metrics;
  std::vector<std::uint32_t> epoch_order;
  std::string dataset_identity;  // Plan::dataset_identity
  struct NodeEntry {
    std::uint64_t offset = 0, length = 0;
    std::uint32_t crc = 0;
  };
  std::vector<NodeEntry> directory;
  // No node sections: each node computes its share (NodePlanStream); the metrics hold only the
  // lower bounds.
  bool streamed = false;
  // The header's CRC-32, which covers the inputs, metrics, dataset identity and every node
  // section's CRC: the plan's identity (peer cards name it, so agents of other plans refuse
  // each other's).
  std::uint32_t checksum = 0;
};

// One node's part: its ranks' batches and its schedule.
struct NodePlan {
  std::uint32_t node = 0;
  // rank_offsets[t·R + r] .. [t·R + r + 1] index `accesses` for local rank r at global step t.
  std::vector<std::uint64_t> rank_offsets;
  std::vector<std::uint32_t> accesses;
  NodeSchedule schedule;
};

// Serialises a plan (also used to compare plans byte for byte); a streamed plan (Plan::streamed)
// as its header alone: O(nodes + epochs) bytes, and the samples' sizes if they differ.
std::vector<std::uint8_t> encode_plan(const Plan& plan);
// Writes atomically (sys::write_file_atomically, mode 0644). Throws PlanFileError.
void write_plan_file(const Plan& plan, const std::filesystem::path& path);

// Parses and checks a header (magic, version, sizes, checksum, config validity).
// `name` is used in error messages.
PlanHeader decode_header(const std::uint8_t* data, std::size_t size, const std::string& name);
// Parses a node section and checks its schedule as that node executes it (a checksum says only
// that the bytes are the writer's): every rank's batch size within the step's [max(1, b−δ),
// b+δ]; no sample more often in an epoch than the epoch's sequence holds it; and a replay of
// the node's buffer: every eviction removes a resident sample, every fetch (storage or peer)
// brings one that is not resident and that a rank uses in its step, every access finds its
// sample resident and is flagged a hit exactly when it was not fetched for it, and the buffer
// never holds more than effective_capacity(). O(accesses + schedule) time, one byte per sample.
// Throws PlanFileError naming the step, rank or sample and what is wrong.
NodePlan decode_node(const PlanHeader& h, std::uint32_t node, const std::uint8_t* data,
                     std::size_t size, const std::string& name);

// Reads a plan file; open() reads only the header, node() only that node's section (a streamed
// plan has none: node() throws; node_plan() in plan_stream.h computes the node's share then,
// and a reader that takes steps in order uses NodePlanStream and keeps a window of them).
class PlanFile {
 public:
  static PlanFile open(const std::filesystem::path& path);
  const PlanHeader& header() const { return header_; }
  NodePlan node(std::uint32_t node) const;

 private:
  std::filesystem::path path_;
  PlanHeader header_;
};

// The whole plan back from its encoding (all nodes, each checked as decode_node does), and
// checked across nodes: every step's global batch has the epoch layout's size, and the
// per-epoch metrics recounted from the records equal the header's. (replay_plan checks more:
// the global batches' membership, the peers' sources.)
Plan decode_plan(const std::uint8_t* data, std::size_t size, const std::string& name);

std::uint32_t crc32(const std::uint8_t* data, std::size_t size, std::uint32_t crc = 0);

}  // namespace solar

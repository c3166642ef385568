// SPDX-License-Identifier: Apache-2.0
// The agent's buffer layout: how many slots of what size, where each rank's ring lies, and (in
// transparent mode) where the shared sample index goes. Pure arithmetic on the plan header and
// the agent's options, so that it can be checked against core's budget rule
// (fit_plan_to_agent_budget, solar/core/config.h): both count agent_slot_bytes per slot and the
// plan's resident set plus `staging_steps` steps of the node's ranks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "solar/core/config.h"

namespace solar::agent {

// Batches up to this size are copied into a ring by whichever thread makes them ready.
inline constexpr std::uint64_t kInlineCopyBytes = 512 * 1024;
// Rings of such small batches are deeper than the budget's staging steps if need be: 2 MiB
// deep, at least 8 and at most 16 batches (small_batch_ring_depth; at most 6 × 512 KiB more
// per rank than the default 2 steps). A rank asks for its next steps ahead
// (protocol::HelloOk::ask_ahead: half the ring less the one it holds, 3 to 7) and finds them
// copied when it comes back, instead of waiting for a round trip to the agent per batch (the
// cost that bounds small batches). libsolar asks for more only when the reply it takes is the
// last one received, with the releases owed since its last write
// (protocol::HelloOk::defer_releases): the step a rank holds and those it asked for are half
// the ring; the other half the agent fills with the steps after them while the rank takes the
// ones it was sent together, so that its next request finds them ready. The deeper the ring,
// the fewer writes and wake-ups per batch: 16 against 8 entries for 64 KiB batches, 1.05
// against 0.92 M samples/s (solar bench serve --epochs 50, 11 runs of 12 ahead).
inline constexpr std::uint64_t kSmallBatchRingBytes = 2 << 20;
inline constexpr std::uint64_t kSmallBatchRingMin = 8, kSmallBatchRingMax = 16;
inline std::uint64_t small_batch_ring_depth(std::uint64_t batch_bytes) {
  return std::clamp<std::uint64_t>(kSmallBatchRingBytes / std::max<std::uint64_t>(batch_bytes, 1),
                                   kSmallBatchRingMin, kSmallBatchRingMax);
}

struct BufferLayout {
  std::uint32_t ranks = 0;         // R: the node's ranks
  std::uint64_t slot_bytes = 0;    // one sample, rounded up to 64 bytes: a 4 KiB one fills a page
  std::uint64_t label_bytes = 0;   // one label; 0 without
  std::uint64_t labels_offset = 0;  // the labels, slot by slot, after the slots
  std::uint64_t slots = 0;         // all of them: cache slots, then the rings
  std::uint64_t cache_slots = 0;   // the plan's resident set
  std::uint64_t ring_depth = 0;    // batches per rank's ring (≥ staging_steps: see above)
  std::uint64_t ring_batch = 0;    // slots per ring batch (b + δ)
  bool inline_copy = false;        // batches small enough to copy without a thread hop
  // Transparent mode: the sample index follows the labels, page-aligned (solar/transparent.h):
  // its header, N 64-bit entries, N 32-bit consumed counters (padded to 8 bytes), then the
  // file table (BufferOptions::files solar_xfile) and the extents of the chunked files
  // (BufferOptions::extents solar_xextent).
  std::uint64_t index_offset = 0;
  std::uint64_t entries_offset = 0;
  std::uint64_t consumed_offset = 0;
  std::uint64_t files_offset = 0;
  std::uint64_t extents_offset = 0;
  std::uint64_t files = 0, extents = 0;  // the tables' records (transparent)
  std::uint64_t map_bytes = 0;     // the whole memfd: slots, then the index (transparent, peers)
  std::uint64_t handover_slots = 0;  // peers: cache slots beyond the plan's, see BufferOptions

  // Ring slot i of rank r's batch of step t.
  std::uint32_t ring_slot(std::uint32_t r, std::uint64_t t, std::size_t i) const {
    const std::uint64_t entry = std::uint64_t{r} * ring_depth + t % ring_depth;
    return static_cast<std::uint32_t>(cache_slots + entry * ring_batch + i);
  }
  std::uint64_t slot_offset(std::uint64_t slot) const { return slot * slot_bytes; }
  std::uint64_t label_offset(std::uint64_t slot) const {
    return labels_offset + slot * label_bytes;
  }
};

struct BufferOptions {
  std::uint32_t staging_steps = kAgentStagingSteps;  // batches in each rank's ring
  bool zero_copy = false;    // no rings: ranks read the cache slots
  bool transparent = false;  // no rings, and the sample index after the slots
  // Peer sharing: the index's entries after the slots (other agents look samples up there),
  // and room for the samples handed over to peers until their reads are done
  // (kPeerHandoverSteps steps of the node's ranks: a plan hands over at most one step's worth
  // per step, ReplayReport::peak_handovers; with that room no agent waits for another's reads
  // of the same step to admit a step, so the agents cannot wait on each other in a cycle).
  // Without rings (zero copy, transparent) the staging slots, which hold samples evicted while
  // still in use, hold these too: once the node's ranks have used the steps before the one it
  // admits, at most one step's handovers are left there out of staging_steps (≥ 2) steps.
  bool peers = false;
  std::uint64_t page_bytes = 4096;
  // Transparent: the dataset's files, and the chunked ones' extents together (one per sample
  // of a chunked file): the index's tables (count_file_tables, transparent_pacer.h).
  std::uint64_t files = 0, extents = 0;
  // Samples of differing sizes (c.sized(), transparent only): the arena in which the node's
  // schedule fits as extents (solar::arena_for_node, at least c.buffer_bytes). The slots are
  // then 64-byte units: that arena and sized_staging_bytes(c) of them, and no labels.
  std::uint64_t arena_bytes = 0;
};

// The layout of the buffer for plan config `c` (sized: see BufferOptions::arena_bytes) (its samples, sample size, ranks, batch, δ and
// resident set) with `label_bytes` per label. Checks nothing: the caller refuses staging_steps
// 0 with rings, and a layout too large for memory or for 32-bit slot numbers.
BufferLayout buffer_layout(const PlanConfig& c, std::uint64_t label_bytes,
                           const BufferOptions& o);

}  // namespace solar::agent

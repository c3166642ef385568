// SPDX-License-Identifier: Apache-2.0
#include "buffer_layout.h"

#include <algorithm>

#include "solar/transparent.h"

namespace solar::agent {

BufferLayout buffer_layout(const PlanConfig& c, std::uint64_t label_bytes,
                           const BufferOptions& o) {
  BufferLayout b;
  const std::uint32_t R = c.ranks_per_node;
  b.ranks = R;
  // Samples and labels apart (protocol version 4): slots of whole 64-byte lines, so that the
  // copy of a 4 KiB sample touches one page, not two (about a fifth of the ring copy's time),
  // and one label per slot after them.
  b.slot_bytes = agent_sample_slot_bytes(c.sample_bytes);
  b.label_bytes = label_bytes;

  // Buffer: the plan's resident set (cache slots), then one ring per rank of `staging_steps`
  // batches. A step's batch is copied into the rank's ring ahead of its request, and the rank
  // reads only there: its page faults stay within its ring (a few batches, touched once)
  // instead of spreading over the whole buffer, its batch is contiguous, and the cache slots
  // it used are free for the plan's evictions as soon as the copy is done.
  b.ring_batch = std::uint64_t{c.batch} + c.imbalance;
  b.inline_copy = b.ring_batch * b.slot_bytes <= kInlineCopyBytes;
  if (c.sized()) {
    // 64-byte units of one arena: each sample takes its (rounded) bytes, and the staging room
    // holds steps of the largest samples.
    b.slot_bytes = 64;
    b.label_bytes = 0;
    b.ring_depth = 0;
    b.inline_copy = false;
    b.cache_slots =
        (std::max(o.arena_bytes, c.buffer_bytes) + sized_staging_bytes(c) + 63) / 64;
  } else if (o.zero_copy || o.transparent) {
    // No rings: ranks read the cache slots; the staging slots hold samples the plan evicted
    // while ranks still use them.
    b.ring_depth = 0;
    b.cache_slots = c.buffer_samples() + std::uint64_t{o.staging_steps} * R * b.ring_batch;
  } else {
    b.ring_depth = o.staging_steps;
    if (b.inline_copy)
      b.ring_depth =
          std::max(b.ring_depth, small_batch_ring_depth(b.ring_batch * b.slot_bytes));
    // A plan of policy `none` may hold less than a step; its samples still need slots.
    b.cache_slots = std::max(c.buffer_samples(), std::uint64_t{R} * b.ring_batch);
    // One step of room beyond the plan's resident set, out of the budget as the plan counts it
    // (kAgentLookaheadSteps, solar/core/agent_budget.h): reads run a step ahead of the copies.
    b.cache_slots += std::uint64_t{kAgentLookaheadSteps} * R * b.ring_batch;
  }
  if (o.peers && b.ring_depth > 0) {  // without rings the staging slots hold them (.h)
    b.handover_slots = std::uint64_t{kPeerHandoverSteps} * R * b.ring_batch;
    b.cache_slots += b.handover_slots;
  }
  b.slots = b.cache_slots + std::uint64_t{R} * b.ring_depth * b.ring_batch;
  b.labels_offset = b.slots * b.slot_bytes;
  const std::uint64_t labels_end = b.labels_offset + b.slots * b.label_bytes;
  // Transparent mode: the sample index follows the labels, page-aligned.
  const std::uint64_t page = o.page_bytes;
  b.index_offset = (labels_end + page - 1) / page * page;
  const std::uint64_t N = c.samples;
  b.entries_offset = b.index_offset + sizeof(solar_xindex);
  b.consumed_offset = b.entries_offset + N * sizeof(std::uint64_t);
  b.files_offset = b.consumed_offset + (N * 4 + 7) / 8 * 8;
  b.files = o.transparent ? o.files : 0;
  b.extents = o.transparent ? o.extents : 0;
  b.extents_offset = b.files_offset + b.files * sizeof(solar_xfile);
  b.map_bytes = o.transparent ? b.extents_offset + b.extents * sizeof(solar_xextent)
                : o.peers     ? b.consumed_offset
                              : labels_end;
  return b;
}

}  // namespace solar::agent

// SPDX-License-Identifier: Apache-2.0
// The shuffled order of one epoch and how it is cut into steps.
//
// An epoch's sequence L is what DistributedSampler produces before striding: a permutation of
// 0..N-1, padded by wrapping (or truncated with drop_last) to a multiple of the world size W.
// Step j's global batch is the contiguous slice L[j·W·b, j·W·b + W·b_j), where b_j is the
// per-rank batch of that step (b, or less for the last step without drop_last). Under the
// standard DistributedSampler assignment, position q of L belongs to rank q mod W, so this
// slice is exactly the union of every rank's j-th DataLoader batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "solar/core/config.h"

namespace solar {

struct EpochLayout {
  std::uint64_t world = 0;      // W
  std::uint64_t per_rank = 0;   // DistributedSampler.num_samples
  std::uint32_t steps = 0;      // steps per epoch
  std::uint32_t batch = 0;      // b
  std::uint32_t last_batch = 0; // per-rank batch of the last step

  static EpochLayout of(const PlanConfig& c);
  std::uint32_t rank_batch(std::uint32_t step) const {
    return step + 1 == steps ? last_batch : batch;
  }
  std::uint64_t step_size(std::uint32_t step) const { return world * rank_batch(step); }
  std::uint64_t step_begin(std::uint32_t step) const { return world * batch * step; }
  // Accesses per epoch: the length of L that steps consume.
  std::uint64_t used() const { return step_begin(steps - 1) + step_size(steps - 1); }
  std::uint64_t sequence_length() const { return world * per_rank; }
};

// Fills `out` with epoch `epoch`'s sequence L (length layout.sequence_length()).
void epoch_sequence(const PlanConfig& c, const EpochLayout& layout, std::uint32_t epoch,
                    std::vector<std::uint32_t>& out);

// Distinct samples one epoch uses (U): N, or fewer when drop_last cuts the tail.
std::uint64_t distinct_per_epoch(const PlanConfig& c, const EpochLayout& layout);

// The hard lower bound on remote fetches of any schedule: U + (E-1)·max(0, U - M·C). With
// sized samples C is the most samples a buffer's bytes hold (of the smallest ones); with a local
// tier C = C_mem + C_disk (both tiers hold what no epoch needs to fetch again).
std::uint64_t lower_bound_fetches(const PlanConfig& c);

// The hard lower bound on remote bytes: B + (E-1)·max(0, B - M·buffer_bytes), B the bytes every
// epoch reads at least (all samples', or with drop_last all but the N-U largest). Equal-size
// samples: lower_bound_fetches × sample_bytes. Saturates at 2^64 - 1.
std::uint64_t lower_bound_bytes(const PlanConfig& c);

}  // namespace solar

// SPDX-License-Identifier: Apache-2.0
// An independent check of a plan: replays it from its own records (rank batches, fetches,
// evictions) without any planner code, checks every invariant, and recounts its metrics.
#pragma once

#include <stdexcept>

#include "solar/core/plan.h"

namespace solar {

// A plan that breaks an invariant; the message names the step, node or rank.
class PlanInvalid : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ReplayReport {
  Metrics metrics;                      // recounted from the records
  std::uint64_t peak_occupancy = 0;     // most samples (sized samples: bytes) a node held
  // Most peer reads in one step of samples their source evicts in that step (handovers), from
  // one source: slots a source keeps beyond its capacity until those reads are done.
  std::uint64_t peak_handovers = 0;
  TierMetrics tiers;  // with a local tier: recounted by replay_tiers
};

// Checks: the epoch order is a permutation; every step's global batch is, as a multiset,
// exactly that step of the epoch's sequence; every rank gets between max(1, b_j-δ) and b_j+δ
// samples; every eviction removes a resident sample, every fetch brings a new one and is used
// in its step, peers serve only samples they held before the step (and may evict in it: a
// handover); every access finds its sample resident and
// is flagged a hit exactly when it was not fetched for it; no buffer exceeds its capacity; and
// the recounted metrics equal plan.metrics. Throws PlanInvalid on the first violation.
// With a local tier it also runs replay_tiers.
ReplayReport replay_plan(const Plan& plan);

// A tiered plan's moves between memory and the local disk (Plan::tiers), replayed on their own:
// every eviction finds its sample in a tier (or dropped), every discard a copy on the disk, every
// write a sample in memory and not yet on the disk, every drop a sample in memory, every read a
// sample on the disk and not in memory; after each step's moves and fetches every sample the
// node's ranks read is in memory and neither tier is over its capacity. Recounts TierMetrics
// (the bound with local_reads_bound), which must equal plan.tier_metrics, and the local reads
// must not be under their bound. Throws PlanInvalid on the first violation.
TierMetrics replay_tiers(const Plan& plan);

}  // namespace solar

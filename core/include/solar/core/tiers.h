// SPDX-License-Identifier: Apache-2.0
// A plan with a local tier (PlanConfig::local_bytes): which part of each node's resident set is
// in memory and which on the local disk, at every step.
//
// The policies plan the resident set as one buffer of buffer + local samples per node, so their
// storage fetches meet the two-tier bound U + (E-1)·max(0, U - M·(C_mem + C_disk)) as they meet
// the one-tier bound. Placing that set in the tiers is then a matter of memory alone, since the
// node's reads are known: memory keeps what the node reads soonest (Belady on memory), a sample
// leaving it goes to the local disk when the node reads it again while it still holds it, and is
// dropped otherwise (no write); a sample the ranks need that is on the disk is read back into
// memory before its step, and the disk keeps its copy while it has room, so a sample read back
// and dropped again is not written again (the disk makes room by discarding the copy of the
// sample in memory that is read soonest: the last to leave memory). Memory misses are then as few as Belady's MIN allows for the node's
// reads, so the local reads are within a few of their bound.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "solar/core/plan.h"

namespace solar {

// Fills plan.tiers and plan.tier_metrics (the bound included) for a tiered plan (its schedules
// already made: make_plan calls this). Throws std::logic_error when the plan is not tiered or
// its schedules do not hold the samples its ranks read.
void place_in_tiers(Plan& plan);

// One node's part, from what that node alone knows: its schedule and its ranks' batches
// (batch(t, k): local rank k's accesses in global step t, hit bits allowed). What an agent
// computes for itself from its section of the plan file (agent/README.md, "The local tier"),
// as place_in_tiers does for every node: the same moves for the same inputs. `counts`, when
// given, gets this node's TierMetrics (its bound included). Throws std::logic_error as
// place_in_tiers does.
using NodeBatch = std::function<std::span<const std::uint32_t>(std::uint64_t, std::uint32_t)>;
NodeTiers place_node_in_tiers(const NodeSchedule& schedule, std::uint64_t total_steps,
                              std::uint32_t ranks_per_node, const NodeBatch& batch,
                              std::uint64_t steps_per_epoch, std::uint64_t memory_samples,
                              std::uint64_t local_samples, std::uint32_t node,
                              TierMetrics* counts = nullptr);

// The least local reads any placement of the plan's resident sets in the tiers needs: for each
// node, the misses of Belady's MIN over the node's reads (per step, the samples of its ranks)
// with a memory of buffer_samples(), less the samples fetched for the node (from storage or a
// peer: they arrive in memory); summed over the nodes. Every memory miss is a fetch or a local
// read, and no memory misses less than MIN.
std::uint64_t local_reads_bound(const Plan& plan);

}  // namespace solar

// SPDX-License-Identifier: Apache-2.0
// How a node agent's memory budget becomes a plan: its slots and staging rings, the buffer
// that fits, and the settings of job-transparent mode and peer sharing.
#pragma once

#include <cstdint>
#include <vector>

#include "solar/core/plan_config.h"

namespace solar {

// How a node agent spends its memory: slots of one sample, rounded up to 64 bytes, each with
// its label in an array after the slots (agent_slot_bytes: the two together); the plan's
// resident set plus `staging_steps` steps of the node's ranks (each rank's
// ring of that many batches, into which its next batches are copied ahead of its requests).
inline constexpr std::uint32_t kAgentStagingSteps = 2;
// With rings, one more step of cache slots than the plan's resident set, out of the budget:
// room to read step t+1 while step t's samples are still being copied into the rings. Without
// it a buffer the plan fills (every epoch after the first, most of the first) makes the reads
// lockstep with the copies, and idle time on the link is bandwidth lost: `solar bench loader`
// over solar-stored at 800 MB/s + 1 ms went from 1.31x to 1.0-1.1x its limit in epochs 1-2,
// at 400 MB/s + 2 ms from 1.28x to 1.1x (issue 39). (Zero copy and the transparent mode read
// the cache slots directly: their staging steps are such room already.)
inline constexpr std::uint32_t kAgentLookaheadSteps = 1;
std::uint64_t agent_slot_bytes(std::uint64_t sample_bytes, std::uint64_t label_bytes);
// A slot's share of that: the sample's bytes rounded up to 64 (the distance between slots).
std::uint64_t agent_sample_slot_bytes(std::uint64_t sample_bytes);
// Sets c.buffer_bytes (the plan's resident set) so that the agent's whole buffer fits in
// `budget_bytes` per node. c must already hold the sample size, batch, ranks and δ.
// Throws ConfigError("--buffer") naming the minimum when the budget is too small.
void fit_plan_to_agent_budget(PlanConfig& c, std::uint64_t budget_bytes,
                              std::uint64_t label_bytes,
                              std::uint32_t staging_steps = kAgentStagingSteps);

// The job-transparent mode's plan (`solar run --transparent`, `--solar-transparent`): an
// unmodified script reads in its own DistributedSampler order with equal batches and decides
// which rank reads what, so the plan is torch order, δ = 0, policy sampler. Call on the config
// for agents; `order_given`: the user named an order. Throws ConfigError("--order" or
// "--imbalance") when the settings contradict the script's.
void follow_the_script(PlanConfig& c, bool order_given);

// The plan config `solar run` and the SPANK plugin use: c's epochs, nodes, ranks, batch, δ,
// seed and order, for a dataset of `samples` × `sample_bytes` (+ `label_bytes` per label), with
// `budget_bytes` of agent memory per node. Checks everything but the buffer first (so a bad
// batch is named as such), then fits the buffer; policy solar. Throws ConfigError.
// peers: the nodes' agents share their buffers (c.peer_fetch is set); with rings (neither zero
// copy nor transparent) each agent then keeps kPeerHandoverSteps more steps of slots for the
// samples handed over to peers, out of the budget (agent/README.md, "Peers"; the agent's
// buffer_layout counts the same).
inline constexpr std::uint32_t kPeerHandoverSteps = 1;
PlanConfig config_for_agents(PlanConfig c, std::uint64_t samples, std::uint64_t sample_bytes,
                             std::uint64_t label_bytes, std::uint64_t budget_bytes,
                             bool peers = false, bool rings = true);

// Samples of differing sizes as they lie in their files (whole files; in the transparent mode also
// filtered chunks): the agent's buffer is one arena of 64-byte units in which each sample takes
// its bytes rounded up to 64 (agent_sample_slot_bytes), and the plan counts those bytes.
// `sizes`: each sample's bytes (storage::stored_sample_sizes); `budget_bytes` per node holds the
// plan's resident set (buffer_bytes) and kAgentStagingSteps steps of the node's ranks at the
// largest sample (samples evicted while a rank still reads them). The agent adds to it what its
// node's schedule needs beyond buffer_bytes as extents (arena_for_node, solar/core/extents.h).
// Sets samples, sample_sizes, sample_bytes (their mean) and buffer_bytes; policy solar (a
// transparent plan then takes follow_the_script as any does; batch mode serves such a plan zero
// copy: whole files, each sample its file's bytes). Throws ConfigError("--buffer") naming the
// largest sample and the least budget when the budget is too small.
PlanConfig config_for_sized_samples(PlanConfig c, const std::vector<std::uint64_t>& sizes,
                                    std::uint64_t budget_bytes);
// The first sample whose bytes `sizes` (as stored) are not what a sized plan counts for it
// (`planned`: agent_sample_slot_bytes of each); the shorter length when all those agree. So
// a dataset matches its plan exactly when this is sizes.size() == planned.size().
std::size_t first_size_unlike_planned(const std::vector<std::uint64_t>& sizes,
                                      const std::vector<std::uint64_t>& planned);
// The bytes `sizes` take in such a buffer (each rounded up to 64): what --buffer 64% is of.
std::uint64_t sized_buffer_bytes(const std::vector<std::uint64_t>& sizes);
// Bytes of staging room of config `c` (sized): kAgentStagingSteps steps of its node's ranks at
// the largest sample.
std::uint64_t sized_staging_bytes(const PlanConfig& c);
}  // namespace solar

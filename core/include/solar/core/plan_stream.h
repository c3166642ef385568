// SPDX-License-Identifier: Apache-2.0
// A plan computed where it is used, as it is needed: one node's share of it, step by step, a
// bounded window ahead of its reader (issue 40).
//
// A plan is a deterministic function of its PlanConfig (portable RNG, golden-tested), so every
// node can compute it itself instead of reading it from a plan file: the planner runs forward
// over the steps as make_plan does, on a thread of its own, and hands over only this node's
// part of each step. Nothing of the run's length is kept: memory is the planner's state
// (O(N + M·C): each sample's holder, the nodes' buffers, two epochs' sequences) plus at most
// `window` steps of this node's share; time is the whole plan's, spread over the run, and the
// first step is ready after the first epoch's sequences are drawn (O(N)).
//
// The steps are exactly those of make_plan(config) for that node, bit for bit (tested against
// the whole plan for every policy), and metrics() is the whole plan's.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "solar/core/plan.h"
#include "solar/core/planner.h"

namespace solar {

// One global step of one node's share of a plan: what the node's NodePlan holds for step t.
struct NodeStep {
  std::uint64_t t = 0;                            // the global step
  std::vector<std::vector<std::uint32_t>> ranks;  // per local rank: sample | kHitBit
  std::vector<std::uint32_t> evicts;              // evicted before the fetches
  std::vector<FetchRun> fetches;                  // from storage, coalesced
  std::vector<PeerFetch> peers;                   // taken from other nodes' buffers
  // What other nodes take from this node's buffer in this step: PeerFetch::from_node is the
  // node that reads the sample here (ordered by that node, then sample).
  std::vector<PeerFetch> serves;
  bool operator==(const NodeStep&) const = default;
};

class NodePlanStream {
 public:
  static constexpr std::uint64_t kDefaultWindow = 256;

  // Validates `config` (throws ConfigError) and starts computing its plan, keeping `node`'s
  // steps only, never more than `window` (≥ 1) of them ahead of the reader. A plan with a
  // local tier is refused (its placement needs the node's whole schedule: make_plan).
  NodePlanStream(const PlanConfig& config, std::uint32_t node,
                 std::uint64_t window = kDefaultWindow);
  // Stops the computation (the thread ends within one step) and waits for it.
  ~NodePlanStream();
  NodePlanStream(const NodePlanStream&) = delete;
  NodePlanStream& operator=(const NodePlanStream&) = delete;

  std::uint64_t total_steps() const;
  // Steps handed out so far: the next one is step taken().
  std::uint64_t taken() const;
  // Steps computed and not yet taken (at most the window).
  std::uint64_t ready() const;
  // The next step (0, 1, ..., total_steps() - 1), waiting until it is computed. Rethrows what
  // the planner threw; std::out_of_range after the last step.
  NodeStep next();
  // The whole plan's metrics (every node's), waiting until the last step is computed (take the
  // steps first: the planner stops `window` steps ahead of the reader).
  const Metrics& metrics();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// The streamed plan of `config` (Plan::streamed): validated (throws ConfigError), with its epoch
// order and lower bounds. A local tier and an order file are refused: the tiers' placement
// needs each node's whole schedule, and the order would have to travel whole to every node.
Plan make_streamed_plan(const PlanConfig& config);
// Whether make_streamed_plan takes `config` (no local tier, no order file), and the refusal
// naming the option in the way when it does not (ConfigError).
bool can_stream(const PlanConfig& config);
void require_streamable(const PlanConfig& config);
// Plans of more accesses than this are streamed by `solar run` and `srun` unless told
// otherwise (--plan, --solar-plan): 2^24 accesses, a 64 MiB plan file and more.
inline constexpr std::uint64_t kStreamAboveAccesses = std::uint64_t{1} << 24;

// How a job's plan goes to its nodes (solar run --plan, srun --solar-plan): streamed above
// kStreamAboveAccesses when it can be (automatic), or as told.
enum class PlanDelivery { automatic, whole, streamed };
// "auto", "whole", "streamed"; nullopt for anything else.
std::optional<PlanDelivery> parse_plan_delivery(std::string_view text);
// The job's plan as its file carries it: make_streamed_plan or make_plan. Throws ConfigError
// (a streamed plan asked for that cannot be: make_streamed_plan).
Plan plan_for_job(const PlanConfig& config, PlanDelivery delivery,
                  const ProgressFn& progress = {});

// One node's whole share of config's plan, computed (NodePlanStream) and gathered: what the
// node's section of the whole plan's file holds. O(the node's accesses over the run) memory.
struct NodePlan;
class PlanFile;
// With `serves`, also what other nodes read from this node's buffer, per step (NodeStep::serves):
// what a whole plan's other sections say of this node, in the same pass.
NodePlan collect_node_plan(const PlanConfig& config, std::uint32_t node,
                           std::vector<std::vector<PeerFetch>>* serves = nullptr);
// A plan file's node: its section, or for a streamed plan collect_node_plan.
NodePlan node_plan(const PlanFile& file, std::uint32_t node);

}  // namespace solar

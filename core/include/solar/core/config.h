// What a plan is computed from, and how those inputs are checked.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace solar {

// The order every epoch's samples come in.
enum class OrderMode : std::uint8_t {
  solar = 0,  // solar's portable RNG (rng.h)
  torch = 1,  // exactly torch.utils.data.DistributedSampler(shuffle=True, seed) + set_epoch(e)
};

// How a plan decides assignment, epoch order and eviction. `solar` is ours; the rest are the
// baselines it is compared with (see core/README.md, "Policies").
enum class Policy : std::uint8_t {
  none = 0,         // no buffer: every access reads remote storage
  lru = 1,          // DistributedSampler assignment, per-node LRU buffer
  solar_paper = 2,  // the published SOLAR artifact: FIFO, PSO epoch order, owner reassignment
  nopfs = 3,        // static assignment, per-node static cache of most frequent samples
  solar = 4,        // locality-steered assignment + clairvoyant (farthest next use) eviction
  sampler = 5,      // DistributedSampler assignment + clairvoyant per-node eviction (the plan of
                    // job-transparent mode, where the unmodified script decides who reads what)
};

std::string_view to_string(OrderMode m);
std::string_view to_string(Policy p);
std::optional<OrderMode> parse_order_mode(std::string_view s);
std::optional<Policy> parse_policy(std::string_view s);
const std::vector<Policy>& all_policies();

// A bad input: names the flag, what is wrong and the allowed range.
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string flag, const std::string& message)
      : std::runtime_error(flag + ": " + message), flag_(std::move(flag)) {}
  const std::string& flag() const { return flag_; }

 private:
  std::string flag_;
};

struct PlanConfig {
  std::uint64_t samples = 0;       // N
  std::uint64_t sample_bytes = 0;  // bytes of one sample
  std::uint32_t epochs = 0;        // E
  std::uint32_t nodes = 1;         // M
  std::uint32_t ranks_per_node = 1;  // R
  std::uint32_t batch = 0;         // b, per rank
  bool drop_last = false;          // DistributedSampler(drop_last) and DataLoader(drop_last)
  std::uint64_t seed = 0;
  OrderMode order = OrderMode::solar;
  std::uint64_t buffer_bytes = 0;  // per node
  std::uint32_t imbalance = 0;     // δ: each rank gets between b-δ and b+δ samples per step
  bool peer_fetch = false;         // allow a node to take a sample from a peer node's buffer
  Policy policy = Policy::solar;

  std::uint64_t world() const { return std::uint64_t{nodes} * ranks_per_node; }
  std::uint64_t global_batch() const { return world() * batch; }
  // C: whole samples that fit one node's buffer.
  std::uint64_t buffer_samples() const { return sample_bytes ? buffer_bytes / sample_bytes : 0; }

  // Throws ConfigError naming the first bad input. Checks ranges, overflow and that the buffer
  // holds at least one step of one node's ranks (R·(b+δ) samples).
  void validate() const;
};

// The buffer capacity (samples per node) the plan's policy works with: the configured buffer,
// or for `none` (no buffer) one step of the node's ranks passing through. The replay and the
// plan file's readers hold plans to it.
inline std::uint64_t effective_capacity(const PlanConfig& c) {
  return c.policy == Policy::none ? std::uint64_t{c.ranks_per_node} * c.batch
                                  : c.buffer_samples();
}

// Limits enforced by validate(); exposed so messages and tests agree on them.
inline constexpr std::uint64_t kMaxSamples = (1ULL << 31) - 1;  // sample ids are 31-bit
// epochs × accesses per epoch (the samples, or more when DistributedSampler pads them to a
// multiple of the world size): every access time of a plan fits a 32-bit eviction key.
inline constexpr std::uint64_t kMaxAccesses = (1ULL << 32) - (1ULL << 26);
inline constexpr std::uint64_t kMaxSampleBytes = 1ULL << 40;
inline constexpr std::uint32_t kMaxNodes = 65535;
inline constexpr std::uint32_t kMaxRanksPerNode = 1024;
inline constexpr std::uint32_t kMaxEpochs = 1000000;

// Parses a whole number in [lo, hi]. Throws ConfigError(flag, ...) naming the range on
// garbage, a sign, or a value out of range (including values that overflow 64 bits).
std::uint64_t parse_count(std::string_view text, const std::string& flag, std::uint64_t lo,
                          std::uint64_t hi);

// The global step a resumed run starts at (solar run --start-epoch/--start-step, srun
// --solar-start-epoch/--solar-start-step, libsolar's SOLAR_START_EPOCH/SOLAR_START_STEP):
// epoch × steps_per_epoch + step. `step` is the step within `epoch`; without an epoch it may
// be any global step. The start may be the plan's end (nothing left), not beyond it: throws
// ConfigError naming the flag and the plan's length.
std::uint64_t start_global_step(std::optional<std::uint64_t> epoch,
                                std::optional<std::uint64_t> step, std::uint32_t steps_per_epoch,
                                std::uint32_t epochs, const std::string& epoch_flag,
                                const std::string& step_flag);

// Parses "512", "16M", "1.5G", "2T" (binary multiples, B optional) into bytes. Throws
// ConfigError(flag, ...) on garbage, negative values or overflow of 64 bits.
std::uint64_t parse_bytes(std::string_view text, const std::string& flag);

// A buffer size as given by the user: bytes, or a percentage of the dataset ("22.5%").
struct BufferSpec {
  std::uint64_t bytes = 0;
  double percent = -1;  // >= 0 when given as a percentage
  static BufferSpec parse(std::string_view text, const std::string& flag);
  // Per-node bytes: a percentage means that share of the dataset's samples, rounded down to
  // whole samples.
  std::uint64_t resolve(std::uint64_t samples, std::uint64_t sample_bytes) const;
};

// How a node agent spends its memory: slots of one sample, rounded up to 64 bytes, each with
// its label in an array after the slots (agent_slot_bytes: the two together); the plan's
// resident set plus `staging_steps` steps of the node's ranks (each rank's
// ring of that many batches, into which its next batches are copied ahead of its requests).
inline constexpr std::uint32_t kAgentStagingSteps = 2;
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

// The presets of `solar plan --scenario` (core/README.md, "Scenarios").
struct Scenario {
  std::string name;
  std::uint64_t samples;
  std::uint32_t epochs, nodes, ranks_per_node, batch;
  std::uint64_t buffer_samples;  // per node
  std::string description;
};
const std::vector<Scenario>& scenarios();
const Scenario* find_scenario(std::string_view name);

std::string format_bytes(std::uint64_t bytes);

// MemAvailable of /proc/meminfo in bytes: what the node can still give a new allocation
// without swapping. ~0 where it cannot be read (no limit known).
std::uint64_t mem_available_bytes();

// Throws ConfigError (flag) unless a file can be written at `path`: its folder exists and is
// writable, and it is not a folder itself. For output options checked before a job starts.
void check_output_file(const std::string& path, const std::string& flag);

}  // namespace solar

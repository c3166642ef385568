// SPDX-License-Identifier: Apache-2.0
// What a plan is computed from (PlanConfig), its orders and policies, and the limits its
// check enforces.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "solar/core/config_error.h"

namespace solar {

// The order every epoch's samples come in.
enum class OrderMode : std::uint8_t {
  solar = 0,  // solar's portable RNG (rng.h)
  torch = 1,  // exactly torch.utils.data.DistributedSampler(shuffle=True, seed) + set_epoch(e)
  file = 2,   // the script's own order, given as a file (order_file.h): PlanConfig::order_list
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

struct PlanConfig {
  std::uint64_t samples = 0;       // N
  std::uint64_t sample_bytes = 0;  // bytes of one sample (with sample_sizes: their mean)
  // Samples of differing sizes: one byte count per sample id (whole-file samples, compressed
  // chunks). Empty: every sample is sample_bytes. With sizes the buffers hold buffer_bytes
  // bytes (not buffer_samples() samples), eviction is clairvoyant by bytes, and the lower bound
  // is one on bytes too (lower_bound_bytes). Shared, so that copies of a config are cheap.
  std::shared_ptr<const std::vector<std::uint64_t>> sample_sizes;
  std::uint32_t epochs = 0;        // E
  std::uint32_t nodes = 1;         // M
  std::uint32_t ranks_per_node = 1;  // R
  std::uint32_t batch = 0;         // b, per rank
  bool drop_last = false;          // DistributedSampler(drop_last) and DataLoader(drop_last)
  std::uint64_t seed = 0;
  OrderMode order = OrderMode::solar;
  // order == file: each epoch's permutation of the samples, epoch e at [e·N, (e+1)·N) (read
  // by order_file.h, checked there). A plan read back from its file has the mode but not the
  // list: its accesses are in the file; what needs the sequences again (a new plan, the
  // replay) needs the order file again. Shared, so that copies of a config are cheap.
  std::shared_ptr<const std::vector<std::uint32_t>> order_list;
  std::uint64_t buffer_bytes = 0;  // per node: memory
  // Per node: a local-disk tier below the memory buffer (0: none). The plan then keeps a resident
  // set of buffer + local bytes per node (its evictions and fetches are of that set), and
  // Plan::tiers says which of it is in memory at every step: what the ranks use always is, the
  // rest moves between memory and the local disk (tiers.h). Samples of one size only.
  std::uint64_t local_bytes = 0;
  std::uint32_t imbalance = 0;     // δ: each rank gets between b-δ and b+δ samples per step
  bool peer_fetch = false;         // allow a node to take a sample from a peer node's buffer
  Policy policy = Policy::solar;

  std::uint64_t world() const { return std::uint64_t{nodes} * ranks_per_node; }
  std::uint64_t global_batch() const { return world() * batch; }
  // C: whole samples that fit one node's buffer (sized samples: of the mean size).
  std::uint64_t buffer_samples() const { return sample_bytes ? buffer_bytes / sample_bytes : 0; }
  // Whole samples the local tier holds (0: none).
  std::uint64_t local_samples() const { return sample_bytes ? local_bytes / sample_bytes : 0; }
  bool tiered() const { return local_bytes > 0; }
  bool sized() const { return sample_sizes && !sample_sizes->empty(); }
  std::uint64_t size_of(std::uint64_t x) const {
    return sized() ? (*sample_sizes)[x] : sample_bytes;
  }
  // Every sample's bytes added up.
  std::uint64_t dataset_bytes() const;
  // The most bytes one step of one node's ranks can read: R·(b+δ) samples, the largest ones.
  std::uint64_t step_bytes_at_most() const;
  // Throws ConfigError naming the first bad input. Checks ranges, overflow and that the buffer
  // holds at least one step of one node's ranks (R·(b+δ) samples; sized samples: the R·(b+δ)
  // largest, and the largest sample on its own, both sizes named).
  void validate() const;

 private:
  void validate_sizes() const;
};

// The buffer capacity per node the plan's policy works with: the configured buffer (with a
// local tier: memory and local disk together, the resident set), or for `none` (no buffer) one
// step of the node's ranks passing through. In samples, or in bytes for sized samples (where
// `none` is not limited: a step passes through whatever its size). The replay and the plan
// file's readers hold plans to it.
inline std::uint64_t effective_capacity(const PlanConfig& c) {
  if (c.sized()) return c.policy == Policy::none ? ~std::uint64_t{0} : c.buffer_bytes;
  return c.policy == Policy::none ? std::uint64_t{c.ranks_per_node} * c.batch
                                  : c.buffer_samples() + c.local_samples();
}

// Limits enforced by validate(); exposed so messages and tests agree on them.
inline constexpr std::uint64_t kMaxSamples = (1ULL << 31) - 1;  // sample ids are 31-bit
// epochs × accesses per epoch (the samples, or more when DistributedSampler pads them to a
// multiple of the world size): every access time of a plan fits a 32-bit eviction key.
inline constexpr std::uint64_t kMaxAccesses = (1ULL << 32) - (1ULL << 26);
inline constexpr std::uint64_t kMaxSampleBytes = 1ULL << 40;
inline constexpr std::uint64_t kMaxDatasetBytes = 1ULL << 62;  // sized samples, added up
inline constexpr std::uint32_t kMaxNodes = 65535;
inline constexpr std::uint32_t kMaxRanksPerNode = 1024;
inline constexpr std::uint32_t kMaxEpochs = 1000000;

// The global step a resumed run starts at (solar run --start-epoch/--start-step, srun
// --solar-start-epoch/--solar-start-step, libsolar's SOLAR_START_EPOCH/SOLAR_START_STEP):
// epoch × steps_per_epoch + step. `step` is the step within `epoch`; without an epoch it may
// be any global step. The start may be the plan's end (nothing left), not beyond it: throws
// ConfigError naming the flag and the plan's length.
std::uint64_t start_global_step(std::optional<std::uint64_t> epoch,
                                std::optional<std::uint64_t> step, std::uint32_t steps_per_epoch,
                                std::uint32_t epochs, const std::string& epoch_flag,
                                const std::string& step_flag);

}  // namespace solar

// SPDX-License-Identifier: Apache-2.0
// solar-agent: one per node per job step. Executes this node's part of the plan: fills a
// shared-memory buffer from storage ahead of the ranks and hands batches to them over a Unix
// socket (protocol/include/solar/protocol.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "solar/core/plan_file.h"
#include "solar/storage/sample_source.h"

namespace solar::agent {

struct AgentOptions {
  std::string plan;          // plan file
  std::uint32_t node = 0;    // which node's part to execute
  std::string dataset;       // SampleSource spec: FILE.h5[:/dset] or fabric://host:port/name
  std::string labels = "/label";
  std::string dataset_index;  // many files: the index to read (else $SOLAR_DATASET_INDEX, a scan)
  std::string socket;        // Unix socket path (its directory should be private, 0700)
  unsigned io_threads = 8;   // parallel requests within one read
  unsigned readers = 8;      // reader threads: storage reads and ring copies
  std::uint32_t staging_steps = kAgentStagingSteps;  // extra slots, in steps of its ranks
  bool zero_copy = false;  // ranks read cache slots directly (no per-rank rings)
  bool direct_io = false;  // HDF5 reads with O_DIRECT (bypass the page cache)
  // Storage bound by requests: samples this close together in the file (bytes between them),
  // of one step or of the steps queued behind it, are one request (Hdf5Options::read_gap).
  std::uint64_t read_gap = 0;
  // Job-transparent mode: unmodified ranks read the dataset file themselves and the
  // interposer (libsolar_preload.so) serves their reads from the buffer through a shared
  // sample index (solar/transparent.h); eviction is paced by the samples they consume.
  bool transparent = false;
  // Transparent: the script's order is not known (demand_cache.h): no plan-order prefetching,
  // the buffer keeps what the ranks read. Without it, the agent switches so by itself when
  // the ranks' reads do not follow the plan.
  bool order_unknown = false;
  // At exit, the run's measured statistics (per epoch, head start, totals) as one JSON file,
  // written atomically (temporary file + rename), mode 0600. Checked at start-up: its folder
  // must exist and be writable. Empty: none.
  std::string stats_out;
  // Resume: the global step (epoch × steps per epoch + step) the agent starts at. Steps before
  // it are never read or served; the buffer starts empty, so samples the plan expects resident
  // at this step are read when a step from here on first needs them (counted as
  // unplanned_fetched_samples). At most the plan's total steps; not with `transparent`.
  std::uint64_t start_step = 0;
  // Peer sharing (agent/README.md, "Peers"): the plan's peer reads are read from the other
  // agents' buffers over libfabric RMA instead of storage. Each agent writes its card (fabric
  // address, memory keys) into this folder, which must be private to the user (0700), and reads
  // the others' from it. Empty: peer reads go to storage.
  std::string peer_dir;
  std::string peer_provider = "tcp;ofi_rxm";  // libfabric provider between agents
  // A peer that does not answer, or does not have a sample, for this long: its samples are read
  // from storage (one warning). Also how long an agent waits at start for the others' cards.
  double peer_timeout = 10;
  // The most the plan may buffer (its buffer_bytes), checked on the plan this agent reads:
  // slurmstepd passes the site's max_buffer, which it checked on the plan before, since the
  // plan lies in a folder of the job's user. 0: no limit.
  std::uint64_t max_buffer = 0;
  // A plan with a local tier (solar plan --local-buffer): the folder on the node's local disk
  // that holds it, created by the agent (0700; it must not exist, its parent must) and removed
  // with its file at exit. Required by such a plan, refused by others (local_tier.h).
  std::string local_dir;
  // The most the plan may keep on the local disk per node (slurmstepd passes the site's
  // max_local_buffer). 0: no limit.
  std::uint64_t max_local_buffer = 0;
};

// Thrown for anything that stops the agent from starting: names the input and the fix.
class AgentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Agent {
 public:
  // Loads and checks everything (plan part, source, buffer, socket); throws AgentError.
  explicit Agent(const AgentOptions& options);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Serves until stop() (SIGTERM/SIGINT) or a shutdown request. Returns the exit code.
  int run();
  void stop();

  // The agent's shared state and the parts that compose it (agent_impl.h), named here so that
  // the parts' headers can refer to it; internal to solar-agent.
  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace solar::agent

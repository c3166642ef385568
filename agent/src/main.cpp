// SPDX-License-Identifier: Apache-2.0
// solar-agent: see agent.h. Started by `solar run` or the SPANK plugin, one per node.
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>

#include "agent.h"
#include "solar/core/config.h"

int main(int argc, char** argv) {
  solar::agent::AgentOptions o;
  std::string log_file;
  CLI::App app{
      "solar-agent: executes one node's part of a solar plan. Fills a shared-memory buffer from\n"
      "storage ahead of the ranks and serves their batches over a Unix socket. Normally started\n"
      "by `solar run` or the Slurm plugin, not by hand.",
      "solar-agent"};
  app.set_version_flag("--version", "solar-agent " SOLAR_PROJECT_VERSION);
  app.add_option("--plan", o.plan, "Plan file (solar plan --out)")->required();
  app.add_option("--node", o.node, "This node's id in the plan")->required();
  app.add_option("--dataset", o.dataset, "FILE.h5[:/dataset] or fabric://HOST:PORT/NAME")
      ->required();
  app.add_option("--labels", o.labels, "Labels dataset in the file ('' for none) [/label]");
  app.add_option("--dataset-index", o.dataset_index,
                 "A dataset of many files: the index the launcher wrote (else "
                 "$SOLAR_DATASET_INDEX; without either the files are listed and checked here)");
  app.add_option("--socket", o.socket, "Unix socket to serve on (in a private directory)")
      ->required();
  app.add_option("--log", log_file, "Log file [stderr]");
  app.add_option("--stats-out", o.stats_out,
                 "At exit, write the run's measured statistics here as JSON (per epoch, head "
                 "start, totals; agent/README.md), atomically, mode 0600. Its folder must exist");
  app.add_option("--start-step", o.start_step,
                 "Resume: start at this global step (epoch x steps per epoch + step); earlier "
                 "steps are neither read nor served [0]");
  app.add_option("--io-threads", o.io_threads, "Parallel storage requests per read [8]");
  app.add_option("--readers", o.readers,
                 "Reader threads: they read the steps' samples (each its share of a step) "
                 "and copy batches into the ranks' rings [8]");
  app.add_option("--staging-steps", o.staging_steps,
                 "Batches in each rank's ring: its next batches are copied there ahead of "
                 "its requests (at least 1; rings of batches up to 512 KiB are at least 8 "
                 "deep, beyond the plan's budget if need be) [2]");
  app.add_flag("--zero-copy", o.zero_copy,
               "Hand out the cache slots themselves instead of copying each batch into the "
               "rank's ring (the staging slots then hold samples ranks still use after the plan "
               "evicted them)");
  app.add_flag("--transparent", o.transparent,
               "Serve unmodified ranks: they read the dataset file themselves and "
               "libsolar_preload.so copies resident samples from this agent's buffer through a "
               "shared index; eviction follows the samples they consume (contiguous or "
               "unfiltered chunked HDF5 datasets; the plan should be in torch order with the "
               "script's seed and batch)");
  app.add_flag("--order-unknown", o.order_unknown,
               "With --transparent: the script's order is not known (its own sampler, weights, "
               "a list it draws): no prefetching in the plan's order; the buffer keeps the "
               "samples the ranks read, until it is full (demand mode). Without it the agent "
               "switches to demand mode itself once the ranks' reads complete no step of the plan");
  app.add_flag("--direct-io", o.direct_io,
               "Read HDF5 files with O_DIRECT, bypassing the page cache: for datasets far larger "
               "than the node's memory (here it doubled cold random reads, but loses the page "
               "cache's hits on files that fit in memory)");
  app.add_option("--peer-dir", o.peer_dir,
                 "Peer sharing: read the plan's peer reads from the other agents' buffers over "
                 "libfabric RMA. The agents of a job exchange their cards (address, keys) in "
                 "this folder: the same for all of them (shared between nodes), private to the "
                 "user (0700). Without it, peer reads come from storage");
  app.add_option("--local-dir", o.local_dir,
                 "A plan with a local tier (solar plan --local-buffer): the folder on the node's "
                 "local disk (NVMe) that holds it. The agent creates it (0700; it must not exist, "
                 "its parent must), keeps one file in it (0600, allocated in full at start) and "
                 "removes both at exit; a full or failing disk degrades to storage reads");
  app.add_option("--max-local-buffer", o.max_local_buffer,
                 "Bytes: refuse a plan that keeps more per node on the local disk (the Slurm "
                 "plugin passes the site's max_local_buffer) [no limit]");
  app.add_option("--peer-provider", o.peer_provider,
                 "libfabric provider between agents: tcp;ofi_rxm, shm (one host), verbs;ofi_rxm "
                 "or cxi on clusters [tcp;ofi_rxm]");
  app.add_option("--max-buffer", o.max_buffer,
                 "Bytes: refuse a plan that buffers more per node (the Slurm plugin passes the "
                 "site's max_buffer) [no limit]");
  app.add_option("--peer-timeout", o.peer_timeout,
                 "Seconds: a peer without a sample or an answer this long is read from storage "
                 "instead (one warning); also the wait for the others' cards at start [10]")
      ->check(CLI::PositiveNumber);
  std::string read_gap;
  app.add_option("--read-gap", read_gap,
                 "For storage bound by requests (IOPS), not bytes: samples at most SIZE apart "
                 "in the file are read as one request, the bytes between them read and dropped; "
                 "samples of the steps queued behind one are merged too. Worth it when a request "
                 "costs more than SIZE of bandwidth: about latency x bandwidth (e.g. 2000 IOPS at "
                 "400 MB/s: 200K). Raw HDF5 layouts only [0: off]")
      ->type_name("SIZE");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!read_gap.empty()) {
    try {
      o.read_gap = solar::parse_bytes(read_gap, "--read-gap");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "solar-agent: %s\n", e.what());
      return 2;
    }
  }
  std::signal(SIGPIPE, SIG_IGN);
  try {
    if (!log_file.empty())
      spdlog::set_default_logger(spdlog::basic_logger_mt("agent", log_file));
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [agent] [%l] %v");
    spdlog::flush_on(spdlog::level::info);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solar-agent: --log %s: %s\n", log_file.c_str(), e.what());
    return 2;
  }
  if (::geteuid() == 0)
    spdlog::warn("running as root: the agent should run as the job's user");
  try {
    solar::agent::Agent agent(o);
    return agent.run();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    std::fprintf(stderr, "solar-agent: %s\n", e.what());
    return 1;
  }
}

// SPDX-License-Identifier: Apache-2.0
// solar bench io: per-sample random reads vs coalesced runs vs a sequential read, each beside
// the raw fabric under a fabric:// source.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cmd_storage.h"
#include "commands.h"
#include "options.h"
#include "progress.h"
#include "solar/core/config.h"
#include "solar/core/rng.h"
#include "solar/storage/content.h"
#include "solar/storage/fabric_reference.h"
#include "solar/storage/fabric_source.h"
#include "solar/storage/hdf5_writer.h"
#include "solar/storage/sample_source.h"
#include "storage_reads.h"

namespace solar::cli {
namespace {

using storage::SampleRun;
using storage::StorageError;

struct BenchOptions {
  std::string source;
  double fraction = 0.5;
  unsigned workers = 8;
  std::string batch = "64M";
  std::uint64_t seed = 0;
  bool cold = true;
  bool json = false;
  bool reference = true;  // fabric://: the raw fabric beside each phase
  std::string reference_op = "4M";
  std::string reference_memory = "plain";  // plain | export
  unsigned repeat = 1;
  SourceFlags flags;
};

// fi_reads of `bytes` at `offset`, in pieces of at most `op` bytes.
void add_reads(std::vector<storage::FabricRead>& out, std::uint64_t offset, std::uint64_t bytes,
               std::uint64_t op) {
  for (std::uint64_t done = 0; done < bytes; done += op)
    out.push_back({offset + done, std::min(op, bytes - done)});
}

void run_bench_io(const BenchOptions& o) {
  std::unique_ptr<storage::SampleSource> src;
  std::uint64_t batch_bytes = 0, reference_op = 0;
  try {
    batch_bytes = parse_bytes(o.batch, "--batch-bytes");
    if (batch_bytes == 0) throw ConfigError("--batch-bytes", "must be > 0");
    reference_op = parse_bytes(o.reference_op, "--reference-op");
    if (reference_op == 0) throw ConfigError("--reference-op", "must be > 0");
    if (!(o.fraction > 0 && o.fraction <= 1))
      throw ConfigError("--fraction", "must be in (0, 1]");
    try {
      src = o.flags.open(o.source);
    } catch (const StorageError& e) {
      throw ConfigError("SOURCE", e.what());
    }
    if (src->info().samples == 0) throw ConfigError("SOURCE", "the dataset has no samples");
  } catch (const ConfigError& e) {
    exit_code() = usage("bench io", e.what());
    return;
  }
  const auto& info = src->info();
  const std::uint64_t sb = info.sample_bytes;
  const std::uint64_t k = std::max<std::uint64_t>(
      1, static_cast<std::uint64_t>(o.fraction * static_cast<double>(info.samples)));
  std::vector<std::uint32_t> perm(info.samples);
  solar_permutation(o.seed, 0, perm);
  std::vector<std::uint64_t> ids(perm.begin(), perm.begin() + static_cast<std::ptrdiff_t>(k));
  const auto sorted_runs = storage::coalesce(ids);
  const std::uint64_t bytes = k * sb;
  const std::uint64_t per_batch = std::min(batch_bytes, bytes);
  auto* served = dynamic_cast<storage::FabricSource*>(src.get());
  // The reference keeps its own session (and the server memory it reads) from one measure to
  // the next, until it goes, before the source.
  std::optional<storage::RawFabricReference> fabric;
  if (o.reference && served) fabric.emplace(*served);
  // The raw fabric's reference: the same server, provider and bytes in plain fi_reads of the
  // phase's request sizes (one sample each; runs and the sequential range in reads of at most
  // --reference-op), --queue-depth in flight, from the server's plain memory (as large as the
  // dataset, up to kMaxReferenceBytes) into the phase's own destination (see below).
  const std::uint64_t remote_bytes =
      std::min<std::uint64_t>(info.samples * sb, storage::kMaxReferenceBytes);
  const unsigned window = o.flags.queue_depth;
  const auto reference_memory = o.reference_memory == "export"
                                    ? storage::ReferenceMemory::exported
                                    : storage::ReferenceMemory::plain;

  struct Phase {
    std::string name;
    std::uint64_t requests = 0;
    std::function<void()> run;
    std::vector<storage::FabricRead> reference_reads;
    std::span<std::byte> reference_local;  // where the reference's reads land
    std::vector<double> seconds, reference_seconds;
    std::optional<storage::FabricReference> reference;
  };
  std::vector<Phase> phases(3);
  // The destinations, allocated and touched before anything is timed: for one-sample requests
  // a ring of max(--queue-depth, --workers) samples (not one cache-hot sample per worker), and
  // two batch buffers for the coalesced and sequential phases, page-aligned (Destination). The
  // reference's reads land in the same memory (the ring, the first batch buffer): on this VM
  // solar's shm 256 KiB reads into a buffer allocated for the run took 4.7-5.6 GB/s, into the
  // ring (then a std::vector, 16 bytes into a page) 3.4-3.6 (the reference in
  // fabric_reference.h).
  const std::uint64_t ring_slots = std::max<std::uint64_t>(window, o.workers);
  const Destination ring(ring_slots * sb);
  const Destination batch_bufs[2] = {Destination(per_batch + sb), Destination(per_batch + sb)};
  // 1. One sample per request, random order, from `workers` threads (a PyTorch Dataset's
  //    __getitem__ under a DataLoader with that many workers).
  phases[0].name = "random, 1 sample/request";
  phases[0].requests = k;
  phases[0].run = [&] {
    std::atomic<std::uint64_t> next{0};
    std::exception_ptr err;
    std::mutex mu;
    std::vector<std::thread> ts;
    for (unsigned w = 0; w < o.workers; ++w)
      ts.emplace_back([&] {
        try {
          for (std::uint64_t i; (i = next.fetch_add(1)) < k;) {
            const SampleRun r{ids[i], 1};
            src->read({&r, 1}, ring.data() + (i % ring_slots) * sb);
          }
        } catch (...) {
          std::lock_guard g(mu);
          if (!err) err = std::current_exception();
          next = k;
        }
      });
    for (auto& t : ts) t.join();
    if (err) std::rethrow_exception(err);
  };
  for (std::uint64_t id : ids) phases[0].reference_reads.push_back({id * sb, sb});
  phases[0].reference_local = ring.span();
  // 2. The same samples, sorted and coalesced into runs, read batch by batch.
  const auto coalesced_parts = batches(sorted_runs, sb, batch_bytes);
  phases[1].name = "sorted, coalesced runs";
  phases[1].requests = sorted_runs.size();
  phases[1].run = [&] { read_all(*src, coalesced_parts, batch_bufs); };
  for (const auto& r : sorted_runs)
    add_reads(phases[1].reference_reads, r.first * sb, r.count * sb, reference_op);
  phases[1].reference_local = batch_bufs[0].span();
  // 3. Device limit: the same number of bytes, read sequentially from sample 0.
  const auto seq_parts = batches({{0, k}}, sb, batch_bytes);
  phases[2].name = "sequential (device limit)";
  phases[2].requests = seq_parts.size();
  phases[2].run = [&] { read_all(*src, seq_parts, batch_bufs); };
  add_reads(phases[2].reference_reads, 0, bytes, reference_op);
  phases[2].reference_local = batch_bufs[0].span();

  try {
    for (auto& p : phases)
      for (unsigned rep = 0; rep < o.repeat; ++rep) {
        auto reference = [&] {
          if (!fabric) return;
          p.reference = fabric->measure(p.reference_reads, window, p.reference_local,
                                        remote_bytes, reference_memory);
          p.reference_seconds.push_back(p.reference->seconds);
        };
        // Every other run measures the reference first: neither side always runs on what
        // the other left behind (a warmed connection, the caches, the scheduler's state).
        if (rep % 2) reference();
        if (o.cold) src->drop_cache();
        const auto t0 = Clock::now();
        p.run();
        p.seconds.push_back(since(t0));
        if (rep % 2 == 0) reference();
      }
  } catch (const StorageError& e) {
    std::fprintf(stderr, "solar bench io: %s\n", e.what());
    exit_code() = kExitFailure;
    return;
  }
  const double seq = gbps(bytes, median(phases[2].seconds));
  auto fabric_gbps = [&](const Phase& p) { return gbps(bytes, median(p.reference_seconds)); };
  // solar's reads as a share of the fabric's: per run, against the reference measured beside
  // it (the same bytes, so reference seconds / solar seconds), then the median and the range of
  // those ratios. Paired this way, what a shared machine's load does to both sides of one run
  // cancels out, which a ratio of two medians taken from different runs does not do.
  auto vs_fabric_runs = [&](const Phase& p) {
    std::vector<double> r;
    for (std::size_t i = 0; i < p.seconds.size() && i < p.reference_seconds.size(); ++i)
      r.push_back(p.seconds[i] > 0 ? p.reference_seconds[i] / p.seconds[i] : 0);
    return r;
  };
  auto vs_fabric = [&](const Phase& p) { return median(vs_fabric_runs(p)); };
  if (o.json) {
    nlohmann::json j = {{"source", src->describe()},   {"layout", info.layout},
                        {"sample_bytes", sb},          {"samples_read", k},
                        {"bytes_per_phase", bytes},    {"cold", o.cold},
                        {"workers", o.workers},        {"repeat", o.repeat},
                        {"phases", nlohmann::json::array()}};
    for (const auto& p : phases) {
      const double s = median(p.seconds);
      nlohmann::json ph = {{"name", p.name},
                           {"requests", p.requests},
                           {"seconds", s},
                           {"seconds_runs", p.seconds},
                           {"gbps", gbps(bytes, s)},
                           {"vs_sequential", seq > 0 ? gbps(bytes, s) / seq : 0}};
      if (p.reference) {
        ph["fabric_gbps"] = fabric_gbps(p);
        ph["vs_fabric"] = vs_fabric(p);
        ph["vs_fabric_runs"] = vs_fabric_runs(p);
        ph["fabric"] = {{"seconds", median(p.reference_seconds)},
                        {"reads", p.reference->reads},
                        {"bytes", p.reference->bytes},
                        {"local_bytes", p.reference->local_bytes},
                        {"seconds_runs", p.reference_seconds}};
      }
      j["phases"].push_back(ph);
    }
    j["coalesced_vs_random"] = median(phases[0].seconds) / median(phases[1].seconds);
    if (fabric) {
      const auto& r = *phases[0].reference;
      j["fabric_reference"] = {{"provider", r.provider},
                               {"window", r.window},
                               {"remote_bytes", r.remote_bytes},
                               {"memory", o.reference_memory},
                               {"max_read_bytes", reference_op}};
    } else {
      j["fabric_reference"] = nullptr;
    }
    if (served) j["server_memory"] = served->served_from();
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("{}: {} samples of {} ({} layout{}); reading a random {:.0f}% = {} samples, {} per "
             "phase, {} cache{}\n\n",
             src->describe(), info.samples, format_bytes(sb), info.layout,
             !served                               ? ""
             : served->served_from() == "memory"   ? ", served from the server's own copy"
             : served->served_from() == "staged"   ? ", staged by the server"
                                                   : ", served from the server's mapped file",
             100 * o.fraction, k, format_bytes(bytes),
             o.cold ? "cold (dropped before each phase)" : "warm",
             o.repeat > 1 ? fmt::format(", median of {} runs", o.repeat) : "");
  fmt::print("{:<28} {:>10} {:>9} {:>9} {:>14}", "phase", "requests", "seconds", "GB/s",
             "vs sequential");
  if (fabric) fmt::print(" {:>12} {:>10}", "fabric GB/s", "vs fabric");
  if (fabric && o.repeat > 1) fmt::print(" {:>15}", "runs' range");
  fmt::print("\n");
  for (const auto& p : phases) {
    const double s = median(p.seconds);
    const double g = gbps(bytes, s);
    fmt::print("{:<28} {:>10} {:>9.2f} {:>9.2f} {:>13.1f}%", p.name, p.requests, s, g,
               seq > 0 ? 100 * g / seq : 0);
    if (fabric) fmt::print(" {:>12.2f} {:>9.1f}%", fabric_gbps(p), 100 * vs_fabric(p));
    if (const auto r = vs_fabric_runs(p); fabric && o.repeat > 1 && !r.empty()) {
      const auto [lo, hi] = std::minmax_element(r.begin(), r.end());
      fmt::print(" {:>15}", fmt::format("{:.0f}-{:.0f}%", 100 * *lo, 100 * *hi));
    }
    fmt::print("\n");
  }
  fmt::print("\ncoalesced vs random: {:.2f}x faster\n",
             median(phases[0].seconds) / median(phases[1].seconds));
  if (fabric) {
    const auto& r = *phases[0].reference;
    const bool from_export = reference_memory == storage::ReferenceMemory::exported;
    fmt::print("fabric: plain fi_reads on an endpoint of their own ({}), {} in flight, of each "
               "phase's sizes (runs in reads of at most {}), from {}: {}\n",
               r.provider, r.window, format_bytes(reference_op),
               from_export
                   ? "the export's own memory (the mapped file, or the server's copy under "
                     "--in-memory, at the offsets solar reads)"
                   : fmt::format("{} of the server's plain memory", format_bytes(r.remote_bytes)),
               from_export ? "solar's read path is not on it, the server's memory is"
                           : "the page cache and solar's read path are not on it");
    if (o.repeat > 1)
      fmt::print("vs fabric: the median over the runs of each run's ratio to the reference "
                 "measured beside it (every other run measures the reference first)\n");
  }
}


}  // namespace

void add_bench_io_command(CLI::App& bench) {
  auto b = std::make_shared<BenchOptions>();
  CLI::App* io = bench.add_subcommand(
      "io",
      "Measure a source three ways in one run, each over the same number of bytes: random\n"
      "one-sample requests (what a PyTorch Dataset does), the same samples as sorted\n"
      "coalesced runs (what solar does), and a sequential read (the device limit).");
  io->add_option("source", b->source, "FILE.h5:/dataset or fabric://HOST:PORT/NAME")
      ->type_name(kSource)
      ->required();
  io->add_option("--fraction", b->fraction, "Share of the samples to read [0.5]")
      ->type_name(kFloat);
  io->add_option("--workers", b->workers, "Threads issuing one-sample requests, 1..256 [8]")
      ->type_name(kUint)
      ->check(CLI::Range(1, 256).description(""));
  io->add_option("--batch-bytes", b->batch, "Bytes per coalesced/sequential request batch [64M]")
      ->type_name(kBytes);
  io->add_option("--seed", b->seed, "Seed of the random sample choice [0]")->type_name(kUint);
  io->add_flag_callback("--warm", [b] { b->cold = false; },
               "Keep the page cache (default: drop it before each phase: posix_fadvise "
               "DONTNEED for files, the server's cache for fabric://)");
  io->add_flag("--json", b->json, "Print machine-readable results");
  io->add_flag_callback("--no-reference", [b] { b->reference = false; },
                        "fabric://: skip the raw-fabric reference (by default each phase is "
                        "followed by plain fi_reads of the same sizes on an endpoint of their "
                        "own, and solar's reads are given as a share of them)");
  io->add_option("--reference-memory", b->reference_memory,
                 "fabric://: what the reference reads on the server: plain (anonymous memory "
                 "it lends, the fabric's own limit) or export (the export's own memory at the "
                 "offsets solar reads: the mapped file, or the server's copy under "
                 "solar-stored --in-memory; what solar's read path costs, the same memory being "
                 "on both sides) [plain]")
      ->type_name("MEMORY")
      ->check(CLI::IsMember({"plain", "export"}));
  io->add_option("--reference-op", b->reference_op,
                 "fabric://: largest fi_read of the reference; runs and the sequential range "
                 "are read in pieces of this size [4M]")
      ->type_name(kBytes);
  io->add_option("--repeat", b->repeat,
                 "Run each phase (and its reference, alternately before and after it) this many "
                 "times and report the medians (vs fabric: of each run's ratio), "
                 "1..100 [1]")
      ->type_name(kUint)
      ->check(CLI::Range(1, 100).description(""));
  b->flags.add(io);
  io->callback([b] { run_bench_io(*b); });
}

}  // namespace solar::cli

// SPDX-License-Identifier: Apache-2.0
// What `solar gen`, `solar verify` and `solar bench io` share: the source options, batches
// of runs, page-aligned destinations and double-buffered reads.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "commands.h"
#include "options.h"
#include "solar/storage/sample_source.h"

namespace solar::cli {

using storage::SampleRun;
using storage::StorageError;
using Clock = std::chrono::steady_clock;

inline double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline double gbps(std::uint64_t bytes, double s) { return s > 0 ? double(bytes) / s / 1e9 : 0; }

inline int usage(const std::string& cmd, const std::string& msg) {
  std::fprintf(stderr, "solar %s: %s\n", cmd.c_str(), msg.c_str());
  return kExitUsage;
}

struct SourceFlags {
  unsigned threads = 4;
  unsigned queue_depth = 16;
  double timeout = 30;
  std::string provider;

  void add(CLI::App* app) {
    app->add_option("--threads", threads, "Parallel reads for files, 1..256 [4]")
        ->type_name(kUint)
        ->check(CLI::Range(1, 256).description(""));
    app->add_option("--queue-depth", queue_depth, "fabric:// reads in flight, 1..1024 [16]")
        ->type_name(kUint)
        ->check(CLI::Range(1, 1024).description(""));
    app->add_option("--timeout", timeout,
                    "fabric://: seconds without progress before a read is retried [30]")
        ->type_name(kFloat)
        ->check([](const std::string& text) -> std::string {
          try {
            std::size_t used = 0;
            if (std::stod(text, &used) > 0 && used == text.size()) return "";
          } catch (const std::exception&) {
          }
          return "'" + text + "' is not a number of seconds > 0";
        });
    app->add_option("--provider", provider,
                    "fabric://: libfabric provider (default: the server's)")
        ->type_name("NAME");
  }
  std::unique_ptr<storage::SampleSource> open(const std::string& spec,
                                              const std::string& labels = "/label") const {
    storage::SourceOptions so;
    so.label_dataset = labels;
    so.io_threads = threads;
    so.queue_depth = queue_depth;
    so.timeout_s = timeout;
    so.provider = provider;
    return storage::open_source(spec, so);
  }
};

// Splits sorted runs into batches of at most `max_bytes` (at least one sample each).
std::vector<std::vector<SampleRun>> batches(const std::vector<SampleRun>& runs,
                                            std::uint64_t sample_bytes, std::uint64_t max_bytes);

// Memory a benchmark's reads land in: page-aligned, as the agent's buffer is (its slots are
// 64-byte aligned), and touched when made, so that page faults of fresh memory are not
// counted as reads. Not a std::vector: its data sits 16 bytes into a page, and copies into
// memory so placed ran slower here (process_vm_readv of 256 KiB pieces, shm's path: 4.5
// against 5.4 GB/s into page-aligned memory, and 5.3-5.7 at offsets 64 and 2048).
class Destination {
 public:
  explicit Destination(std::uint64_t bytes) : bytes_(bytes) {
    void* p = nullptr;
    if (::posix_memalign(&p, 4096, std::max<std::uint64_t>(bytes, 1)) != 0) throw std::bad_alloc();
    p_.reset(static_cast<std::byte*>(p));
    std::memset(p, 1, bytes);
  }
  std::byte* data() const { return p_.get(); }
  std::span<std::byte> span() const { return {p_.get(), bytes_}; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> p_;
  std::uint64_t bytes_;
};

// Reads every batch, two at a time (double buffering: one batch is being issued while the
// other completes, as the agent does), into `bufs`, two buffers of at least a batch each.
void read_all(storage::SampleSource& src, const std::vector<std::vector<SampleRun>>& parts,
              const Destination (&bufs)[2]);

}  // namespace solar::cli

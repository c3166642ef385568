// SPDX-License-Identifier: Apache-2.0
// FabricSource: samples exported by a solar-stored server (fabric://HOST:PORT/NAME), read with
// one-sided libfabric RMA (fi_read) straight into the caller's memory.
//
// A TCP bootstrap tells the client the server's provider and fabric address, the memory keys
// and addresses of the exported regions, and the dataset's metadata. Contiguous datasets are
// read directly from the server's mapped file; chunked ones through a staging buffer the server
// fills on request. Up to `queue_depth` fi_reads are in flight, of every thread's reads of
// the source together (read() and read_labels() may be called from several threads at once:
// one thread drives the connection for all, see fabric_sharing.cpp). A read that fails (a CQ error, no
// progress within `timeout_s`, the server closing the bootstrap connection) is retried on a new
// connection, again and again with backoff (0.1 s doubling to 2 s) until `reconnect_s` have
// passed since the server was lost: a restarted solar-stored is picked up where the read
// stopped. Only reads that did not complete are repeated, and a server that comes back with a
// different file is refused. One warning is logged when an outage starts and one line when it
// ends. When the window has passed the caller gets a StorageError naming the server, never
// partly-filled data reported as good.
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>

#include "solar/storage/sample_source.h"

namespace solar::storage {

struct FabricOptions {
  unsigned queue_depth = 16;
  double timeout_s = 30;  // a connect, hello or read with no progress this long fails
  // Seconds to keep reconnecting after the server is lost (also while a busy server refuses
  // the first connection); negative: $SOLAR_STORED_RECONNECT, else 30; 0: no second attempt.
  double reconnect_s = -1;
  // A first connection refused (nobody listening) is retried within reconnect_s too, as a
  // lost server is: for clients of a running job (a rank reading directly after its agent is
  // gone), whose server was there when the job was planned and may be restarting. Off, a
  // server that is not there is an error at once (a wrong address should not wait).
  bool wait_for_server = false;
  std::uint64_t request_bytes = 4ULL << 20;  // largest single fi_read
  std::string token;     // shared secret the server asks for; "" = $SOLAR_STORED_TOKEN
  std::string provider;  // "" = the server's provider (the client must use the same one)
};

class FabricSource : public SampleSource {
 public:
  // Connects and checks the dataset exists. Throws StorageError for a malformed URI, an
  // unreachable server, a rejected token or an unknown dataset name.
  static std::unique_ptr<FabricSource> connect(const std::string& uri,
                                               const FabricOptions& options = {});
  ~FabricSource() override;

  const DatasetInfo& info() const override;
  void read(std::span<const SampleRun> runs, std::byte* dst) override;
  void read_labels(std::span<const SampleRun> runs, std::byte* dst) override;
  void drop_cache() override;  // asks the server to drop its page cache for the file
  std::string describe() const override;
  // The server's identity of the export (its name and file); a reconnection to a server that
  // exports anything else fails instead of mixing its bytes in.
  const std::string& identity() const override;

  std::string provider() const;
  // What the server serves this export from: "file" (its mapped file), "memory" (its own copy,
  // solar-stored --in-memory) or "staged" (read into a staging buffer per request).
  const std::string& served_from() const;
  std::uint64_t bytes_read() const;    // completed payload bytes since connect (all threads)
  std::uint64_t reconnects() const;
  // The most fi_reads of read() calls in flight at once so far (all threads): up to
  // queue_depth when several callers' reads, or one caller's pieces, overlap.
  std::uint64_t peak_in_flight() const;

  struct Impl;

 private:
  friend class RawFabricReference;  // opens sessions of its own to the same server
  explicit FabricSource(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace solar::storage

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

// The largest reference buffer a solar-stored lends (FabricSource::measure_fabric). One buffer
// serves every connection that asks, and it is freed when the last of them closes, so
// authenticated clients can make the server hold this much at most, while they measure. As
// large as a 1 GiB benchmark dataset: with 256 MiB the reference's reads wrapped into a
// quarter of the memory solar's reads of the same dataset walk.
inline constexpr std::uint64_t kMaxReferenceBytes = 1ULL << 30;

// One read of the raw-fabric reference: `len` bytes at `offset` of the server's reference
// buffer (offsets past its end wrap around).
struct FabricRead {
  std::uint64_t offset = 0, len = 0;
};

// What the raw-fabric reference reads on the server: `plain`, a buffer of anonymous memory
// lent for it (the fabric's own limit: no file, no page cache); `exported`, the export's own
// memory, the mapped file (or the server's copy, solar-stored --in-memory) solar's reads come
// from, at the same offsets (the fabric's limit from that memory: solar's share of it is what
// its read path costs, whatever that memory does to both). Contiguous (one-sided) exports only.
enum class ReferenceMemory { plain, exported };

// What FabricSource::measure_fabric measured.
struct FabricReference {
  double seconds = 0;  // first read issued to last completion
  std::uint64_t bytes = 0, reads = 0;
  unsigned window = 0;              // reads in flight
  std::uint64_t remote_bytes = 0;   // the server's reference buffer (or the export's bytes)
  std::uint64_t local_bytes = 0;    // the destination ring
  std::string provider;
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
  // The raw fabric under this source, measured as fabtests' fi_rma_bw does: on a connection
  // and endpoint of its own (same provider, same server), `reads` are issued as plain
  // fi_reads, `window` in flight, from a registered buffer of plain memory the server lends
  // for this (`remote_bytes`, at most kMaxReferenceBytes: no file and no page cache behind
  // it) into `local`, used as a ring and registered once. Nothing of solar's read path is on
  // this path, so solar's reads of the same sizes, divided by it, are solar's share of the
  // fabric. Pass the very memory solar's reads land in: in `solar bench io` on this VM,
  // solar's reads into a buffer allocated for the run were up to 1.5x as fast as into the
  // ring allocated before the phases (shm, 256 KiB reads: 4.7-5.6 against 3.4-3.6 GB/s, the
  // same source, alternating runs), which made a reference with a fresh ring of its own look
  // up to 35% faster than solar (the ring was a std::vector, 16 bytes into a page; memory
  // so placed takes such copies ~17% slower here, which is most likely the cause).
  // With ReferenceMemory::exported the reads come from the export's own registered memory
  // instead (offsets within the dataset; `remote_bytes` is not used).
  // Throws StorageError when a read fails or the server does not lend the buffer.
  FabricReference measure_fabric(std::span<const FabricRead> reads, unsigned window,
                                 std::span<std::byte> local, std::uint64_t remote_bytes,
                                 ReferenceMemory memory = ReferenceMemory::plain);
  std::uint64_t bytes_read() const;    // completed payload bytes since connect (all threads)
  std::uint64_t reconnects() const;
  // The most fi_reads of read() calls in flight at once so far (all threads): up to
  // queue_depth when several callers' reads, or one caller's pieces, overlap.
  std::uint64_t peak_in_flight() const;

  struct Impl;

 private:
  explicit FabricSource(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace solar::storage

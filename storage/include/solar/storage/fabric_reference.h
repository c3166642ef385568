// SPDX-License-Identifier: Apache-2.0
// RawFabricReference: the raw-fabric reference of `solar bench io fabric://...`, the fabric
// under a FabricSource measured without solar's read path, so that solar's reads can be given
// as a share of it. A benchmark's tool, not a reader's: it lives in its own library
// (solar_storage_reference, linked by `solar` and the storage tests), not in libsolar_storage.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "solar/storage/fabric_source.h"

namespace solar::storage {

// The largest reference buffer a solar-stored lends (RawFabricReference::measure). One buffer
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

// What RawFabricReference::measure measured.
struct FabricReference {
  double seconds = 0;  // first read issued to last completion
  std::uint64_t bytes = 0, reads = 0;
  unsigned window = 0;              // reads in flight
  std::uint64_t remote_bytes = 0;   // the server's reference buffer (or the export's bytes)
  std::uint64_t local_bytes = 0;    // the destination ring
  std::string provider;
};

// The reference of one FabricSource. It keeps its connection, endpoint and the server memory
// it reads from one measure to the next (a new one only when the memory or the size asked
// changes), until it goes; it must not outlive the source. One thread at a time.
class RawFabricReference {
 public:
  explicit RawFabricReference(FabricSource& source);
  ~RawFabricReference();
  RawFabricReference(const RawFabricReference&) = delete;
  RawFabricReference& operator=(const RawFabricReference&) = delete;

  // The raw fabric under the source, measured as fabtests' fi_rma_bw does: on a connection
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
  FabricReference measure(std::span<const FabricRead> reads, unsigned window,
                          std::span<std::byte> local, std::uint64_t remote_bytes,
                          ReferenceMemory memory = ReferenceMemory::plain);
 private:
  struct Kept;
  FabricSource& source_;
  std::unique_ptr<Kept> kept_;
};

}  // namespace solar::storage

// SPDX-License-Identifier: Apache-2.0
// HDF5Source: samples from an HDF5 dataset whose first dimension indexes samples.
//
// Contiguous, unfiltered, little-endian datasets are read without HDF5 on the data path: the
// raw data's file offset is taken once (H5Dget_offset) and coalesced byte ranges are read with
// pread from a pool of threads. Chunked or compressed datasets go through H5Dread, one call per
// run (never one call with an OR'ed multi-run selection: HDF5 1.10 runs that below 100 MB/s),
// with a chunk cache sized to hold a run's chunks. HDF5 itself is not thread-safe here, so
// H5Dread calls are serialised; pread calls are not.
//
// With `mpio`, the file is opened through MPI-IO (H5Pset_fapl_mpio on MPI_COMM_WORLD; the
// program must have called MPI_Init) and every read is an H5Dread with an independent or
// collective transfer; collective reads must be called by every rank the same number of times.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "solar/storage/dataset_files.h"
#include "solar/storage/sample_source.h"

namespace solar::storage {

struct Hdf5Options {
  std::string label_dataset = "/label";  // "" = no labels; a missing one is not an error
  unsigned io_threads = 8;
  std::uint64_t request_bytes = 8ULL << 20;  // largest single pread
  std::uint64_t chunk_cache_bytes = 0;       // 0: room for 8 chunks (at least 64 MiB)
  bool mpio = false;
  bool collective = false;                   // with mpio: collective transfers
  // Raw (contiguous or whole-sample chunk) reads with O_DIRECT: no page cache, no kernel copy
  // (2x the cold random-read throughput measured here). Where the file system refuses O_DIRECT
  // the reads stay buffered.
  bool direct = false;
  // After each read, besides the open file (check_unchanged), its path (check_path): a file
  // moved over it, renamed away or deleted stops the reader, which then never reads on from a
  // file the job's other readers can no longer open. Off for the transparent agent, whose
  // unmodified ranks read whatever the path holds themselves.
  bool check_path = true;
  // Raw reads: requested pieces at most this many bytes apart in the file are read as one
  // request, the gap read and dropped (up to request_bytes a request). For storage bound by
  // requests (IOPS) rather than bytes, where another request costs more than the gap's bytes:
  // about latency x bandwidth. 0: every piece its own request.
  std::uint64_t read_gap = 0;
  // The whole array is one sample (a dataset of one file per sample: CosmoFlow's `split`):
  // samples() is 1, the sample shape is the array's shape, and the labels array is its label.
  bool whole = false;
};

class Hdf5Source : public SampleSource, public DatasetFiles {
 public:
  // Opens `dataset` in `path`. Throws StorageError naming the file or dataset when it is
  // missing, unreadable, truncated, or not an array of samples (rank < 1).
  static std::unique_ptr<Hdf5Source> open(const std::string& path, const std::string& dataset,
                                          const Hdf5Options& options = {});
  ~Hdf5Source() override;

  const DatasetInfo& info() const override;
  void read(std::span<const SampleRun> runs, std::byte* dst) override;
  void read_labels(std::span<const SampleRun> runs, std::byte* dst) override;
  void read_stored(std::span<const SampleRun> runs, std::byte* dst, std::uint64_t stride) override;
  void drop_cache() override;  // posix_fadvise(DONTNEED) on the file
  std::uint64_t requests() const override;  // raw reads' preads (not HDF5's own reads)
  std::string describe() const override;
  // The file's inode, size and mtime when it was opened. A read after the file changed in
  // place (another size or mtime) throws StorageError instead of returning its bytes; a file
  // moved over the path does not matter to an open source (it keeps reading the one it opened).
  const std::string& identity() const override;
  // Throws StorageError naming the file when it changed in place since it was opened (size,
  // modification time, and change time while the link count is the one at open: a rewrite
  // that restores the mtime still moves the ctime; so do chmod and chown, refused alike).
  void check_unchanged() const;
  // Throws StorageError naming the file when its path no longer names the file opened:
  // another file moved over it, nothing there (renamed away, deleted), or it was deleted.
  void check_path() const;
  // fstat of the file at open (identity() is made of it).
  const struct ::stat& opened_stat() const;
  // DatasetFiles: the one file, sample 0 first. check_file(0, path): check_unchanged(), and
  // with `path` check_path().
  const DatasetFiles* file_set() const override { return this; }
  std::span<const DatasetFile> files() const override;
  void check_file(std::size_t i, bool path = true) const override;

  const std::string& path() const;
  // File offset of sample 0 when the samples lie in the file as raw bytes (contiguous,
  // unfiltered, native byte order); empty otherwise.
  std::uint64_t direct_reads() const;  // raw reads done with O_DIRECT (Hdf5Options::direct)
  std::optional<std::uint64_t> raw_offset() const;
  // File offset of sample i's bytes when samples lie in the file as raw bytes (contiguous, or
  // unfiltered chunks holding whole samples); empty otherwise.
  std::optional<std::uint64_t> sample_offset(std::uint64_t i) const;

  struct Impl;

 private:
  explicit Hdf5Source(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace solar::storage

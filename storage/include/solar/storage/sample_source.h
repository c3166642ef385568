// SPDX-License-Identifier: Apache-2.0
// SampleSource: the one interface every storage backend implements. A dataset is N samples of
// equal shape and dtype (the first dimension of an HDF5 dataset indexes samples), with an
// optional label per sample. Reads take a list of index runs and fill caller memory.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace solar::storage {

// Anything that went wrong reading or opening storage. The message names the source (file,
// dataset, server) and what to do about it.
class StorageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DType : std::uint8_t { int8, uint8, int16, uint16, int32, uint32, int64, uint64,
                                  float32, float64 };
std::string_view to_string(DType t);
std::optional<DType> parse_dtype(std::string_view s);  // "int16", "float32", ...
std::size_t dtype_size(DType t);

// Samples [first, first + count).
struct SampleRun {
  std::uint64_t first = 0;
  std::uint64_t count = 0;
  bool operator==(const SampleRun&) const = default;
};

// Coalesces sample ids (any order, duplicates allowed) into sorted maximal runs.
std::vector<SampleRun> coalesce(std::vector<std::uint64_t> ids);
std::uint64_t total_samples(std::span<const SampleRun> runs);

// The content `solar gen` writes (content.h): random bytes, or sparse ones that compress as
// a CosmoFlow-like volume does (mostly empty voxels).
enum class Content : std::uint8_t { random, sparse };

struct DatasetInfo {
  std::uint64_t samples = 0;                // N
  std::vector<std::uint64_t> sample_shape;  // shape of one sample (dataset shape without dim 0)
  DType dtype = DType::uint8;
  std::uint64_t sample_bytes = 0;
  bool has_labels = false;                  // one label per sample (e.g. /label)
  DType label_dtype = DType::int32;
  std::uint64_t label_bytes = 0;            // bytes of one sample's label
  std::optional<std::uint64_t> seed;        // content seed when written by `solar gen`
  Content content = Content::random;        // and which of its contents (content.h)
  // Written by `solar gen` as one file of many: the global id of this file's first sample
  // (attribute solar_first); a dataset of many files keeps `seed` only when every file's is
  // its place in the dataset.
  std::optional<std::uint64_t> generated_first;
  std::string layout;                       // contiguous, chunked, gzip, ... (for people)
  // Whole-file samples (dataset_files.h): each sample is one file's bytes, of its own size
  // (sample_bytes: the largest; shape {sample_bytes} of uint8). They are read only as stored
  // (read_stored: each file's bytes at a stride, zero-padded), which is what the transparent
  // mode serves; read() refuses them (a sample's length has no place in a batch yet).
  bool whole_files = false;

  std::string shape_string() const;         // "4x128x128x128"
};

// Throws StorageError when a run is empty-sized or reaches past the dataset.
void check_runs(const DatasetInfo& info, std::span<const SampleRun> runs,
                std::string_view source);

class DatasetFiles;  // dataset_files.h

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual const DatasetInfo& info() const = 0;

  // Reads the samples of `runs`, in the order given, back to back into `dst`
  // (total_samples(runs) * info().sample_bytes bytes). Safe to call from several threads at
  // once; each call keeps enough requests in flight to saturate the storage. On failure throws
  // StorageError and the contents of `dst` are unspecified (never silently wrong).
  virtual void read(std::span<const SampleRun> runs, std::byte* dst) = 0;

  // Same for labels (info().label_bytes per sample). Throws when the dataset has no labels.
  virtual void read_labels(std::span<const SampleRun> runs, std::byte* dst) = 0;

  // The samples' bytes as they lie in their files, not decoded: each sample's stored extent
  // (DatasetFile::stored_extent: a compressed chunk as written, or a raw sample) at
  // dst + i * stride, in the order given; stride at least the longest extent (the rest of each
  // stride is zeroed). What the transparent mode serves to a program that decodes them itself
  // (h5py decompressing the chunks). Throws StorageError for a source whose extents are not
  // known (solar-stored, layouts HDF5 alone reads).
  virtual void read_stored(std::span<const SampleRun> runs, std::byte* dst, std::uint64_t stride);

  // Requests this source made to its storage so far (a file's preads, with read_gap several
  // runs in one); 0 where it does not count them.
  virtual std::uint64_t requests() const { return 0; }

  // Best effort: make the next reads come from the device, not a page cache (for benchmarks).
  virtual void drop_cache() {}

  // "file.h5:/data", "fabric://host:port/name": what this source reads, for messages.
  virtual std::string describe() const = 0;

  // What the data is, not where: for a file "file inode I size S mtime T" (the inode, size and
  // modification time of the file this source opened: equal on every node of a cluster file
  // system, different after `mv` of another file over the path or a rewrite in place); for a
  // storage server the export's identity. A plan records it (Plan::dataset_identity) and
  // every reader opens with SourceOptions::expect_identity, so no reader mixes another file's
  // bytes into a run.
  virtual const std::string& identity() const = 0;

  // The files the samples lie in (dataset_files.h), for file-backed sources; nullptr for
  // solar-stored.
  virtual const DatasetFiles* file_set() const { return nullptr; }
};

// "file inode I size S mtime SEC.NSEC": a file's identity (no device number: it differs between
// the nodes that mount one cluster file system).
std::string file_identity(const struct ::stat& st);

// Throws StorageError naming the source when `source` is not `expected` (non-empty): the
// dataset was replaced or rewritten after the plan was computed.
void check_identity(const SampleSource& source, const std::string& expected);

struct SourceOptions {
  unsigned io_threads = 8;              // parallel requests per read() for files
  std::string label_dataset = "/label"; // HDF5 labels dataset ("" = none)
  unsigned queue_depth = 16;            // fabric reads in flight
  double timeout_s = 30;                // fabric: a read with no progress this long fails
  double reconnect_s = -1;              // fabric: seconds to reconnect after the server is
                                        // lost; < 0: $SOLAR_STORED_RECONNECT, else 30
  std::string token;                    // fabric: shared token (else $SOLAR_STORED_TOKEN)
  std::string provider;                 // fabric: override (normally the server's)
  bool wait_for_server = false;         // fabric: see FabricOptions::wait_for_server
  bool direct = false;                  // files: O_DIRECT reads (see Hdf5Options::direct)
  std::string expect_identity;          // non-empty: refuse any other data (check_identity)
  // files: each read also checks that the path still names the file opened (see
  // Hdf5Options::check_path)
  bool check_path = true;
  std::uint64_t read_gap = 0;  // files: see Hdf5Options::read_gap
  // Many files: the dataset index to read instead of listing and checking every file
  // (dataset_files.h); empty: $SOLAR_DATASET_INDEX, else scan. One made for another spec or
  // labels is ignored (scanned again).
  std::string index_path;
  // Many files: at most this many files open at once per source (0: 64, fewer where
  // RLIMIT_NOFILE is low).
  unsigned max_open_files = 0;
};

// Opens "FILE.h5:/dataset" (dataset defaults to /data), many files (a directory, a glob or
// @LIST, each with :/name: dataset_files.h) or "fabric://HOST:PORT/NAME", and checks
// options.expect_identity when given.
std::unique_ptr<SampleSource> open_source(std::string_view spec, const SourceOptions& options = {});

}  // namespace solar::storage

// SPDX-License-Identifier: Apache-2.0
// The files a dataset's samples lie in. A dataset spec names one HDF5 file (FILE.h5[:/name]) or
// many: a directory (every HDF5 file below it, recursively: *.h5, *.hdf5, *.hdf, *.he5), a glob
// ('train/*/*.hdf5') or @LIST (a text file of paths, one a line), each with `:/name` for the
// array in every file. Sample ids are global: the files in sorted path order (a list keeps its
// own order), then the index within each file.
//
// Whole-file samples: a glob or @LIST without `:/name` whose first file is not HDF5 ('npz/*.npz',
// '@images.txt', 'shards/*'): every file is one sample, its whole bytes (numpy's .npy/.npz, JPEG,
// anything), of its own size; no labels (the script's come from its own files). They are served
// as they lie in the files (DatasetFile::stored_extent is {0, size}), so only the transparent
// mode reads them; a directory names HDF5 files only (name other files with a glob).
//
// What one sample of a file is: in a single file, and with `[]` after the array's name
// (`dlio/:/records[]`), the array's first dimension indexes samples (N x sample shape, N may
// differ between files); without it, in a dataset of many files each file's whole array is one
// sample (the SOLAR artifact's CosmoFlow `split`, DeepCAM's `climate/data`).
//
// Listing and checking many files is done once: the result, a DatasetIndex, is written to an
// index file (write_index) that every agent and rank reads instead of scanning again
// ($SOLAR_DATASET_INDEX or SourceOptions::index_path). Readers never trust it blindly: each file
// is checked against its entry (inode, size, modification and change time) when it is opened
// and again after it is read, so no reader ever hands out another file's bytes.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "solar/storage/sample_source.h"

namespace solar::storage {

// Labels of at most this many bytes a file are kept in the index (DatasetFile::labels).
inline constexpr std::uint64_t kIndexLabelBytes = 4096;

// One file of a dataset, as indexed.
struct DatasetFile {
  std::string path;
  // Its stat when it was indexed (dev is this host's: it differs between the nodes that mount a
  // cluster file system, so it is not part of any identity compared between hosts).
  std::uint64_t dev = 0, ino = 0, size = 0;
  std::int64_t mtime_ns = 0, ctime_ns = 0;
  std::uint64_t first = 0;  // global id of the file's first sample
  std::uint64_t count = 0;  // samples in this file
  // Where the samples' bytes lie, when they lie in the file as raw bytes: contiguous at
  // data_offset + k * sample_bytes, or (unfiltered chunks of whole samples) at
  // sample_offsets[k]. Neither (compressed, filtered, other byte order): read through HDF5.
  std::optional<std::uint64_t> data_offset;
  std::vector<std::uint64_t> sample_offsets;
  // Filtered chunks of one sample each (gzip, shuffle+gzip, lzf, ...): where each sample's
  // chunk lies and its stored length, as HDF5's chunk index says. Its bytes are not the
  // sample's (a reader decodes them), but they are what a program reading the file gets: the
  // transparent mode serves them from memory as they are.
  std::vector<std::uint64_t> stored_offsets, stored_lengths;
  // Its samples' labels (count * label_bytes), kept in the index when they are small (at most
  // kIndexLabelBytes a file: CosmoFlow's unitPar, DLIO's labels): then no reader goes to the
  // file for them, which on storage bound by requests would halve the samples read. Empty:
  // read through HDF5 (or the dataset has no labels).
  std::vector<std::byte> labels;

  bool raw() const { return data_offset.has_value() || !sample_offsets.empty(); }
  bool stored() const { return !stored_lengths.empty(); }
  // Local sample k's bytes in the file as they lie there, {offset, length}: the raw sample, or
  // its stored chunk. Only for raw() or stored() files.
  std::pair<std::uint64_t, std::uint64_t> stored_extent(std::uint64_t k,
                                                        std::uint64_t sample_bytes) const {
    if (stored()) return {stored_offsets[k], stored_lengths[k]};
    return {sample_offset(k, sample_bytes), sample_bytes};
  }
  // File offset of local sample k's bytes (raw() only).
  std::uint64_t sample_offset(std::uint64_t k, std::uint64_t sample_bytes) const {
    return data_offset ? *data_offset + k * sample_bytes : sample_offsets[k];
  }
  // The stat fields above, from `st`.
  void set_stat(const struct ::stat& st);
  // Empty when `st` is the file indexed (same inode, size, mtime and ctime), else what differs,
  // for a message ("size 4096 -> 0").
  std::string differs(const struct ::stat& st) const;
};

// A file-backed source's files. SampleSource::file_set() returns it for HDF5 sources (one file
// for FILE.h5, many for a directory, glob or list) and nothing for solar-stored.
class DatasetFiles {
 public:
  virtual ~DatasetFiles() = default;
  // Sorted by `first` (global sample order); together they cover [0, info().samples).
  virtual std::span<const DatasetFile> files() const = 0;
  // Throws StorageError naming the file when file i is no longer the file indexed: its path
  // holds another file or nothing, or (while it is open) it changed in place. `path`: also
  // check the path (a single open file may be checked without).
  virtual void check_file(std::size_t i, bool path = true) const = 0;
};

// The index of a dataset of many files: what a listing found, and what every file holds.
struct DatasetIndex {
  std::string spec;                  // the spec it was made for, as given
  std::string dataset;               // the array's name in every file ("/split")
  bool rows = false;                 // `[]`: the array's first dimension indexes samples
  bool whole_files = false;          // every file one sample, its whole bytes (dataset unused)
  std::string label_dataset;         // "" = no labels
  DatasetInfo info;                  // N = all files' samples together
  std::vector<DatasetFile> files;
  std::string identity;              // "files F samples N index HHHHHHHHHHHHHHHH"
};

// Lists and checks the files `spec` names (a directory, a glob or @LIST, with :/name and an
// optional `[]`). Every file must hold the array with the same sample shape and dtype (and the
// same labels); the first file that differs, is missing, unreadable or not HDF5 is refused with
// a StorageError naming it and what differs. `progress(done, total)` is called now and then.
// With `previous` (an index of the same spec and labels), a file whose stat is still the one
// indexed there is taken from it without opening it (a stat instead of an HDF5 open).
DatasetIndex scan_dataset(std::string_view spec, const std::string& label_dataset,
                          const std::function<void(std::uint64_t, std::uint64_t)>& progress = {},
                          const DatasetIndex* previous = nullptr);

// scan_dataset with the user's index cache: the index of the last scan of this spec (and
// labels, and working directory for a relative spec) in $SOLAR_INDEX_CACHE, else
// $XDG_CACHE_HOME/solar, else ~/.cache/solar ("none": no cache), is the `previous` one, and
// the new index replaces it. What launchers (solar run, srun's dataset-info) call: a job over
// the same files again costs a stat a file.
DatasetIndex index_dataset(std::string_view spec, const std::string& label_dataset,
                           const std::function<void(std::uint64_t, std::uint64_t)>& progress = {});
// Where index_dataset keeps the index of `spec` ("" when there is no cache).
std::string index_cache_path(std::string_view spec, const std::string& label_dataset);

// True when `spec` names many files (a directory, a glob, @LIST), not one file or a server.
// Stats the path (a directory is told from a file only so).
bool names_many_files(std::string_view spec);

// The transparent mode over filtered chunks: the bytes a buffer slot takes for any sample as it
// lies in its file (the longest stored chunk, and S for files whose samples are raw), when some
// file of `source` has filtered chunks of one sample (DatasetFile::stored); 0 when none has
// (every sample is served as its S raw bytes, or the source has no files).
std::uint64_t stored_sample_bytes(const SampleSource& source);
// The same per sample: each sample's bytes as they lie in its file, by global id (a filtered
// chunk's stored length, a whole file's size, S for a raw sample); empty when
// stored_sample_bytes is 0 or every sample has that one size (slots of it serve them). What a
// buffer of byte-sized samples holds in the transparent mode.
std::vector<std::uint64_t> stored_sample_sizes(const SampleSource& source);

// Writes `index` to `path` atomically (text: a header, then one line per file). Throws
// StorageError when it cannot.
void write_index(const DatasetIndex& index, const std::string& path);
// Reads an index file. Throws StorageError naming the file when it is unreadable, malformed,
// or was made for another spec or labels (then scan again).
DatasetIndex read_index(const std::string& path, std::string_view spec,
                        const std::string& label_dataset);

// A source over the files of `index`: reads raw samples with pread (a bounded number of files
// open at once, several requests in flight), others through HDF5, and checks every file
// against its entry around each read.
std::unique_ptr<SampleSource> open_files_source(DatasetIndex index, const SourceOptions& options);

}  // namespace solar::storage

// SPDX-License-Identifier: Apache-2.0
// Writing generated datasets (`solar gen`): one HDF5 file (/data with N samples, /label with one
// int32 each), or a directory of many files in the layouts of real workloads. Every sample's
// bytes are content::fill_sample(seed, global id, content) and its label content::fill_label(seed, global
// id), the global id counting the files in sorted path order, then the samples within each, so
// any reader can check what it got. Every data array carries the attributes solar_generator,
// solar_seed and solar_first (the global id of its file's first sample).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "solar/storage/sample_source.h"

namespace solar::storage {

// How an array is stored in its file.
enum class Layout : std::uint8_t { contiguous, chunked, gzip };
std::string_view to_string(Layout l);

// Which files a dataset is, and what each holds.
enum class FilesLayout : std::uint8_t {
  single,            // OUT: /data (N x shape), /label (int32, N)
  // The SOLAR artifact's CosmoFlow (Cosmoflow/utils/preprocess_dataset.py): universes of 64
  // samples, `universes_per_dir` universes a subfolder, one sample a file:
  // OUT/DDD/univUUUU_KKK.hdf5 with /split (shape) and /unitPar (float32, 4).
  per_sample_files,
  // MLPerf HPC DeepCAM: OUT/data-IIIIII.h5, one sample a file: /climate/data (shape, H x W x C)
  // and /climate/labels_0 (int32, H x W).
  deepcam,
  // DLIO / MLPerf Storage: OUT/img_I_of_F.hdf5 (DLIO's names, I zero-padded), rows of samples:
  // /records (n x shape) and /labels (int64, n); the last file shorter when the samples do
  // not divide.
  dlio,
};
std::string_view to_string(FilesLayout l);

struct GenSpec {
  std::string path;                    // the file (single) or the directory (the others)
  std::uint64_t samples = 0;
  std::vector<std::uint64_t> shape = {4, 128, 128, 128};  // one sample
  DType dtype = DType::int16;
  Layout layout = Layout::contiguous;  // chunked and gzip: one sample per chunk
  std::uint64_t seed = 0;
  Content content = Content::random;   // sparse: compressible (content.h), for --layout gzip
  bool force = false;                  // replace an existing file or generated directory
  FilesLayout files = FilesLayout::single;
  std::uint64_t file_count = 0;         // dlio: files (0: from samples_per_file)
  std::uint64_t samples_per_file = 0;   // dlio: samples a file (0: samples / file_count, up)
  std::uint64_t universes_per_dir = 64; // per_sample_files: universes a subfolder
};

// The arrays every file of `spec`'s layout holds.
struct GenArrays {
  std::string data;                        // "/data", "/split", "/climate/data", "/records"
  bool rows = true;                        // the data array's first dimension indexes samples
  std::string labels;                      // "/label", "/unitPar", ...
  DType label_dtype = DType::int32;
  std::vector<std::uint64_t> label_shape;  // one sample's label ({}: one value)
  std::uint64_t label_bytes() const;
};
GenArrays gen_arrays(const GenSpec& spec);

// One file of a generated dataset: its path below spec.path ("" for the single file) and the
// global ids of its samples, [first, first + count).
struct GenFile {
  std::string path;
  std::uint64_t first = 0, count = 0;
};
// The files `spec` makes, in global order, which is also their sorted path order (the names are
// zero-padded). Throws StorageError naming the option when the numbers do not fit the layout
// (dlio: --files and --samples-per-file that leave a file empty).
std::vector<GenFile> gen_files(const GenSpec& spec);

// The arguments a reader of the dataset is given: --dataset ("OUT.h5", "OUT/:/split",
// "OUT/:/records[]") and --labels ("/label", "/unitPar").
std::string dataset_spec(const GenSpec& spec);

// Bytes the dataset will take on disk (data, labels and an estimate of each file's HDF5
// metadata).
std::uint64_t dataset_bytes(const GenSpec& spec);

// Writes the dataset atomically: every file to a temporary renamed when complete, and a
// directory as a whole (written beside it and moved into place at the end), so a dataset that
// is there is complete. With `force` it replaces an existing file, or a directory that holds
// only HDF5 files and folders. Throws StorageError when the path exists without `force`, the
// disk lacks the space, or a write fails (leaving nothing behind).
// `progress(done, total)` is called after each block of samples.
void write_dataset(const GenSpec& spec,
                   const std::function<void(std::uint64_t, std::uint64_t)>& progress = {});

}  // namespace solar::storage

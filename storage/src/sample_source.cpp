// SPDX-License-Identifier: Apache-2.0
// Opening a source by its spec (HDF5 file or solar-stored). The plain types it uses (dtypes,
// runs, their checks) are in sample_types.cpp, which needs no HDF5 or libfabric.
#include "solar/storage/sample_source.h"

#include <fmt/format.h>

#include <cstdlib>
#include <sys/stat.h>

#include "solar/dataset_spec.h"
#include "solar/storage/dataset_files.h"
#include "solar/storage/fabric_source.h"
#include "solar/storage/hdf5_source.h"

namespace solar::storage {

void SampleSource::read_stored(std::span<const SampleRun>, std::byte*, std::uint64_t) {
  throw StorageError(fmt::format("{}: its samples' stored bytes are not known to solar (only "
                                 "the HDF5 files of a FILE.h5, directory, glob or list source, "
                                 "raw or of one chunk a sample, have them)",
                                 describe()));
}

void check_identity(const SampleSource& source, const std::string& expected) {
  if (expected.empty() || source.identity() == expected) return;
  throw StorageError(fmt::format(
      "{}: this is not the dataset the plan was computed for (the plan has {}, this is {}): "
      "the file was replaced or rewritten after the job started, and solar refuses to mix "
      "another dataset's bytes into training; restore the original file or start the job again",
      source.describe(), expected, source.identity()));
}

namespace {
std::unique_ptr<SampleSource> open_unchecked(std::string_view spec, const SourceOptions& o) {
  using Kind = protocol::DatasetSpec::Kind;
  const protocol::DatasetSpec parsed = protocol::parse_dataset_spec(spec);
  if (parsed.kind == Kind::fabric) {
    FabricOptions f;
    f.queue_depth = o.queue_depth;
    f.timeout_s = o.timeout_s;
    f.reconnect_s = o.reconnect_s;
    f.wait_for_server = o.wait_for_server;
    f.token = o.token;
    f.provider = o.provider;
    return FabricSource::connect(std::string(spec), f);
  }
  if (parsed.kind == Kind::unknown_scheme)
    throw StorageError(fmt::format("source '{}': unknown scheme; use FILE.h5:/dataset or "
                                   "fabric://HOST:PORT/NAME",
                                   spec));
  if (parsed.kind == Kind::no_file)
    throw StorageError(fmt::format("source '{}': no file; use FILE.h5:/dataset", spec));
  if (names_many_files(spec)) {
    // The index the launcher wrote, when there is one for this spec and these labels; else
    // list and check every file here.
    std::string index = o.index_path;
    if (index.empty())
      if (const char* env = std::getenv("SOLAR_DATASET_INDEX")) index = env;
    struct stat st {};
    if (!index.empty() && ::stat(index.c_str(), &st) == 0) {
      try {
        return open_files_source(read_index(index, spec, o.label_dataset), o);
      } catch (const StorageError&) {
        // made for another spec or labels, or damaged: the scan below decides
      }
    }
    return open_files_source(scan_dataset(spec, o.label_dataset), o);
  }
  Hdf5Options h;
  h.io_threads = o.io_threads;
  h.label_dataset = o.label_dataset;
  h.direct = o.direct;
  h.check_path = o.check_path;
  h.read_gap = o.read_gap;
  return Hdf5Source::open(parsed.where.file, parsed.where.dataset, h);
}
}  // namespace

std::unique_ptr<SampleSource> open_source(std::string_view spec, const SourceOptions& o) {
  auto src = open_unchecked(spec, o);
  check_identity(*src, o.expect_identity);
  return src;
}

}  // namespace solar::storage

// SPDX-License-Identifier: Apache-2.0
// Each sample's bytes as they lie in its file (dataset_files.h): in solar_storage_base, so that
// libsolar, which reads whole-file samples' lengths from its source but links no storage
// backend, has them too.
#include <algorithm>
#include <functional>

#include "solar/storage/dataset_files.h"

namespace solar::storage {

std::uint64_t stored_sample_bytes(const SampleSource& source) {
  const DatasetFiles* set = source.file_set();
  if (!set) return 0;
  std::uint64_t most = 0;
  bool any = false;
  for (const DatasetFile& f : set->files()) {
    if (f.stored()) {
      any = true;
      for (std::uint64_t len : f.stored_lengths) most = std::max(most, len);
    } else {
      most = std::max(most, source.info().sample_bytes);
    }
  }
  return any ? most : 0;
}

std::vector<std::uint64_t> stored_sample_sizes(const SampleSource& source) {
  std::vector<std::uint64_t> sizes;
  if (stored_sample_bytes(source) == 0) return sizes;
  const std::uint64_t S = source.info().sample_bytes;
  sizes.resize(source.info().samples, S);
  for (const DatasetFile& f : source.file_set()->files())
    if (f.stored())
      for (std::uint64_t k = 0; k < f.count; ++k) sizes.at(f.first + k) = f.stored_lengths.at(k);
  if (std::adjacent_find(sizes.begin(), sizes.end(), std::not_equal_to<>()) == sizes.end())
    sizes.clear();  // one size
  return sizes;
}

}  // namespace solar::storage

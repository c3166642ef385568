// Writing generated datasets (`solar gen`): /data with N samples of a given shape and dtype,
// /label with one int32 per sample, both filled by content.h so any reader can check them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "solar/storage/sample_source.h"

namespace solar::storage {

enum class Layout : std::uint8_t { contiguous, chunked, gzip };
std::string_view to_string(Layout l);

struct GenSpec {
  std::string path;
  std::uint64_t samples = 0;
  std::vector<std::uint64_t> shape = {4, 128, 128, 128};  // one sample
  DType dtype = DType::int16;
  Layout layout = Layout::contiguous;  // chunked and gzip: one sample per chunk
  std::uint64_t seed = 0;
  bool force = false;                  // replace an existing file
};

// Bytes the file will take (data and labels; HDF5 metadata not counted).
std::uint64_t dataset_bytes(const GenSpec& spec);

// Writes the file atomically (a temporary beside it, renamed at the end). Throws StorageError
// when the file exists without `force`, the disk lacks the space, or a write fails.
// `progress(done, total)` is called after each block of samples.
void write_dataset(const GenSpec& spec,
                   const std::function<void(std::uint64_t, std::uint64_t)>& progress = {});

}  // namespace solar::storage

// SPDX-License-Identifier: Apache-2.0
// Hdf5Source::Impl, shared by the files that implement Hdf5Source: hdf5_source.cpp (open,
// metadata, the checks that the file is still the one opened) and hdf5_reads.cpp (reading runs
// of samples: pread of raw bytes, O_DIRECT, H5Dread, retries).
#pragma once

#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "hdf5_util.h"
#include "io_pool.h"
#include "solar/storage/hdf5_source.h"

namespace solar::storage {

// A failed read (EIO, ESTALE, ...) is tried this many times in all, pausing 50, 100, 200 ms
// between tries (0.35 s in all), before the error is reported.
constexpr unsigned kReadAttempts = 4;
constexpr std::chrono::milliseconds kRetryPause{50};

struct Hdf5Source::Impl {
  std::string path, dataset;
  Hdf5Options options;
  DatasetInfo info;
  h5::Handle file, dset, space, dxpl;
  hid_t mem_type = -1;
  std::vector<hsize_t> dims;
  std::optional<std::uint64_t> raw_offset;  // contiguous: file offset of sample 0
  // Unfiltered chunks holding whole samples: file offset of each chunk, read with pread too.
  std::vector<std::uint64_t> chunk_addr;
  std::uint64_t samples_per_chunk = 0;
  int fd = -1;
  int direct_fd = -1;  // O_DIRECT twin of fd, or -1
  std::atomic<std::uint64_t> direct_reads{0};
  std::atomic<std::uint64_t> requests{0};  // read_exact calls: requests to the storage
  std::vector<std::byte> labels;  // all labels, read once at open (small)
  DatasetFile entry;              // the DatasetFiles view: this one file
  std::string identity;
  struct stat opened {};  // fstat of fd at open
  // The link count and change time check_unchanged compares with: opened's, until a link
  // count moves (a rename over the path, a hard link), which moves the ctime with it.
  mutable std::mutex seen_mu;
  mutable nlink_t nlink_seen = 0;
  mutable struct timespec ctime_seen {};

  // Throws when the open file is no longer what was opened (rewritten in place, truncated).
  void check_unchanged() const;
  void check_path() const;
  std::unique_ptr<IoPool> pool;

  std::string where() const { return fmt::format("{}:{}", path, dataset); }

  ~Impl() {
    std::lock_guard g(h5::lock());
    dxpl.reset();
    space.reset();
    dset.reset();
    file.reset();
    if (fd >= 0) ::close(fd);
    if (direct_fd >= 0) ::close(direct_fd);
  }

  bool raw() const { return raw_offset.has_value() || samples_per_chunk > 0; }
  std::uint64_t file_offset(std::uint64_t sample) const {
    if (raw_offset) return *raw_offset + sample * info.sample_bytes;
    return chunk_addr[sample / samples_per_chunk] + (sample % samples_per_chunk) * info.sample_bytes;
  }
  void read_raw(std::span<const SampleRun> runs, std::byte* dst);
  void read_exact(std::uint64_t off, std::uint64_t len, std::byte* out);
  bool read_direct(std::uint64_t off, std::uint64_t len, std::byte* out);
  void read_h5(std::span<const SampleRun> runs, std::byte* dst);
};
}  // namespace solar::storage

// SPDX-License-Identifier: Apache-2.0
// Hdf5Source's reads: runs of samples from the file into memory. Raw layouts (contiguous, or
// unfiltered chunks of whole samples) are pread in coalesced pieces on the I/O pool, O_DIRECT
// when asked, nearby pieces merged into one request on request-bound storage (read_gap); other
// layouts go through H5Dread, one hyperslab per run. I/O errors are retried, then reported.
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "direct_io.h"
#include "hdf5_source_impl.h"
#include "hdf5_util.h"
#include "io_pool.h"

namespace solar::storage {

void Hdf5Source::Impl::read_raw(std::span<const SampleRun> runs, std::byte* dst) {
  struct Piece {
    std::uint64_t file_off, len;
    std::byte* out;
  };
  std::vector<Piece> pieces;
  const std::uint64_t sb = info.sample_bytes;
  const std::uint64_t max = std::max<std::uint64_t>(options.request_bytes, sb ? sb : 1);
  std::byte* out = dst;
  auto add = [&](std::uint64_t off, std::uint64_t left) {
    if (!pieces.empty() && pieces.back().file_off + pieces.back().len == off &&
        pieces.back().len + left <= max) {  // adjacent in the file and in memory
      pieces.back().len += left;
      out += left;
      return;
    }
    while (left) {
      const std::uint64_t n = std::min(left, max);
      pieces.push_back({off, n, out});
      off += n;
      out += n;
      left -= n;
    }
  };
  for (const auto& r : runs) {
    if (raw_offset) {
      add(file_offset(r.first), r.count * sb);
    } else {
      for (std::uint64_t i = r.first; i < r.first + r.count;) {
        const std::uint64_t in_chunk = std::min(r.first + r.count - i,
                                                samples_per_chunk - i % samples_per_chunk);
        add(file_offset(i), in_chunk * sb);
        i += in_chunk;
      }
    }
  }
  if (options.read_gap == 0 || pieces.size() < 2) {
    pool->run(pieces.size(), [&](std::size_t i) {
      read_exact(pieces[i].file_off, pieces[i].len, pieces[i].out);
    });
    return;
  }
  // Request-bound storage: pieces no more than read_gap apart in the file are one request,
  // the bytes between them read and dropped (a request saved costs more than the gap).
  std::vector<std::size_t> order(pieces.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return pieces[a].file_off < pieces[b].file_off; });
  std::vector<std::pair<std::size_t, std::size_t>> groups;  // [begin, end) of `order`
  for (std::size_t i = 0; i < order.size();) {
    const std::uint64_t first = pieces[order[i]].file_off;
    std::uint64_t end = first + pieces[order[i]].len;
    std::size_t j = i + 1;
    for (; j < order.size(); ++j) {
      const Piece& q = pieces[order[j]];
      if (q.file_off < end || q.file_off - end > options.read_gap ||
          q.file_off + q.len - first > max)
        break;
      end = q.file_off + q.len;
    }
    groups.emplace_back(i, j);
    i = j;
  }
  pool->run(groups.size(), [&](std::size_t g) {
    const auto [b, e] = groups[g];
    const Piece& head = pieces[order[b]];
    if (e - b == 1) return read_exact(head.file_off, head.len, head.out);
    const Piece& tail = pieces[order[e - 1]];
    thread_local std::vector<std::byte> span;
    span.resize(tail.file_off + tail.len - head.file_off);
    read_exact(head.file_off, span.size(), span.data());
    for (std::size_t k = b; k < e; ++k) {
      const Piece& p = pieces[order[k]];
      std::memcpy(p.out, span.data() + (p.file_off - head.file_off), p.len);
    }
  });
}

// [off, off + len) of the file into `out`: O_DIRECT when open (and the kernel takes it), else
// pread, retried on I/O errors. One storage request (counted in `requests`).
void Hdf5Source::Impl::read_exact(std::uint64_t off, std::uint64_t len, std::byte* out) {
  ++requests;
  if (direct_fd >= 0 && read_direct(off, len, out)) return;
  std::uint64_t done = 0;
  for (unsigned attempt = 1;;) {
    const ssize_t n = ::pread(fd, out + done, len - done, static_cast<off_t>(off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      // An I/O error (EIO: a bad disk or a storage server's hiccup; ESTALE: the file gone on
      // NFS) is retried a few times with a growing pause, then reported with the file and
      // the offset: a read never hangs and never returns what it did not read.
      const int err = errno;
      if (attempt < kReadAttempts) {
        std::this_thread::sleep_for(kRetryPause * (1U << (attempt - 1)));
        ++attempt;
        continue;
      }
      throw StorageError(fmt::format("{}: read of {} bytes at offset {} failed ({} attempts): "
                                     "{}",
                                     where(), len - done, off + done, attempt,
                                     std::strerror(err)));
    }
    if (n == 0)
      throw StorageError(fmt::format("{}: the file ended at offset {} (truncated?)", where(),
                                     off + done));
    done += static_cast<std::uint64_t>(n);
    if (done == len) return;
  }
}

bool Hdf5Source::Impl::read_direct(std::uint64_t off, std::uint64_t len, std::byte* out) {
  if (!storage::read_direct(direct_fd, off, len, out)) return false;
  ++direct_reads;
  return true;
}

bool read_direct(int direct_fd, std::uint64_t off, std::uint64_t len, std::byte* out) {
  constexpr std::uint64_t kAlign = 4096;
  struct Bounce {
    std::byte* p = nullptr;
    std::uint64_t cap = 0;
    ~Bounce() { std::free(p); }
  };
  thread_local Bounce bounce;
  const std::uint64_t a = off / kAlign * kAlign;
  const std::uint64_t e = (off + len + kAlign - 1) / kAlign * kAlign;
  if (bounce.cap < e - a) {
    std::free(bounce.p);
    bounce.p = nullptr;
    bounce.cap = 0;
    void* m = nullptr;
    if (::posix_memalign(&m, kAlign, e - a) != 0) return false;
    bounce.p = static_cast<std::byte*>(m);
    bounce.cap = e - a;
  }
  std::uint64_t got = 0;
  while (a + got < off + len) {  // short only at the end of the file
    const ssize_t n = ::pread(direct_fd, bounce.p + got, e - a - got, static_cast<off_t>(a + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<std::uint64_t>(n);
    if (got % kAlign) break;  // the end of the file
  }
  if (a + got < off + len) return false;
  std::memcpy(out, bounce.p + (off - a), len);
  return true;
}

void Hdf5Source::Impl::read_h5(std::span<const SampleRun> runs, std::byte* dst) {
  const std::size_t rank = dims.size();
  std::vector<hsize_t> start(rank, 0), count(dims);
  std::byte* out = dst;
  for (const auto& r : runs) {
    if (!options.whole) {  // whole: the one sample is the whole array
      start[0] = r.first;
      count[0] = r.count;
    }
    for (unsigned attempt = 1;; ++attempt) {  // I/O errors retried as in read_raw
      {
        std::lock_guard g(h5::lock());
        h5::Handle fs(H5Scopy(space.get()), H5Sclose);
        H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                            nullptr);
        h5::Handle ms(H5Screate_simple(static_cast<int>(rank), count.data(), nullptr), H5Sclose);
        if (H5Dread(dset.get(), mem_type, ms.get(), fs.get(), dxpl.get(), out) >= 0) break;
        if (attempt >= kReadAttempts)
          h5::check(-1, fmt::format("{}: reading samples [{}, {}) failed ({} attempts)", where(),
                                    r.first, r.first + r.count, attempt));
      }
      std::this_thread::sleep_for(kRetryPause * (1U << (attempt - 1)));
    }
    out += r.count * info.sample_bytes;
  }
}

void Hdf5Source::read(std::span<const SampleRun> runs, std::byte* dst) {
  check_runs(impl_->info, runs, impl_->where());
  if (impl_->raw())
    impl_->read_raw(runs, dst);
  else
    impl_->read_h5(runs, dst);
  impl_->check_unchanged();  // after: a rewrite during the read is caught too
  if (impl_->options.check_path) impl_->check_path();
}

void Hdf5Source::read_labels(std::span<const SampleRun> runs, std::byte* dst) {
  if (!impl_->info.has_labels)
    throw StorageError(fmt::format("{}: the file has no labels dataset ({})", impl_->where(),
                                   impl_->options.label_dataset.empty()
                                       ? "none requested"
                                       : impl_->options.label_dataset + " not found"));
  check_runs(impl_->info, runs, impl_->where());
  const std::uint64_t lb = impl_->info.label_bytes;
  for (const auto& r : runs) {
    std::memcpy(dst, impl_->labels.data() + r.first * lb, r.count * lb);
    dst += r.count * lb;
  }
}

void Hdf5Source::drop_cache() {
  ::fdatasync(impl_->fd);
  ::posix_fadvise(impl_->fd, 0, 0, POSIX_FADV_DONTNEED);
}

}  // namespace solar::storage

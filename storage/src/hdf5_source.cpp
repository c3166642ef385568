// SPDX-License-Identifier: Apache-2.0
#include "solar/storage/hdf5_source.h"

#include <fcntl.h>
#include <hdf5.h>
#ifdef H5_HAVE_PARALLEL  // the parallel HDF5 build (libsolar uses the serial one: no MPI)
#include <mpi.h>
#endif
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <fmt/format.h>

#include "hdf5_source_impl.h"
#include "hdf5_util.h"
#include "io_pool.h"
#include "solar/storage/content.h"

namespace solar::storage {

std::unique_ptr<Hdf5Source> Hdf5Source::open(const std::string& path, const std::string& dataset,
                                             const Hdf5Options& options) {
  h5::quiet();
  auto im = std::make_unique<Impl>();
  im->path = path;
  im->dataset = dataset.empty() || dataset[0] != '/' ? "/" + dataset : dataset;
  im->options = options;

  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw StorageError(fmt::format("{}: {}; check the path (a source is FILE.h5:/dataset)",
                                   path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    throw StorageError(fmt::format("{}: not a regular file", path));
  im->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (im->fd < 0)
    throw StorageError(fmt::format("{}: cannot open for reading: {}", path, std::strerror(errno)));
  if (options.direct) im->direct_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  // No readahead on our reads (issue 15: 6.6% more bytes than planned came from the device with
  // the kernel's guess, read_ahead_kb 8192 here): samples are read where the plan says, runs
  // already coalesced, and every extra byte costs time on bandwidth-bound shared storage.
  ::posix_fadvise(im->fd, 0, 0, POSIX_FADV_RANDOM);
  ::fstat(im->fd, &im->opened);
  im->identity = file_identity(im->opened);
  im->nlink_seen = im->opened.st_nlink;
  im->ctime_seen = im->opened.st_ctim;

  std::lock_guard g(h5::lock());
  h5::Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (options.mpio) {
#ifdef H5_HAVE_PARALLEL
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited)
      throw StorageError(fmt::format("{}: MPI-IO mode needs MPI_Init (run under mpirun)", path));
    h5::check(H5Pset_fapl_mpio(fapl.get(), MPI_COMM_WORLD, MPI_INFO_NULL),
              fmt::format("{}: cannot set up MPI-IO", path));
#else
    throw StorageError(fmt::format("{}: MPI-IO mode is not in this build (serial HDF5); use "
                                   "libsolar_storage built with parallel HDF5",
                                   path));
#endif
  }
  im->file = h5::Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  // Only when the open failed is the signature looked at, for the message: an open less per
  // file (a dataset of many files opens every one when it is indexed).
  if (!im->file && H5Fis_hdf5(path.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw StorageError(fmt::format("{}: not an HDF5 file (or damaged); write one with `solar gen` "
                                   "or h5py",
                                   path));
  }
  if (!im->file) {
    const std::string e = h5::last_error();
    throw StorageError(fmt::format("{}: cannot open as HDF5 ({}); the file may be truncated or "
                                   "damaged",
                                   path, e.empty() ? "unknown error" : e));
  }
  if (!options.mpio) {
    // HDF5 opened the path again: it must be the file our fd has (not one moved over it since).
    void* handle = nullptr;
    struct stat h5st {};
    if (H5Fget_vfd_handle(im->file.get(), H5P_DEFAULT, &handle) >= 0 && handle &&
        ::fstat(*static_cast<int*>(handle), &h5st) == 0 &&
        (h5st.st_ino != im->opened.st_ino || h5st.st_dev != im->opened.st_dev))
      throw StorageError(fmt::format("{}: the file was replaced while it was being opened; try "
                                     "again once nobody writes it",
                                     path));
    if (handle) ::posix_fadvise(*static_cast<int*>(handle), 0, 0, POSIX_FADV_RANDOM);  // chunks
  }
  if (!h5::dataset_exists(im->file.get(), im->dataset))
    throw StorageError(fmt::format("{}: no dataset '{}' (datasets at the top level: {})", path,
                                   im->dataset, h5::list_datasets(im->file.get())));

  h5::Handle dapl(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
  im->dset = h5::Handle(
      h5::check(H5Dopen2(im->file.get(), im->dataset.c_str(), H5P_DEFAULT),
                fmt::format("{}: cannot open dataset", im->where())),
      H5Dclose);
  im->space = h5::Handle(H5Dget_space(im->dset.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(im->space.get());
  if (rank < 1)
    throw StorageError(fmt::format("{}: dataset has rank {}; samples need an array whose first "
                                   "dimension indexes them (N x sample shape)",
                                   im->where(), rank));
  im->dims.resize(rank);
  H5Sget_simple_extent_dims(im->space.get(), im->dims.data(), nullptr);

  h5::Handle ftype(H5Dget_type(im->dset.get()), H5Tclose);
  const auto dtype = h5::dtype_of(ftype.get());
  if (!dtype)
    throw StorageError(fmt::format("{}: unsupported element type (class {}, {} bytes); use an "
                                   "integer or float dataset",
                                   im->where(), static_cast<int>(H5Tget_class(ftype.get())),
                                   H5Tget_size(ftype.get())));
  DatasetInfo& info = im->info;
  info.samples = options.whole ? 1 : im->dims[0];
  info.sample_shape.assign(im->dims.begin() + (options.whole ? 0 : 1), im->dims.end());
  info.dtype = *dtype;
  info.sample_bytes = dtype_size(*dtype);
  for (auto d : info.sample_shape) info.sample_bytes *= d;
  im->mem_type = h5::native_type(*dtype);

  h5::Handle dcpl(H5Dget_create_plist(im->dset.get()), H5Pclose);
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  const int filters = H5Pget_nfilters(dcpl.get());
  info.layout = h5::layout_name(layout, filters);
  std::vector<hsize_t> chunk(rank);
  if (layout == H5D_CHUNKED) {
    H5Pget_chunk(dcpl.get(), rank, chunk.data());
    std::uint64_t chunk_bytes = dtype_size(*dtype);
    for (auto c : chunk) chunk_bytes *= c;
    const std::uint64_t cache =
        options.chunk_cache_bytes ? options.chunk_cache_bytes
                                  : std::max<std::uint64_t>(64ULL << 20, 8 * chunk_bytes);
    // Reopen with a chunk cache that holds several chunks (the default 1 MiB holds none).
    im->dset.reset();
    H5Pset_chunk_cache(dapl.get(), 12421, cache, 1.0);
    im->dset = h5::Handle(
        h5::check(H5Dopen2(im->file.get(), im->dataset.c_str(), dapl.get()),
                  fmt::format("{}: cannot open dataset", im->where())),
        H5Dclose);
  }

  if (!options.mpio && layout == H5D_CONTIGUOUS && filters == 0 && h5::native_order(ftype.get())) {
    const haddr_t off = H5Dget_offset(im->dset.get());
    H5Eclear2(H5E_DEFAULT);
    if (off != HADDR_UNDEF) {
      const std::uint64_t end = off + info.samples * info.sample_bytes;
      if (end > static_cast<std::uint64_t>(st.st_size))
        throw StorageError(fmt::format("{}: the file is truncated: the dataset's data ends at "
                                       "byte {} but the file has {} bytes",
                                       im->where(), end, st.st_size));
      im->raw_offset = off;
    }
  }

  // Chunks of whole samples (chunk[0] of them; whole: the one chunk of the file's sample): the
  // chunk index, each chunk's address and stored size (one B-tree lookup each), or nothing when
  // a chunk is missing or lies past the end of the file. `raw`: unfiltered chunks, each holding
  // `per` samples of raw bytes; else filtered ones, their stored bytes.
  const bool by_samples = !options.mpio && layout == H5D_CHUNKED &&
                          std::equal(chunk.begin() + 1, chunk.end(), im->dims.begin() + 1) &&
                          chunk[0] >= 1 && (!options.whole || chunk[0] == im->dims[0]);
  const std::uint64_t per = options.whole ? 1 : chunk.empty() ? 0 : chunk[0];
  auto chunk_index = [&](bool raw)
      -> std::optional<std::pair<std::vector<std::uint64_t>, std::vector<std::uint64_t>>> {
    const std::uint64_t chunks = (info.samples + per - 1) / per;
    std::vector<std::uint64_t> addr(chunks), stored(chunks);
    std::vector<hsize_t> coord(rank, 0);
    bool all = true;
    for (std::uint64_t j = 0; j < chunks && all; ++j) {
      coord[0] = j * per;
      unsigned mask = 0;
      haddr_t a = HADDR_UNDEF;
      hsize_t size = 0;
      all = H5Dget_chunk_info_by_coord(im->dset.get(), coord.data(), &mask, &a, &size) >= 0 &&
            a != HADDR_UNDEF && (raw ? mask == 0 : size > 0) &&
            a + (raw ? per * info.sample_bytes : size) <= static_cast<std::uint64_t>(st.st_size);
      addr[j] = a;
      stored[j] = size;
    }
    H5Eclear2(H5E_DEFAULT);
    if (!all) return std::nullopt;
    return std::pair{std::move(addr), std::move(stored)};
  };
  // Unfiltered: the samples lie in the file as raw bytes, pread like a contiguous dataset.
  if (by_samples && filters == 0 && h5::native_order(ftype.get())) {
    if (auto t = chunk_index(true)) {
      im->chunk_addr = std::move(t->first);
      im->samples_per_chunk = per;
    }
  }
  // Filtered, one sample a chunk: where each chunk lies and how long it is as stored, for the
  // transparent mode, which serves those bytes as they are (the reading program decodes them).
  // Any filter, any byte order.
  if (by_samples && filters != 0 && per == 1) {
    if (auto t = chunk_index(false)) {
      im->entry.stored_offsets = std::move(t->first);
      im->entry.stored_lengths = std::move(t->second);
    }
  }

  im->dxpl = h5::Handle(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
#ifdef H5_HAVE_PARALLEL
  if (options.mpio)
    H5Pset_dxpl_mpio(im->dxpl.get(),
                     options.collective ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT);
#endif

  if (auto gen = h5::string_attribute(im->dset.get(), "solar_generator");
      gen && content::parse_generator(*gen)) {
    info.content = *content::parse_generator(*gen);
    info.seed = h5::u64_attribute(im->dset.get(), "solar_seed");
    info.generated_first = h5::u64_attribute(im->dset.get(), "solar_first");
  }
  H5Eclear2(H5E_DEFAULT);

  // Labels: optional; when present they must have one entry per sample.
  std::string label = options.label_dataset;
  if (!label.empty() && label[0] != '/') label = "/" + label;
  if (!label.empty() && label != im->dataset && h5::dataset_exists(im->file.get(), label)) {
    h5::Handle ld(h5::check(H5Dopen2(im->file.get(), label.c_str(), H5P_DEFAULT),
                            fmt::format("{}:{}: cannot open labels", path, label)),
                  H5Dclose);
    h5::Handle ls(H5Dget_space(ld.get()), H5Sclose);
    int lrank = H5Sget_simple_extent_ndims(ls.get());
    std::vector<hsize_t> ldims(std::max(lrank, 0));
    if (lrank > 0) H5Sget_simple_extent_dims(ls.get(), ldims.data(), nullptr);
    if (options.whole) {  // the whole labels array is the one sample's label
      ldims.insert(ldims.begin(), 1);
      ++lrank;
    }
    if (lrank < 1 || ldims[0] != info.samples)
      throw StorageError(fmt::format("{}:{}: labels need one entry per sample ({}), but the "
                                     "dataset has shape {}",
                                     path, label, info.samples,
                                     lrank < 1 ? "scalar" : std::to_string(ldims[0]) + "x..."));
    h5::Handle lt(H5Dget_type(ld.get()), H5Tclose);
    const auto ltype = h5::dtype_of(lt.get());
    if (!ltype)
      throw StorageError(fmt::format("{}:{}: unsupported label type", path, label));
    info.has_labels = true;
    info.label_dtype = *ltype;
    info.label_bytes = dtype_size(*ltype);
    for (int i = 1; i < lrank; ++i) info.label_bytes *= ldims[i];
    im->labels.resize(info.samples * info.label_bytes);
    if (info.samples)
      h5::check(H5Dread(ld.get(), h5::native_type(*ltype), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                        im->labels.data()),
                fmt::format("{}:{}: cannot read labels", path, label));
  }

  if (im->raw()) im->pool = std::make_unique<IoPool>(std::max(1u, options.io_threads) - 1);
  DatasetFile& f = im->entry;
  f.path = path;
  f.set_stat(im->opened);
  f.count = info.samples;
  f.data_offset = im->raw_offset;
  if (!im->raw_offset && im->samples_per_chunk > 0) {
    f.sample_offsets.resize(info.samples);
    for (std::uint64_t i = 0; i < info.samples; ++i) f.sample_offsets[i] = im->file_offset(i);
  }
  return std::unique_ptr<Hdf5Source>(new Hdf5Source(std::move(im)));
}

Hdf5Source::Hdf5Source(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Hdf5Source::~Hdf5Source() = default;

const DatasetInfo& Hdf5Source::info() const { return impl_->info; }
const std::string& Hdf5Source::path() const { return impl_->path; }
std::optional<std::uint64_t> Hdf5Source::raw_offset() const { return impl_->raw_offset; }
std::optional<std::uint64_t> Hdf5Source::sample_offset(std::uint64_t i) const {
  if (!impl_->raw() || i >= impl_->info.samples) return std::nullopt;
  return impl_->file_offset(i);
}
std::string Hdf5Source::describe() const { return impl_->where(); }

void Hdf5Source::read_stored(std::span<const SampleRun> runs, std::byte* dst,
                             std::uint64_t stride) {
  Impl& im = *impl_;
  check_runs(im.info, runs, im.where());
  const DatasetFile& f = im.entry;
  if (!f.raw() && !f.stored())
    throw StorageError(fmt::format("{}: its samples' stored bytes are not known (a layout HDF5 "
                                   "alone reads: chunks of several samples, or filtered "
                                   "contiguous data)",
                                   im.where()));
  std::byte* out = dst;
  for (const SampleRun& r : runs)
    for (std::uint64_t k = r.first; k < r.first + r.count; ++k, out += stride) {
      const auto [off, len] = f.stored_extent(k, im.info.sample_bytes);
      if (len > stride)
        throw StorageError(fmt::format("{}: sample {} is {} bytes as stored, more than the {} "
                                       "given for it",
                                       im.where(), k, len, stride));
      im.read_exact(off, len, out);
      std::memset(out + len, 0, stride - len);
    }
}
const std::string& Hdf5Source::identity() const { return impl_->identity; }
const struct ::stat& Hdf5Source::opened_stat() const { return impl_->opened; }
void Hdf5Source::check_unchanged() const { impl_->check_unchanged(); }
std::span<const DatasetFile> Hdf5Source::files() const { return {&impl_->entry, 1}; }
void Hdf5Source::check_file(std::size_t, bool path) const {
  impl_->check_unchanged();
  if (path) impl_->check_path();
}
void Hdf5Source::check_path() const { impl_->check_path(); }

// The open file (fstat: rewritten or truncated in place) and, in check_path, its path (stat:
// another file moved over it, or the file renamed away or deleted; on NFS the open file may
// then read as ESTALE or old bytes). Either way the file is no longer the one the plan was made
// for.
void Hdf5Source::Impl::check_unchanged() const {
  struct stat now {};
  if (::fstat(fd, &now) != 0)
    throw StorageError(fmt::format("{}: fstat: {}", where(), std::strerror(errno)));
  // ctime too: every write sets it and nothing can set it back, so a rewrite that restores
  // the mtime (touch -d, rsync -t, tar -x) is seen. A link count that changed (the path
  // renamed over or deleted, a hard link made: the open file keeps its bytes) moves it as
  // well: then size and mtime decide this once, and the new ctime is the one compared from
  // then on. (The interposer, which compares the ctime at open with every read it serves,
  // reads such a file itself.) chmod and chown move it too, and are refused alike.
  bool ctime_moved;
  struct timespec was {};
  {
    std::lock_guard lk(seen_mu);
    was = ctime_seen;
    ctime_moved = now.st_nlink == nlink_seen && (now.st_ctim.tv_sec != ctime_seen.tv_sec ||
                                                 now.st_ctim.tv_nsec != ctime_seen.tv_nsec);
    if (now.st_nlink != nlink_seen) nlink_seen = now.st_nlink, ctime_seen = now.st_ctim;
  }
  const bool content_moved = now.st_size != opened.st_size ||
                             now.st_mtim.tv_sec != opened.st_mtim.tv_sec ||
                             now.st_mtim.tv_nsec != opened.st_mtim.tv_nsec;
  // A rename moves the ctime too: the path's own reason first, when it has one.
  if (ctime_moved && !content_moved && options.check_path) check_path();
  if (content_moved || ctime_moved)
    throw StorageError(fmt::format(
        "{}: the file changed while solar was reading it (opened as {}, now {}{}): the bytes "
        "just read may belong to the new content, so they are refused; run on a file nobody "
        "rewrites",
        where(), identity, file_identity(now),
        ctime_moved ? fmt::format(", its change time {}.{:09} -> {}.{:09}", was.tv_sec,
                                  was.tv_nsec, now.st_ctim.tv_sec, now.st_ctim.tv_nsec)
                    : std::string()));
}

void Hdf5Source::Impl::check_path() const {
  struct stat at {};
  if (::stat(path.c_str(), &at) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR)
      throw StorageError(fmt::format("{}: the file was deleted or renamed while solar was "
                                     "reading it (nothing is at its path any more); nothing "
                                     "more is read from it",
                                     where()));
    throw StorageError(fmt::format("{}: stat of its path failed: {}", where(), std::strerror(err)));
  }
  if (at.st_dev != opened.st_dev || at.st_ino != opened.st_ino)
    throw StorageError(fmt::format(
        "{}: another file was moved over its path while solar was reading it (opened as {}, "
        "the path now holds {}): not the dataset the plan was computed for; nothing more is "
        "read from it",
        where(), identity, file_identity(at)));
  struct stat now {};
  if (::fstat(fd, &now) == 0 && now.st_nlink == 0)  // the path is another link to it
    throw StorageError(fmt::format("{}: the file was deleted while solar was reading it (opened "
                                   "as {}); nothing more is read from it",
                                   where(), identity));
}
std::uint64_t Hdf5Source::direct_reads() const { return impl_->direct_reads.load(); }
std::uint64_t Hdf5Source::requests() const { return impl_->requests.load(); }
}  // namespace solar::storage

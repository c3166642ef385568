#include "solar/storage/hdf5_writer.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>

#include "hdf5_util.h"
#include "io_pool.h"
#include "solar/core/config.h"
#include "solar/storage/content.h"

namespace solar::storage {

std::string_view to_string(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::chunked: return "chunked";
    case Layout::gzip: return "gzip";
  }
  return "?";
}

std::uint64_t dataset_bytes(const GenSpec& s) {
  std::uint64_t sb = dtype_size(s.dtype);
  for (auto d : s.shape) sb *= d;
  return s.samples * (sb + 4);
}

namespace {

void write_attributes(hid_t dset, std::uint64_t seed, const std::string& where) {
  h5::Handle scalar(H5Screate(H5S_SCALAR), H5Sclose);
  h5::Handle str(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(str.get(), content::kGenerator.size());
  h5::Handle a(h5::check(H5Acreate2(dset, "solar_generator", str.get(), scalar.get(), H5P_DEFAULT,
                                    H5P_DEFAULT),
                         where + ": cannot write attribute"),
               H5Aclose);
  h5::check(H5Awrite(a.get(), str.get(), content::kGenerator.data()), where);
  h5::Handle b(h5::check(H5Acreate2(dset, "solar_seed", H5T_STD_U64LE, scalar.get(), H5P_DEFAULT,
                                    H5P_DEFAULT),
                         where + ": cannot write attribute"),
               H5Aclose);
  h5::check(H5Awrite(b.get(), H5T_NATIVE_UINT64, &seed), where);
}

hid_t file_type(DType t) {
  switch (t) {
    case DType::int8: return H5T_STD_I8LE;
    case DType::uint8: return H5T_STD_U8LE;
    case DType::int16: return H5T_STD_I16LE;
    case DType::uint16: return H5T_STD_U16LE;
    case DType::int32: return H5T_STD_I32LE;
    case DType::uint32: return H5T_STD_U32LE;
    case DType::int64: return H5T_STD_I64LE;
    case DType::uint64: return H5T_STD_U64LE;
    case DType::float32: return H5T_IEEE_F32LE;
    case DType::float64: return H5T_IEEE_F64LE;
  }
  return H5T_STD_U8LE;
}

}  // namespace

void write_dataset(const GenSpec& s,
                   const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  namespace fs = std::filesystem;
  if (s.samples == 0) throw StorageError("--samples: must be at least 1");
  if (s.shape.empty()) throw StorageError("--shape: give at least one dimension, e.g. 4,128,128,128");
  std::uint64_t sb = dtype_size(s.dtype);
  for (auto d : s.shape) {
    if (d == 0) throw StorageError("--shape: every dimension must be at least 1");
    if (sb > (1ULL << 40) / d) throw StorageError("--shape: a sample must be under 1 TiB");
    sb *= d;
  }
  if ((s.layout != Layout::contiguous) && sb >= (4ULL << 30))
    throw StorageError("--layout: HDF5 chunks must be under 4 GiB; use --layout contiguous");

  std::error_code ec;
  if (fs::exists(s.path, ec) && !s.force)
    throw StorageError(fmt::format("{}: already exists; pass --force to replace it", s.path));
  const fs::path parent = fs::absolute(s.path).parent_path();
  if (!fs::is_directory(parent, ec))
    throw StorageError(fmt::format("{}: directory {} does not exist", s.path, parent.string()));
  struct statvfs vfs {};
  if (::statvfs(parent.c_str(), &vfs) == 0) {
    const std::uint64_t avail = std::uint64_t{vfs.f_bavail} * vfs.f_frsize;
    const std::uint64_t need = dataset_bytes(s) + (1ULL << 20);
    if (need > avail)
      throw StorageError(fmt::format("{}: needs {} but {} has only {} free", s.path,
                                     format_bytes(need), parent.string(), format_bytes(avail)));
  }

  const std::string tmp = fmt::format("{}.partial.{}", s.path, ::getpid());
  h5::quiet();
  try {
    std::lock_guard g(h5::lock());
    // Data on page boundaries (4 KiB): a sample read from a cold file then costs its own pages
    // only, not a page on each side, and O_DIRECT reads need no wider span (at offset 2048, as
    // HDF5 puts it by default, a lone 4 KiB sample took 8 KiB from the device).
    h5::Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    H5Pset_alignment(fapl.get(), 4096, 4096);
    h5::Handle file(h5::check(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()),
                              fmt::format("{}: cannot create", tmp)),
                    H5Fclose);
    std::vector<hsize_t> dims{s.samples};
    dims.insert(dims.end(), s.shape.begin(), s.shape.end());
    const int rank = static_cast<int>(dims.size());
    h5::Handle space(H5Screate_simple(rank, dims.data(), nullptr), H5Sclose);
    h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
    if (s.layout == Layout::contiguous) {
      H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
      H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
    } else {
      std::vector<hsize_t> chunk(dims);
      chunk[0] = 1;
      H5Pset_chunk(dcpl.get(), rank, chunk.data());
      if (s.layout == Layout::gzip) H5Pset_deflate(dcpl.get(), 1);
    }
    h5::Handle dset(h5::check(H5Dcreate2(file.get(), "/data", file_type(s.dtype), space.get(),
                                         H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                              fmt::format("{}: cannot create /data", tmp)),
                    H5Dclose);
    write_attributes(dset.get(), s.seed, s.path + ":/data");

    const std::uint64_t block = std::max<std::uint64_t>(1, (64ULL << 20) / sb);
    std::vector<std::byte> buf(std::min(block, s.samples) * sb);
    IoPool pool(1);
    std::vector<hsize_t> start(rank, 0), count(dims);
    for (std::uint64_t first = 0; first < s.samples; first += block) {
      const std::uint64_t n = std::min(block, s.samples - first);
      pool.run(n, [&](std::size_t i) {
        content::fill_sample(s.seed, first + i, buf.data() + i * sb, sb);
      });
      start[0] = first;
      count[0] = n;
      h5::Handle fsel(H5Scopy(space.get()), H5Sclose);
      H5Sselect_hyperslab(fsel.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                          nullptr);
      h5::Handle ms(H5Screate_simple(rank, count.data(), nullptr), H5Sclose);
      h5::check(H5Dwrite(dset.get(), h5::native_type(s.dtype), ms.get(), fsel.get(), H5P_DEFAULT,
                         buf.data()),
                fmt::format("{}: writing samples [{}, {}) failed", tmp, first, first + n));
      if (progress) progress(first + n, s.samples);
    }

    std::vector<std::int32_t> labels(s.samples);
    for (std::uint64_t i = 0; i < s.samples; ++i) labels[i] = content::label(s.seed, i);
    hsize_t ldim = s.samples;
    h5::Handle lspace(H5Screate_simple(1, &ldim, nullptr), H5Sclose);
    h5::Handle lset(h5::check(H5Dcreate2(file.get(), "/label", H5T_STD_I32LE, lspace.get(),
                                         H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                              fmt::format("{}: cannot create /label", tmp)),
                    H5Dclose);
    h5::check(H5Dwrite(lset.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                       labels.data()),
              fmt::format("{}: writing /label failed", tmp));
    lset.reset();
    dset.reset();
    if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0)
      throw StorageError(fmt::format("{}: flush failed ({})", tmp, h5::last_error()));
    file.reset();
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  fs::rename(tmp, s.path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw StorageError(fmt::format("{}: cannot rename {} into place: {}", s.path, tmp,
                                   ec.message()));
  }
}

}  // namespace solar::storage

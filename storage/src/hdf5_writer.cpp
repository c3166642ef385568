// SPDX-License-Identifier: Apache-2.0
#include "solar/storage/hdf5_writer.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>

#include "hdf5_util.h"
#include "io_pool.h"
#include "solar/core/config.h"
#include "solar/storage/content.h"

namespace solar::storage {

namespace fs = std::filesystem;

std::string_view to_string(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::chunked: return "chunked";
    case Layout::gzip: return "gzip";
  }
  return "?";
}

std::string_view to_string(FilesLayout l) {
  switch (l) {
    case FilesLayout::single: return "single";
    case FilesLayout::per_sample_files: return "per-sample-files";
    case FilesLayout::deepcam: return "deepcam";
    case FilesLayout::dlio: return "dlio";
  }
  return "?";
}

std::uint64_t GenArrays::label_bytes() const {
  std::uint64_t b = dtype_size(label_dtype);
  for (auto d : label_shape) b *= d;
  return b;
}

GenArrays gen_arrays(const GenSpec& s) {
  GenArrays a;
  switch (s.files) {
    case FilesLayout::single:
      a = {"/data", true, "/label", DType::int32, {}};
      break;
    case FilesLayout::per_sample_files:
      // The artifact's unitPar: the universe's 4 normalised cosmological parameters.
      a = {"/split", false, "/unitPar", DType::float32, {4}};
      break;
    case FilesLayout::deepcam: {
      // DeepCAM's labels_0: a class per pixel of the H x W x C sample.
      std::vector<std::uint64_t> mask(s.shape.begin(),
                                      s.shape.begin() + std::min<std::size_t>(2, s.shape.size()));
      a = {"/climate/data", false, "/climate/labels_0", DType::int32, mask};
      break;
    }
    case FilesLayout::dlio:
      // DLIO writes `labels` from a Python list of ints: int64.
      a = {"/records", true, "/labels", DType::int64, {}};
      break;
  }
  return a;
}

namespace {

constexpr std::uint64_t kUniverse = 64;  // samples a universe (the artifact: 512^3 into 128^3)

std::size_t digits(std::uint64_t n) { return std::to_string(n).size(); }

}  // namespace

std::vector<GenFile> gen_files(const GenSpec& s) {
  std::vector<GenFile> out;
  if (s.samples == 0) throw StorageError("--samples: must be at least 1");
  switch (s.files) {
    case FilesLayout::single:
      out.push_back({"", 0, s.samples});
      break;
    case FilesLayout::per_sample_files: {
      if (s.universes_per_dir == 0) throw StorageError("--universes-per-dir: must be at least 1");
      const std::uint64_t universes = (s.samples + kUniverse - 1) / kUniverse;
      const std::uint64_t dirs = (universes + s.universes_per_dir - 1) / s.universes_per_dir;
      // Equal widths, so that sorted path order is global order.
      const std::size_t wd = std::max<std::size_t>(3, digits(dirs - 1));
      const std::size_t wu = std::max<std::size_t>(4, digits(universes - 1));
      out.reserve(s.samples);
      for (std::uint64_t g = 0; g < s.samples; ++g) {
        const std::uint64_t u = g / kUniverse;
        out.push_back({fmt::format("{:0{}}/univ{:0{}}_{:03}.hdf5", u / s.universes_per_dir, wd, u,
                                   wu, g % kUniverse),
                       g, 1});
      }
      break;
    }
    case FilesLayout::deepcam: {
      const std::size_t w = std::max<std::size_t>(6, digits(s.samples - 1));
      out.reserve(s.samples);
      for (std::uint64_t g = 0; g < s.samples; ++g)
        out.push_back({fmt::format("data-{:0{}}.h5", g, w), g, 1});
      break;
    }
    case FilesLayout::dlio: {
      std::uint64_t files = s.file_count, per = s.samples_per_file;
      if (files == 0 && per == 0)
        throw StorageError("--layout dlio: give --files N (the samples are divided over them) "
                           "or --samples-per-file K");
      if (per == 0) {
        if (files > s.samples)
          throw StorageError(fmt::format("--files: {} files for {} samples would leave files "
                                         "empty; give at most --files {}",
                                         files, s.samples, s.samples));
        per = (s.samples + files - 1) / files;
      } else if (files == 0) {
        files = (s.samples + per - 1) / per;
      }
      // The first files full, the last one the rest: DLIO's num_samples_per_file.
      if ((files - 1) * per >= s.samples || files * per < s.samples)
        throw StorageError(fmt::format(
            "--samples {} does not fill --files {} of --samples-per-file {} (the last file must "
            "hold 1..{}): give --samples in {}..{}, or only two of the three",
            s.samples, files, per, per, (files - 1) * per + 1, files * per));
      const std::size_t w = digits(files);  // DLIO's add_padding(i, len(str(N)))
      out.reserve(files);
      for (std::uint64_t f = 0; f < files; ++f)
        out.push_back({fmt::format("img_{:0{}}_of_{}.hdf5", f, w, files), f * per,
                       std::min(per, s.samples - f * per)});
      break;
    }
  }
  return out;
}

std::string dataset_spec(const GenSpec& s) {
  const GenArrays a = gen_arrays(s);
  if (s.files == FilesLayout::single) return s.path;
  std::string dir = s.path;
  if (dir.empty() || dir.back() != '/') dir += '/';
  return fmt::format("{}:{}{}", dir, a.data, a.rows ? "[]" : "");
}

namespace {

std::uint64_t sample_bytes(const GenSpec& s) {
  std::uint64_t sb = dtype_size(s.dtype);
  for (auto d : s.shape) {
    if (d == 0) throw StorageError("--shape: every dimension must be at least 1");
    if (sb > (1ULL << 40) / d) throw StorageError("--shape: a sample must be under 1 TiB");
    sb *= d;
  }
  return sb;
}

// A file's HDF5 metadata, data aligned to 4 KiB: superblock, object headers, attributes.
constexpr std::uint64_t kFileOverhead = 8 << 10;

void write_attributes(hid_t dset, std::uint64_t seed, std::uint64_t first, Content c,
                      const std::string& where) {
  const std::string_view gen = content::generator(c);
  h5::Handle scalar(H5Screate(H5S_SCALAR), H5Sclose);
  h5::Handle str(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(str.get(), gen.size());
  h5::Handle a(h5::check(H5Acreate2(dset, "solar_generator", str.get(), scalar.get(), H5P_DEFAULT,
                                    H5P_DEFAULT),
                         where + ": cannot write attribute"),
               H5Aclose);
  h5::check(H5Awrite(a.get(), str.get(), gen.data()), where);
  for (const auto& [name, value] :
       {std::pair{"solar_seed", seed}, std::pair{"solar_first", first}}) {
    h5::Handle b(h5::check(H5Acreate2(dset, name, H5T_STD_U64LE, scalar.get(), H5P_DEFAULT,
                                      H5P_DEFAULT),
                           where + ": cannot write attribute"),
                 H5Aclose);
    h5::check(H5Awrite(b.get(), H5T_NATIVE_UINT64, &value), where);
  }
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

// Writes the files of one dataset, one after the other, with one buffer and one pool.
class FileWriter {
 public:
  using Progress = std::function<void(std::uint64_t, std::uint64_t)>;
  FileWriter(const GenSpec& s, const GenArrays& a, std::uint64_t sample_bytes, const Progress& p)
      : spec(s), arrays(a), sb(sample_bytes), progress(p) {}
  // Writes samples [first, first + count) to `tmp` (`name` in messages).
  void write(const std::string& tmp, const std::string& name, std::uint64_t first,
             std::uint64_t count);

 private:
  const GenSpec& spec;
  const GenArrays& arrays;
  const std::uint64_t sb;
  const Progress& progress;
  IoPool pool{1};
  std::vector<std::byte> buf;
  std::uint64_t done = 0;  // samples written so far, all files together
};

void FileWriter::write(const std::string& tmp, const std::string& name, std::uint64_t first,
                       std::uint64_t count) {
  const GenSpec& s = spec;
  std::lock_guard g(h5::lock());
  // Data on page boundaries (4 KiB): a sample read from a cold file then costs its own pages
  // only, not a page on each side, and O_DIRECT reads need no wider span (at offset 2048, as
  // HDF5 puts it by default, a lone 4 KiB sample took 8 KiB from the device).
  h5::Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_alignment(fapl.get(), 4096, 4096);
  h5::Handle file(h5::check(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()),
                            fmt::format("{}: cannot create", tmp)),
                  H5Fclose);
  // "/climate/data": its groups are made on the way.
  h5::Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);

  // Rows: count x shape, a sample per row; otherwise the file's one sample is the whole array.
  std::vector<hsize_t> dims;
  if (arrays.rows) dims.push_back(count);
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
    if (arrays.rows) chunk[0] = 1;
    H5Pset_chunk(dcpl.get(), rank, chunk.data());
    if (s.layout == Layout::gzip) H5Pset_deflate(dcpl.get(), 1);
  }
  const std::string where = name + ":" + arrays.data;
  h5::Handle dset(h5::check(H5Dcreate2(file.get(), arrays.data.c_str(), file_type(s.dtype),
                                       space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
                            fmt::format("{}: cannot create {}", tmp, arrays.data)),
                  H5Dclose);
  write_attributes(dset.get(), s.seed, first, s.content, where);

  const std::uint64_t block = std::max<std::uint64_t>(1, (64ULL << 20) / sb);
  buf.resize(std::min(block, count) * sb);
  std::vector<hsize_t> start(rank, 0), part(dims);
  for (std::uint64_t k = 0; k < count; k += block) {
    const std::uint64_t n = std::min(block, count - k);
    pool.run(n, [&](std::size_t i) {
      content::fill_sample(s.seed, first + k + i, buf.data() + i * sb, sb, s.content);
    });
    if (arrays.rows) {
      start[0] = k;
      part[0] = n;
    }
    h5::Handle fsel(H5Scopy(space.get()), H5Sclose);
    H5Sselect_hyperslab(fsel.get(), H5S_SELECT_SET, start.data(), nullptr, part.data(), nullptr);
    h5::Handle ms(H5Screate_simple(rank, part.data(), nullptr), H5Sclose);
    h5::check(H5Dwrite(dset.get(), h5::native_type(s.dtype), ms.get(), fsel.get(), H5P_DEFAULT,
                       buf.data()),
              fmt::format("{}: writing samples [{}, {}) failed", tmp, first + k, first + k + n));
    done += n;
    if (progress) progress(done, s.samples);
  }

  // Labels: the dtype's little-endian bytes, which are this (little-endian) host's native ones.
  const std::uint64_t lb = arrays.label_bytes();
  std::vector<std::byte> labels(count * lb);
  for (std::uint64_t k = 0; k < count; ++k)
    content::fill_label(s.seed, first + k, arrays.label_dtype, labels.data() + k * lb, lb);
  std::vector<hsize_t> ldims;
  if (arrays.rows) ldims.push_back(count);
  ldims.insert(ldims.end(), arrays.label_shape.begin(), arrays.label_shape.end());
  h5::Handle lspace(ldims.empty() ? H5Screate(H5S_SCALAR)
                                  : H5Screate_simple(static_cast<int>(ldims.size()), ldims.data(),
                                                     nullptr),
                    H5Sclose);
  h5::Handle lset(h5::check(H5Dcreate2(file.get(), arrays.labels.c_str(),
                                       file_type(arrays.label_dtype), lspace.get(), lcpl.get(),
                                       H5P_DEFAULT, H5P_DEFAULT),
                            fmt::format("{}: cannot create {}", tmp, arrays.labels)),
                  H5Dclose);
  h5::check(H5Dwrite(lset.get(), h5::native_type(arrays.label_dtype), H5S_ALL, H5S_ALL,
                     H5P_DEFAULT, labels.data()),
            fmt::format("{}: writing {} failed", tmp, arrays.labels));
  lset.reset();
  dset.reset();
  if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0)
    throw StorageError(fmt::format("{}: flush failed ({})", tmp, h5::last_error()));
  file.reset();
}

bool hdf5_name(const fs::path& p) {
  const std::string e = p.extension().string();
  return e == ".h5" || e == ".hdf5" || e == ".hdf" || e == ".he5";
}

// --force replaces a directory only when it holds nothing but HDF5 files and folders of them:
// never a folder of other things given by mistake (`solar gen ~ --force`).
void check_replaceable(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(path, ec))) return;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    const auto st = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_directory(st) || (fs::is_regular_file(st) && hdf5_name(it->path()))) continue;
    throw StorageError(fmt::format("{}: holds {}, which is not an HDF5 file, so --force does "
                                   "not replace it; remove {} yourself or write elsewhere",
                                   path, it->path().string(), path));
  }
  if (ec)
    throw StorageError(fmt::format("{}: cannot list it to replace it: {}", path, ec.message()));
}

// Puts the complete `tmp` (a file or a directory) at `path`, replacing what is there. Where the
// file system can, the two are swapped in one step (renameat2 RENAME_EXCHANGE), so that `path`
// names a whole dataset at every moment; the old one is then removed.
void move_into_place(const std::string& tmp, const std::string& path) {
  std::error_code ec;
  const bool existed = fs::exists(fs::symlink_status(path, ec));
  if (!existed || (fs::is_regular_file(fs::symlink_status(path, ec)) &&
                   fs::is_regular_file(fs::symlink_status(tmp, ec)))) {
    fs::rename(tmp, path, ec);  // a file over a file: rename(2) replaces it atomically
    if (ec)
      throw StorageError(fmt::format("{}: cannot rename {} into place: {}", path, tmp,
                                     ec.message()));
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp, ec);  // now the old dataset
    return;
  }
  // No exchange on this file system: move the old one aside first.
  const std::string old = fmt::format("{}.old.{}", path, ::getpid());
  fs::rename(path, old, ec);
  if (!ec) fs::rename(tmp, path, ec);
  if (ec)
    throw StorageError(fmt::format("{}: cannot move {} into its place: {}", path, tmp,
                                   ec.message()));
  fs::remove_all(old, ec);
}

}  // namespace

std::uint64_t dataset_bytes(const GenSpec& s) {
  const std::uint64_t per = sample_bytes(s) + gen_arrays(s).label_bytes();
  const std::uint64_t files =
      s.files == FilesLayout::dlio ? gen_files(s).size()
      : s.files == FilesLayout::single ? 1
                                       : s.samples;
  constexpr std::uint64_t kMax = ~std::uint64_t{0};
  if (per > (kMax - kFileOverhead * files) / std::max<std::uint64_t>(s.samples, 1)) return kMax;
  return s.samples * per + kFileOverhead * files;
}

void write_dataset(const GenSpec& s,
                   const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  if (s.samples == 0) throw StorageError("--samples: must be at least 1");
  if (s.shape.empty()) throw StorageError("--shape: give at least one dimension, e.g. 4,128,128,128");
  const std::uint64_t sb = sample_bytes(s);
  if ((s.layout != Layout::contiguous) && sb >= (4ULL << 30))
    throw StorageError("--layout: HDF5 chunks must be under 4 GiB; use --layout contiguous");
  const GenArrays arrays = gen_arrays(s);
  const std::vector<GenFile> files = gen_files(s);

  std::error_code ec;
  if (fs::exists(fs::symlink_status(s.path, ec))) {
    if (!s.force)
      throw StorageError(fmt::format("{}: already exists; pass --force to replace it", s.path));
    check_replaceable(s.path);
  }
  const fs::path parent = fs::absolute(s.path).lexically_normal().parent_path();
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

  // Beside the target, so that the final rename stays on one file system.
  std::string target = s.path;
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  const std::string tmp = fmt::format("{}.partial.{}", target, ::getpid());
  h5::quiet();
  FileWriter writer(s, arrays, sb, progress);
  try {
    if (s.files == FilesLayout::single) {
      writer.write(tmp, s.path, 0, s.samples);
    } else {
      if (!fs::create_directory(tmp, ec))
        throw StorageError(fmt::format("{}: cannot create {}: {}", s.path, tmp,
                                       ec ? ec.message() : "it exists"));
      for (const GenFile& f : files) {
        const fs::path dst = fs::path(tmp) / f.path;
        fs::create_directories(dst.parent_path(), ec);
        if (ec)
          throw StorageError(fmt::format("{}: cannot create {}: {}", s.path,
                                         dst.parent_path().string(), ec.message()));
        // Each file complete or absent, as the single file is.
        const std::string part = dst.string() + ".partial";
        writer.write(part, (fs::path(target) / f.path).string(), f.first, f.count);
        fs::rename(part, dst, ec);
        if (ec)
          throw StorageError(fmt::format("{}: cannot rename {} into place: {}", s.path, part,
                                         ec.message()));
      }
    }
    move_into_place(tmp, target);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace solar::storage

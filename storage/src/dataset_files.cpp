// SPDX-License-Identifier: Apache-2.0
// Datasets of many files: listing a directory, a glob or a list, checking every file (the
// index), the index file, and the source that reads samples across the files. See
// solar/storage/dataset_files.h.
#include "solar/storage/dataset_files.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "direct_io.h"
#include "io_pool.h"
#include "solar/dataset_spec.h"
#include "solar/storage/hdf5_source.h"
#include "solar/sys/atomic_file.h"

namespace solar::storage {

namespace fs = std::filesystem;

namespace {

std::int64_t ns_of(const struct timespec& t) {
  return static_cast<std::int64_t>(t.tv_sec) * 1000000000LL + t.tv_nsec;
}

std::string time_string(std::int64_t ns) {
  return fmt::format("{}.{:09}", ns / 1000000000LL, ns % 1000000000LL);
}

// Failed reads are tried this many times in all (pausing 50, 100, 200 ms), as Hdf5Source does.
constexpr unsigned kAttempts = 4;
constexpr std::chrono::milliseconds kPause{50};

bool hdf5_name(const fs::path& p) {
  static const char* const kSuffixes[] = {".h5", ".hdf5", ".hdf", ".he5"};
  const std::string ext = p.extension().string();
  return std::any_of(std::begin(kSuffixes), std::end(kSuffixes),
                     [&](const char* s) { return ext == s; });
}

// Whether `spec` names an array (`:/name` after its first character, as split_file_dataset
// reads it), rather than leaving it to the default.
bool names_array(std::string_view spec) {
  const auto pos = spec.rfind(":/");
  return pos != std::string_view::npos && pos > 0;
}

// Whether `path` is an HDF5 file: its signature at 0, or at 512, 1024, 2048, ... (after a user
// block), as the HDF5 format specification places it. An unreadable file counts as HDF5 (the
// HDF5 open then says why it cannot be read).
bool hdf5_signature(const std::string& path) {
  static constexpr unsigned char kSig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  struct stat st {};
  bool found = ::fstat(fd, &st) != 0;
  for (std::uint64_t at = 0; !found && at + 8 <= static_cast<std::uint64_t>(st.st_size) &&
                             at <= (std::uint64_t{1} << 30);
       at = at ? at * 2 : 512) {
    unsigned char b[8];
    found = ::pread(fd, b, 8, static_cast<off_t>(at)) == 8 && std::memcmp(b, kSig, 8) == 0;
  }
  ::close(fd);
  return found;
}

// The files `parsed` names, in the dataset's order.
std::vector<std::string> list_files(const protocol::DatasetSpec& parsed, std::string_view spec) {
  const std::string& where = parsed.where.file;
  std::vector<std::string> paths;
  if (parsed.list) {
    std::ifstream in(where);
    if (!in)
      throw StorageError(fmt::format("dataset '{}': cannot read the list {}: {}", spec, where,
                                     std::strerror(errno)));
    const fs::path base = fs::path(where).parent_path();
    std::string line;
    std::unordered_set<std::string> seen;
    for (std::uint64_t no = 1; std::getline(in, line); ++no) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
        line.pop_back();
      const auto b = line.find_first_not_of(" \t");
      if (b == std::string::npos || line[b] == '#') continue;
      std::string p = line.substr(b);
      if (fs::path(p).is_relative() && !base.empty()) p = (base / p).string();
      if (!seen.insert(p).second)
        throw StorageError(fmt::format("dataset '{}': {} line {} names {} a second time; every "
                                       "file may be in the list once",
                                       spec, where, no, p));
      paths.push_back(std::move(p));
    }
  } else if (parsed.glob) {
    glob_t g{};
    const int rc = ::glob(where.c_str(), GLOB_NOSORT | GLOB_ERR, nullptr, &g);
    if (rc != 0 && rc != GLOB_NOMATCH) {
      globfree(&g);
      throw StorageError(fmt::format("dataset '{}': cannot expand {}: {}", spec, where,
                                     rc == GLOB_NOSPACE ? "out of memory" : "a directory is unreadable"));
    }
    for (std::size_t i = 0; i < g.gl_pathc; ++i) {
      struct stat st {};
      if (::stat(g.gl_pathv[i], &st) == 0 && S_ISDIR(st.st_mode)) continue;
      paths.emplace_back(g.gl_pathv[i]);
    }
    globfree(&g);
    std::sort(paths.begin(), paths.end());  // byte order, not the locale's
  } else {
    std::error_code ec;
    fs::recursive_directory_iterator it(where, fs::directory_options::none, ec), end;
    if (ec)
      throw StorageError(fmt::format("dataset '{}': cannot list the directory {}: {}", spec,
                                     where, ec.message()));
    for (; it != end; it.increment(ec)) {
      if (ec)
        throw StorageError(fmt::format("dataset '{}': cannot list {}: {}", spec, where,
                                       ec.message()));
      if (it->is_regular_file(ec) && hdf5_name(it->path())) paths.push_back(it->path().string());
    }
    std::sort(paths.begin(), paths.end());
  }
  if (paths.empty())
    throw StorageError(fmt::format(
        "dataset '{}': no files{}; a dataset of many files is a directory (its *.h5, *.hdf5, "
        "*.hdf, *.he5 files, recursively), a glob ('train/*/*.hdf5') or @LIST (a file of paths); "
        "files of other kinds, one sample a file (npz, JPEG, ...), are named by a glob "
        "('train/*.npz') or a list",
        spec,
        parsed.list ? " in the list" : parsed.glob ? " match the pattern" : " (HDF5) below it"));
  for (const auto& p : paths)
    if (p.find('\n') != std::string::npos)
      throw StorageError(fmt::format("dataset '{}': a file name holds a newline; rename it", spec));
  return paths;
}

std::string mismatch(const DatasetInfo& a, const DatasetInfo& b) {
  if (a.sample_shape != b.sample_shape || a.dtype != b.dtype)
    return fmt::format("its samples are {} {}, the first file's {} {}", b.shape_string(),
                       to_string(b.dtype), a.shape_string(), to_string(a.dtype));
  if (a.has_labels != b.has_labels)
    return b.has_labels ? "it has labels and the first file has none"
                        : "it has no labels and the first file has";
  if (a.has_labels && (a.label_dtype != b.label_dtype || a.label_bytes != b.label_bytes))
    return fmt::format("its labels are {} bytes of {}, the first file's {} bytes of {}",
                       b.label_bytes, to_string(b.label_dtype), a.label_bytes,
                       to_string(a.label_dtype));
  return {};
}

// FNV-1a over the index's content: what the plan records, so that every reader of the index
// (or of a scan made again) knows it has the dataset the plan was made for.
struct Fnv {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  void add(std::string_view s) {
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
    h = (h ^ 0xff) * 0x100000001b3ULL;
  }
};

std::string hex_of(std::span<const std::byte> b) {
  static const char* d = "0123456789abcdef";
  std::string s(b.size() * 2, '0');
  for (std::size_t i = 0; i < b.size(); ++i) {
    s[2 * i] = d[std::to_integer<unsigned>(b[i]) >> 4];
    s[2 * i + 1] = d[std::to_integer<unsigned>(b[i]) & 15];
  }
  return s;
}

// One file's line of the index, without the path's line break: what the identity hashes too
// (no dev and no ctime: they may differ between the hosts that read one index).
std::string file_line(const DatasetFile& f) {
  // Raw chunks' offsets, or filtered chunks' as OFFSET:LENGTH (stored extents).
  std::string offs = "-";
  if (!f.sample_offsets.empty()) {
    offs.clear();
    for (std::size_t i = 0; i < f.sample_offsets.size(); ++i)
      offs += (i ? "," : "") + std::to_string(f.sample_offsets[i]);
  } else if (f.stored()) {
    offs.clear();
    for (std::size_t i = 0; i < f.stored_offsets.size(); ++i)
      offs += fmt::format("{}{}:{}", i ? "," : "", f.stored_offsets[i], f.stored_lengths[i]);
  }
  return fmt::format("{} {} {} {} {} {} {} {} {}", f.count, f.ino, f.size, f.mtime_ns,
                     f.ctime_ns, f.data_offset ? std::to_string(*f.data_offset) : "-", offs,
                     f.labels.empty() ? "-" : hex_of(f.labels), f.path);
}

std::string identity_of(const DatasetIndex& x) {
  Fnv h;
  h.add(x.dataset);
  h.add(x.whole_files ? "files" : x.rows ? "rows" : "whole");
  h.add(x.label_dataset);
  h.add(fmt::format("{} {} {} {}", x.info.shape_string(), to_string(x.info.dtype),
                    x.info.label_bytes, to_string(x.info.label_dtype)));
  for (const auto& f : x.files)
    h.add(fmt::format("{} {} {} {} {}", f.count, f.ino, f.size, f.mtime_ns, f.path));
  return fmt::format("files {} samples {} index {:016x}", x.files.size(), x.info.samples, h.h);
}

std::uint64_t to_u64(std::string_view s, const std::string& where) {
  std::uint64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size())
    throw StorageError(fmt::format("{}: '{}' is not a number", where, s));
  return v;
}

// Whole-file samples: each file of `paths` one sample of its size, stat'ed (no file opened).
DatasetIndex scan_whole_files(DatasetIndex x, const std::vector<std::string>& paths,
                              const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  x.whole_files = true;
  x.dataset.clear();
  x.rows = false;
  x.files.reserve(paths.size());
  std::uint64_t least = UINT64_MAX, most = 0, total = 0;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    if (progress && i % 1024 == 0) progress(i, paths.size());
    struct stat st {};
    if (::stat(paths[i].c_str(), &st) != 0)
      throw StorageError(fmt::format("dataset '{}', file {} of {} ({}): {}", x.spec, i + 1,
                                     paths.size(), paths[i], std::strerror(errno)));
    if (!S_ISREG(st.st_mode))
      throw StorageError(fmt::format("dataset '{}': {} is not a regular file; every file of a "
                                     "dataset of whole-file samples is one sample",
                                     x.spec, paths[i]));
    if (st.st_size == 0)
      throw StorageError(fmt::format("dataset '{}': {} is empty; a whole-file sample is at "
                                     "least one byte (remove it from the dataset)",
                                     x.spec, paths[i]));
    if (::access(paths[i].c_str(), R_OK) != 0)
      throw StorageError(fmt::format("dataset '{}': cannot read {}: {}", x.spec, paths[i],
                                     std::strerror(errno)));
    DatasetFile f;
    f.path = paths[i];
    f.set_stat(st);
    f.first = i;
    f.count = 1;
    f.stored_offsets = {0};
    f.stored_lengths = {f.size};
    least = std::min(least, f.size);
    most = std::max(most, f.size);
    total += f.size;
    x.files.push_back(std::move(f));
  }
  if (progress) progress(paths.size(), paths.size());
  x.info = DatasetInfo{};
  x.info.samples = paths.size();
  x.info.dtype = DType::uint8;
  x.info.sample_shape = {most};
  x.info.sample_bytes = most;
  x.info.whole_files = true;
  x.info.layout = fmt::format("{} files, whole-file samples of {} to {} bytes (mean {})",
                              paths.size(), least, most, total / paths.size());
  x.identity = identity_of(x);
  return x;
}

}  // namespace

void DatasetFile::set_stat(const struct ::stat& st) {
  dev = st.st_dev;
  ino = st.st_ino;
  size = static_cast<std::uint64_t>(st.st_size);
  mtime_ns = ns_of(st.st_mtim);
  ctime_ns = ns_of(st.st_ctim);
}

std::string DatasetFile::differs(const struct ::stat& st) const {
  if (!S_ISREG(st.st_mode)) return "not a regular file any more";
  if (st.st_ino != ino) return fmt::format("another file (inode {} -> {})", ino, st.st_ino);
  if (static_cast<std::uint64_t>(st.st_size) != size)
    return fmt::format("size {} -> {}", size, st.st_size);
  if (ns_of(st.st_mtim) != mtime_ns)
    return fmt::format("modified at {} -> {}", time_string(mtime_ns), time_string(ns_of(st.st_mtim)));
  if (ns_of(st.st_ctim) != ctime_ns)
    return fmt::format("changed at {} -> {} (written, or its mode or owner changed)",
                       time_string(ctime_ns), time_string(ns_of(st.st_ctim)));
  return {};
}

bool names_many_files(std::string_view spec) {
  const protocol::DatasetSpec d = protocol::parse_dataset_spec(spec);
  if (d.kind != protocol::DatasetSpec::Kind::file) return false;
  if (d.list || d.glob || d.where.file.ends_with('/')) return true;
  struct stat st {};
  return ::stat(d.where.file.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

DatasetIndex scan_dataset(std::string_view spec, const std::string& label_dataset,
                          const std::function<void(std::uint64_t, std::uint64_t)>& progress,
                          const DatasetIndex* previous) {
  const protocol::DatasetSpec parsed = protocol::parse_dataset_spec(spec);
  if (parsed.kind != protocol::DatasetSpec::Kind::file)
    throw StorageError(fmt::format("dataset '{}': not a dataset of files", spec));
  DatasetIndex x;
  x.spec = std::string(spec);
  x.dataset = parsed.where.dataset;
  x.rows = parsed.rows;
  x.label_dataset = label_dataset;
  const std::vector<std::string> paths = list_files(parsed, spec);
  if ((parsed.glob || parsed.list) && !names_array(spec) && !hdf5_signature(paths[0]))
    return scan_whole_files(std::move(x), paths, progress);
  Hdf5Options ho;
  ho.io_threads = 1;
  ho.label_dataset = label_dataset;
  ho.whole = !parsed.rows;
  ho.check_path = false;
  x.files.reserve(paths.size());
  bool seeded = true;
  std::optional<std::uint64_t> seed;
  // A previous index of this spec: a file whose stat is the one indexed then (inode, size,
  // mtime, ctime: any write moves the ctime) is taken from it without opening it.
  std::unordered_map<std::string_view, const DatasetFile*> before;
  if (previous && previous->spec == spec && previous->label_dataset == label_dataset)
    for (const auto& f : previous->files) before.emplace(f.path, &f);
  bool checked_previous = false;  // the previous index's files match this one's first
  for (std::size_t i = 0; i < paths.size(); ++i) {
    if (progress && i % 1024 == 0) progress(i, paths.size());
    if (const auto it = before.find(paths[i]); it != before.end()) {
      struct stat st {};
      if (::stat(paths[i].c_str(), &st) == 0 && it->second->differs(st).empty()) {
        if (i == 0) {
          x.info = previous->info;
          x.info.samples = 0;
          x.info.layout = "contiguous";
          if (const auto sp = previous->info.layout.find(" files, "); sp != std::string::npos)
            x.info.layout = previous->info.layout.substr(sp + 8);
          seed = previous->info.seed;
        } else if (!checked_previous) {
          if (const std::string why = mismatch(x.info, previous->info); !why.empty())
            throw StorageError(fmt::format("dataset '{}': {} does not match the files before it: "
                                           "{}; every file of a dataset must hold samples of one "
                                           "shape and dtype (and the same labels)",
                                           spec, paths[i], why));
        }
        checked_previous = true;
        DatasetFile f = *it->second;
        f.set_stat(st);
        seeded = seeded && previous->info.seed && previous->info.seed == seed &&
                 previous->info.content == x.info.content && it->second->first == x.info.samples;
        f.first = x.info.samples;
        x.info.samples += f.count;
        x.files.push_back(std::move(f));
        continue;
      }
    }
    std::unique_ptr<Hdf5Source> h;
    try {
      h = Hdf5Source::open(paths[i], x.dataset, ho);
    } catch (const StorageError& e) {
      throw StorageError(fmt::format("dataset '{}', file {} of {}: {}", spec, i + 1,
                                     paths.size(), e.what()));
    }
    const DatasetInfo& info = h->info();
    if (i == 0) {
      x.info = info;
      x.info.samples = 0;
      x.info.generated_first.reset();
      seed = info.seed;
    } else if (const std::string why = mismatch(x.info, info); !why.empty()) {
      const bool rows_differ = !x.rows && info.sample_shape.size() == x.info.sample_shape.size() &&
                               info.dtype == x.info.dtype && !info.sample_shape.empty() &&
                               std::equal(info.sample_shape.begin() + 1, info.sample_shape.end(),
                                          x.info.sample_shape.begin() + 1);
      throw StorageError(fmt::format(
          "dataset '{}': {} does not match the files before it: {}; every file of a dataset "
          "must hold samples of one shape and dtype (and the same labels){}",
          spec, paths[i], why,
          rows_differ ? fmt::format("; if the array's first dimension indexes samples, put [] "
                                    "after its name ({}[])",
                                    x.dataset)
                      : ""));
    }
    DatasetFile f = h->files()[0];
    f.first = x.info.samples;
    if (info.has_labels && info.samples * info.label_bytes <= kIndexLabelBytes) {
      f.labels.resize(info.samples * info.label_bytes);
      if (info.samples) {
        const SampleRun all{0, info.samples};
        h->read_labels({&all, 1}, f.labels.data());
      }
    }
    seeded = seeded && info.seed == seed && info.content == x.info.content &&
             info.generated_first == f.first;
    x.info.samples += info.samples;
    x.files.push_back(std::move(f));
  }
  if (progress) progress(paths.size(), paths.size());
  if (!seeded) x.info.seed.reset();
  x.info.layout = fmt::format("{} files, {}", x.files.size(), x.info.layout);
  x.identity = identity_of(x);
  return x;
}

std::string index_cache_path(std::string_view spec, const std::string& label_dataset) {
  std::string dir;
  if (const char* c = std::getenv("SOLAR_INDEX_CACHE"); c && *c) {
    dir = c;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    dir = std::string(x) + "/solar";
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    dir = std::string(home) + "/.cache/solar";
  } else {
    return {};
  }
  if (dir == "none") return {};
  Fnv h;
  h.add(spec);
  h.add(label_dataset);
  std::error_code ec;
  if (!spec.starts_with("/") && !spec.starts_with("@/"))  // relative: also where from
    h.add(fs::current_path(ec).string());
  return fmt::format("{}/index-{:016x}", dir, h.h);
}

DatasetIndex index_dataset(std::string_view spec, const std::string& label_dataset,
                           const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  const std::string cache = index_cache_path(spec, label_dataset);
  std::optional<DatasetIndex> previous;
  struct stat st {};
  if (!cache.empty() && ::stat(cache.c_str(), &st) == 0) {
    try {
      previous = read_index(cache, spec, label_dataset);
    } catch (const StorageError&) {
      // another spec on a hash collision, or damaged: scanned afresh, and replaced below
    }
  }
  DatasetIndex x = scan_dataset(spec, label_dataset, progress, previous ? &*previous : nullptr);
  if (!cache.empty() && (!previous || previous->identity != x.identity)) {
    std::error_code ec;
    fs::create_directories(fs::path(cache).parent_path(), ec);
    ::chmod(fs::path(cache).parent_path().c_str(), 0700);
    try {
      write_index(x, cache);
    } catch (const StorageError&) {
      // a cache: the next job scans again
    }
  }
  return x;
}

void write_index(const DatasetIndex& x, const std::string& path) {
  std::string out = fmt::format(
      "solar-dataset-index 3\nspec {}\ndataset {}\nrows {}\nwhole-files {}\nlabels {}\n"
      "info {} {} {} {} {} {} {} {}\nidentity {}\nfiles {}\n",
      x.spec, x.dataset.empty() ? "-" : x.dataset, x.rows ? 1 : 0, x.whole_files ? 1 : 0,
      x.label_dataset.empty() ? "-" : x.label_dataset,
      x.info.samples, x.info.shape_string(), to_string(x.info.dtype), x.info.has_labels ? 1 : 0,
      to_string(x.info.label_dtype), x.info.label_bytes,
      // the seed, "sparse:SEED" for sparse content (content.h), "-" for none
      !x.info.seed                            ? std::string("-")
      : x.info.content == Content::sparse ? "sparse:" + std::to_string(*x.info.seed)
                                              : std::to_string(*x.info.seed),
      x.info.layout, x.identity,
      x.files.size());
  out.reserve(out.size() + x.files.size() * 96);
  for (const auto& f : x.files) {
    out += file_line(f);
    out += '\n';
  }
  if (const char* step = sys::write_file_atomically(path, out, 0644))
    throw StorageError(fmt::format("cannot write the dataset index {} ({}: {})", path, step,
                                   std::strerror(errno)));
}

DatasetIndex read_index(const std::string& path, std::string_view spec,
                        const std::string& label_dataset) {
  std::ifstream in(path);
  if (!in)
    throw StorageError(fmt::format("dataset index {}: cannot read: {}", path, std::strerror(errno)));
  auto bad = [&](std::string_view why) {
    return StorageError(fmt::format("dataset index {}: {}; delete it (solar scans the dataset "
                                    "again)",
                                    path, why));
  };
  std::string line;
  auto field = [&](std::string_view key) {
    if (!std::getline(in, line) || !line.starts_with(std::string(key) + " "))
      throw bad(fmt::format("no '{}' line where expected", key));
    return line.substr(key.size() + 1);
  };
  // Version 3 added the whole-files line; a version 2 index (no whole-file samples) is read.
  if (!std::getline(in, line) ||
      (line != "solar-dataset-index 3" && line != "solar-dataset-index 2"))
    throw bad("not a dataset index of this version");
  const bool v2 = line.ends_with(" 2");
  DatasetIndex x;
  x.spec = field("spec");
  if (x.spec != spec)
    throw StorageError(fmt::format("dataset index {} was made for '{}', not '{}'; point "
                                   "$SOLAR_DATASET_INDEX at the right one or unset it",
                                   path, x.spec, spec));
  x.dataset = field("dataset");
  if (x.dataset == "-") x.dataset.clear();
  x.rows = field("rows") == "1";
  if (!v2) x.whole_files = field("whole-files") == "1";
  x.label_dataset = field("labels");
  if (x.label_dataset == "-") x.label_dataset.clear();
  if (x.label_dataset != label_dataset)
    throw StorageError(fmt::format("dataset index {} was made with labels '{}', not '{}'", path,
                                   x.label_dataset, label_dataset));
  {
    std::istringstream is(field("info"));
    std::string shape, dtype, ldtype, seed, layout_rest;
    int has_labels = 0;
    is >> x.info.samples >> shape >> dtype >> has_labels >> ldtype >> x.info.label_bytes >> seed;
    std::getline(is, layout_rest);
    if (!is && !is.eof()) throw bad("unreadable info line");
    const auto dt = parse_dtype(dtype), lt = parse_dtype(ldtype);
    if (!dt || !lt) throw bad("unknown dtype");
    x.info.dtype = *dt;
    x.info.label_dtype = *lt;
    x.info.has_labels = has_labels != 0;
    x.info.sample_bytes = dtype_size(*dt);
    for (std::size_t b = 0; b < shape.size();) {
      std::size_t e = shape.find('x', b);
      if (e == std::string::npos) e = shape.size();
      x.info.sample_shape.push_back(to_u64(std::string_view(shape).substr(b, e - b), path));
      x.info.sample_bytes *= x.info.sample_shape.back();
      b = e + 1;
    }
    if (seed.starts_with("sparse:")) {
      x.info.content = Content::sparse;
      seed.erase(0, 7);
    }
    if (seed != "-") x.info.seed = to_u64(seed, path);
    x.info.layout = layout_rest.empty() ? "" : layout_rest.substr(1);
    x.info.whole_files = x.whole_files;
  }
  x.identity = field("identity");
  const std::uint64_t n = to_u64(field("files"), path);
  x.files.reserve(n);
  std::uint64_t total = 0;
  const std::uint64_t lb = x.info.has_labels ? x.info.label_bytes : 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    if (!std::getline(in, line)) throw bad(fmt::format("{} of {} files listed", i, n));
    // count ino size mtime ctime data_offset offsets labels path (the path may hold spaces)
    std::string_view rest = line;
    std::string_view part[8];
    for (auto& p : part) {
      const auto sp = rest.find(' ');
      if (sp == std::string_view::npos) throw bad(fmt::format("line {} is short", i + 10));
      p = rest.substr(0, sp);
      rest.remove_prefix(sp + 1);
    }
    DatasetFile f;
    f.path = std::string(rest);
    f.count = to_u64(part[0], path);
    f.ino = to_u64(part[1], path);
    f.size = to_u64(part[2], path);
    f.mtime_ns = static_cast<std::int64_t>(to_u64(part[3], path));
    f.ctime_ns = static_cast<std::int64_t>(to_u64(part[4], path));
    if (part[5] != "-") f.data_offset = to_u64(part[5], path);
    if (part[6] != "-")
      for (std::size_t b = 0; b <= part[6].size();) {
        std::size_t e = part[6].find(',', b);
        if (e == std::string_view::npos) e = part[6].size();
        const std::string_view one = part[6].substr(b, e - b);
        if (const auto colon = one.find(':'); colon != std::string_view::npos) {
          f.stored_offsets.push_back(to_u64(one.substr(0, colon), path));
          f.stored_lengths.push_back(to_u64(one.substr(colon + 1), path));
        } else {
          f.sample_offsets.push_back(to_u64(one, path));
        }
        b = e + 1;
      }
    if (!f.sample_offsets.empty() && !f.stored_offsets.empty())
      throw bad(fmt::format("line {}: raw and stored offsets mixed", i + 10));
    if ((!f.sample_offsets.empty() && f.sample_offsets.size() != f.count) ||
        (!f.stored_offsets.empty() && f.stored_offsets.size() != f.count))
      throw bad(fmt::format("line {}: {} offsets for {} samples", i + 10,
                            f.sample_offsets.size() + f.stored_offsets.size(), f.count));
    if (part[7] != "-") {
      if (part[7].size() != 2 * f.count * lb) throw bad(fmt::format("line {}: labels", i + 10));
      f.labels.resize(f.count * lb);
      for (std::size_t k = 0; k < f.labels.size(); ++k) {
        unsigned v = 0;
        std::from_chars(part[7].data() + 2 * k, part[7].data() + 2 * k + 2, v, 16);
        f.labels[k] = static_cast<std::byte>(v);
      }
    }
    f.first = total;
    total += f.count;
    x.files.push_back(std::move(f));
  }
  if (total != x.info.samples)
    throw bad(fmt::format("its files hold {} samples, its header says {}", total, x.info.samples));
  if (identity_of(x) != x.identity) throw bad("its identity does not match its content");
  return x;
}

// ---- reading samples across the files ---------------------------------------------------------

namespace {

class FilesSource final : public SampleSource, public DatasetFiles {
 public:
  FilesSource(DatasetIndex x, const SourceOptions& o) : x_(std::move(x)), o_(o) {
    unsigned open_max = o.max_open_files ? o.max_open_files : 64;
    struct rlimit rl {};
    // At most an eighth of the process's descriptors: the program around us needs the rest.
    if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
      open_max = static_cast<unsigned>(std::min<rlim_t>(open_max, std::max<rlim_t>(1, rl.rlim_cur / 8)));
    // Every part of a read has one file open: as many parts in flight as files may be open.
    workers_ = std::max(1u, std::min(open_max, std::max(1u, o.io_threads)));
    pool_ = std::make_unique<IoPool>(workers_ - 1);
    h5_.label_dataset = x_.label_dataset;
    h5_.whole = !x_.rows;
    h5_.io_threads = 1;
    h5_.check_path = false;
  }

  const DatasetInfo& info() const override { return x_.info; }
  std::string describe() const override { return x_.spec; }
  const std::string& identity() const override { return x_.identity; }
  std::uint64_t requests() const override { return requests_.load(); }
  const DatasetFiles* file_set() const override { return this; }
  std::span<const DatasetFile> files() const override { return x_.files; }

  void check_file(std::size_t i, bool) const override {
    const DatasetFile& f = x_.files.at(i);
    struct stat st {};
    if (::stat(f.path.c_str(), &st) != 0)
      throw StorageError(fmt::format("{} (of dataset '{}'): {} since the dataset was indexed; "
                                     "nothing more is read from it",
                                     f.path, x_.spec,
                                     errno == ENOENT ? "deleted or renamed away"
                                                     : std::strerror(errno)));
    if (const std::string why = f.differs(st); !why.empty())
      throw StorageError(fmt::format("{} (of dataset '{}') is not the file indexed: {}; solar "
                                     "refuses to mix another file's bytes into training",
                                     f.path, x_.spec, why));
  }

  void read(std::span<const SampleRun> runs, std::byte* dst) override {
    if (x_.whole_files)
      throw StorageError(fmt::format(
          "dataset '{}' is whole-file samples ({}): each sample is its file's bytes, of its own "
          "length, read as stored (read_stored) by solar's loader and by the agents, in batch "
          "mode as with --transparent, never as rows of one size",
          x_.spec, x_.info.layout));
    check_runs(x_.info, runs, x_.spec);
    run_parts(split(runs, dst, x_.info.sample_bytes),
              [this](const Part& p) { read_part(p); });
  }

  void read_stored(std::span<const SampleRun> runs, std::byte* dst,
                   std::uint64_t stride) override {
    check_runs(x_.info, runs, x_.spec);
    run_parts(split(runs, dst, stride), [this, stride](const Part& p) {
      const DatasetFile& f = x_.files[p.file];
      if (!f.raw() && !f.stored())
        throw StorageError(fmt::format("{} (of dataset '{}'): its samples' stored bytes are not "
                                       "known (a layout HDF5 alone reads: chunks of several "
                                       "samples, or filtered contiguous data)",
                                       f.path, x_.spec));
      read_part(p, stride);
    });
  }

  void read_labels(std::span<const SampleRun> runs, std::byte* dst) override {
    if (!x_.info.has_labels)
      throw StorageError(fmt::format("dataset '{}' has no labels ({})", x_.spec,
                                     x_.label_dataset.empty() ? "none requested"
                                                              : x_.label_dataset + " not found"));
    check_runs(x_.info, runs, x_.spec);
    const std::uint64_t lb = x_.info.label_bytes;
    std::vector<Part> parts = split(runs, dst, lb);
    std::vector<Part> h5;  // labels not in the index: read from the file
    for (const Part& p : parts) {
      const DatasetFile& f = x_.files[p.file];
      if (!f.labels.empty())
        std::memcpy(p.out, f.labels.data() + p.first * lb, p.count * lb);
      else
        h5.push_back(p);
    }
    run_parts(std::move(h5), [this](const Part& p) {
      auto h = open_h5(p.file);
      const SampleRun r{p.first, p.count};
      h->read_labels({&r, 1}, p.out);
    });
  }

  void drop_cache() override {
    for (const auto& f : x_.files) {
      const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }

 private:
  struct Part {  // local samples [first, first + count) of one file, into `out`
    std::size_t file;
    std::uint64_t first, count;
    std::byte* out;
  };

  std::size_t file_of(std::uint64_t id) const {
    auto it = std::upper_bound(x_.files.begin(), x_.files.end(), id,
                               [](std::uint64_t v, const DatasetFile& f) { return v < f.first; });
    return static_cast<std::size_t>(it - x_.files.begin()) - 1;
  }

  // Runs of global ids -> one part per file touched, in the order given, with where each goes.
  std::vector<Part> split(std::span<const SampleRun> runs, std::byte* dst, std::uint64_t each) {
    std::vector<Part> parts;
    for (const auto& r : runs) {
      std::uint64_t id = r.first, left = r.count;
      while (left) {
        const std::size_t fi = file_of(id);
        const DatasetFile& f = x_.files[fi];
        const std::uint64_t local = id - f.first, n = std::min(left, f.count - local);
        if (!parts.empty() && parts.back().file == fi &&
            parts.back().first + parts.back().count == local)
          parts.back().count += n;  // runs adjacent in one file: one part
        else
          parts.push_back({fi, local, n, dst});
        dst += n * each;
        id += n;
        left -= n;
      }
    }
    return parts;
  }

  // The parts of one file together (one open each), the files in parallel.
  void run_parts(std::vector<Part> parts, const std::function<void(const Part&)>& each) {
    if (parts.empty()) return;
    pool_->run(parts.size(), [&](std::size_t i) { each(parts[i]); });
  }

  std::unique_ptr<Hdf5Source> open_h5(std::size_t fi) {
    const DatasetFile& f = x_.files[fi];
    std::unique_ptr<Hdf5Source> h;
    try {
      h = Hdf5Source::open(f.path, x_.dataset, h5_);
    } catch (const StorageError& e) {
      throw StorageError(fmt::format("{} (of dataset '{}'): {}", f.path, x_.spec, e.what()));
    }
    if (const std::string why = f.differs(h->opened_stat()); !why.empty())
      throw StorageError(fmt::format("{} (of dataset '{}') is not the file indexed: {}; solar "
                                     "refuses to mix another file's bytes into training",
                                     f.path, x_.spec, why));
    return h;
  }

  // stride 0: the samples decoded, back to back; else each one's stored extent at its stride.
  void read_part(const Part& p, std::uint64_t stride = 0) {
    const DatasetFile& f = x_.files[p.file];
    if (!stride && !f.raw()) {  // compressed, filtered: HDF5 reads it
      auto h = open_h5(p.file);
      const SampleRun r{p.first, p.count};
      h->read({&r, 1}, p.out);
      ++requests_;
      return;
    }
    const std::uint64_t sb = x_.info.sample_bytes;
    for (unsigned attempt = 1;; ++attempt) {
      try {
        read_raw(f, p, sb, stride);
        return;
      } catch (const std::system_error& e) {  // I/O errors: retried, then reported
        if (attempt >= kAttempts)
          throw StorageError(fmt::format("{} (of dataset '{}'): reading samples [{}, {}) of the "
                                         "file (the dataset's [{}, {})) failed ({} attempts): {}",
                                         f.path, x_.spec, p.first, p.first + p.count,
                                         f.first + p.first, f.first + p.first + p.count, attempt,
                                         e.code().message()));
        std::this_thread::sleep_for(kPause * (1U << (attempt - 1)));
      }
    }
  }

  // The part's bytes with pread, checked against the index before and after (a rewrite during
  // the read, a file moved over the path: refused). I/O errors throw std::system_error.
  void read_raw(const DatasetFile& f, const Part& p, std::uint64_t sb, std::uint64_t stride) {
    // SourceOptions::direct: O_DIRECT where the file system takes it (no page cache), else
    // buffered, as Hdf5Source does.
    int fd = o_.direct ? ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT) : -1;
    bool direct = fd >= 0;
    if (fd < 0) fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == ENOENT || err == EACCES || err == ENOTDIR)
        throw StorageError(fmt::format("{} (of dataset '{}'): cannot open: {}", f.path, x_.spec,
                                       std::strerror(err)));
      throw std::system_error(err, std::generic_category());
    }
    struct Close {
      int& fd;
      ~Close() { ::close(fd); }
    } closer{fd};
    auto check = [&] {
      struct stat st {};
      if (::fstat(fd, &st) != 0) throw std::system_error(errno, std::generic_category());
      if (const std::string why = f.differs(st); !why.empty())
        throw StorageError(fmt::format("{} (of dataset '{}') is not the file indexed: {}; solar "
                                       "refuses to mix another file's bytes into training",
                                       f.path, x_.spec, why));
    };
    check();
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    auto pread_all = [&](std::uint64_t off, std::uint64_t len, std::byte* out) {
      ++requests_;
      if (direct) {
        if (read_direct(fd, off, len, out)) return;
        // refused (an alignment this file system does not take): buffered from here on
        const int plain = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
        if (plain < 0) throw std::system_error(errno, std::generic_category());
        ::close(fd);
        fd = plain;
        direct = false;
        check();
      }
      for (std::uint64_t done = 0; done < len;) {
        const ssize_t n = ::pread(fd, out + done, len - done, static_cast<off_t>(off + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw std::system_error(errno, std::generic_category());
        if (n == 0)
          throw StorageError(fmt::format("{} (of dataset '{}'): the file ended at offset {} "
                                         "(truncated?)",
                                         f.path, x_.spec, off + done));
        done += static_cast<std::uint64_t>(n);
      }
    };
    if (stride) {  // stored extents, one a sample
      for (std::uint64_t k = 0; k < p.count; ++k) {
        const auto [off, len] = f.stored_extent(p.first + k, sb);
        if (len > stride)
          throw StorageError(fmt::format("{} (of dataset '{}'): sample {} is {} bytes as stored, "
                                         "more than the {} given for it",
                                         f.path, x_.spec, p.first + k, len, stride));
        pread_all(off, len, p.out + k * stride);
        std::memset(p.out + k * stride + len, 0, stride - len);
      }
    } else if (f.data_offset) {
      pread_all(*f.data_offset + p.first * sb, p.count * sb, p.out);
    } else {
      for (std::uint64_t k = 0; k < p.count;) {  // adjacent chunks in one request
        std::uint64_t n = 1;
        while (k + n < p.count &&
               f.sample_offsets[p.first + k + n] == f.sample_offsets[p.first + k] + n * sb)
          ++n;
        pread_all(f.sample_offsets[p.first + k], n * sb, p.out + k * sb);
        k += n;
      }
    }
    check();  // after: a rewrite during the read is caught too
  }

  DatasetIndex x_;
  SourceOptions o_;
  Hdf5Options h5_;
  unsigned workers_ = 1;
  std::unique_ptr<IoPool> pool_;
  std::atomic<std::uint64_t> requests_{0};
};

}  // namespace

std::unique_ptr<SampleSource> open_files_source(DatasetIndex index, const SourceOptions& options) {
  return std::make_unique<FilesSource>(std::move(index), options);
}

}  // namespace solar::storage

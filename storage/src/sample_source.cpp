#include "solar/storage/sample_source.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "solar/storage/fabric_source.h"
#include "solar/storage/hdf5_source.h"

namespace solar::storage {
namespace {
struct DTypeName {
  DType type;
  std::string_view name;
  std::size_t size;
};
constexpr std::array<DTypeName, 10> kDTypes{{{DType::int8, "int8", 1},
                                             {DType::uint8, "uint8", 1},
                                             {DType::int16, "int16", 2},
                                             {DType::uint16, "uint16", 2},
                                             {DType::int32, "int32", 4},
                                             {DType::uint32, "uint32", 4},
                                             {DType::int64, "int64", 8},
                                             {DType::uint64, "uint64", 8},
                                             {DType::float32, "float32", 4},
                                             {DType::float64, "float64", 8}}};
}  // namespace

std::string_view to_string(DType t) { return kDTypes[static_cast<std::size_t>(t)].name; }
std::size_t dtype_size(DType t) { return kDTypes[static_cast<std::size_t>(t)].size; }
std::optional<DType> parse_dtype(std::string_view s) {
  for (const auto& d : kDTypes)
    if (d.name == s) return d.type;
  return std::nullopt;
}

std::vector<SampleRun> coalesce(std::vector<std::uint64_t> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::vector<SampleRun> runs;
  for (std::uint64_t id : ids) {
    if (!runs.empty() && runs.back().first + runs.back().count == id)
      ++runs.back().count;
    else
      runs.push_back({id, 1});
  }
  return runs;
}

std::uint64_t total_samples(std::span<const SampleRun> runs) {
  std::uint64_t n = 0;
  for (const auto& r : runs) n += r.count;
  return n;
}

std::string DatasetInfo::shape_string() const {
  std::string s;
  for (auto d : sample_shape) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s.empty() ? "scalar" : s;
}

void check_runs(const DatasetInfo& info, std::span<const SampleRun> runs,
                std::string_view source) {
  for (const auto& r : runs) {
    if (r.first >= info.samples || r.count > info.samples - r.first)
      throw StorageError(fmt::format(
          "{}: samples [{}, {}) requested, but the dataset has samples 0..{}", source, r.first,
          r.first + r.count, info.samples == 0 ? 0 : info.samples - 1));
  }
}

std::string file_identity(const struct ::stat& st) {
  return fmt::format("file inode {} size {} mtime {}.{:09}", st.st_ino, st.st_size,
                     st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
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
  if (spec.starts_with("fabric://")) {
    FabricOptions f;
    f.queue_depth = o.queue_depth;
    f.timeout_s = o.timeout_s;
    f.reconnect_s = o.reconnect_s;
    f.token = o.token;
    f.provider = o.provider;
    return FabricSource::connect(std::string(spec), f);
  }
  if (spec.find("://") != std::string_view::npos)
    throw StorageError(fmt::format("source '{}': unknown scheme; use FILE.h5:/dataset or "
                                   "fabric://HOST:PORT/NAME",
                                   spec));
  // FILE.h5:/dataset — split at the last ":/" so paths with colons still work.
  std::string path(spec), dataset = "/data";
  if (auto pos = spec.rfind(":/"); pos != std::string_view::npos && pos > 0) {
    path = std::string(spec.substr(0, pos));
    dataset = std::string(spec.substr(pos + 1));
  }
  if (path.empty())
    throw StorageError(fmt::format("source '{}': no file; use FILE.h5:/dataset", spec));
  Hdf5Options h;
  h.io_threads = o.io_threads;
  h.label_dataset = o.label_dataset;
  h.direct = o.direct;
  return Hdf5Source::open(path, dataset, h);
}
}  // namespace

std::unique_ptr<SampleSource> open_source(std::string_view spec, const SourceOptions& o) {
  auto src = open_unchecked(spec, o);
  check_identity(*src, o.expect_identity);
  return src;
}

}  // namespace solar::storage

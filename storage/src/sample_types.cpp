// SPDX-License-Identifier: Apache-2.0
// The plain types of sample_source.h: dtypes, runs of samples and their checks, identities. No
// HDF5, MPI or libfabric here, so that a program that only decodes requests (solar-stored's
// wire protocol, its fuzzer in tests/fuzz) can link them alone.
#include "solar/storage/sample_source.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>

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

}  // namespace solar::storage

// SPDX-License-Identifier: Apache-2.0
// libsolar-direct.so: the direct path's storage (HDF5, libfabric), loaded by libsolar on first
// use (direct_source.h). Only solar_direct_open_v1 is exported; everything linked in is local.
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fmt/format.h>
#include <type_traits>

#include "direct_source.h"

extern "C" [[gnu::visibility("default")]] int solar_direct_open_v1(
    const char* build, const char* spec, const solar::storage::SourceOptions* options,
    solar::storage::SampleSource** out, char* error, std::size_t error_size) {
  static_assert(std::is_same_v<decltype(solar_direct_open_v1), solar::client::DirectOpenFn>);
  try {
    if (build == nullptr || solar::client::direct_build() != build) {
      Dl_info info{};
      ::dladdr(reinterpret_cast<void*>(&solar_direct_open_v1), &info);
      throw solar::storage::StorageError(fmt::format(
          "{} is of another build than the libsolar that loaded it (module: {}; libsolar: {}): "
          "install both from one build, or point SOLAR_DIRECT_LIBRARY at this libsolar's",
          info.dli_fname ? info.dli_fname : solar::client::kDirectModule,
          solar::client::direct_build(), build ? build : "?"));
    }
    *out = solar::storage::open_source(spec, *options).release();
    return 0;
  } catch (const std::exception& e) {
    if (error_size) {
      const std::size_t n = std::min(std::strlen(e.what()), error_size - 1);
      std::memcpy(error, e.what(), n);
      error[n] = '\0';
    }
    return 1;
  } catch (...) {
    if (error_size) std::snprintf(error, error_size, "opening %s failed (unknown error)", spec);
    return 1;
  }
}

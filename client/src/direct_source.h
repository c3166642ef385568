// SPDX-License-Identifier: Apache-2.0
// The direct path's storage (a rank reading its samples itself, without an agent), kept out of
// libsolar: HDF5 and libfabric (with every libfabric provider's dependencies and their
// constructors) cost a rank 0.2 s at load time and take over signal handlers, for a path most
// ranks never take. They live in the module libsolar-direct.so, which libsolar opens the first
// time a rank reads directly. This header is the contract between the two; both are built from
// the same tree, and the module refuses a libsolar of another build.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "solar/solar.h"
#include "solar/storage/sample_source.h"

namespace solar::client {

// The module's file name, looked for beside libsolar (see open_direct_source).
inline constexpr char kDirectModule[] = "libsolar-direct.so";

// The module's only exported symbol. Opens `spec` with `options` (storage::open_source) into
// *out; returns 0, or non-zero with the reason in `error` (NUL-terminated, truncated to
// `error_size`). No exception crosses it. `build` must equal kDirectBuild as the module was
// compiled: both sides pass C++ objects, so they must agree on their layout.
inline constexpr char kDirectOpenSymbol[] = "solar_direct_open_v1";
using DirectOpenFn = int(const char* build, const char* spec,
                         const storage::SourceOptions* options, storage::SampleSource** out,
                         char* error, std::size_t error_size);

// What the two sides must agree on: the version and the sizes of the objects passed.
inline std::string direct_build() {
  return std::string(SOLAR_VERSION_STRING) + " options " +
         std::to_string(sizeof(storage::SourceOptions)) + " info " +
         std::to_string(sizeof(storage::DatasetInfo)) + " source " +
         std::to_string(sizeof(storage::SampleSource));
}

// storage::open_source through the module, which is loaded on the first call (thread-safe)
// from $SOLAR_DIRECT_LIBRARY, else beside the libsolar this code is in. Every signal
// disposition is put back as it was before the load (the constructors of libfabric's provider
// libraries install their own handlers). Throws storage::StorageError naming where it looked
// when the module cannot be loaded, or the module's error when the source cannot be opened.
std::unique_ptr<storage::SampleSource> open_direct_source(const std::string& spec,
                                                          const storage::SourceOptions& options);

}  // namespace solar::client

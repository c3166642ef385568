// SPDX-License-Identifier: Apache-2.0
// Small helpers around the HDF5 C API: owning handles, the library lock, error text, types.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "solar/storage/sample_source.h"

namespace solar::storage::h5 {

// HDF5 is built without its thread-safety option here: every HDF5 call holds this lock.
std::recursive_mutex& lock();

// Silences HDF5's own error printing once per process (we report errors ourselves).
void quiet();

// The innermost message on HDF5's error stack ("" when empty), then clears the stack.
std::string last_error();

// Throws StorageError("<what>: <hdf5 message>") when id < 0.
hid_t check(hid_t id, const std::string& what);

class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept {
    reset();
    id_ = o.id_;
    close_ = o.close_;
    o.id_ = -1;
    return *this;
  }
  ~Handle() { reset(); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// The native memory type of a dtype, and the dtype of a file type (nullopt: unsupported).
hid_t native_type(DType t);
std::optional<DType> dtype_of(hid_t file_type);
// True when the file type is the host's byte order (raw bytes need no conversion).
bool native_order(hid_t file_type);

// Dataset names directly under the root group ("/a, /b", or "none"), for "did you mean" messages.
std::string list_datasets(hid_t file);
// True when every component of `path` exists and the last one is a dataset.
bool dataset_exists(hid_t file, const std::string& path);
// A string (fixed or variable length) or uint64 attribute of `obj`; nullopt when absent or of
// another type.
std::optional<std::string> string_attribute(hid_t obj, const char* name);
std::optional<std::uint64_t> u64_attribute(hid_t obj, const char* name);
// DatasetInfo::layout's name of a layout: contiguous, compact, chunked, chunked+compressed, virtual.
std::string layout_name(H5D_layout_t layout, int filters);

}  // namespace solar::storage::h5

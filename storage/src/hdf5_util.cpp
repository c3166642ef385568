// SPDX-License-Identifier: Apache-2.0
#include "hdf5_util.h"

#include <cstring>

#include <fmt/format.h>

namespace solar::storage::h5 {

std::recursive_mutex& lock() {
  static std::recursive_mutex m;
  return m;
}

void quiet() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::lock_guard g(lock());
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

std::string last_error() {
  std::string msg;
  auto walk = [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
    auto* out = static_cast<std::string*>(data);
    if (e->desc && *e->desc) *out = e->desc;  // the last one walked is the innermost
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk, &msg);
  H5Eclear2(H5E_DEFAULT);
  return msg;
}

hid_t check(hid_t id, const std::string& what) {
  if (id < 0) {
    const std::string e = last_error();
    throw StorageError(e.empty() ? what : fmt::format("{} ({})", what, e));
  }
  return id;
}

hid_t native_type(DType t) {
  switch (t) {
    case DType::int8: return H5T_NATIVE_INT8;
    case DType::uint8: return H5T_NATIVE_UINT8;
    case DType::int16: return H5T_NATIVE_INT16;
    case DType::uint16: return H5T_NATIVE_UINT16;
    case DType::int32: return H5T_NATIVE_INT32;
    case DType::uint32: return H5T_NATIVE_UINT32;
    case DType::int64: return H5T_NATIVE_INT64;
    case DType::uint64: return H5T_NATIVE_UINT64;
    case DType::float32: return H5T_NATIVE_FLOAT;
    case DType::float64: return H5T_NATIVE_DOUBLE;
  }
  return H5T_NATIVE_UINT8;
}

std::optional<DType> dtype_of(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const std::size_t size = H5Tget_size(type);
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    switch (size) {
      case 1: return is_signed ? DType::int8 : DType::uint8;
      case 2: return is_signed ? DType::int16 : DType::uint16;
      case 4: return is_signed ? DType::int32 : DType::uint32;
      case 8: return is_signed ? DType::int64 : DType::uint64;
      default: return std::nullopt;
    }
  }
  if (cls == H5T_FLOAT) {
    if (size == 4) return DType::float32;
    if (size == 8) return DType::float64;
  }
  return std::nullopt;
}

bool native_order(hid_t type) {
  const H5T_order_t o = H5Tget_order(type);
  return o == H5T_ORDER_LE || o == H5T_ORDER_NONE;  // this code targets little-endian hosts
}

std::string list_datasets(hid_t file) {
  std::string names;
  auto visit = [](hid_t g, const char* name, const H5L_info_t*, void* data) -> herr_t {
    H5O_info_t oi;
    if (H5Oget_info_by_name(g, name, &oi, H5P_DEFAULT) >= 0 && oi.type == H5O_TYPE_DATASET) {
      auto* out = static_cast<std::string*>(data);
      *out += (out->empty() ? "/" : ", /") + std::string(name);
    }
    return 0;
  };
  H5Literate(file, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, visit, &names);
  H5Eclear2(H5E_DEFAULT);
  return names.empty() ? "none" : names;
}

bool dataset_exists(hid_t file, const std::string& path) {
  std::string prefix;
  std::size_t pos = 0;
  while (pos < path.size()) {
    std::size_t next = path.find('/', pos + 1);
    if (next == std::string::npos) next = path.size();
    prefix = path.substr(0, next);
    if (prefix != "/" && H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
    pos = next;
  }
  H5O_info_t oi;
  if (H5Oget_info_by_name(file, path.c_str(), &oi, H5P_DEFAULT) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  return oi.type == H5O_TYPE_DATASET;
}

std::optional<std::string> string_attribute(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return std::nullopt;
  Handle a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!a) return std::nullopt;
  Handle type(H5Aget_type(a.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING) return std::nullopt;
  if (H5Tis_variable_str(type.get()) > 0) {
    Handle mt(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mt.get(), H5T_VARIABLE);
    H5Tset_cset(mt.get(), H5Tget_cset(type.get()));
    char* s = nullptr;
    if (H5Aread(a.get(), mt.get(), &s) < 0 || !s) return std::nullopt;
    std::string out(s);
    H5free_memory(s);
    return out;
  }
  std::string out(H5Tget_size(type.get()), '\0');
  if (H5Aread(a.get(), type.get(), out.data()) < 0) return std::nullopt;
  out.resize(std::strlen(out.c_str()));
  return out;
}

std::optional<std::uint64_t> u64_attribute(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return std::nullopt;
  Handle a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  std::uint64_t v = 0;
  if (!a || H5Aread(a.get(), H5T_NATIVE_UINT64, &v) < 0) return std::nullopt;
  return v;
}

std::string layout_name(H5D_layout_t layout, int filters) {
  if (layout == H5D_CONTIGUOUS) return "contiguous";
  if (layout == H5D_COMPACT) return "compact";
  if (layout == H5D_CHUNKED) return filters > 0 ? "chunked+compressed" : "chunked";
  return "virtual";
}

}  // namespace solar::storage::h5

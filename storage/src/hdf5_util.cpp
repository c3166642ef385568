#include "hdf5_util.h"

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

}  // namespace solar::storage::h5

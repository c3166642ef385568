// SPDX-License-Identifier: Apache-2.0
#include "solar/core/order_file.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string_view>

#include "solar/core/config.h"
#include "solar/core/config_error.h"

namespace solar {
namespace {

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw ConfigError("--order-file", fmt::format("{}: {}", path, why));
}

struct Ids {
  std::vector<std::uint64_t> v;
  std::optional<std::pair<std::uint64_t, std::uint64_t>> shape;  // (rows, columns), 2-D .npy
};

// The value of `key` in a .npy header's dict literal ("{'descr': '<i8', 'fortran_order': False,
// 'shape': (3, 100), }"), up to the next top-level comma or brace.
std::string_view dict_value(std::string_view h, std::string_view key) {
  const auto at = h.find(fmt::format("'{}'", key));
  if (at == std::string_view::npos) return {};
  auto v = h.substr(at + key.size() + 2);
  v.remove_prefix(std::min(v.find_first_not_of(" :"), v.size()));
  if (v.empty()) return {};
  const std::size_t end = v.front() == '(' ? v.find(')') + 1 : v.find_first_of(",}");
  return v.substr(0, std::min(end, v.size()));
}

Ids read_npy(const std::string& path, const std::string& bytes) {
  auto fail = [&](const std::string& why) -> Ids {
    bad(path, fmt::format("not a .npy file this reads: {} (write it with np.save of an integer "
                          "array, or give a text file of sample ids)",
                          why));
  };
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) return fail("no NumPy magic");
  const auto major = static_cast<unsigned char>(bytes[6]);
  std::size_t len = 0, at = 0;
  if (major == 1) {
    len = static_cast<unsigned char>(bytes[8]) | static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8;
    at = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return fail("truncated header");
    for (int i = 0; i < 4; ++i)
      len |= static_cast<std::size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    at = 12;
  } else {
    return fail(fmt::format("format version {}", major));
  }
  if (bytes.size() < at + len) return fail("truncated header");
  const std::string_view header(bytes.data() + at, len);
  at += len;
  std::string_view descr = dict_value(header, "descr");
  if (descr.size() >= 2 && descr.front() == '\'' && descr.back() == '\'')
    descr = descr.substr(1, descr.size() - 2);
  std::size_t width = 0;
  bool is_signed = false;
  if (descr == "<i4") width = 4, is_signed = true;
  else if (descr == "<i8") width = 8, is_signed = true;
  else if (descr == "<u4") width = 4;
  else if (descr == "<u8") width = 8;
  else return fail(fmt::format("dtype {} (int32, int64, uint32 or uint64, little-endian)", descr));
  if (dict_value(header, "fortran_order") != "False")
    return fail("Fortran order (save a C-order array: np.ascontiguousarray)");
  std::string_view shape = dict_value(header, "shape");
  std::vector<std::uint64_t> dims;
  for (std::size_t i = 0; i < shape.size();) {
    if (shape[i] >= '0' && shape[i] <= '9') {
      std::uint64_t d = 0;
      while (i < shape.size() && shape[i] >= '0' && shape[i] <= '9') d = d * 10 + (shape[i++] - '0');
      dims.push_back(d);
    } else {
      ++i;
    }
  }
  if (dims.empty() || dims.size() > 2)
    return fail(fmt::format("shape {} (one array of shape (epochs, samples))", shape));
  const std::uint64_t count = dims.size() == 1 ? dims[0] : dims[0] * dims[1];
  if ((bytes.size() - at) / width < count)
    return fail(fmt::format("{} ids in the header's shape, {} bytes of data", count, bytes.size() - at));
  Ids ids;
  if (dims.size() == 2) ids.shape = std::pair{dims[0], dims[1]};
  ids.v.resize(count);
  const char* p = bytes.data() + at;
  for (std::uint64_t i = 0; i < count; ++i, p += width) {
    std::uint64_t u = 0;
    std::memcpy(&u, p, width);  // little-endian host (x86-64, aarch64)
    if (is_signed && width == 4) {
      const auto v = static_cast<std::int32_t>(static_cast<std::uint32_t>(u));
      u = v < 0 ? ~std::uint64_t{0} : static_cast<std::uint64_t>(v);
    } else if (is_signed && static_cast<std::int64_t>(u) < 0) {
      u = ~std::uint64_t{0};
    }
    ids.v[i] = u;
  }
  return ids;
}

Ids read_text(const std::string& path, const std::string& text) {
  Ids ids;
  std::size_t i = 0, line = 1;
  while (i < text.size()) {
    const char ch = text[i];
    if (ch == '\n') ++line;
    if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == ',') {
      ++i;
      continue;
    }
    if (ch < '0' || ch > '9') {
      const std::size_t end = std::min(text.find_first_of(" \t\r\n,", i), text.size());
      bad(path, fmt::format("line {}: '{}' is not a sample id (non-negative integers separated "
                            "by white space or commas)",
                            line, text.substr(i, std::min<std::size_t>(end - i, 40))));
    }
    std::uint64_t v = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      v = v > (~std::uint64_t{0} - 9) / 10 ? ~std::uint64_t{0} : v * 10 + (text[i] - '0');
      ++i;
    }
    ids.v.push_back(v);
  }
  return ids;
}

}  // namespace

std::shared_ptr<const std::vector<std::uint32_t>> read_order_file(const std::string& path,
                                                                  std::uint64_t samples,
                                                                  std::uint32_t epochs) {
  std::ifstream f(path, std::ios::binary);
  if (!f) bad(path, fmt::format("cannot open ({})", std::strerror(errno)));
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) bad(path, "read error");
  const bool npy = bytes.compare(0, 6, "\x93NUMPY") == 0;
  const Ids ids = npy ? read_npy(path, bytes) : read_text(path, bytes);
  const std::uint64_t need = std::uint64_t{epochs} * samples;
  if (ids.shape && ids.shape->second != samples)
    bad(path, fmt::format("shape ({}, {}): rows of {} sample ids, the dataset has {} samples",
                          ids.shape->first, ids.shape->second, ids.shape->second, samples));
  if (ids.v.size() < need || ids.v.size() % samples != 0)
    bad(path, fmt::format("{} sample ids: {} epochs of {} samples need {}{}", ids.v.size(), epochs,
                          samples, need,
                          ids.v.size() % samples != 0 ? " (not a whole number of epochs)" : ""));
  auto out = std::make_shared<std::vector<std::uint32_t>>(need);
  std::vector<std::uint32_t> seen_in(samples, ~std::uint32_t{0});  // the epoch it was last seen
  for (std::uint32_t e = 0; e < epochs; ++e)
    for (std::uint64_t q = 0; q < samples; ++q) {
      const std::uint64_t x = ids.v[std::uint64_t{e} * samples + q];
      if (x >= samples)
        bad(path, fmt::format("epoch {}, position {}: {} is out of range (the dataset has {} "
                              "samples: 0..{})",
                              e, q,
                              x == ~std::uint64_t{0} ? std::string("a negative sample id")
                                                     : fmt::format("sample id {}", x),
                              samples, samples - 1));
      if (seen_in[x] == e)
        bad(path, fmt::format("epoch {}, position {}: sample {} appears twice in the epoch (each "
                              "epoch must be a permutation of 0..{})",
                              e, q, x, samples - 1));
      seen_in[x] = e;
      (*out)[std::uint64_t{e} * samples + q] = static_cast<std::uint32_t>(x);
    }
  return out;
}

void follow_order_file(PlanConfig& c, const std::string& path) {
  c.order = OrderMode::file;
  c.order_list = read_order_file(path, c.samples, c.epochs);
  c.validate();
}

}  // namespace solar

// SPDX-License-Identifier: Apache-2.0
#include "solar/storage/npz.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "solar/core/plan_file.h"  // crc32 (zlib's, as zip's)
#include "solar/storage/sample_source.h"

namespace solar::storage {
namespace {

void put16(std::string& o, std::uint16_t v) {
  o.push_back(static_cast<char>(v & 0xff));
  o.push_back(static_cast<char>(v >> 8));
}
void put32(std::string& o, std::uint32_t v) {
  put16(o, static_cast<std::uint16_t>(v & 0xffff));
  put16(o, static_cast<std::uint16_t>(v >> 16));
}
std::uint32_t get(const std::string& s, std::size_t at, int bytes) {
  std::uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i)
    v = v << 8 | static_cast<unsigned char>(s[at + static_cast<std::size_t>(i)]);
  return v;
}

// The .npy bytes of one array: format 1.0, its header padded with spaces to a multiple of 64.
std::string npy_bytes(const NpyArray& a) {
  std::string shape;
  for (std::uint64_t d : a.shape) shape += fmt::format("{}, ", d);
  if (a.shape.size() > 1) shape.resize(shape.size() - 2);  // (n,) for one dimension
  else if (!a.shape.empty()) shape.pop_back();
  std::string dict =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", a.descr, shape);
  const std::size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  put16(out, static_cast<std::uint16_t>(dict.size()));
  out += dict;
  out.append(reinterpret_cast<const char*>(a.data.data()), a.data.size());
  return out;
}

// The array of .npy bytes `npy` (entry `name` of `path`).
NpyArray parse_npy(const std::string& path, const std::string& name, const std::string& npy) {
  auto bad = [&](const std::string& why) {
    return StorageError(fmt::format("{}: entry {}: {}", path, name, why));
  };
  if (npy.size() < 10 || npy.compare(0, 6, "\x93NUMPY") != 0) throw bad("not a .npy array");
  const int major = static_cast<unsigned char>(npy[6]);
  const std::size_t start = major == 1 ? 10 : 12;
  if (major < 1 || major > 3 || npy.size() < start) throw bad("a .npy header cut short");
  const std::size_t hl = major == 1 ? get(npy, 8, 2) : get(npy, 8, 4);
  if (npy.size() < start + hl) throw bad("a .npy header cut short");
  const std::string h = npy.substr(start, hl);
  auto field = [&](const std::string& key, char open, char close) {
    const std::size_t k = h.find("'" + key + "'");
    const std::size_t a = k == std::string::npos ? k : h.find(open, k + key.size() + 2);
    const std::size_t b = a == std::string::npos ? a : h.find(close, a + 1);
    if (b == std::string::npos) throw bad(fmt::format("its .npy header has no {}: {}", key, h));
    return h.substr(a + 1, b - a - 1);
  };
  NpyArray out;
  out.name = name.ends_with(".npy") ? name.substr(0, name.size() - 4) : name;
  out.descr = field("descr", '\'', '\'');
  if (h.find("'fortran_order': True") != std::string::npos) throw bad("Fortran order");
  const std::string dims = field("shape", '(', ')');
  for (std::size_t p = 0; p < dims.size();) {
    const std::size_t q = std::min(dims.find(',', p), dims.size());
    const std::string d = dims.substr(p, q - p);
    if (const std::size_t digit = d.find_first_not_of(' '); digit != std::string::npos) {
      if (d.find_first_not_of("0123456789 ") != std::string::npos || d.size() - digit > 19)
        throw bad(fmt::format("its .npy shape is ({})", dims));
      out.shape.push_back(std::stoull(d));
    }
    p = q + 1;
  }
  const char* data = npy.data() + start + hl;
  out.data.assign(reinterpret_cast<const std::byte*>(data),
                  reinterpret_cast<const std::byte*>(npy.data() + npy.size()));
  return out;
}

}  // namespace

void write_npz(const std::string& path, std::span<const NpyArray> arrays) {
  std::string zip, central;
  std::uint16_t entries = 0;
  for (const NpyArray& a : arrays) {
    const std::string name = a.name + ".npy";
    const std::string body = npy_bytes(a);
    if (body.size() >= 0xffffffffULL)
      throw StorageError(fmt::format("{}: array {} of {} bytes needs zip64, which this writer "
                                     "does not write",
                                     path, a.name, body.size()));
    const std::uint32_t crc =
        crc32(reinterpret_cast<const std::uint8_t*>(body.data()), body.size());
    const auto offset = static_cast<std::uint32_t>(zip.size());
    auto header = [&](std::string& o, bool central_entry) {
      put32(o, central_entry ? 0x02014b50 : 0x04034b50);
      if (central_entry) put16(o, 20);  // made by
      put16(o, 20);                     // needed: 2.0
      put16(o, 0);                      // flags
      put16(o, 0);                      // stored
      put16(o, 0);                      // time
      put16(o, 0x21);                   // date: 1980-01-01
      put32(o, crc);
      put32(o, static_cast<std::uint32_t>(body.size()));
      put32(o, static_cast<std::uint32_t>(body.size()));
      put16(o, static_cast<std::uint16_t>(name.size()));
      put16(o, 0);  // extra
      if (central_entry) {
        put16(o, 0);  // comment
        put16(o, 0);  // disk
        put16(o, 0);  // internal attributes
        put32(o, 0);  // external attributes
        put32(o, offset);
      }
      o += name;
    };
    header(zip, false);
    zip += body;
    header(central, true);
    ++entries;
  }
  const auto cd_offset = static_cast<std::uint32_t>(zip.size());
  zip += central;
  put32(zip, 0x06054b50);
  put16(zip, 0);
  put16(zip, 0);
  put16(zip, entries);
  put16(zip, entries);
  put32(zip, static_cast<std::uint32_t>(central.size()));
  put32(zip, cd_offset);
  put16(zip, 0);
  const std::string tmp = path + ".partial";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(zip.data(), static_cast<std::streamsize>(zip.size()));
    f.close();
    if (!f) throw StorageError(fmt::format("writing {}: {}", tmp, std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw StorageError(fmt::format("renaming {} to {}: {}", tmp, path, std::strerror(err)));
  }
}

std::vector<NpyArray> read_npz(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw StorageError(fmt::format("{}: {}", path, std::strerror(errno)));
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<NpyArray> out;
  std::size_t at = 0;
  while (at + 4 <= s.size() && get(s, at, 4) == 0x04034b50) {
    if (at + 30 > s.size()) break;
    const std::uint32_t flags = get(s, at + 6, 2), method = get(s, at + 8, 2),
                        crc = get(s, at + 14, 4), size = get(s, at + 18, 4),
                        name_len = get(s, at + 26, 2), extra = get(s, at + 28, 2);
    const std::size_t data = at + 30 + name_len + extra;
    const std::string name = s.substr(at + 30, name_len);
    if (method != 0)
      throw StorageError(fmt::format("{}: entry {} is compressed (zip method {}: "
                                     "np.savez_compressed?); solar reads stored entries (np.savez)",
                                     path, name, method));
    if ((flags & 8) || data + size > s.size())
      throw StorageError(fmt::format("{}: entry {} is cut short or has no sizes in its header",
                                     path, name));
    const std::string npy = s.substr(data, size);
    if (crc32(reinterpret_cast<const std::uint8_t*>(npy.data()), npy.size()) != crc)
      throw StorageError(fmt::format("{}: entry {}: its CRC-32 does not match its bytes", path,
                                     name));
    out.push_back(parse_npy(path, name, npy));
    at = data + size;
  }
  if (out.empty()) throw StorageError(fmt::format("{}: not an .npz (no zip entry found)", path));
  return out;
}

}  // namespace solar::storage

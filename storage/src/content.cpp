// SPDX-License-Identifier: Apache-2.0
#include "solar/storage/content.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace solar::storage::content {
namespace {
constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

constexpr std::uint64_t mix(std::uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ULL;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::uint64_t base(std::uint64_t seed, std::uint64_t index) {
  return mix(mix(seed ^ 0x5EED5EED5EED5EEDULL) + index * kGolden);
}

// Little-endian words; this code targets little-endian hosts only (x86-64, aarch64).
static_assert(std::endian::native == std::endian::little);

// Sparse content: each byte r of the random word becomes r < 192 ? 0 : 1 + (r & 3).
std::uint64_t sparse(std::uint64_t w) {
  std::uint64_t out = 0;
  for (int j = 0; j < 8; ++j) {
    const std::uint64_t r = (w >> (8 * j)) & 0xFF;
    out |= (r < 192 ? 0 : 1 + (r & 3)) << (8 * j);
  }
  return out;
}

// Word k of sample `b`'s content.
std::uint64_t word(std::uint64_t b, std::uint64_t k, Content c) {
  const std::uint64_t w = mix(b + (k + 1) * kGolden);
  return c == Content::sparse ? sparse(w) : w;
}
}  // namespace

std::string_view generator(Content c) {
  return c == Content::sparse ? kGeneratorSparse : kGenerator;
}

std::optional<Content> parse_generator(std::string_view name) {
  if (name == kGenerator) return Content::random;
  if (name == kGeneratorSparse) return Content::sparse;
  return std::nullopt;
}

std::string_view to_string(Content c) { return c == Content::sparse ? "sparse" : "random"; }

std::optional<Content> parse_content(std::string_view name) {
  if (name == "random") return Content::random;
  if (name == "sparse") return Content::sparse;
  return std::nullopt;
}

void fill_sample(std::uint64_t seed, std::uint64_t index, std::byte* dst, std::uint64_t bytes,
                 Content c) {
  const std::uint64_t b = base(seed, index);
  const std::uint64_t words = bytes / 8;
  auto* out = reinterpret_cast<unsigned char*>(dst);
  for (std::uint64_t k = 0; k < words; ++k) {
    const std::uint64_t w = word(b, k, c);
    std::memcpy(out + 8 * k, &w, 8);
  }
  if (bytes % 8) {
    const std::uint64_t w = word(b, words, c);
    std::memcpy(out + 8 * words, &w, bytes % 8);
  }
}

bool check_sample(std::uint64_t seed, std::uint64_t index, const std::byte* src,
                  std::uint64_t bytes, Content c) {
  const std::uint64_t b = base(seed, index);
  const std::uint64_t words = bytes / 8;
  const auto* in = reinterpret_cast<const unsigned char*>(src);
  std::uint64_t diff = 0;
  for (std::uint64_t k = 0; k < words; ++k) {
    std::uint64_t w;
    std::memcpy(&w, in + 8 * k, 8);
    diff |= w ^ word(b, k, c);
    if ((k & 4095) == 4095 && diff) return false;
  }
  if (bytes % 8) {
    const std::uint64_t w = word(b, words, c);
    if (std::memcmp(in + 8 * words, &w, bytes % 8) != 0) return false;
  }
  return diff == 0;
}

std::int32_t label(std::uint64_t seed, std::uint64_t index) {
  return static_cast<std::int32_t>(mix(base(seed, index)) >> 33);
}

namespace {
// Element k of a label, as the dtype's little-endian bytes in the low end of a word.
std::uint64_t label_element(std::uint64_t b, std::uint64_t k, DType dtype) {
  const std::uint64_t r = mix(b ^ (k * kGolden));
  if (dtype == DType::float32) {
    const float f = static_cast<float>(r >> 40) * 0x1p-24f;
    return std::bit_cast<std::uint32_t>(f);
  }
  if (dtype == DType::float64)
    return std::bit_cast<std::uint64_t>(static_cast<double>(r >> 11) * 0x1p-53);
  return r >> 33;  // every integer dtype: its low bits, little-endian
}

// Calls `part(offset, word, n)` for the label's elements in order: n bytes of `word` at offset.
template <class F>
void for_label_elements(std::uint64_t seed, std::uint64_t index, DType dtype,
                        std::uint64_t bytes, F&& part) {
  const std::uint64_t b = base(seed, index);
  const std::uint64_t size = dtype_size(dtype);
  for (std::uint64_t off = 0, k = 0; off < bytes; off += size, ++k)
    if (!part(off, label_element(b, k, dtype), std::min(size, bytes - off))) return;
}
}  // namespace

void fill_label(std::uint64_t seed, std::uint64_t index, DType dtype, std::byte* dst,
                std::uint64_t bytes) {
  for_label_elements(seed, index, dtype, bytes,
                     [&](std::uint64_t off, std::uint64_t w, std::uint64_t n) {
                       std::memcpy(dst + off, &w, n);
                       return true;
                     });
}

bool check_label(std::uint64_t seed, std::uint64_t index, DType dtype, const std::byte* src,
                 std::uint64_t bytes) {
  bool same = true;
  for_label_elements(seed, index, dtype, bytes,
                     [&](std::uint64_t off, std::uint64_t w, std::uint64_t n) {
                       same = std::memcmp(src + off, &w, n) == 0;
                       return same;
                     });
  return same;
}

}  // namespace solar::storage::content

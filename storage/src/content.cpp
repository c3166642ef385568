#include "solar/storage/content.h"

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
}  // namespace

void fill_sample(std::uint64_t seed, std::uint64_t index, std::byte* dst, std::uint64_t bytes) {
  const std::uint64_t b = base(seed, index);
  const std::uint64_t words = bytes / 8;
  auto* out = reinterpret_cast<unsigned char*>(dst);
  for (std::uint64_t k = 0; k < words; ++k) {
    const std::uint64_t w = mix(b + (k + 1) * kGolden);
    std::memcpy(out + 8 * k, &w, 8);
  }
  if (bytes % 8) {
    const std::uint64_t w = mix(b + (words + 1) * kGolden);
    std::memcpy(out + 8 * words, &w, bytes % 8);
  }
}

bool check_sample(std::uint64_t seed, std::uint64_t index, const std::byte* src,
                  std::uint64_t bytes) {
  const std::uint64_t b = base(seed, index);
  const std::uint64_t words = bytes / 8;
  const auto* in = reinterpret_cast<const unsigned char*>(src);
  std::uint64_t diff = 0;
  for (std::uint64_t k = 0; k < words; ++k) {
    std::uint64_t w;
    std::memcpy(&w, in + 8 * k, 8);
    diff |= w ^ mix(b + (k + 1) * kGolden);
    if ((k & 4095) == 4095 && diff) return false;
  }
  if (bytes % 8) {
    const std::uint64_t w = mix(b + (words + 1) * kGolden);
    if (std::memcmp(in + 8 * words, &w, bytes % 8) != 0) return false;
  }
  return diff == 0;
}

std::int32_t label(std::uint64_t seed, std::uint64_t index) {
  return static_cast<std::int32_t>(mix(base(seed, index)) >> 33);
}

}  // namespace solar::storage::content

// SPDX-License-Identifier: Apache-2.0
#include "solar/core/rng.h"

#include <numeric>
#include <utility>

namespace solar {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

namespace {
__extension__ typedef unsigned __int128 u128;  // GCC/Clang; the product needs 128 bits
inline std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Xoshiro256::Xoshiro256(std::uint64_t seed) {
  std::uint64_t sm = seed;
  for (auto& word : s_) word = splitmix64(sm);
}

std::uint64_t Xoshiro256::next() {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

std::uint64_t Xoshiro256::bounded(std::uint64_t bound) {
  // 128-bit product: the high word is uniform in [0, bound) once the low word clears the
  // threshold 2^64 mod bound.
  u128 m = static_cast<u128>(next()) * bound;
  auto low = static_cast<std::uint64_t>(m);
  if (low < bound) {
    const std::uint64_t threshold = (0 - bound) % bound;
    while (low < threshold) {
      m = static_cast<u128>(next()) * bound;
      low = static_cast<std::uint64_t>(m);
    }
  }
  return static_cast<std::uint64_t>(m >> 64);
}

Mt19937::Mt19937(std::uint64_t seed) {
  mt_[0] = static_cast<std::uint32_t>(seed & 0xffffffffULL);
  for (int i = 1; i < 624; ++i) {
    mt_[i] = 1812433253U * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<std::uint32_t>(i);
  }
  index_ = 624;
}

void Mt19937::twist() {
  constexpr std::uint32_t kUpper = 0x80000000U, kLower = 0x7fffffffU, kMatrix = 0x9908b0dfU;
  for (int i = 0; i < 624; ++i) {
    const std::uint32_t y = (mt_[i] & kUpper) | (mt_[(i + 1) % 624] & kLower);
    mt_[i] = mt_[(i + 397) % 624] ^ (y >> 1) ^ ((y & 1U) ? kMatrix : 0U);
  }
  index_ = 0;
}

std::uint32_t Mt19937::next() {
  if (index_ >= 624) twist();
  std::uint32_t y = mt_[index_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= y >> 18;
  return y;
}

void solar_permutation(std::uint64_t seed, std::uint64_t epoch, std::span<std::uint32_t> out) {
  std::iota(out.begin(), out.end(), 0U);
  // Per-epoch stream: epochs can be generated independently and in any order.
  std::uint64_t key = seed ^ (0x5ec7d5a1a2b3c4d5ULL * (epoch + 1));
  Xoshiro256 rng(splitmix64(key));
  // Fisher–Yates, from the top: swap out[i] with a uniform out[j], j in [0, i].
  for (std::size_t i = out.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(rng.bounded(i));
    std::swap(out[i - 1], out[j]);
  }
}

void torch_randperm(std::uint64_t seed, std::span<std::uint32_t> out) {
  std::iota(out.begin(), out.end(), 0U);
  Mt19937 gen(seed);
  const std::size_t n = out.size();
  for (std::size_t i = 0; i + 1 < n; ++i) {
    const std::size_t z = gen.next() % (n - i);
    std::swap(out[i], out[i + z]);
  }
}

}  // namespace solar

// The deterministic content of a generated dataset: every byte of sample i is a function of
// (seed, i), so any reader can check what it got. The same function is implemented in
// tests/storage/make_h5py_dataset.py (numpy) for files written by h5py.
//
//   key    = mix(seed ^ 0x5EED5EED5EED5EED)
//   base_i = mix(key + i * G)                      G = 0x9E3779B97F4A7C15
//   word_k = mix(base_i + (k + 1) * G)             sample bytes = words 0, 1, ... little-endian
//   label  = int32(mix(base_i) >> 33)
//   mix(z) = SplitMix64's finaliser (z ^= z>>30; z *= 0xBF58476D1CE4E5B9; z ^= z>>27;
//            z *= 0x94D049BB133111EB; z ^= z>>31), all arithmetic mod 2^64.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace solar::storage::content {

// Stored as the HDF5 attribute solar_generator on the data set, next to solar_seed.
inline constexpr std::string_view kGenerator = "solar-splitmix64-v1";

void fill_sample(std::uint64_t seed, std::uint64_t index, std::byte* dst, std::uint64_t bytes);
// True when `src` holds exactly sample `index`'s content.
bool check_sample(std::uint64_t seed, std::uint64_t index, const std::byte* src,
                  std::uint64_t bytes);
std::int32_t label(std::uint64_t seed, std::uint64_t index);

}  // namespace solar::storage::content

// SPDX-License-Identifier: Apache-2.0
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
//
// Sparse content (solar gen --content sparse): each byte r of the random content above becomes
//   r < 192 ? 0 : 1 + (r & 3)
// (three bytes in four zero, the rest 1..4: about 1.3 bits a byte, which solar gen's gzip,
// deflate level 1, keeps at 29%, like CosmoFlow's counts). Labels are the same for both.
//
// A label of any dtype and size (fill_label: the CosmoFlow artifact's unitPar, float32[4];
// DeepCAM's labels_0, a 2-D mask; DLIO's int64 labels) is elements k = 0, 1, ... of
//   r_k    = mix(base_i ^ (k * G))                 (r_0 = mix(base_i): element 0 of an
//                                                   integer label is `label` above)
//   integers: the value r_k >> 33 (0 .. 2^31 - 1) in the dtype, modulo 2^bits, little-endian
//   float32: (r_k >> 40) * 2^-24, float64: (r_k >> 11) * 2^-53 (in [0, 1), exact)
// and a label's bytes past its last whole element (none for an array of the dtype) are the
// next element's first bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "solar/storage/sample_source.h"

namespace solar::storage::content {

// Stored as the HDF5 attribute solar_generator on the data set, next to solar_seed.
inline constexpr std::string_view kGenerator = "solar-splitmix64-v1";
inline constexpr std::string_view kGeneratorSparse = "solar-splitmix64-sparse-v1";
std::string_view generator(Content c);
// The content a solar_generator attribute names; nullopt for anything else.
std::optional<Content> parse_generator(std::string_view name);
// "random", "sparse" (solar gen --content) and back.
std::string_view to_string(Content c);
std::optional<Content> parse_content(std::string_view name);

void fill_sample(std::uint64_t seed, std::uint64_t index, std::byte* dst, std::uint64_t bytes,
                 Content c = Content::random);
// True when `src` holds exactly sample `index`'s content.
bool check_sample(std::uint64_t seed, std::uint64_t index, const std::byte* src,
                  std::uint64_t bytes, Content c = Content::random);
std::int32_t label(std::uint64_t seed, std::uint64_t index);

// Sample `index`'s label as `bytes` bytes of `dtype` (the rule above). An int32 label of 4
// bytes is label(seed, index).
void fill_label(std::uint64_t seed, std::uint64_t index, DType dtype, std::byte* dst,
                std::uint64_t bytes);
// True when `src` holds exactly sample `index`'s label.
bool check_label(std::uint64_t seed, std::uint64_t index, DType dtype, const std::byte* src,
                 std::uint64_t bytes);

}  // namespace solar::storage::content

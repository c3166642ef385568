// SPDX-License-Identifier: Apache-2.0
// numpy's .npz as np.savez writes it: a zip archive of .npy arrays, stored (not deflated). What
// `solar gen --layout npz` writes (MLPerf Storage's UNet3D layout, samples of spread sizes) and
// `solar verify` reads back; np.load reads these files as it reads np.savez's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace solar::storage {

struct NpyArray {
  std::string name;                  // the entry without ".npy" ("x")
  std::string descr;                 // numpy's dtype string: "|u1", "<i8", "<u8", "<f4"
  std::vector<std::uint64_t> shape;  // C order
  std::vector<std::byte> data;       // the elements, little-endian
};

// Writes `arrays` as an .npz at `path` (each NAME.npy, zip format stored, CRC-32 checked by
// readers), to a temporary beside it renamed into place. Throws StorageError naming the file.
void write_npz(const std::string& path, std::span<const NpyArray> arrays);

// Reads an .npz of stored entries (np.savez's, or write_npz's): every array, its dtype string
// and shape from its .npy header. Throws StorageError naming the file and what is wrong (not a
// zip, a deflated entry (np.savez_compressed), a CRC or header that does not match).
std::vector<NpyArray> read_npz(const std::string& path);

}  // namespace solar::storage

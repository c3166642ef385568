// SPDX-License-Identifier: Apache-2.0
// Reading with O_DIRECT (internal to storage): what Hdf5Source and the many-file source share.
#pragma once

#include <cstddef>
#include <cstdint>

namespace solar::storage {

// One O_DIRECT read of the aligned span around [off, off + len) of `direct_fd` (opened with
// O_DIRECT) into this thread's aligned bounce buffer, then the payload into `out`. False
// (nothing promised) when the kernel refuses it, e.g. an alignment the file system does not
// accept: the caller reads buffered instead.
bool read_direct(int direct_fd, std::uint64_t off, std::uint64_t len, std::byte* out);

}  // namespace solar::storage

// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: what solar-stored decodes of a client's bytes (storage/src/wire.h) and
// what a client decodes of its replies. The input is a frame as sent on the socket (4-byte
// little-endian length, then the JSON body); its length is checked as the server checks a
// hello's, its body read as the hello (parse_hello), as a later request (parse_request, and a
// stage request's runs against a dataset and staging buffer taken from the input's last 24
// bytes), and as a hello reply's dataset description and address (info_from_json, from_hex).
// Refusals must be StorageError; a stage request accepted must fit the staging buffer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "wire.h"

namespace wire = solar::storage::wire;
using solar::storage::DatasetInfo;
using solar::storage::StorageError;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  DatasetInfo info;
  info.samples = 1000;
  info.sample_bytes = 4096;
  std::uint64_t limit = 64u << 20;
  if (size >= 4 + 24) {  // the dataset and the staging buffer the runs are checked against
    size -= 24;
    std::memcpy(&info.samples, data + size, 8);
    std::memcpy(&info.sample_bytes, data + size + 8, 8);
    std::memcpy(&limit, data + size + 16, 8);
    if (static_cast<unsigned __int128>(info.samples) * info.sample_bytes >> 63)
      return 0;  // no file that large: its own size would not fit a 64-bit offset
  }
  const std::uint32_t n = wire::frame_length(data);
  if (n > wire::kMaxMessage || n > size - 4) return 0;  // refused, or not all here
  const std::string body(reinterpret_cast<const char*>(data + 4), n);
  nlohmann::json msg;
  try {
    msg = wire::parse_body(body);
  } catch (const StorageError&) {
    return 0;
  }
  try {
    (void)wire::parse_hello(msg);
  } catch (const StorageError&) {
  }
  try {
    const wire::Request r = wire::parse_request(msg);
    if (r.op == "stage") {
      const std::uint64_t bytes = wire::staged_bytes(info, r.runs, limit, "fuzz");
      unsigned __int128 exact = 0;
      for (const auto& run : r.runs) exact += run.count;
      exact *= info.sample_bytes;
      if (exact != bytes || exact > limit) std::abort();  // would overrun the staging buffer
    }
  } catch (const StorageError&) {
  }
  try {
    if (const auto it = msg.find("info"); it != msg.end()) (void)wire::info_from_json(*it);
  } catch (const StorageError&) {
  }
  try {
    if (const auto it = msg.find("address"); it != msg.end() && it->is_string())
      (void)wire::from_hex(it->get<std::string>());
  } catch (const StorageError&) {
  }
  return 0;
}

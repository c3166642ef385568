// SPDX-License-Identifier: Apache-2.0
// The bootstrap protocol between FabricSource and solar-stored: JSON messages over TCP, each
// framed by a 4-byte little-endian length. Version 2:
//   hello  {op, version, token, dataset}   -> {ok, provider, address (hex), virt_addr, info,
//                                              identity, data {mode: rma|staged, key, base,
//                                              memory: file|memory (rma: the mapped file or the
//                                              server's copy, --in-memory)},
//                                              labels {key, base}?, staging {key, base, bytes}?,
//                                              throttle {bandwidth, latency_s}}
//   stage  {op, runs: [[first, count], ...]} -> {ok, bytes}: samples copied into the staging
//                                              buffer, to be fetched with fi_read; the buffer
//                                              is the client's until its next message
//   done   {op}                              (no reply): the staged runs were fetched
//   drop_cache {op}                         -> {ok}
//   reference {op, bytes}                   -> {ok, key, base, bytes}: a registered buffer of
//                                              plain memory (no file behind it, at most
//                                              kMaxReferenceBytes), this connection's to fi_read
//                                              until it leaves: the raw-fabric reference of
//                                              `solar bench io` (RawFabricReference::measure)
// Every reply with ok=false carries `error`, a message for people, and `retry: true` when the
// same request may succeed later (the server is busy).
//
// Limits: the server reads a connection's hello (before any token check) into a buffer of at
// most kMaxHello bytes, refusing a larger announced length before allocating anything; after
// the hello, messages may be up to kMaxMessage bytes, and a body's buffer grows only as its
// bytes arrive, so an announced length alone costs nothing.
#pragma once

#include <utility>  // before asio (g++ 12: std::exchange)

#include <boost/asio.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "solar/storage/fabric_address.h"
#include "solar/storage/fabric_source.h"  // kMaxReferenceBytes
#include "solar/storage/sample_source.h"

namespace solar::storage::wire {

inline constexpr int kVersion = 2;
inline constexpr std::uint32_t kMaxMessage = 16u << 20;
inline constexpr std::uint32_t kMaxHello = 16u << 10;

// Blocking I/O on the socket's descriptor (the socket must be in blocking mode), so that its
// SO_RCVTIMEO / SO_SNDTIMEO apply: an expired one throws system_error(timed_out). Throw
// boost::system::system_error on socket errors (eof when the peer closed), StorageError on a
// malformed message or one longer than `limit`.
void send(boost::asio::ip::tcp::socket& s, const nlohmann::json& msg);
nlohmann::json receive(boost::asio::ip::tcp::socket& s, std::uint32_t limit = kMaxMessage);

// The 4-byte little-endian length that starts every message.
std::uint32_t frame_length(const unsigned char len[4]);
std::string frame(const nlohmann::json& msg);  // length + body, ready to write
nlohmann::json parse_body(const std::string& body);  // StorageError if not a JSON object

// A field of a message: a non-negative JSON integer (count_field) or a finite number >= 0
// (rate_field); StorageError "protocol error: WHAT (...)" otherwise. (json's get<std::uint64_t>
// converts any number, and -1.5 or 1e300 that way is undefined behaviour.)
std::uint64_t count_field(const nlohmann::json& v, std::string_view what);
double rate_field(const nlohmann::json& v, std::string_view what);

// to_hex, from_hex: fabric addresses as text (solar/storage/fabric_address.h).

// A client's first message (before any token check), its fields as sent: absent ones are empty
// or 0. StorageError ("protocol error: ...") when a field has the wrong type.
struct Hello {
  std::string op, token, dataset;
  std::int64_t version = 0;
};
Hello parse_hello(const nlohmann::json& msg);

// A request after the hello: its op and, for stage, its runs; for reference, its bytes.
// StorageError ("protocol error: ...") when the op is not a string, the runs are not
// [[first, count], ...] of counts or the bytes not a count.
struct Request {
  std::string op;
  std::vector<SampleRun> runs;
  std::uint64_t bytes = 0;
};
Request parse_request(const nlohmann::json& msg);

// The bytes a stage request's `runs` take: StorageError (naming `source`) when a run is outside
// the dataset or they exceed `limit`, the staging buffer's size.
std::uint64_t staged_bytes(const DatasetInfo& info, std::span<const SampleRun> runs,
                           std::uint64_t limit, const std::string& source);

nlohmann::json to_json(const DatasetInfo& info);
DatasetInfo info_from_json(const nlohmann::json& j);

}  // namespace solar::storage::wire

// SPDX-License-Identifier: Apache-2.0
// solar-stored's request decoding (storage/src/wire.h) on what the fuzzer (fuzz.stored_wire)
// and its review found: runs whose bytes wrap around 64 bits, counts that are not integers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "wire.h"

namespace solar::storage {
namespace {

DatasetInfo dataset(std::uint64_t samples, std::uint64_t sample_bytes) {
  DatasetInfo i;
  i.samples = samples;
  i.sample_bytes = sample_bytes;
  return i;
}

TEST(Wire, StageRequestsThatWrapAroundAreRefused) {
  // 4 runs of 2^62 samples of 1 byte: 2^64 bytes, 0 once wrapped, which passed the check
  // against the staging buffer and would have been read into it.
  const auto r = wire::parse_request(nlohmann::json::parse(
      R"({"op":"stage","runs":[[0,4611686018427387904],[0,4611686018427387904],)"
      R"([0,4611686018427387904],[0,4611686018427387904]]})"));
  ASSERT_EQ(r.runs.size(), 4u);
  EXPECT_THROW(wire::staged_bytes(dataset(std::uint64_t{1} << 62, 1), r.runs, 64 << 20, "t"),
               StorageError);
  // The same with large samples: 2^20 samples of 2^44 bytes.
  const std::vector<SampleRun> big = {{0, 1 << 20}};
  EXPECT_THROW(wire::staged_bytes(dataset(1 << 20, std::uint64_t{1} << 44), big, 64 << 20, "t"),
               StorageError);
  EXPECT_EQ(wire::staged_bytes(dataset(100, 4096), {{{0, 4}, {10, 2}}}, 64 << 20, "t"),
            6u * 4096);
  EXPECT_EQ(wire::staged_bytes(dataset(100, 4096), {{{0, 16}}}, 16 * 4096, "t"), 16u * 4096);
  EXPECT_THROW(wire::staged_bytes(dataset(100, 4096), {{{0, 17}}}, 16 * 4096, "t"),
               StorageError);
  EXPECT_THROW(wire::staged_bytes(dataset(100, 4096), {{{99, 2}}}, 64 << 20, "t"), StorageError);
}

TEST(Wire, MalformedRequestsAreProtocolErrors) {
  for (const char* bad : {R"({"op":7})", R"({"op":"stage"})", R"({"op":"stage","runs":{}})",
                          R"({"op":"stage","runs":[[0]]})", R"({"op":"stage","runs":[[0,1,2]]})",
                          R"({"op":"stage","runs":[[-1.5,2]]})",
                          R"({"op":"stage","runs":[[0,1e300]]})", R"({"op":"stage","runs":[5]})"}) {
    EXPECT_THROW(wire::parse_request(nlohmann::json::parse(bad)), StorageError) << bad;
  }
  EXPECT_EQ(wire::parse_request(nlohmann::json::parse(R"({"op":"done"})")).op, "done");
  EXPECT_EQ(wire::parse_request(nlohmann::json::parse("{}")).op, "");
}

TEST(Wire, HelloFieldsOfTheWrongTypeAreProtocolErrors) {
  const auto h = wire::parse_hello(nlohmann::json::parse(
      R"({"op":"hello","version":2,"token":"t","dataset":"train"})"));
  EXPECT_EQ(h.op, "hello");
  EXPECT_EQ(h.version, 2);
  EXPECT_EQ(h.token, "t");
  EXPECT_EQ(h.dataset, "train");
  // 1e300 as an int was undefined behaviour (hello.value("version", 0)).
  for (const char* bad : {R"({"op":"hello","version":1e300})", R"({"op":"hello","version":2.0})",
                          R"({"op":1})", R"({"op":"hello","token":5})",
                          R"({"op":"hello","dataset":[]})"})
    EXPECT_THROW(wire::parse_hello(nlohmann::json::parse(bad)), StorageError) << bad;
}

TEST(Wire, DatasetDescriptionsWithBadCountsAreProtocolErrors) {
  nlohmann::json info = {{"samples", 200},         {"shape", {4, 8}},
                         {"dtype", "int16"},       {"sample_bytes", 64},
                         {"has_labels", false},    {"label_dtype", "int32"},
                         {"label_bytes", 0},       {"layout", "contiguous"}};
  EXPECT_EQ(wire::info_from_json(info).samples, 200u);
  for (const char* key : {"samples", "sample_bytes", "label_bytes"})
    for (const nlohmann::json& v : {nlohmann::json(-1.5), nlohmann::json(1e300), nlohmann::json(-3)}) {
      nlohmann::json bad = info;
      bad[key] = v;
      EXPECT_THROW(wire::info_from_json(bad), StorageError) << key << " " << v;
    }
  nlohmann::json bad = info;
  bad["shape"] = {4, -1.5};
  EXPECT_THROW(wire::info_from_json(bad), StorageError);
  // A seed's content kind goes with it; anything but "sparse" is refused.
  DatasetInfo sparse = wire::info_from_json(info);
  sparse.seed = 7;
  sparse.content = Content::sparse;
  const nlohmann::json j = wire::to_json(sparse);
  EXPECT_EQ(j.at("content"), "sparse");
  EXPECT_EQ(wire::info_from_json(j).content, Content::sparse);
  bad = j;
  bad["content"] = "zeros";
  EXPECT_THROW(wire::info_from_json(bad), StorageError);
}

// The client's side: FabricSource reads the server's keys, addresses and throttle with these;
// json's own get<std::uint64_t> of -1.5 or 1e300 was undefined behaviour.
TEST(Wire, ReplyFieldsThatAreNotCountsOrRatesAreProtocolErrors) {
  EXPECT_EQ(wire::count_field(nlohmann::json(0), "x"), 0u);
  EXPECT_EQ(wire::count_field(nlohmann::json(18446744073709551615ull), "x"),
            18446744073709551615ull);
  for (const nlohmann::json& v : {nlohmann::json(-1), nlohmann::json(-1.5), nlohmann::json(1e300),
                                  nlohmann::json(2.0), nlohmann::json("7"), nlohmann::json()}) {
    try {
      wire::count_field(v, "fabric://h:1/d: the server's hello reply is bad");
      ADD_FAILURE() << v << " was taken as a count";
    } catch (const StorageError& e) {
      EXPECT_NE(std::string(e.what()).find("fabric://h:1/d: the server's hello reply is bad"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(wire::rate_field(nlohmann::json(4e8), "x"), 4e8);
  EXPECT_EQ(wire::rate_field(nlohmann::json(0), "x"), 0.0);
  for (const nlohmann::json& v : {nlohmann::json(-1e-3), nlohmann::json(-5), nlohmann::json("1"),
                                  nlohmann::json(nullptr)})
    EXPECT_THROW(wire::rate_field(v, "x"), StorageError) << v;
  // JSON has no inf or NaN literal, but a double can hold them.
  EXPECT_THROW(wire::rate_field(nlohmann::json(std::numeric_limits<double>::infinity()), "x"),
               StorageError);
  EXPECT_THROW(wire::rate_field(nlohmann::json(std::nan("")), "x"), StorageError);
}

}  // namespace
}  // namespace solar::storage

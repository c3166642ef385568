// SPDX-License-Identifier: Apache-2.0
// `solar bench io fabric://...`'s raw-fabric reference: it runs on both providers, for a
// mapped and a staged export, and its JSON has the fields. No timing is asserted (speed lives
// in the benchmarks, bench/README.md).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "solar/storage/fabric_reference.h"
#include "solar/storage/fabric_source.h"
#include "solar/storage/hdf5_writer.h"
#include "test_util.h"

namespace solar::storage {
namespace {
using nlohmann::json;
using test::StoredProcess;
using test::TempDir;
using test::write;

// Its datasets: 64 samples of 32 KiB (4x16x16x16 int16).
constexpr std::uint64_t kSamples = 64;

json bench(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {SOLAR_CLI, "bench", "io"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  EXPECT_EQ(test::run(argv, &out), 0) << out;
  const auto j = json::parse(out.substr(std::min(out.find('{'), out.size())), nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << out;
  return j;
}

class Reference : public ::testing::TestWithParam<std::string> {};

TEST_P(Reference, BenchIoMeasuresTheFabricBesideEveryPhase) {
  TempDir dir;
  write(dir, "c.h5", Layout::contiguous, kSamples);
  write(dir, "k.h5", Layout::chunked, kSamples);
  StoredProcess server(dir, {"--provider", GetParam(), "--export", "c=" + dir.file("c.h5"),
                             "--export", "k=" + dir.file("k.h5")});
  ASSERT_TRUE(server.start()) << server.log();
  for (const char* name : {"c", "k"}) {
    const json j = bench({server.uri(name), "--json", "--fraction", "1", "--batch-bytes", "256K",
                          "--reference-op", "64K", "--queue-depth", "4", "--repeat", "2"});
    ASSERT_TRUE(j.is_object());
    const auto& ref = j.at("fabric_reference");
    EXPECT_EQ(ref.at("provider"), GetParam());
    EXPECT_EQ(ref.at("window"), 4);
    EXPECT_EQ(ref.at("max_read_bytes"), 64 << 10);
    EXPECT_GE(ref.at("remote_bytes").get<std::uint64_t>(), 64u * (32 << 10));
    EXPECT_EQ(j.at("repeat"), 2);
    const std::uint64_t bytes = j.at("bytes_per_phase");
    ASSERT_EQ(j.at("phases").size(), 3u);
    for (const auto& p : j.at("phases")) {
      SCOPED_TRACE(p.dump());
      EXPECT_GT(p.at("gbps").get<double>(), 0);
      EXPECT_GT(p.at("fabric_gbps").get<double>(), 0);
      EXPECT_GT(p.at("vs_fabric").get<double>(), 0);
      // vs_fabric is the median of the runs' own ratios (each against its own reference).
      const auto runs = p.at("vs_fabric_runs").get<std::vector<double>>();
      ASSERT_EQ(runs.size(), 2u);
      for (double r : runs) EXPECT_GT(r, 0);
      EXPECT_DOUBLE_EQ(p.at("vs_fabric").get<double>(), (runs[0] + runs[1]) / 2);
      EXPECT_EQ(p.at("fabric").at("bytes").get<std::uint64_t>(), bytes);
      // Each run's own seconds, solar's and the reference's: the ratios above are theirs.
      const auto s = p.at("seconds_runs").get<std::vector<double>>();
      const auto f = p.at("fabric").at("seconds_runs").get<std::vector<double>>();
      ASSERT_EQ(s.size(), 2u);
      ASSERT_EQ(f.size(), 2u);
      for (int i = 0; i < 2; ++i) EXPECT_DOUBLE_EQ(runs[i], f[i] / s[i]);
      EXPECT_GT(p.at("fabric").at("seconds").get<double>(), 0);
      EXPECT_GE(p.at("fabric").at("reads").get<std::uint64_t>(), 1u);
    }
    // Random: one read per sample; runs and the range in reads of at most --reference-op.
    EXPECT_EQ(j["phases"][0]["fabric"]["reads"], 64);
    EXPECT_EQ(j["phases"][2]["fabric"]["reads"], 64 * (32 << 10) / (64 << 10));
  }
  // Without it, and for files, there is none.
  EXPECT_TRUE(bench({server.uri("c"), "--json", "--no-reference"}).at("fabric_reference").is_null());
  EXPECT_TRUE(bench({dir.file("c.h5"), "--json"}).at("fabric_reference").is_null());
}

INSTANTIATE_TEST_SUITE_P(Storage, Reference, ::testing::Values("tcp;ofi_rxm", "shm"),
                         [](const auto& p) {
                           return p.param == "shm" ? std::string("shm") : std::string("tcp_rxm");
                         });

TEST(FabricReference, ReadsLongerThanTheServersBufferAreRefused) {
  TempDir dir;
  write(dir, "c.h5", Layout::contiguous, kSamples);
  StoredProcess server(dir, {"--export", "c=" + dir.file("c.h5")});
  ASSERT_TRUE(server.start()) << server.log();
  auto src = FabricSource::connect(server.uri("c"));
  RawFabricReference ref(*src);
  const FabricRead ok{5 << 20, 64 << 10};  // wraps around the 1 MiB (smallest) buffer
  std::vector<std::byte> local(2 << 20);
  const auto r = ref.measure({&ok, 1}, 2, {local.data(), 64 << 10}, 1);
  EXPECT_EQ(r.bytes, 64u << 10);
  EXPECT_EQ(r.local_bytes, 64u << 10);
  // What landed is the server's reference buffer (its fill byte) in the caller's memory.
  EXPECT_EQ(local[0], std::byte{0x5a});
  EXPECT_EQ(local[(64 << 10) - 1], std::byte{0x5a});
  EXPECT_EQ(r.reads, 1u);
  EXPECT_EQ(r.remote_bytes, 1u << 20);
  const FabricRead big{0, 2 << 20};
  try {
    ref.measure({&big, 1}, 2, local, 1);
    FAIL() << "no error";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("longer than the server's"), std::string::npos)
        << e.what();
  }
  try {  // a destination smaller than a read
    ref.measure({&ok, 1}, 2, {local.data(), 4096}, 1);
    FAIL() << "no error";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit its 4096-byte destination"),
              std::string::npos)
        << e.what();
  }
  // The source still reads after both.
  std::vector<std::byte> buf(src->info().sample_bytes);
  const SampleRun one{3, 1};
  src->read({&one, 1}, buf.data());
}

// --reference-memory export: the reference reads the export's own mapping (as many bytes as
// the dataset, no buffer lent), and a staged export, which has none, is refused by name.
TEST(FabricReference, ReadsTheExportsOwnMemoryWhenAsked) {
  TempDir dir;
  write(dir, "c.h5", Layout::contiguous, kSamples);
  write(dir, "k.h5", Layout::chunked, kSamples);
  StoredProcess server(dir, {"--provider", "shm", "--export", "c=" + dir.file("c.h5"),
                             "--export", "k=" + dir.file("k.h5")});
  ASSERT_TRUE(server.start()) << server.log();
  auto src = FabricSource::connect(server.uri("c"));
  RawFabricReference ref(*src);
  const std::uint64_t dataset = 64u * (32 << 10);
  const FabricRead last{dataset - (32 << 10), 32 << 10};
  std::vector<std::byte> local(32 << 10), sample(32 << 10);
  const auto r = ref.measure({&last, 1}, 1, local, 1, ReferenceMemory::exported);
  EXPECT_EQ(r.remote_bytes, dataset);
  EXPECT_EQ(r.bytes, 32u << 10);
  // The bytes are the dataset's last sample, as solar reads it.
  const SampleRun last_sample{63, 1};
  src->read({&last_sample, 1}, sample.data());
  EXPECT_EQ(local, sample);
  // Plain memory again: the smallest buffer lent (1 MiB), its fill byte landing.
  EXPECT_EQ(ref.measure({&last, 1}, 1, local, 1).remote_bytes, 1u << 20);
  EXPECT_EQ(local[0], std::byte{0x5a});
  auto staged = FabricSource::connect(server.uri("k"));
  try {
    RawFabricReference(*staged).measure({&last, 1}, 1, local, 1, ReferenceMemory::exported);
    FAIL() << "no error";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("staging buffer"), std::string::npos) << e.what();
  }
  const json j = bench({server.uri("c"), "--json", "--fraction", "1", "--reference-memory",
                        "export"});
  EXPECT_EQ(j.at("fabric_reference").at("memory"), "export");
  EXPECT_EQ(j.at("fabric_reference").at("remote_bytes"), dataset);
  for (const auto& p : j.at("phases")) EXPECT_GT(p.at("vs_fabric").get<double>(), 0);
  std::string out;
  EXPECT_EQ(test::run({SOLAR_CLI, "bench", "io", server.uri("c"), "--reference-memory", "file"},
                      &out),
            2)
      << out;
  EXPECT_NE(out.find("--reference-memory"), std::string::npos) << out;
}

// The server's resident memory (VmRSS), bytes.
std::uint64_t rss_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

TEST(FabricReference, TheBufferIsAsLargeAsAskedKeptForTheNextMeasureAndGoesWithTheReference) {
  TempDir dir;
  write(dir, "c.h5", Layout::contiguous, kSamples);
  StoredProcess server(dir, {"--export", "c=" + dir.file("c.h5")});
  ASSERT_TRUE(server.start()) << server.log();
  const std::uint64_t idle = rss_of(server.pid());
  constexpr std::uint64_t kBig = 512ULL << 20;  // above the old 256 MiB cap
  std::vector<std::byte> local(64 << 10);
  {
    auto src = FabricSource::connect(server.uri("c"));
    RawFabricReference ref(*src);
    const FabricRead far{kBig - (64 << 10), 64 << 10};  // its last 64 KiB: no wrap-around
    for (int i = 0; i < 3; ++i) {
      const auto r = ref.measure({&far, 1}, 1, local, kBig);
      // Lent whole: its last bytes were read (a read past the registered region fails).
      EXPECT_EQ(r.remote_bytes, kBig);
      EXPECT_EQ(r.bytes, 64u << 10);
      // Kept between measures, not lent anew for each: resident once, not three times.
      const std::uint64_t rss = rss_of(server.pid());
      EXPECT_GE(rss, idle + kBig - (64ULL << 20)) << "measure " << i;
      EXPECT_LT(rss, idle + 2 * kBig) << "measure " << i;
    }
  }
  // Filled once for the three (the server says so each time it lends one anew).
  const std::string log = server.log();
  std::size_t lent = 0;
  for (auto at = log.find("-byte reference buffer"); at != std::string::npos;
       at = log.find("-byte reference buffer", at + 1))
    ++lent;
  EXPECT_EQ(lent, 1u) << log;
  // The reference's session closed with it: the server frees the buffer once that
  // connection's thread has ended.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (rss_of(server.pid()) > idle + (64ULL << 20) && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_LE(rss_of(server.pid()), idle + (64ULL << 20));
  // Beyond the cap, the server lends what it may, and says how much.
  auto src = FabricSource::connect(server.uri("c"));
  const FabricRead one{0, 64 << 10};
  RawFabricReference ref(*src);
  EXPECT_EQ(ref.measure({&one, 1}, 1, local, kMaxReferenceBytes + 1).remote_bytes,
            kMaxReferenceBytes);
}

}  // namespace
}  // namespace solar::storage

// SPDX-License-Identifier: Apache-2.0
// FabricSource against real solar-stored processes on loopback, for tcp;ofi_rxm and shm.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <optional>
#include <thread>

#include "solar/core/config.h"
#include "solar/storage/content.h"
#include "solar/storage/fabric_source.h"
#include "solar/storage/hdf5_writer.h"
#include "test_util.h"

namespace solar::storage {
namespace {
using test::error_of;
using test::expect_all;
using test::StoredProcess;
using test::TempDir;
using test::write;

class Providers : public ::testing::TestWithParam<std::string> {};

TEST_P(Providers, EveryLayoutVerifiesThroughTheServer) {
  TempDir dir;
  write(dir, "c.h5", Layout::contiguous);
  write(dir, "k.h5", Layout::chunked);
  write(dir, "z.h5", Layout::gzip);
  StoredProcess server(dir, {"--provider", GetParam(), "--staging-bytes", "100K", "--export",
                             "c=" + dir.file("c.h5"), "--export", "k=" + dir.file("k.h5") + ":/data",
                             "--export", "z=" + dir.file("z.h5")});
  ASSERT_TRUE(server.start()) << server.log();
  for (const char* name : {"c", "k", "z"}) {
    FabricOptions o;
    o.request_bytes = 40000;  // several fi_reads per sample and per run
    o.queue_depth = 4;
    auto src = FabricSource::connect(server.uri(name), o);
    EXPECT_EQ(src->provider(), GetParam());
    EXPECT_EQ(src->info().samples, 48u);
    EXPECT_EQ(src->info().sample_bytes, 4u * 16 * 16 * 16 * 2);
    EXPECT_EQ(*src->info().seed, 5u);
    EXPECT_EQ(src->served_from(), name == std::string("c") ? "file" : "staged");
    expect_all(*src, {{0, 48}});
    expect_all(*src, {{47, 1}, {3, 9}, {20, 2}});
    EXPECT_EQ(src->reconnects(), 0u);
  }
  // And through `solar verify`, as a user would.
  std::string out;
  EXPECT_EQ(test::run({SOLAR_CLI, "verify", server.uri("z"), "--no-progress"}, &out), 0) << out;
}

// Reads of one source from several threads at once (the agent's readers, a DataLoader's
// workers) are in flight together, and each gets exactly its own bytes and labels.
TEST_P(Providers, ReadsFromSeveralThreadsAreInFlightTogetherWithTheirOwnBytes) {
  TempDir dir;
  write(dir, "c.h5", Layout::contiguous, 96);
  StoredProcess server(dir, {"--provider", GetParam(), "--export", "c=" + dir.file("c.h5")});
  ASSERT_TRUE(server.start()) << server.log();
  FabricOptions o;
  o.request_bytes = 12000;  // pieces that straddle samples: many per read
  o.queue_depth = 5;
  auto src = FabricSource::connect(server.uri("c"), o);
  const std::uint64_t sb = src->info().sample_bytes;
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < 6; ++t)
    ts.emplace_back([&, t] {
      std::vector<std::byte> buf;
      std::vector<std::int32_t> labels;
      for (unsigned k = 0; k < 40; ++k) {
        // Runs of different lengths and places for every thread and round.
        const std::uint64_t a = (t * 37 + k * 11) % 90, b = (t * 13 + k * 7) % 96;
        const std::vector<SampleRun> runs = {{a, 1 + (k + t) % 6}, {b, 1}};
        buf.assign(total_samples(runs) * sb, std::byte{0xEE});
        labels.assign(total_samples(runs), -1);
        src->read(runs, buf.data());
        src->read_labels(runs, reinterpret_cast<std::byte*>(labels.data()));
        std::size_t i = 0;
        for (const auto& r : runs)
          for (std::uint64_t x = r.first; x < r.first + r.count; ++x, ++i)
            if (!content::check_sample(5, x, buf.data() + i * sb, sb) ||
                labels[i] != content::label(5, x))
              ++bad;
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(src->reconnects(), 0u);

  // In flight together: with 150 ms of emulated latency per read, 8 threads' one-sample reads
  // overlap (when a source read one request at a time, at most 1 was ever in flight). Counted,
  // not timed. (This server polls without pause, the other sleeps on its wait object where it
  // has one: both serve.)
  StoredProcess slow(dir, {"--provider", GetParam(), "--busy-poll", "--throttle-latency", "150",
                           "--export", "c=" + dir.file("c.h5")});
  ASSERT_TRUE(slow.start()) << slow.log();
  o.request_bytes = 4 << 20;  // one fi_read per sample, all eight fit the queue depth
  o.queue_depth = 16;
  auto s2 = FabricSource::connect(slow.uri("c"), o);
  std::vector<std::thread> ws;
  for (unsigned t = 0; t < 8; ++t)
    ws.emplace_back([&, t] {
      std::vector<std::byte> one(sb);
      const SampleRun r{t, 1};
      s2->read({&r, 1}, one.data());
      if (!content::check_sample(5, t, one.data(), sb)) ++bad;
    });
  for (auto& w : ws) w.join();
  // Each read waits out its 150 ms in flight, so the threads' reads meet there (all 8 but on
  // a machine that starts the threads more than 150 ms apart).
  EXPECT_GE(s2->peak_in_flight(), 2u);
  EXPECT_EQ(bad.load(), 0);
}

// --in-memory: clients read the server's own copy of the data. Every byte verifies through it,
// with samples of 1170 bytes (the copy is loaded with O_DIRECT, whose reads must be aligned,
// so these go through its bounce buffer), before and after a client's drop_cache: dropping the
// copy as if it were page cache (MADV_DONTNEED) would zero it. A staged export beside it still
// serves.
TEST_P(Providers, AnInMemoryExportServesEveryByteAndKeepsThemThroughDropCache) {
  TempDir dir;
  write(dir, "c.h5", Layout::contiguous, 96, {5, 9, 13});
  write(dir, "k.h5", Layout::chunked);
  StoredProcess server(dir, {"--provider", GetParam(), "--in-memory", "--export",
                             "c=" + dir.file("c.h5"), "--export", "k=" + dir.file("k.h5")});
  ASSERT_TRUE(server.start()) << server.log();
  EXPECT_NE(server.log().find("export c: " + format_bytes(96 * 5 * 9 * 13 * 2) +
                              " loaded into memory"),
            std::string::npos)
      << server.log();
  EXPECT_NE(server.log().find("one-sided RMA from the server's memory"), std::string::npos);
  EXPECT_NE(server.log().find("staged reads"), std::string::npos);
  auto src = FabricSource::connect(server.uri("c"));
  EXPECT_EQ(src->served_from(), "memory");
  expect_all(*src, {{0, 96}});
  src->drop_cache();
  expect_all(*src, {{95, 1}, {0, 40}, {50, 3}});
  auto staged = FabricSource::connect(server.uri("k"));
  EXPECT_EQ(staged->served_from(), "staged");
  expect_all(*staged, {{0, 48}});
}

INSTANTIATE_TEST_SUITE_P(Storage, Providers, ::testing::Values("tcp;ofi_rxm", "shm"),
                         [](const auto& p) {
                           return p.param == "shm" ? std::string("shm") : std::string("tcp_rxm");
                         });

TEST(FabricSource, BadRequestsGetClearErrorsAndTheServerKeepsServing) {
  TempDir dir;
  write(dir, "c.h5", Layout::contiguous, 10, {64});
  // A truncated copy and a scalar-free wrong dataset name: those exports are refused, the
  // good one is served.
  const std::string cut = dir.file("cut.h5");
  std::filesystem::copy_file(dir.file("c.h5"), cut);
  std::filesystem::resize_file(cut, std::filesystem::file_size(cut) - 300);
  StoredProcess server(dir, {"--token", "s3cret", "--export", "good=" + dir.file("c.h5"),
                             "--export", "cut=" + cut, "--export",
                             "label=" + dir.file("c.h5") + ":/nolabel"});
  ASSERT_TRUE(server.start()) << server.log();
  FabricOptions ok;
  ok.token = "s3cret";
  EXPECT_NE(error_of([&] { FabricSource::connect(server.uri("good")); }).find("token rejected"),
            std::string::npos);
  FabricOptions wrong = ok;
  wrong.token = "s3creT";
  EXPECT_NE(error_of([&] { FabricSource::connect(server.uri("good"), wrong); })
                .find("token rejected"),
            std::string::npos);
  EXPECT_NE(error_of([&] { FabricSource::connect(server.uri("nope"), ok); })
                .find("no dataset named 'nope' is exported here (exports: good)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { FabricSource::connect(server.uri("cut"), ok); }).find("truncated"),
            std::string::npos);
  EXPECT_NE(error_of([&] { FabricSource::connect(server.uri("label"), ok); })
                .find("no dataset '/nolabel'"),
            std::string::npos);
  auto src = FabricSource::connect(server.uri("good"), ok);
  std::vector<std::byte> buf(64 * 20);
  const SampleRun past{8, 3};
  EXPECT_NE(error_of([&] { src->read({&past, 1}, buf.data()); }).find("samples [8, 11)"),
            std::string::npos);
  expect_all(*src, {{0, 10}});
  EXPECT_NE(error_of([&] { FabricSource::connect("fabric://127.0.0.1:x/good", ok); }).find("port"),
            std::string::npos);
  EXPECT_NE(error_of([&] { FabricSource::connect("fabric://127.0.0.1:1/good", ok); })
                .find("cannot connect"),
            std::string::npos);
}


TEST(FabricSource, ServerStartsOnlyWithAUsableExport) {
  TempDir dir;
  StoredProcess server(dir, {"--export", "x=" + dir.file("missing.h5")});
  EXPECT_FALSE(server.start());
  EXPECT_NE(server.log().find("missing.h5"), std::string::npos) << server.log();
}

// Slow enough (emulated 8 MB/s) that the kill lands mid-read.
StoredProcess throttled(const TempDir& dir) {
  return StoredProcess(dir, {"--throttle-bandwidth", "8M", "--export", "c=" + dir.file("c.h5")});
}

// A source connected to `server` with `o`, reading all 64 samples of "c" into `buf` in the
// background: constructed once its first bytes came (or the read ended), so that what the test
// does next to the server lands mid-read.
struct ReadUnderway {
  ReadUnderway(const StoredProcess& server, const FabricOptions& o)
      : src(FabricSource::connect(server.uri("c"), o)), buf(64 * src->info().sample_bytes) {
    reading = std::async(std::launch::async, [this] { src->read({&all, 1}, buf.data()); });
    while (src->bytes_read() == 0 &&
           reading.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready) {
    }
  }
  std::unique_ptr<FabricSource> src;
  std::vector<std::byte> buf;
  const SampleRun all{0, 64};
  std::future<void> reading;
};

// 64 samples of 128 KiB as "c" (16 MiB: ~2 s at throttled()'s 8 MB/s) in `dir`, and the options
// of a source reading them in 256 KiB requests with a 5 s timeout.
FabricOptions write_slow_export(const TempDir& dir) {
  write(dir, "c.h5", Layout::contiguous, 64, {4, 32, 32, 32});
  FabricOptions o;
  o.timeout_s = 5;
  o.request_bytes = 256 << 10;
  return o;
}

TEST(FabricSource, ServerKilledMidReadIsAClearError) {
  TempDir dir;
  FabricOptions o = write_slow_export(dir);
  StoredProcess server = throttled(dir);
  ASSERT_TRUE(server.start()) << server.log();
  o.reconnect_s = 2;
  ReadUnderway r(server, o);
  server.kill_now();
  const auto killed = std::chrono::steady_clock::now();
  try {
    r.reading.get();
    FAIL() << "the read succeeded with the server dead";
  } catch (const StorageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(server.uri("c")), std::string::npos) << m;
    EXPECT_NE(m.find("gave up after"), std::string::npos) << m;
    EXPECT_NE(m.find("did not come back within 2 s"), std::string::npos) << m;
  }
  // Within the window (and the time to notice the server has gone: its socket closing).
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count(), 4.5);
  // The outage is shared: a later read fails at its first attempt, not after another window.
  const auto again = std::chrono::steady_clock::now();
  EXPECT_NE(error_of([&] { r.src->read({&r.all, 1}, r.buf.data()); }).find("gave up after"),
            std::string::npos);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - again).count(), 1.0);
  // The error says where in the dataset the read was (issue 14: the file and the offset).
  const SampleRun mid{10, 5};
  const std::string m = error_of([&] { r.src->read({&mid, 1}, r.buf.data()); });
  EXPECT_NE(m.find(fmt::format("reading 5 samples from sample 10, byte offset {} of the exported "
                               "samples",
                               10 * r.src->info().sample_bytes)),
            std::string::npos)
      << m;
}

// A restart that takes longer than the old 1.5 s of retries: the read waits for the server and
// finishes with the right bytes (the reconnection window, 30 s by default).
TEST(FabricSource, ServerBackAfterSecondsIsPickedUp) {
  TempDir dir;
  FabricOptions o = write_slow_export(dir);
  StoredProcess first = throttled(dir);
  ASSERT_TRUE(first.start()) << first.log();
  ReadUnderway r(first, o);
  first.kill_now();
  // The outage itself: the server is away for 4 s.
  EXPECT_EQ(r.reading.wait_for(std::chrono::seconds(4)), std::future_status::timeout);
  StoredProcess second = throttled(dir);
  ASSERT_TRUE(second.start(first.port())) << second.log();
  r.reading.get();
  EXPECT_GE(r.src->reconnects(), 1u);
  ASSERT_TRUE(test::holds_content(r.buf.data(), 0, 64, r.src->info().sample_bytes));
}

// A rank whose agent dies while solar-stored restarts opens the dataset with the server away
// (the soak, scripts/soak: the rank failed with "Connection refused"): with wait_for_server
// the first connection is retried within the window; without, it fails at once as before.
TEST(FabricSource, FirstConnectionWaitsForARestartingServerWhenAsked) {
  TempDir dir;
  write(dir, "c.h5", Layout::contiguous, 16, {4, 8, 8, 8});
  StoredProcess first(dir, {"--export", "c=" + dir.file("c.h5")});
  ASSERT_TRUE(first.start()) << first.log();
  const std::string uri = first.uri("c");
  first.kill_now();
  FabricOptions o;
  o.timeout_s = 5;
  o.reconnect_s = 20;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(error_of([&] { FabricSource::connect(uri, o); }).find("cannot connect"),
            std::string::npos);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  o.wait_for_server = true;
  auto connecting = std::async(std::launch::async, [&] { return FabricSource::connect(uri, o); });
  EXPECT_EQ(connecting.wait_for(std::chrono::seconds(2)), std::future_status::timeout);
  StoredProcess second(dir, {"--export", "c=" + dir.file("c.h5")});
  ASSERT_TRUE(second.start(first.port())) << second.log();
  auto src = connecting.get();
  std::vector<std::byte> buf(16 * src->info().sample_bytes);
  const SampleRun all{0, 16};
  src->read({&all, 1}, buf.data());
  ASSERT_TRUE(test::holds_content(buf.data(), 0, 16, src->info().sample_bytes));
  // Still bounded: nobody there for the whole window is an error naming the server.
  second.kill_now();
  o.reconnect_s = 1;
  EXPECT_NE(error_of([&] { FabricSource::connect(uri, o); }).find("did not accept the connection"),
            std::string::npos);
}

// The server killed between a client's connection and its first read: tcp;ofi_rxm's fi_read
// may answer EAGAIN for ever (it keeps reconnecting to the dead fabric address), and the read
// spun in its issue loop at 100% CPU for good (a rank of scripts/soak's, after a solar-stored
// restart). It must notice the server gone and fail within the window instead.
TEST(FabricSource, ServerKilledBeforeTheFirstReadIsNoticed) {
  TempDir dir;
  write(dir, "c.h5", Layout::contiguous, 16, {4, 8, 8, 8});
  StoredProcess server(dir, {"--export", "c=" + dir.file("c.h5")});
  ASSERT_TRUE(server.start()) << server.log();
  FabricOptions o;
  o.timeout_s = 5;
  o.reconnect_s = 2;
  auto src = FabricSource::connect(server.uri("c"), o);
  server.kill_now();
  std::vector<std::byte> buf(16 * src->info().sample_bytes);
  const SampleRun all{0, 16};
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(error_of([&] { src->read({&all, 1}, buf.data()); }).find("gave up after"),
            std::string::npos);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 15.0);
}

TEST(FabricSource, ServerRestartedMidReadIsRetriedWithCorrectBytes) {
  TempDir dir;
  FabricOptions o = write_slow_export(dir);
  StoredProcess first = throttled(dir);
  ASSERT_TRUE(first.start()) << first.log();
  ReadUnderway r(first, o);
  first.kill_now();
  StoredProcess second = throttled(dir);
  ASSERT_TRUE(second.start(first.port())) << second.log();
  r.reading.get();
  EXPECT_GE(r.src->reconnects(), 1u);
  ASSERT_TRUE(test::holds_content(r.buf.data(), 0, 64, r.src->info().sample_bytes));
}

// Several threads' reads in flight when the server is killed and restarted: each is issued
// again on the new connection where it stopped, and every byte is right.
TEST(FabricSource, ServerRestartedUnderReadsFromSeveralThreadsGivesEachItsBytes) {
  TempDir dir;
  write(dir, "c.h5", Layout::contiguous, 64, {4, 32, 32, 32});
  StoredProcess first = throttled(dir);
  ASSERT_TRUE(first.start()) << first.log();
  FabricOptions o;
  o.timeout_s = 5;
  o.request_bytes = 128 << 10;
  o.queue_depth = 4;
  auto src = FabricSource::connect(first.uri("c"), o);
  const std::uint64_t sb = src->info().sample_bytes;
  std::vector<std::vector<std::byte>> bufs(4, std::vector<std::byte>(16 * sb));
  std::vector<std::future<void>> readers;
  for (std::uint64_t t = 0; t < 4; ++t)
    readers.push_back(std::async(std::launch::async, [&, t] {
      const SampleRun r{t * 16, 16};
      src->read({&r, 1}, bufs[t].data());
    }));
  while (src->bytes_read() < sb) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  first.kill_now();
  StoredProcess second = throttled(dir);
  ASSERT_TRUE(second.start(first.port())) << second.log();
  for (auto& r : readers) r.get();
  EXPECT_GE(src->reconnects(), 1u);
  for (std::uint64_t t = 0; t < 4; ++t)
    ASSERT_TRUE(test::holds_content(bufs[t].data(), t * 16, 16, sb));
}

}  // namespace
}  // namespace solar::storage

// SPDX-License-Identifier: Apache-2.0
// solar-stored itself, from the outside: who may read its memory (keys, tokens), exports
// withdrawn or refused, staging buffers shared by many clients, its command line.
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
#include "solar/sys/meminfo.h"
#include "solar/storage/fabric.h"  // the attacker below speaks raw libfabric
#include "test_util.h"
#include "wire.h"

namespace solar::storage {
namespace {
using test::error_of;
using test::expect_all;
using test::StoredProcess;
using test::TempDir;
using test::write;

// Someone on the network with no token: knows the server's fabric address (it is visible in
// `ss`) and reads its memory with fi_read and guessed keys, never saying hello.
class Attacker {
 public:
  Attacker(const std::string& provider, const std::vector<std::uint8_t>& address)
      : ep_(fabric::Endpoint::open(provider, "")), buf_(4096) {
    server_ = ep_->insert(address);
    if (ep_->local_mr()) local_ = ep_->register_memory(buf_.data(), buf_.size(), FI_READ);
  }
  // Whether `len` bytes at (key, addr) came back; the bytes are in buf().
  bool read(std::uint64_t key, std::uint64_t addr, std::size_t len) {
    std::fill(buf_.begin(), buf_.end(), std::byte{0xab});
    fi_context2 ctx{};
    ssize_t rc;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((rc = fi_read(ep_->ep(), buf_.data(), len, local_.desc(), server_, addr, key, &ctx)) ==
           -FI_EAGAIN) {
      fi_cq_entry e[1];
      if (fi_cq_read(ep_->cq(), e, 1) == 1 || std::chrono::steady_clock::now() > until) break;
    }
    if (rc != 0) return false;
    for (;;) {
      fi_cq_entry e[1];
      const ssize_t n = fi_cq_read(ep_->cq(), e, 1);
      if (n == 1) return e[0].op_context == &ctx;
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        fi_cq_readerr(ep_->cq(), &err, 0);
        return false;
      }
      if (std::chrono::steady_clock::now() > until) {
        ADD_FAILURE() << "a read with key " << key << " neither completed nor failed in 10 s";
        return false;
      }
    }
  }
  const std::byte* buf() const { return buf_.data(); }

 private:
  std::unique_ptr<fabric::Endpoint> ep_;
  fi_addr_t server_ = FI_ADDR_UNSPEC;
  std::vector<std::byte> buf_;
  fabric::Region local_;
};

TEST(SolarStored, KeysAreUnguessableAndOnlyGrantedToTokenHolders) {
  TempDir dir;
  write(dir, "c.h5", Layout::contiguous, 64, {32, 64});  // int16: 4 KiB samples
  StoredProcess server(dir, {"--token", "s3cret", "--export", "d=" + dir.file("c.h5")});
  ASSERT_TRUE(server.start()) << server.log();
  // A legitimate client's hello: the address is public (ss shows it), the keys are not.
  boost::asio::io_context io;
  auto legit = std::make_unique<boost::asio::ip::tcp::socket>(io);
  legit->connect({boost::asio::ip::make_address("127.0.0.1"), server.port()});
  wire::send(*legit, {{"op", "hello"}, {"version", wire::kVersion}, {"token", "s3cret"},
                      {"dataset", "d"}});
  const auto reply = wire::receive(*legit);
  ASSERT_TRUE(reply.at("ok").get<bool>()) << reply.dump();
  ASSERT_EQ(reply.at("provider"), "tcp;ofi_rxm");
  ASSERT_EQ(reply.at("data").at("mode"), "rma");
  const std::uint64_t key = reply["data"]["key"], base = reply["data"]["base"];
  const std::uint64_t label_key = reply["labels"]["key"], label_base = reply["labels"]["base"];
  const auto address = wire::from_hex(reply.at("address").get<std::string>());
  // A failed read breaks the endpoint's connection (later reads on it fail too), so every
  // attempt is the first read of a fresh endpoint: the very situation in which the granted key
  // does read, as this shows.
  auto attempt = [&](std::uint64_t k, std::uint64_t addr,
                     std::size_t len) -> std::optional<std::vector<std::byte>> {
    Attacker attacker("tcp;ofi_rxm", address);
    if (!attacker.read(k, addr, len)) return std::nullopt;
    return std::vector<std::byte>(attacker.buf(), attacker.buf() + len);
  };
  const auto sample = attempt(key, base + 7 * 4096, 4096);
  ASSERT_TRUE(sample);
  EXPECT_TRUE(content::check_sample(5, 7, sample->data(), 4096));

  std::vector<std::uint64_t> guesses;
  for (std::uint64_t k = 0; k <= 16; ++k) guesses.push_back(k);
  for (std::uint64_t k : {0xffULL, 0xffffULL, 0xffffffffULL, 1ULL << 32, 1ULL << 63, ~0ULL})
    guesses.push_back(k);
  for (std::uint64_t k : {key, label_key})
    for (std::uint64_t d : {1ULL, 2ULL, 3ULL}) guesses.push_back(k ^ d);
  for (std::uint64_t k : guesses) {  // a random 64-bit key is none of them (p < 2^-58)
    for (std::uint64_t addr : {base, base + 4096, label_base})
      EXPECT_FALSE(attempt(k, addr, 64).has_value()) << "read with guessed key " << k << " at " << addr;
  }
  // A departed client's keys are revoked: once it has gone, they read nothing either.
  wire::send(*legit, {{"op", "bye"}});
  legit.reset();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  bool revoked = false;
  while (!revoked && std::chrono::steady_clock::now() < until)
    revoked = !attempt(key, base, 64) && !attempt(label_key, label_base, 4);
  EXPECT_TRUE(revoked) << "the keys still read after their client left";
  // And the server still serves token holders.
  FabricOptions ok;
  ok.token = "s3cret";
  auto src = FabricSource::connect(server.uri("d"), ok);
  expect_all(*src, {{0, 64}});
}

TEST(SolarStored, AFileChangedInPlaceIsWithdrawn) {
  // Served from the mapped file, or from the server's own copy (--in-memory), which still
  // stands for the file and is withdrawn with it.
  for (const bool in_memory : {false, true}) {
    SCOPED_TRACE(in_memory ? "--in-memory" : "mapped file");
    TempDir dir;
    const std::string path = write(dir, "c.h5", Layout::contiguous, 16, {32, 64});
    std::vector<std::string> args{"--export", "d=" + path};
    if (in_memory) args.push_back("--in-memory");
    StoredProcess server(dir, args);
    ASSERT_TRUE(server.start()) << server.log();
    auto src = FabricSource::connect(server.uri("d"));
    expect_all(*src, {{0, 16}});
    // Clients read the mapped file without the server's CPU: the server notices the change
    // (here the mtime of a rewrite) within its watch period, refuses new clients and hangs up on
    // the ones reading it, whose next read then fails instead of returning new bytes.
    std::filesystem::last_write_time(path, std::filesystem::last_write_time(path) +
                                               std::chrono::seconds(1));
    std::string err;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (err.find("withdrawn") == std::string::npos && std::chrono::steady_clock::now() < until)
      err = error_of([&] { FabricSource::connect(server.uri("d")); });
    EXPECT_NE(err.find("dataset 'd' is withdrawn"), std::string::npos) << err;
    EXPECT_NE(err.find("changed while solar was reading it"), std::string::npos) << err;
    std::vector<std::byte> buf(16 * 4096);
    const SampleRun all{0, 16};
    EXPECT_NE(error_of([&] { src->read({&all, 1}, buf.data()); }).find("withdrawn"),
              std::string::npos);
  }
}

// An export that does not fit in the node's available memory is refused by name, with the
// sizes and what to do; the server serves the others. The large one is a sparse file (4 KiB
// on disk), so the test costs neither disk nor memory.
TEST(SolarStored, AnInMemoryExportLargerThanAvailableMemoryIsRefusedNamingTheSizes) {
  if (!test::have_h5py()) GTEST_SKIP() << "/usr/bin/python3 with h5py and numpy is not installed";
  TempDir dir;
  const std::string big = dir.file("big.h5");
  const std::uint64_t mib = sys::mem_available_bytes() / (1 << 20) + 2048;
  std::string out;
  ASSERT_EQ(test::run({"/usr/bin/python3", "-c",
                       "import h5py, sys\n"
                       "f = h5py.File(sys.argv[1], 'w')\n"
                       "p = h5py.h5p.create(h5py.h5p.DATASET_CREATE)\n"
                       "p.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)\n"
                       "p.set_fill_time(h5py.h5d.FILL_TIME_NEVER)\n"
                       "h5py.h5d.create(f.id, b'data', h5py.h5t.NATIVE_UINT8,\n"
                       "                h5py.h5s.create_simple((int(sys.argv[2]), 1 << 20)), p)\n",
                       big, std::to_string(mib)},
                      &out),
            0)
      << out;
  write(dir, "c.h5", Layout::contiguous, 16);
  StoredProcess server(dir, {"--in-memory", "--export", "big=" + big, "--export",
                             "c=" + dir.file("c.h5")});
  ASSERT_TRUE(server.start()) << server.log();
  const std::string err = error_of([&] { FabricSource::connect(server.uri("big")); });
  EXPECT_NE(err.find("dataset 'big' is unavailable on this server: --in-memory: export big "
                     "needs " + format_bytes(mib << 20) + " of memory"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("without --in-memory"), std::string::npos) << err;
  auto src = FabricSource::connect(server.uri("c"));
  expect_all(*src, {{0, 16}});
}

TEST(SolarStored, MoreClientsThanStagingBuffersAllReadAStagedExport) {
  // A chunked export is read through the server's 4 staging buffers: each client holds one only
  // between a stage request and its next message, so 6 clients (6 nodes' agents) all read.
  TempDir dir;
  write(dir, "k.h5", Layout::chunked, 24, {4, 16, 16, 16});
  StoredProcess server(dir, {"--export", "k=" + dir.file("k.h5")});
  ASSERT_TRUE(server.start()) << server.log();
  FabricOptions o;
  o.reconnect_s = 10;  // a busy staging buffer is tried again
  std::vector<std::unique_ptr<FabricSource>> clients;
  for (int i = 0; i < 6; ++i) clients.push_back(FabricSource::connect(server.uri("k"), o));
  for (int round = 0; round < 2; ++round)
    for (auto& c : clients) expect_all(*c, {{static_cast<std::uint64_t>(round * 12), 12}});
}


TEST(SolarStored, HelpExplainsEveryFlag) {
  std::string out;
  EXPECT_EQ(test::run({SOLAR_STORED, "--help"}, &out), 0);
  for (const char* flag : {"--listen", "--export", "--provider", "--token", "--token-file",
                           "--throttle-bandwidth", "--throttle-latency", "--ready-file",
                           "--max-pending", "--max-clients", "--hello-timeout", "--busy-poll",
                           "--in-memory"})
    EXPECT_NE(out.find(flag), std::string::npos) << flag;
  EXPECT_EQ(test::run({SOLAR_STORED, "--export", "bad"}, &out), 2);
  EXPECT_NE(out.find("NAME=FILE.h5:/dataset"), std::string::npos) << out;
}

}  // namespace
}  // namespace solar::storage

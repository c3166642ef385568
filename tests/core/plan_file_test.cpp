#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "solar/core/plan_file.h"
#include "solar/core/planner.h"
#include "solar/core/replay.h"

namespace solar {
namespace {

PlanConfig config(std::uint64_t seed) {
  PlanConfig c;
  c.samples = 1000;
  c.sample_bytes = 64;
  c.epochs = 3;
  c.nodes = 3;
  c.ranks_per_node = 2;
  c.batch = 8;
  c.imbalance = 1;
  c.buffer_bytes = 150 * 64;
  c.seed = seed;
  return c;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/solar-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::filesystem::path operator/(const char* f) const { return path_ / f; }

 private:
  std::filesystem::path path_;
};

// The plan's checksum is the standard CRC-32 (IEEE, as zlib's crc32): the check value, every
// length and alignment against the byte-at-a-time definition, and chaining.
TEST(PlanFile, Crc32IsTheStandardOneAtEveryLengthAndAlignment) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32(reinterpret_cast<const std::uint8_t*>(check.data()), check.size()),
            0xCBF43926U);
  EXPECT_EQ(crc32(nullptr, 0), 0U);
  auto bitwise = [](const std::uint8_t* p, std::size_t n) {
    std::uint32_t c = ~0U;
    for (std::size_t i = 0; i < n; ++i) {
      c ^= p[i];
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320U ^ (c >> 1) : c >> 1;
    }
    return ~c;
  };
  std::vector<std::uint8_t> bytes(300);
  std::uint32_t x = 12345;
  for (auto& b : bytes) b = static_cast<std::uint8_t>((x = x * 1103515245U + 12345U) >> 24);
  for (std::size_t at = 0; at < 8; ++at)
    for (std::size_t n = 0; n + at <= 80; ++n)
      ASSERT_EQ(crc32(bytes.data() + at, n), bitwise(bytes.data() + at, n)) << at << " " << n;
  EXPECT_EQ(crc32(bytes.data() + 100, 200, crc32(bytes.data(), 100)), bitwise(bytes.data(), 300));
}

TEST(PlanFile, RoundTripsAndReplays) {
  const Plan plan = make_plan(config(1));
  const auto bytes = encode_plan(plan);
  const Plan back = decode_plan(bytes.data(), bytes.size(), "mem");
  EXPECT_EQ(back.accesses, plan.accesses);
  EXPECT_EQ(back.rank_offsets, plan.rank_offsets);
  EXPECT_EQ(back.epoch_order, plan.epoch_order);
  EXPECT_EQ(back.metrics, plan.metrics);
  ASSERT_EQ(back.nodes.size(), plan.nodes.size());
  for (std::size_t n = 0; n < plan.nodes.size(); ++n) {
    EXPECT_EQ(back.nodes[n].fetch_runs, plan.nodes[n].fetch_runs);
    EXPECT_EQ(back.nodes[n].evicts, plan.nodes[n].evicts);
  }
  EXPECT_NO_THROW(replay_plan(back));
}

TEST(PlanFile, RoundTripsEveryPolicy) {
  for (Policy p : all_policies()) {
    PlanConfig c = config(3);
    c.policy = p;
    const Plan plan = make_plan(c);
    const auto bytes = encode_plan(plan);
    const Plan back = decode_plan(bytes.data(), bytes.size(), "mem");
    EXPECT_EQ(back.config.policy, p) << to_string(p);
    EXPECT_EQ(back.accesses, plan.accesses) << to_string(p);
    EXPECT_EQ(back.metrics, plan.metrics) << to_string(p);
    EXPECT_NO_THROW(replay_plan(back)) << to_string(p);
  }
}

TEST(PlanFile, CarriesTheDatasetIdentity) {
  for (const std::string& id : std::vector<std::string>{"", "file inode 12 size 34 mtime 5.000000006",
                                                       std::string(4096, 'x')}) {
    Plan plan = make_plan(config(1));
    plan.dataset_identity = id;
    const auto bytes = encode_plan(plan);
    EXPECT_EQ(bytes.size() % 8, 0U);
    EXPECT_EQ(decode_plan(bytes.data(), bytes.size(), "mem").dataset_identity, id);
    EXPECT_EQ(decode_header(bytes.data(), bytes.size(), "mem").dataset_identity, id);
    EXPECT_NO_THROW(decode_plan(bytes.data(), bytes.size(), "mem").nodes.at(2));
  }
  Plan plan = make_plan(config(1));
  plan.dataset_identity = std::string(4097, 'x');
  EXPECT_THROW(encode_plan(plan), PlanFileError);
}

TEST(PlanFile, SameInputsSameBytesOtherSeedOtherBytes) {
  const auto a = encode_plan(make_plan(config(1)));
  const auto b = encode_plan(make_plan(config(1)));
  const auto c = encode_plan(make_plan(config(2)));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(PlanFile, ReadsOneNodeWithoutTheRest) {
  TempDir dir;
  const Plan plan = make_plan(config(3));
  write_plan_file(plan, dir / "p.plan");
  const PlanFile pf = PlanFile::open(dir / "p.plan");
  EXPECT_EQ(pf.header().config.nodes, 3U);
  const NodePlan np = pf.node(1);
  // Node 1's rank 0 at step 0 is global rank 2.
  const auto want = plan.rank_batch(0, 2);
  ASSERT_GE(np.rank_offsets.size(), 2U);
  std::vector<std::uint32_t> got(np.accesses.begin(),
                                 np.accesses.begin() + static_cast<long>(np.rank_offsets[1]));
  EXPECT_EQ(got, std::vector<std::uint32_t>(want.begin(), want.end()));
  EXPECT_THROW(pf.node(3), PlanFileError);
  // Corrupting node 2's section does not stop node 1 from being read, but node 2 is refused.
  {
    std::fstream f(dir / "p.plan", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<long>(pf.header().directory[2].offset + 40));
    f.put('\x7f');
  }
  EXPECT_NO_THROW(pf.node(1));
  EXPECT_THROW(pf.node(2), PlanFileError);
}

TEST(PlanFile, RejectsCorruptTruncatedAndWrongVersion) {
  const auto good = encode_plan(make_plan(config(4)));
  auto expect_error = [](std::vector<std::uint8_t> bytes, const char* needle) {
    try {
      decode_plan(bytes.data(), bytes.size(), "x.plan");
      FAIL() << "accepted a bad file (" << needle << ")";
    } catch (const PlanFileError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("x.plan"), std::string::npos) << e.what();
    }
  };
  auto v = good;
  v[0] = 'X';
  expect_error(v, "magic");
  v = good;
  v[8] = 9;  // version
  expect_error(v, "version 9");
  v = good;
  v[40] ^= 1;  // a config byte: the header checksum catches it
  expect_error(v, "");
  v = good;
  v[v.size() - 100] ^= 0x55;  // inside the last node section
  expect_error(v, "checksum");
  v = good;
  v.resize(v.size() / 2);
  expect_error(v, "truncated");
  v = good;
  v.resize(10);
  expect_error(v, "truncated");
  expect_error({}, "truncated");
}

TEST(PlanFile, WriteIsAtomicAndLeavesNoTemporary) {
  TempDir dir;
  write_plan_file(make_plan(config(5)), dir / "a.plan");
  write_plan_file(make_plan(config(6)), dir / "a.plan");  // replaces
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir / "")) ++files;
  EXPECT_EQ(files, 1);
  EXPECT_EQ(PlanFile::open(dir / "a.plan").header().config.seed, 6U);
  EXPECT_THROW(write_plan_file(make_plan(config(5)), dir / "no/such/dir/a.plan"), PlanFileError);
}

}  // namespace
}  // namespace solar

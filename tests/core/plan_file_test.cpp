// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "solar/core/plan_file.h"
#include "solar/core/planner.h"
#include "solar/core/replay.h"
#include "solar/core/rng.h"
#include "random_config.h"

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

// Checksums say only that the bytes are the writer's. A plan whose schedule breaks what the
// planner guarantees, re-encoded (so its checksums are right), is refused by the readers of one
// node's section (the agent, libsolar) and of the whole plan, with the invariant named.
class PlanSchedule : public ::testing::Test {
 protected:
  static PlanConfig shape() {
    PlanConfig c = config(7);
    c.samples = 960;  // a multiple of the world's 6 ranks: every sample once per epoch
    return c;
  }
  const Plan good_ = make_plan(shape());
  const std::uint64_t W_ = good_.layout.world, R_ = good_.config.ranks_per_node;

  struct Access {
    std::uint64_t t = 0, rank = 0, i = 0;  // step, global rank, index into accesses
  };
  bool fetched(std::uint64_t node, std::uint64_t t, std::uint32_t x) const {
    bool f = false;
    for (const FetchRun& r : good_.nodes[node].fetches_at(t))
      f |= x >= r.first && x < r.first + r.count;
    for (const PeerFetch& p : good_.nodes[node].peers_at(t)) f |= p.sample == x;
    return f;
  }
  // The first access of local rank `local` of `node`, at step `from` or later, that is a hit
  // on a sample not fetched in its step (`hit`), or a miss (!hit).
  Access find(std::uint64_t node, std::uint64_t local, std::uint64_t from, bool hit) const {
    const std::uint64_t w = node * R_ + local;
    for (std::uint64_t t = from; t < good_.total_steps(); ++t)
      for (std::uint64_t i = good_.rank_offsets[t * W_ + w]; i < good_.rank_offsets[t * W_ + w + 1];
           ++i) {
        const std::uint32_t a = good_.accesses[i];
        if (hit ? (a & kHitBit) && !fetched(node, t, a & kSampleMask) : !(a & kHitBit))
          return {t, w, i};
      }
    ADD_FAILURE() << "no such access of node " << node << " local rank " << local;
    return {};
  }

  // `value` added to step t's part of a schedule list.
  template <class List, class V>
  static void insert_at(List& list, std::vector<std::uint64_t>& offsets, std::uint64_t t, V value) {
    list.insert(list.begin() + static_cast<std::ptrdiff_t>(offsets[t]), value);
    for (std::size_t k = t + 1; k < offsets.size(); ++k) ++offsets[k];
  }

  // `bad` re-encoded (checksums as the writer computes them) is refused by decode_plan, and
  // node `node`'s section by PlanFile::node (what the agent and libsolar read), each naming
  // `needle`.
  static void expect_refused(const Plan& bad, std::uint32_t node, const std::string& needle) {
    const auto bytes = encode_plan(bad);
    try {
      decode_plan(bytes.data(), bytes.size(), "x.plan");
      ADD_FAILURE() << "decode_plan accepted a plan whose schedule is inconsistent (" << needle
                    << ")";
    } catch (const PlanFileError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("x.plan"), std::string::npos) << e.what();
    }
    TempDir dir;
    write_plan_file(bad, dir / "x.plan");
    const PlanFile pf = PlanFile::open(dir / "x.plan");  // the header alone is fine
    try {
      pf.node(node);
      ADD_FAILURE() << "PlanFile::node accepted node " << node << "'s inconsistent schedule ("
                    << needle << ")";
    } catch (const PlanFileError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(fmt::format("node {} section", node)),
                std::string::npos)
          << e.what();
    }
  }
};

TEST_F(PlanSchedule, EveryPolicysPlanPasses) {
  for (Policy p : all_policies()) {
    PlanConfig c = shape();
    c.policy = p;
    c.peer_fetch = p == Policy::sampler;
    if (c.peer_fetch) c.imbalance = 0;
    const Plan plan = make_plan(c);
    const auto b = encode_plan(plan);
    EXPECT_NO_THROW(decode_plan(b.data(), b.size(), "x.plan")) << to_string(p);
    if (c.peer_fetch) {
      EXPECT_GT(plan.metrics.peer_fetches, 0U);  // peer reads are replayed too
    }
  }
}

// What the readers check is what the planner guarantees, for any inputs: random configs of
// every policy (padding, drop_last, δ, one-rank steps, peers) read back.
TEST(PlanScheduleProperty, RandomPlansOfEveryPolicyReadBack) {
  Xoshiro256 g(3232);
  int checked = 0;
  for (int i = 0; i < 300; ++i) {
    PlanConfig c = random_config(g);
    c.policy = all_policies()[g.bounded(all_policies().size())];
    if (c.policy == Policy::sampler) c.imbalance = 0;
    Plan plan;
    try {
      plan = make_plan(c);
    } catch (const ConfigError&) {
      continue;  // inputs the planner refuses
    }
    const auto bytes = encode_plan(plan);
    ASSERT_NO_THROW(decode_plan(bytes.data(), bytes.size(), "x.plan"))
        << "policy " << to_string(c.policy) << " N=" << c.samples << " M=" << c.nodes
        << " R=" << c.ranks_per_node << " b=" << c.batch << " d=" << c.imbalance
        << " drop_last=" << c.drop_last << " peers=" << c.peer_fetch;
    ++checked;
  }
  EXPECT_GT(checked, 200);
}

TEST_F(PlanSchedule, AHitOnASampleTheNodeDoesNotHoldIsRefused) {
  Plan bad = good_;
  const Access h = find(0, 0, good_.layout.steps, true);
  // A sample node 0 does not hold at that step: one that none of its ranks has read so far.
  std::vector<bool> named(bad.config.samples, false);
  for (std::uint64_t t = 0; t <= h.t; ++t)
    for (std::uint64_t w = 0; w < R_; ++w)
      for (std::uint32_t a : bad.rank_batch(t, w)) named[a & kSampleMask] = true;
  std::uint32_t never = 0;
  while (named[never]) ++never;
  bad.accesses[h.i] = never | kHitBit;
  expect_refused(bad, 0, fmt::format("step {} rank 0: sample {} is not in the node's buffer", h.t,
                                     never));
}

TEST_F(PlanSchedule, HitBitsThatDisagreeWithTheFetchesAreRefused) {
  Plan bad = good_;
  const Access m = find(0, 1, 3, false);
  bad.accesses[m.i] |= kHitBit;
  expect_refused(bad, 0, fmt::format("step {} rank 1: sample {} is flagged a hit but is fetched",
                                     m.t, bad.accesses[m.i] & kSampleMask));
  bad = good_;
  const Access h = find(1, 1, good_.layout.steps, true);
  bad.accesses[h.i] &= kSampleMask;
  expect_refused(bad, 1, fmt::format("step {} rank 3: sample {} is flagged a miss but nothing "
                                     "fetches it",
                                     h.t, bad.accesses[h.i]));
}

TEST_F(PlanSchedule, ABatchOutsideTheStepsBoundsIsRefused) {
  // Three of rank 0's samples at step 3 moved into rank 1's batch (both of node 0): the node
  // reads the same samples in that step, but rank 0's batch leaves [b-δ, b+δ] = [7, 9].
  Plan bad = good_;
  bad.rank_offsets[3 * W_ + 1] -= 3;
  expect_refused(bad, 0, fmt::format("step 3 rank 0: {} samples, outside the step's [7, 9]",
                                     bad.rank_batch(3, 0).size()));
}

TEST_F(PlanSchedule, ASampleTwiceInOneEpochIsRefused) {
  // One of rank 1's hits replaced by a hit of rank 0 in the same step: still resident and a
  // hit, but the epoch's order holds each sample once.
  Plan bad = good_;
  const Access h0 = find(0, 0, good_.layout.steps, true);
  Access h1{};
  for (std::uint64_t t = h0.t;; ++t) {
    h1 = find(0, 1, t, true);
    if (h1.t == t) break;  // rank 1 has a resident hit at the same step as rank 0
    ASSERT_LT(t, good_.total_steps());
  }
  const Access h = find(0, 0, h1.t, true);
  ASSERT_EQ(h.t, h1.t);
  bad.accesses[h1.i] = bad.accesses[h.i];
  expect_refused(bad, 0, fmt::format("the node reads sample {} more than the 1 time(s) the "
                                     "epoch's order holds it",
                                     bad.accesses[h.i] & kSampleMask));
}

TEST_F(PlanSchedule, EvictionsAndFetchesThatDisagreeWithTheBufferAreRefused) {
  // An eviction, at the step of one of node 1's resident hits, of that sample.
  Plan bad = good_;
  const Access h = find(1, 0, good_.layout.steps, true);
  const std::uint32_t x = bad.accesses[h.i] & kSampleMask;
  insert_at(bad.nodes[1].evicts, bad.nodes[1].evict_offsets, h.t, x);
  expect_refused(bad, 1, fmt::format("step {} rank 2: sample {} is not in the node's buffer",
                                     h.t, x));
  // An eviction of a sample it no longer holds: the first one it evicts, again a step later.
  bad = good_;
  NodeSchedule& n1 = bad.nodes[1];
  std::uint64_t t = 0;
  while (n1.evict_offsets[t + 1] == n1.evict_offsets[t]) ++t;
  const std::uint32_t gone = n1.evicts[n1.evict_offsets[t]];
  insert_at(n1.evicts, n1.evict_offsets, t + 1, gone);
  expect_refused(bad, 1, fmt::format("step {} evicts sample {}, which the node does not hold",
                                     t + 1, gone));
  // A fetch of a sample it holds: one of node 2's resident hits, fetched in its step.
  bad = good_;
  const Access h2 = find(2, 0, good_.layout.steps, true);
  const FetchRun again{bad.accesses[h2.i] & kSampleMask, 1};
  insert_at(bad.nodes[2].fetch_runs, bad.nodes[2].fetch_offsets, h2.t, again);
  expect_refused(bad, 2, fmt::format("step {} fetches sample {}, which the node already holds",
                                     h2.t, again.first));
}

TEST_F(PlanSchedule, AFetchNoRankUsesIsRefused) {
  // Node 0 fetches, at the step of one of its resident hits, a sample it does not read then,
  // and evicts to make room one it holds and reads only at a later step.
  Plan bad = good_;
  const Access h0 = find(0, 0, good_.layout.steps, true);
  const std::uint64_t t0 = h0.t;
  auto read_at = [&](std::uint64_t t, std::uint32_t x) {
    for (std::uint64_t w = 0; w < R_; ++w)
      for (std::uint32_t a : good_.rank_batch(t, w))
        if ((a & kSampleMask) == x) return true;
    return false;
  };
  std::uint32_t later = ~0U;
  for (std::uint64_t t = t0 + 1; t < good_.total_steps() && later == ~0U; ++t)
    for (std::uint64_t w = 0; w < R_ && later == ~0U; ++w)
      for (std::uint32_t a : good_.rank_batch(t, w)) {
        const std::uint32_t x = a & kSampleMask;
        bool since = false;  // fetched or evicted between t0 and t
        for (std::uint64_t u = t0; u <= t; ++u) {
          since |= fetched(0, u, x);
          for (std::uint32_t e : good_.nodes[0].evicts_at(u)) since |= e == x;
        }
        if ((a & kHitBit) && !since && !read_at(t0, x)) {
          later = x;
          break;
        }
      }
  ASSERT_NE(later, ~0U);
  std::vector<bool> named(good_.config.samples, false);
  for (std::uint64_t t = 0; t < good_.total_steps(); ++t)
    for (std::uint64_t w = 0; w < R_; ++w)
      for (std::uint32_t a : good_.rank_batch(t, w)) named[a & kSampleMask] = true;
  std::uint32_t never = 0;
  while (never < named.size() && named[never]) ++never;
  if (never == named.size()) {  // every sample is read at some step: one not read at t0
    never = 0;
    while (read_at(t0, never) || fetched(0, t0, never)) ++never;
  }
  insert_at(bad.nodes[0].evicts, bad.nodes[0].evict_offsets, t0, later);
  insert_at(bad.nodes[0].fetch_runs, bad.nodes[0].fetch_offsets, t0, FetchRun{never, 1});
  expect_refused(bad, 0, fmt::format("step {} fetches sample {}, which no rank of the node uses "
                                     "in it",
                                     t0, never));
}

TEST_F(PlanSchedule, MetricsThatDisagreeWithTheRecordsAreRefusedByTheWholePlan) {
  Plan bad = good_;
  ++bad.metrics.per_epoch[1].hits;
  ++bad.metrics.hits;
  const auto bytes = encode_plan(bad);
  try {
    decode_plan(bytes.data(), bytes.size(), "x.plan");
    ADD_FAILURE() << "accepted metrics that the records do not give";
  } catch (const PlanFileError& e) {
    EXPECT_NE(std::string(e.what()).find("metrics recounted"), std::string::npos) << e.what();
  }
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

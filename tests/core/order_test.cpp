// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>

#include "solar/core/order.h"
#include "solar/core/order_file.h"
#include "solar/core/planner.h"
#include "solar/core/replay.h"
#include "small_config.h"

namespace solar {
namespace {

TEST(Layout, MatchesDistributedSamplerAndDataLoader) {
  auto c = small_config(10, 1, 4, 2);  // W=4: num_samples = ceil(10/4) = 3 -> steps of 2 and 1
  auto l = EpochLayout::of(c);
  EXPECT_EQ(l.per_rank, 3U);
  EXPECT_EQ(l.steps, 2U);
  EXPECT_EQ(l.last_batch, 1U);
  EXPECT_EQ(l.used(), 12U);
  c.drop_last = true;  // num_samples = ceil((10-4)/4) = 2 -> one full step
  l = EpochLayout::of(c);
  EXPECT_EQ(l.per_rank, 2U);
  EXPECT_EQ(l.steps, 1U);
  EXPECT_EQ(l.used(), 8U);
}

TEST(Layout, PaddingWrapsAroundThePermutation) {
  auto c = small_config(10, 1, 4, 3);
  const auto l = EpochLayout::of(c);
  std::vector<std::uint32_t> seq;
  epoch_sequence(c, l, 0, seq);
  ASSERT_EQ(seq.size(), 12U);
  EXPECT_EQ(seq[10], seq[0]);
  EXPECT_EQ(seq[11], seq[1]);
}

TEST(LowerBound, FormulaAndSaturation) {
  auto c = small_config(800, 1, 4, 16);
  c.sample_bytes = 1;
  c.buffer_bytes = 512;
  EXPECT_EQ(lower_bound_fetches(c), 800U + 2 * 288);
  c.nodes = 2;
  c.buffer_bytes = 512;  // 2·512 ≥ 800: everything can stay
  EXPECT_EQ(lower_bound_fetches(c), 800U);
}

// --order-file (issue 38): the script's own order, a permutation per epoch.
class OrderFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/solar-order-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  // A .npy file as np.save writes it (format 1.0, header padded to 64 bytes) of int64 ids.
  std::string npy(const std::string& name, const std::vector<std::int64_t>& ids,
                  const std::string& shape, const std::string& descr = "<i8") {
    std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape +
                         ", }";
    while ((10 + header.size() + 1) % 64) header += ' ';
    header += '\n';
    std::string b = std::string("\x93NUMPY\x01\x00", 8);
    b += static_cast<char>(header.size() & 0xff);
    b += static_cast<char>(header.size() >> 8);
    b += header;
    for (std::int64_t v : ids) {
      if (descr == "<i8") b.append(reinterpret_cast<const char*>(&v), 8);
      else {
        const auto w = static_cast<std::int32_t>(v);
        b.append(reinterpret_cast<const char*>(&w), 4);
      }
    }
    return write(name, b);
  }
  static std::string error_of(const std::string& path, std::uint64_t n, std::uint32_t e) {
    try {
      read_order_file(path, n, e);
    } catch (const ConfigError& err) {
      EXPECT_EQ(err.flag(), "--order-file");
      return err.what();
    }
    return "no error";
  }
  std::string dir_;
};

TEST_F(OrderFile, NpyAndTextGiveTheSameOrder) {
  const std::vector<std::int64_t> ids{3, 1, 0, 2, 2, 0, 3, 1};
  const auto a = read_order_file(npy("o.npy", ids, "(2, 4)"), 4, 2);
  const auto b = read_order_file(write("o.txt", "3 1 0 2\n2,0,3,1\n"), 4, 2);
  const auto c = read_order_file(npy("flat.npy", ids, "(8,)", "<i4"), 4, 2);
  const std::vector<std::uint32_t> want{3, 1, 0, 2, 2, 0, 3, 1};
  EXPECT_EQ(*a, want);
  EXPECT_EQ(*b, want);
  EXPECT_EQ(*c, want);
  // A file of more epochs than the run's: its first ones.
  EXPECT_EQ(*read_order_file(npy("more.npy", ids, "(2, 4)"), 4, 1),
            std::vector<std::uint32_t>(want.begin(), want.begin() + 4));
}

TEST_F(OrderFile, EveryBadFileIsNamedWithWhatIsWrong) {
  EXPECT_NE(error_of(dir_ + "/none.npy", 4, 1).find("cannot open"), std::string::npos);
  EXPECT_NE(error_of(npy("short.npy", {0, 1, 2, 3}, "(1, 4)"), 4, 2)
                .find("4 sample ids: 2 epochs of 4 samples need 8"),
            std::string::npos);
  EXPECT_NE(error_of(npy("wide.npy", {0, 1, 2, 3, 4, 0}, "(1, 6)"), 4, 1)
                .find("rows of 6 sample ids, the dataset has 4 samples"),
            std::string::npos);
  EXPECT_NE(error_of(npy("range.npy", {0, 1, 4, 2}, "(1, 4)"), 4, 1)
                .find("epoch 0, position 2: sample id 4 is out of range"),
            std::string::npos);
  EXPECT_NE(error_of(npy("neg.npy", {0, 1, 2, 3, 0, -1, 2, 3}, "(2, 4)"), 4, 2)
                .find("epoch 1, position 1: a negative sample id"),
            std::string::npos);
  EXPECT_NE(error_of(write("twice.txt", "0 1 2 3\n0 1 1 3\n"), 4, 2)
                .find("epoch 1, position 2: sample 1 appears twice"),
            std::string::npos);
  EXPECT_NE(error_of(write("words.txt", "0 1\nx 3\n"), 4, 1).find("line 2: 'x' is not a sample id"),
            std::string::npos);
  EXPECT_NE(error_of(npy("f.npy", {0, 1, 2, 3}, "(1, 4)", "<f8"), 4, 1).find("dtype <f8"),
            std::string::npos);
}

// The plan follows the file: each epoch's sequence is its row (padded by wrapping), the
// transparent mode's sampler assignment strides it among the ranks, and the replay recounts the
// plan. A plan without the list (read back from its file) says to give the file again.
TEST_F(OrderFile, ThePlanFollowsTheFileExactly) {
  PlanConfig c = small_config(10, 2, 2, 2);
  c.buffer_bytes = 6;
  c.order = OrderMode::file;
  auto list = std::make_shared<std::vector<std::uint32_t>>();
  for (std::uint32_t e = 0; e < c.epochs; ++e)
    for (std::uint32_t q = 0; q < 10; ++q) list->push_back((q * 3 + e) % 10);  // permutations
  c.order_list = list;
  c.validate();
  const EpochLayout l = EpochLayout::of(c);
  std::vector<std::uint32_t> seq;
  for (std::uint32_t e = 0; e < c.epochs; ++e) {
    epoch_sequence(c, l, e, seq);
    ASSERT_EQ(seq.size(), 12u);
    for (std::uint32_t q = 0; q < 12; ++q) EXPECT_EQ(seq[q], (*list)[e * 10 + q % 10]) << e << q;
  }
  c.policy = Policy::sampler;  // DistributedSampler(shuffle=False) over the rows
  const Plan p = make_plan(c);
  EXPECT_EQ(replay_plan(p).metrics, p.metrics);  // throws PlanInvalid on a violation
  for (std::uint32_t pos = 0; pos < c.epochs; ++pos) {
    const std::uint32_t e = p.epoch_order[pos];
    for (std::uint32_t j = 0; j < l.steps; ++j)
      for (std::uint64_t w = 0; w < c.world(); ++w) {
        const auto batch = p.rank_batch(std::uint64_t{pos} * l.steps + j, w);
        for (std::size_t i = 0; i < batch.size(); ++i) {
          const std::uint64_t q = l.step_begin(j) + i * c.world() + w;
          EXPECT_EQ(batch[i] & ~kHitBit, (*list)[e * 10 + q % 10]);
        }
      }
  }
  PlanConfig without = c;
  without.order_list.reset();
  try {
    epoch_sequence(without, l, 0, seq);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("give the order file again"), std::string::npos);
  }
  PlanConfig wrong = c;
  wrong.epochs = 2;  // a list of 3 epochs for 2
  EXPECT_THROW(wrong.validate(), ConfigError);
}

}  // namespace
}  // namespace solar

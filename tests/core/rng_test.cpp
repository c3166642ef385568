// SPDX-License-Identifier: Apache-2.0
// Golden tests: the generators and shuffles must give these exact values on every platform.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "solar/core/order.h"
#include "solar/core/rng.h"

namespace solar {
namespace {

TEST(Rng, SplitMix64MatchesReference) {
  // Reference outputs of splitmix64 from state 1234567 (Vigna's splitmix64.c).
  std::uint64_t s = 1234567;
  EXPECT_EQ(splitmix64(s), 6457827717110365317ULL);
  EXPECT_EQ(splitmix64(s), 3203168211198807973ULL);
  EXPECT_EQ(splitmix64(s), 9817491932198370423ULL);
}

TEST(Rng, Mt19937MatchesTheStandardEngine) {
  // std::mt19937 is fully specified by the standard (its 10000th output is 4123659995), so it
  // is a valid reference for our own implementation.
  Mt19937 ours(5489);
  std::mt19937 ref(5489);
  for (int i = 0; i < 20000; ++i) ASSERT_EQ(ours.next(), ref()) << "output " << i;
  Mt19937 tenk(5489);
  std::uint32_t v = 0;
  for (int i = 0; i < 10000; ++i) v = tenk.next();
  EXPECT_EQ(v, 4123659995U);
}

TEST(Rng, Mt19937UsesLow32BitsOfSeed) {
  Mt19937 a((1ULL << 40) + 77), b(77);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.next(), b.next());
}

TEST(Rng, BoundedIsInRangeAndCoversIt) {
  Xoshiro256 g(42);
  std::vector<int> seen(7, 0);
  for (int i = 0; i < 7000; ++i) {
    const auto v = g.bounded(7);
    ASSERT_LT(v, 7U);
    ++seen[v];
  }
  for (int c : seen) EXPECT_GT(c, 800);  // ~1000 each; a biased or broken draw fails this
}

TEST(Rng, XoshiroGolden) {
  // Computed by an independent Python transcription of the reference xoshiro256** + splitmix64.
  Xoshiro256 g(0);
  const std::uint64_t expect[] = {11091344671253066420ULL, 13793997310169335082ULL,
                                  1900383378846508768ULL};
  for (std::uint64_t e : expect) EXPECT_EQ(g.next(), e);
}

TEST(Order, SolarPermutationGolden) {
  std::vector<std::uint32_t> p(10);
  solar_permutation(0, 0, p);
  EXPECT_EQ(p, (std::vector<std::uint32_t>{9, 5, 4, 1, 2, 8, 3, 0, 6, 7}));
  solar_permutation(0, 1, p);
  EXPECT_EQ(p, (std::vector<std::uint32_t>{7, 3, 0, 4, 8, 1, 6, 5, 2, 9}));
  solar_permutation(42, 0, p);
  EXPECT_EQ(p, (std::vector<std::uint32_t>{3, 6, 1, 9, 8, 7, 2, 4, 5, 0}));
}

TEST(Order, SolarPermutationIsAPermutationAndSeedMatters) {
  std::vector<std::uint32_t> a(1000), b(1000);
  solar_permutation(1, 0, a);
  solar_permutation(2, 0, b);
  EXPECT_NE(a, b);
  std::vector<std::uint32_t> s = a;
  std::sort(s.begin(), s.end());
  for (std::uint32_t i = 0; i < 1000; ++i) ASSERT_EQ(s[i], i);
}

TEST(Order, TorchRandpermMatchesPyTorchGolden) {
  // tests/data/torch_sampler_golden.json was written by real PyTorch (gen_torch_golden.py).
  std::ifstream f(std::string(SOLAR_TEST_DATA) + "/torch_sampler_golden.json");
  ASSERT_TRUE(f) << "missing golden file";
  const auto golden = nlohmann::json::parse(f);
  ASSERT_GE(golden["cases"].size(), 5U);
  for (const auto& cs : golden["cases"]) {
    PlanConfig c;
    c.samples = cs["n"];
    c.nodes = 1;
    c.ranks_per_node = cs["world"];
    c.seed = cs["seed"];
    c.drop_last = cs["drop_last"];
    c.order = OrderMode::torch;
    c.batch = 1;
    c.epochs = static_cast<std::uint32_t>(cs["epoch"]) + 1;
    const EpochLayout layout = EpochLayout::of(c);
    std::vector<std::uint32_t> seq;
    epoch_sequence(c, layout, cs["epoch"], seq);
    const auto& ranks = cs["ranks"];
    ASSERT_EQ(ranks.size(), layout.world);
    for (std::uint64_t r = 0; r < layout.world; ++r) {
      const auto& want = ranks[r];
      ASSERT_EQ(want.size(), layout.per_rank) << "n=" << c.samples << " rank " << r;
      for (std::uint64_t i = 0; i < layout.per_rank; ++i)
        ASSERT_EQ(seq[r + i * layout.world], want[i].get<std::uint32_t>())
            << "n=" << c.samples << " world=" << layout.world << " rank " << r << " i " << i;
    }
  }
}

}  // namespace
}  // namespace solar

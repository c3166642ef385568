// SPDX-License-Identifier: Apache-2.0
// PlanConfig's checks, the transparent mode's settings, sizes as text, and the job-parameter
// table every front end parses with (core/include/solar/core/{plan_config,agent_budget,units,
// job_params}.h).
#include <gtest/gtest.h>

#include <string>

#include "solar/core/config.h"
#include "solar/core/job_params.h"
#include "small_config.h"

namespace solar {
namespace {

TEST(Config, RejectsBadInputWithTheFlagNamed) {
  auto expect_flag = [](PlanConfig c, const char* flag) {
    try {
      c.validate();
      FAIL() << "accepted a config that should fail on " << flag;
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.flag(), flag) << e.what();
      EXPECT_NE(std::string(e.what()).find("allowed"), std::string::npos) << e.what();
    }
  };
  auto ok = small_config(800, 1, 4, 16);
  ok.sample_bytes = 10;
  ok.buffer_bytes = 5120;
  EXPECT_NO_THROW(ok.validate());
  auto c = ok;
  c.samples = 0;
  expect_flag(c, "--samples");
  c = ok;
  c.batch = 201;  // 201 × 4 > 800
  expect_flag(c, "--batch");
  c = ok;
  c.batch = 0;
  expect_flag(c, "--batch");
  c = ok;
  c.buffer_bytes = 9;  // less than one sample
  expect_flag(c, "--buffer");
  c = ok;
  c.buffer_bytes = 630;  // 63 samples < one step of 64
  expect_flag(c, "--buffer");
  c = ok;
  c.ranks_per_node = 801;
  expect_flag(c, "--ranks-per-node");
  c = ok;
  c.epochs = 0;
  expect_flag(c, "--epochs");
  c = ok;
  c.epochs = 6000000;  // 6e6 × 800 accesses overflow the plan limit
  expect_flag(c, "--epochs");
  c = ok;
  c.imbalance = 16;
  expect_flag(c, "--imbalance");
  // The limit counts DistributedSampler's padding: 2^20 + 1 samples over 1024 ranks are 1025
  // per rank, 1049600 accesses per epoch. 4031 epochs × N fit, 4031 × 1049600 do not (every
  // access time must fit a 32-bit eviction key); 4028 × 1049600 do.
  c = small_config((1U << 20) + 1, 1, 1024, 1);
  c.epochs = 4031;
  ASSERT_LE(std::uint64_t{c.epochs} * c.samples, kMaxAccesses);
  expect_flag(c, "--epochs");
  c.epochs = 4028;
  EXPECT_NO_THROW(c.validate());
  c.epochs = 4031;
  c.drop_last = true;  // no padding: the samples are the limit, as before
  EXPECT_NO_THROW(c.validate());
  c = ok;
  c.sample_bytes = 0;
  expect_flag(c, "--sample-bytes");
}

TEST(Config, TheTransparentModeFollowsTheScript) {
  PlanConfig c;
  c.samples = 100;
  c.sample_bytes = 64;
  c.epochs = 2;
  c.batch = 4;
  c.buffer_bytes = 64 * 64;
  follow_the_script(c, false);  // the default order: the script's
  EXPECT_EQ(c.order, OrderMode::torch);
  EXPECT_EQ(c.policy, Policy::sampler);
  c.order = OrderMode::solar;
  try {
    follow_the_script(c, true);
    ADD_FAILURE() << "accepted --order solar";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--order");
  }
  c.order = OrderMode::torch;
  c.imbalance = 1;
  try {
    follow_the_script(c, true);
    ADD_FAILURE() << "accepted --imbalance 1";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--imbalance");
  }
}

TEST(Config, ParsesSizesAndRejectsGarbage) {
  EXPECT_EQ(parse_bytes("512", "--x"), 512U);
  EXPECT_EQ(parse_bytes("16M", "--x"), 16ULL << 20);
  EXPECT_EQ(parse_bytes("1.5G", "--x"), 3ULL << 29);
  EXPECT_EQ(parse_bytes("2TiB", "--x"), 2ULL << 40);
  EXPECT_THROW(parse_bytes("lots", "--x"), ConfigError);
  EXPECT_THROW(parse_bytes("-5M", "--x"), ConfigError);
  EXPECT_THROW(parse_bytes("99999999999T", "--x"), ConfigError);
  EXPECT_THROW(parse_bytes("5Q", "--x"), ConfigError);
  const auto pct = BufferSpec::parse("22.5%", "--buffer");
  EXPECT_EQ(pct.resolve(8192, 16), 1843U * 16);
  EXPECT_THROW(BufferSpec::parse("150%", "--buffer"), ConfigError);
  EXPECT_THROW(BufferSpec::parse("%", "--buffer"), ConfigError);
}

TEST(Config, JobParametersHaveTheLimitsThePlanChecks) {
  // One range per parameter for every front end (solar plan, solar run, solar bench loader,
  // srun --solar-*): the upper bounds are validate()'s.
  EXPECT_EQ(job_params::kSamples.hi, kMaxSamples);
  EXPECT_EQ(job_params::kEpochs.hi, kMaxEpochs);
  EXPECT_EQ(job_params::kBatch.hi, kMaxSamples);
  EXPECT_EQ(job_params::kImbalance.hi, kMaxSamples);
  EXPECT_EQ(job_params::kNodes.hi, kMaxNodes);
  EXPECT_EQ(job_params::kRanksPerNode.hi, kMaxRanksPerNode);
  EXPECT_EQ(job_params::kEpochs.lo, 1U);
  EXPECT_EQ(job_params::kImbalance.lo, 0U);
  EXPECT_EQ(parse_job_param32("1000000", "--epochs", job_params::kEpochs), 1000000U);
  EXPECT_EQ(parse_job_param32("1001", "--epochs", job_params::kEpochs), 1001U);
  try {
    parse_job_param32("1000001", "--epochs", job_params::kEpochs);
    ADD_FAILURE() << "accepted --epochs 1000001";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--epochs");
    EXPECT_NE(std::string(e.what()).find("1..1000000"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_job_param32("0", "--batch", job_params::kBatch), ConfigError);
  EXPECT_EQ(parse_job_param("18446744073709551615", "--seed", job_params::kSeed),
            ~std::uint64_t{0});
}

}  // namespace
}  // namespace solar

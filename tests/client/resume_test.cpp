// SPDX-License-Identifier: Apache-2.0
// libsolar's resume API (solar_skip_to, solar_position, solar_plan_fingerprint) and the
// standalone defaults of solar_open_env, on the direct-read path with a real HDF5 file and a
// real plan. (With an agent, skip_to is exercised end to end by python/tests/test_wheel.py
// under `solar run`.)
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "solar/core/plan_file.h"
#include "solar/core/planner.h"
#include "solar/solar.hpp"
#include "solar/storage/content.h"
#include "solar/storage/hdf5_writer.h"

namespace {

namespace fs = std::filesystem;
using solar::storage::content::check_sample;

constexpr std::uint64_t kSamples = 150, kSeed = 7;
constexpr std::uint64_t kSampleBytes = 64 * 2;  // 64 int16

struct Step {
  std::uint64_t step;
  std::uint32_t epoch;
  std::vector<std::uint64_t> indices;
  std::vector<std::byte> bytes;
  bool operator==(const Step&) const = default;
};

class Resume : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/solar-resume-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    solar::storage::GenSpec g;
    g.path = (dir_ / "data.h5").string();
    g.samples = kSamples;
    g.shape = {64};
    g.dtype = solar::storage::DType::int16;
    g.seed = kSeed;
    solar::storage::write_dataset(g);
    plan_ = make("plan", 2, 1);
    solo_ = make("solo", 1, 1);
    wide_ = make("wide", 2, 2);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // A plan for `ranks` ranks on each of `nodes` nodes, 3 epochs of batch 8.
  static std::string make(const std::string& name, std::uint32_t ranks, std::uint32_t nodes,
                          std::uint64_t seed = 11) {
    solar::PlanConfig c;
    c.samples = kSamples;
    c.sample_bytes = kSampleBytes;
    c.epochs = 3;
    c.nodes = nodes;
    c.ranks_per_node = ranks;
    c.batch = 8;
    c.seed = seed;
    c.buffer_bytes = kSamples / 2 * kSampleBytes;
    const std::string path = (dir_ / name).string();
    solar::write_plan_file(solar::make_plan(c), path);
    return path;
  }

  void SetUp() override {
    for (const char* v : {"SOLAR_SOCKET", "SOLAR_NODE", "SOLAR_LOCAL_RANK", "LOCAL_RANK",
                          "SOLAR_START_EPOCH", "SOLAR_START_STEP",
                          "WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE",
                          "PMI_SIZE", "SOLAR_LABELS"})
      ::unsetenv(v);
    use(plan_, 0, 1);
  }

  static void use(const std::string& plan, int node, int local_rank) {
    ::setenv("SOLAR_PLAN", plan.c_str(), 1);
    ::setenv("SOLAR_DATASET", (dir_ / "data.h5").c_str(), 1);
    if (node >= 0) ::setenv("SOLAR_NODE", std::to_string(node).c_str(), 1);
    if (local_rank >= 0) ::setenv("SOLAR_LOCAL_RANK", std::to_string(local_rank).c_str(), 1);
  }

  // Every remaining batch of `l`, with its samples' bytes (checked against the generator).
  static std::vector<Step> drain(solar::Loader& l) {
    std::vector<Step> out;
    while (auto b = l.next()) {
      Step s{b->step(), b->epoch(), {}, {}};
      for (std::size_t i = 0; i < b->size(); ++i) {
        s.indices.push_back(b->index(i));
        const auto d = b->sample(i);
        EXPECT_TRUE(check_sample(kSeed, b->index(i), d.data(), d.size()));
        s.bytes.insert(s.bytes.end(), d.begin(), d.end());
      }
      out.push_back(std::move(s));
    }
    return out;
  }

  static fs::path dir_;
  static std::string plan_, solo_, wide_;
};

fs::path Resume::dir_;
std::string Resume::plan_, Resume::solo_, Resume::wide_;

// What a sample is, from the dataset libsolar reads directly (solar_sample_shape & co.).
TEST_F(Resume, LayoutIsTheDatasets) {
  {
    solar::Loader l;
    ASSERT_FALSE(l.using_agent());
    EXPECT_EQ(l.sample_shape(), std::vector<std::uint64_t>{64});
    EXPECT_EQ(l.sample_dtype(), "int16");
    EXPECT_EQ(l.label_dtype(), "int32");
    std::uint64_t dims[2] = {7, 7};
    EXPECT_EQ(solar_sample_shape(l.get(), dims, 0), 1);  // nothing written
    EXPECT_EQ(dims[0], 7u);
    EXPECT_EQ(solar_sample_shape(l.get(), dims, 2), 1);
    EXPECT_EQ(dims[0], 64u);
    EXPECT_EQ(dims[1], 7u);
  }
  ::setenv("SOLAR_LABELS", "", 1);  // no labels: no label type
  solar::Loader l;
  EXPECT_EQ(l.label_dtype(), "");
  EXPECT_EQ(l.sample_dtype(), "int16");
}

TEST_F(Resume, SkipToGivesTheUninterruptedRunsBatchesFromThatStep) {
  std::vector<Step> full;
  std::uint64_t total = 0, spe = 0;
  {
    solar::Loader l;
    ASSERT_FALSE(l.using_agent());
    spe = l.steps_per_epoch();
    total = spe * l.epochs();
    EXPECT_EQ(l.position(), 0u);
    EXPECT_EQ(l.batch_per_rank(), 8u);
    full = drain(l);
    EXPECT_EQ(l.position(), total);
  }
  ASSERT_EQ(full.size(), total);
  ASSERT_GT(spe, 4u);
  for (std::uint64_t k : {std::uint64_t{0}, std::uint64_t{1}, spe / 2, spe - 1, spe, spe + 3,
                          total - 1, total}) {
    solar::Loader l;
    l.skip_to(k);
    EXPECT_EQ(l.position(), k);
    const auto rest = drain(l);
    ASSERT_EQ(rest.size(), total - k) << "from step " << k;
    EXPECT_TRUE(std::equal(rest.begin(), rest.end(), full.begin() + static_cast<long>(k)))
        << "from step " << k;
    if (k < total) {
      EXPECT_EQ(rest.front().step, k);
      EXPECT_EQ(rest.front().epoch, k / spe);
    }
  }
  // Mid-run: a few batches taken, then forward again.
  solar::Loader l;
  for (int i = 0; i < 3; ++i) l.next();
  l.skip_to(3);  // where it is: nothing to do
  l.skip_to(spe + 1);
  const auto rest = drain(l);
  ASSERT_EQ(rest.size(), total - spe - 1);
  EXPECT_EQ(rest.front(), full[spe + 1]);
}

TEST_F(Resume, SkipToRefusesWhatItCannotDo) {
  solar::Loader l;
  const std::uint64_t total = std::uint64_t{l.steps_per_epoch()} * l.epochs();
  try {
    l.skip_to(total + 1);
    FAIL() << "a step beyond the end was accepted";
  } catch (const solar::Error& e) {
    EXPECT_NE(std::string(e.what()).find("step " + std::to_string(total + 1) +
                                            " is beyond the end of the plan (" +
                                            std::to_string(total) + " steps"), std::string::npos)
        << e.what();
  }
  {
    auto b = l.next();
    ASSERT_TRUE(b);
    try {
      l.skip_to(5);
      FAIL() << "skip_to with a batch held was accepted";
    } catch (const solar::Error& e) {
      EXPECT_NE(std::string(e.what()).find("step 0 is still held"), std::string::npos)
          << e.what();
    }
  }
  l.skip_to(4);
  try {
    l.skip_to(2);
    FAIL() << "a step already served was accepted";
  } catch (const solar::Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 2 was already served (the next step is 4)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(l.position(), 4u);  // a refused skip moves nothing
  EXPECT_EQ(l.next()->step(), 4u);
  l.skip_to(total);
  EXPECT_FALSE(l.next());
  EXPECT_EQ(solar_skip_to(nullptr, 0), -1);
}

// A resumed launch (solar run --start-epoch/--start-step, srun --solar-start-*) sets
// SOLAR_START_EPOCH and SOLAR_START_STEP: the loader starts there, skip_to it is a cursor move,
// an earlier step is refused, and a start beyond the plan names the plan's length.
TEST_F(Resume, StartFromTheLaunchersEnvironment) {
  std::vector<Step> full;
  std::uint64_t spe = 0, total = 0;
  {
    solar::Loader l;
    spe = l.steps_per_epoch();
    total = spe * l.epochs();
    full = drain(l);
  }
  ::setenv("SOLAR_START_EPOCH", "1", 1);
  ::setenv("SOLAR_START_STEP", "2", 1);
  {
    solar::Loader l;
    EXPECT_EQ(l.position(), spe + 2);
    l.skip_to(spe + 2);  // the checkpoint's step: nothing to do
    try {
      l.skip_to(spe);
      FAIL() << "a step before the launch's start was accepted";
    } catch (const solar::Error& e) {
      EXPECT_NE(std::string(e.what()).find("where this launch started"), std::string::npos)
          << e.what();
    }
    const auto rest = drain(l);
    ASSERT_EQ(rest.size(), total - spe - 2);
    EXPECT_TRUE(std::equal(rest.begin(), rest.end(), full.begin() + static_cast<long>(spe + 2)));
  }
  ::unsetenv("SOLAR_START_EPOCH");
  ::setenv("SOLAR_START_STEP", std::to_string(spe + 2).c_str(), 1);  // a global step alone
  {
    solar::Loader l;
    EXPECT_EQ(l.position(), spe + 2);
  }
  ::setenv("SOLAR_START_STEP", std::to_string(total + 1).c_str(), 1);
  EXPECT_EQ(solar_open_env(), nullptr);
  EXPECT_NE(std::string(solar_last_error()).find("beyond the end of the plan (the plan has " +
                                                 std::to_string(total) + " steps: 3 epochs of " +
                                                 std::to_string(spe) + ")"),
            std::string::npos)
      << solar_last_error();
  ::setenv("SOLAR_START_EPOCH", "1", 1);
  ::setenv("SOLAR_START_STEP", std::to_string(spe).c_str(), 1);
  EXPECT_EQ(solar_open_env(), nullptr);
  EXPECT_NE(std::string(solar_last_error()).find("SOLAR_START_STEP: step"), std::string::npos)
      << solar_last_error();
  ::unsetenv("SOLAR_START_EPOCH");
  ::unsetenv("SOLAR_START_STEP");
}

TEST_F(Resume, FingerprintIdentifiesThePlanNotTheRank) {
  std::uint64_t f0, f1;
  {
    solar::Loader a;
    f1 = a.plan_fingerprint();
  }
  use(plan_, 0, 0);
  {
    solar::Loader b;
    f0 = b.plan_fingerprint();
  }
  EXPECT_EQ(f0, f1);
  use(make("again", 2, 1), 0, 0);  // the same inputs: the same plan
  EXPECT_EQ(solar::Loader().plan_fingerprint(), f0);
  use(make("other-seed", 2, 1, 12), 0, 0);
  EXPECT_NE(solar::Loader().plan_fingerprint(), f0);
}

TEST_F(Resume, StandaloneDefaultsToNodeZeroLocalRankZero) {
  ::unsetenv("SOLAR_NODE");
  ::unsetenv("SOLAR_LOCAL_RANK");
  use(solo_, -1, -1);
  {
    solar::Loader l;  // one rank: no warning, no error
    EXPECT_EQ(l.rank(), 0u);
    EXPECT_EQ(l.world_size(), 1u);
  }
  // A plan of 2 nodes x 2 ranks read on its own: node 0, local rank 0 (a warning on stderr).
  use(wide_, -1, -1);
  {
    solar::Loader l;
    EXPECT_EQ(l.rank(), 0u);
    EXPECT_EQ(l.world_size(), 4u);
  }
  ::setenv("LOCAL_RANK", "1", 1);
  EXPECT_EQ(solar::Loader().rank(), 1u);  // node still defaults to 0
  // Started by a launcher as one of several: which rank it is must be said.
  ::setenv("WORLD_SIZE", "4", 1);
  try {
    solar::Loader l;
    FAIL() << "one of 4 processes without SOLAR_NODE was opened as node 0";
  } catch (const solar::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("SOLAR_NODE is not set but this process is one of several (WORLD_SIZE=4)"),
              std::string::npos)
        << m;
  }
  ::setenv("SOLAR_NODE", "1", 1);
  EXPECT_EQ(solar::Loader().rank(), 3u);
}

TEST_F(Resume, MissingPlanOrDatasetSaysWhatToDo) {
  ::unsetenv("SOLAR_PLAN");
  EXPECT_EQ(solar_open_env(), nullptr);
  EXPECT_NE(std::string(solar_last_error()).find("SOLAR_PLAN is not set"), std::string::npos);
  EXPECT_NE(std::string(solar_last_error()).find("solar plan"), std::string::npos);
  use(plan_, 0, 0);
  ::unsetenv("SOLAR_DATASET");
  EXPECT_EQ(solar_open_env(), nullptr);
  EXPECT_NE(std::string(solar_last_error()).find("SOLAR_DATASET is not set"), std::string::npos)
      << solar_last_error();
  ::setenv("SOLAR_DATASET", (dir_ / "missing.h5").c_str(), 1);
  EXPECT_EQ(solar_open_env(), nullptr);
  EXPECT_NE(std::string(solar_last_error()).find("missing.h5"), std::string::npos)
      << solar_last_error();
  ::setenv("SOLAR_DATASET", (dir_ / "data.h5").c_str(), 1);
  ::setenv("SOLAR_PLAN", (dir_ / "no-such-plan").c_str(), 1);
  EXPECT_EQ(solar_open_env(), nullptr);
  EXPECT_NE(std::string(solar_last_error()).find("no-such-plan"), std::string::npos)
      << solar_last_error();
}

}  // namespace

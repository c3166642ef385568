// SPDX-License-Identifier: Apache-2.0
// The plugin's settings without Slurm: plugstack.conf arguments, --solar-* options and SOLAR_*
// variables, and the plan a step gets from them.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "settings.h"
#include "solar/core/agent_budget.h"

namespace solar::spank {
namespace {

DatasetShape tiny() {
  DatasetShape i;
  i.samples = 256;
  i.sample_bytes = 4096;
  i.label_bytes = 4;
  return i;
}

JobOptions basic() {
  JobOptions o;
  o.set(JobOptions::dataset, "/data/x.h5:/data");
  o.set(JobOptions::buffer, "50%");
  o.set(JobOptions::epochs, "3");
  o.set(JobOptions::batch, "8");
  return o;
}

TEST(JobOptions, StartEpochAndStepResumeTheStep) {
  JobOptions o = basic();
  EXPECT_EQ(o.start_step_in(10, 3), 0u);
  o.set(JobOptions::start_epoch, "1");
  o.set(JobOptions::start_step, "3");
  EXPECT_EQ(o.start_step_in(10, 3), 13u);
  EXPECT_THROW(o.set(JobOptions::start_step, "-1"), ConfigError);
  o.set(JobOptions::start_epoch, "3");
  try {
    o.start_step_in(10, 3);
    FAIL() << "a start beyond the plan was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--solar-start-epoch");
    EXPECT_NE(std::string(e.what()).find("the plan has 30 steps: 3 epochs of 10"),
              std::string::npos)
        << e.what();
  }
  JobOptions only;  // a start alone does not turn solar on
  only.set(JobOptions::start_step, "5");
  EXPECT_FALSE(only.active());
  JobOptions env;  // SOLAR_START_* from the environment, outside a solar step
  std::map<std::string, std::string> vars = {{"SOLAR_DATASET", "/d.h5"},
                                             {"SOLAR_START_STEP", "7"}};
  env.add_environment([&](const char* n) {
    const auto it = vars.find(n);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
  EXPECT_EQ(env.start_step_in(10, 3), 7u);
}

TEST(PluginConfig, DefaultsAndKeys) {
  const PluginConfig d = PluginConfig::parse({});
  EXPECT_EQ(d.on_error, OnError::fallback);
  EXPECT_FALSE(d.max_buffer);
  EXPECT_FALSE(d.zero_copy);
  const PluginConfig c = PluginConfig::parse({"agent=/opt/solar/bin/solar-agent",
                                              "plan_dir=/lus/plans/", "runtime_dir=/run/s",
                                              "max_buffer=50%", "provider=tcp", "on_error=fail",
                                              "timeout=5", "zero_copy=yes"});
  EXPECT_EQ(c.agent, "/opt/solar/bin/solar-agent");
  EXPECT_EQ(c.plan_dir, "/lus/plans");
  EXPECT_EQ(c.runtime_dir, "/run/s");
  ASSERT_TRUE(c.max_buffer);
  EXPECT_DOUBLE_EQ(c.max_buffer->percent, 50);
  EXPECT_EQ(c.provider, "tcp");
  EXPECT_EQ(c.on_error, OnError::fail);
  EXPECT_EQ(c.timeout_s, 5);
  EXPECT_TRUE(c.zero_copy);
  EXPECT_FALSE(PluginConfig::parse({"zero_copy=no"}).zero_copy);
}

// Installed anywhere, the plugin finds the programs where the install put them beside it; an
// argument still wins.
TEST(PluginConfig, DefaultsLieRelativeToThePluginFile) {
  const PluginConfig at_build_prefix = PluginConfig::parse({});
  EXPECT_EQ(at_build_prefix.agent, SOLAR_SPANK_DEFAULT_AGENT);
  // The install tree unpacked under /opt/x (a staging root, say).
  const PluginConfig moved =
      PluginConfig::parse({}, "/opt/x" SOLAR_SPANK_INSTALL_DIR "/solar_spank.so");
  EXPECT_EQ(moved.agent, "/opt/x" + std::string(SOLAR_SPANK_DEFAULT_AGENT));
  EXPECT_EQ(moved.solar, "/opt/x" + std::string(SOLAR_SPANK_DEFAULT_SOLAR));
  EXPECT_EQ(moved.preload, "/opt/x" + std::string(SOLAR_SPANK_DEFAULT_PRELOAD));
  EXPECT_EQ(PluginConfig::parse({"agent=/a/solar-agent"}, "/opt/x/lib/solar_spank.so").agent,
            "/a/solar-agent");
}

TEST(PluginConfig, RejectsUnknownAndBad) {
  for (const char* bad : {"colour=blue", "agent", "agent=relative/path", "on_error=maybe",
                          "max_buffer=lots", "timeout=0", "zero_copy=maybe"})
    EXPECT_THROW(PluginConfig::parse({bad}), ConfigError) << bad;
  try {
    PluginConfig::parse({"colour=blue"});
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "colour");
  }
}

TEST(JobOptions, SyntaxCheckedAtOnce) {
  JobOptions o;
  EXPECT_THROW(o.set(JobOptions::buffer, "lots"), ConfigError);
  EXPECT_THROW(o.set(JobOptions::epochs, "0"), ConfigError);
  EXPECT_THROW(o.set(JobOptions::batch, "-1"), ConfigError);
  EXPECT_THROW(o.set(JobOptions::order, "random"), ConfigError);
  EXPECT_THROW(o.set(JobOptions::enable, "maybe"), ConfigError);
  try {
    o.set(JobOptions::buffer, "lots");
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--solar-buffer");
  }
  EXPECT_FALSE(o.active());
}

TEST(JobOptions, EnvironmentFillsWhatTheCommandLineLeaves) {
  JobOptions o;
  o.set(JobOptions::batch, "8");
  std::map<std::string, std::string> env{{"SOLAR_DATASET", "/d.h5"}, {"SOLAR_BATCH", "99"},
                                         {"SOLAR_EPOCHS", "2"}, {"SOLAR_BUFFER", "1G"}};
  o.add_environment([&](const char* n) { return env.count(n) ? env[n].c_str() : nullptr; });
  EXPECT_EQ(*o.value[JobOptions::batch], "8");
  EXPECT_EQ(*o.value[JobOptions::dataset], "/d.h5");
  EXPECT_TRUE(o.active());
  EXPECT_NO_THROW(o.validate());

  env["SOLAR_EPOCHS"] = "many";
  JobOptions bad;
  try {
    bad.add_environment([&](const char* n) { return env.count(n) ? env[n].c_str() : nullptr; });
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "SOLAR_EPOCHS");
  }
}

TEST(JobOptions, InsideASolarStepTheVariablesAreNotSettings) {
  std::map<std::string, std::string> env{{"SOLAR_DATASET", "/d.h5"}, {"SOLAR_STEP", "7.0"}};
  JobOptions o;
  o.add_environment([&](const char* n) { return env.count(n) ? env[n].c_str() : nullptr; });
  EXPECT_FALSE(o.active());
}

TEST(JobOptions, OffWins) {
  JobOptions o = basic();
  o.set(JobOptions::enable, "off");
  EXPECT_FALSE(o.active());
}

TEST(JobOptions, RequiredOptionsNamed) {
  JobOptions o;
  o.set(JobOptions::dataset, "/d.h5");
  try {
    o.validate();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--solar-buffer");
  }
  JobOptions p;
  p.set(JobOptions::epochs, "3");
  try {
    p.validate();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--solar-dataset");
  }
}

TEST(StepPlan, SameBudgetRuleAsSolarRun) {
  const PluginConfig pc;
  const PlanConfig c = plan_config_for_step(basic(), pc, tiny(), 2, 2, 1ULL << 30);
  EXPECT_EQ(c.nodes, 2u);
  EXPECT_EQ(c.ranks_per_node, 2u);
  EXPECT_EQ(c.samples, 256u);
  EXPECT_EQ(c.policy, Policy::solar);
  // 50% of 256 slots of (4096 + 4 -> 4160) bytes, minus two staging steps of 2 ranks x 8 and
  // the look-ahead step (kAgentLookaheadSteps: reads a step ahead of the copies).
  EXPECT_EQ(c.buffer_bytes, (128u - (2u + kAgentLookaheadSteps) * 16u) * 4096u);
}

// Transparent over filtered chunks (issue 36): the plan counts slots of the longest chunk as
// stored, as `solar run --transparent` and the agent do; the batch modes, the decoded samples.
TEST(StepPlan, TransparentOverGzipChunksCountsTheirStoredBytes) {
  const PluginConfig pc;
  DatasetShape d = tiny();
  d.stored_sample_bytes = 1000;
  JobOptions o = basic();
  o.set(JobOptions::transparent, "");
  const PlanConfig t = plan_config_for_step(o, pc, d, 1, 2, 1ULL << 30);
  EXPECT_EQ(t.sample_bytes, 1000u);
  const PlanConfig b = plan_config_for_step(basic(), pc, d, 1, 2, 1ULL << 30);
  EXPECT_EQ(b.sample_bytes, 4096u);
  const auto parsed = DatasetShape::parse(
      R"({"samples":48,"sample_bytes":4096,"stored_sample_bytes":1203,"label_bytes":4,)"
      R"("identity":"i"})");
  EXPECT_EQ(parsed.stored_sample_bytes, 1203u);
}

// Samples of differing sizes as stored (whole files, gzip chunks): dataset-info lists each
// one's bytes, and the transparent plan counts them, as `solar run --transparent` does.
TEST(StepPlan, TransparentOverSamplesOfDifferingSizesPlansByBytes) {
  const PluginConfig pc;
  DatasetShape d = tiny();  // 256 samples
  d.stored_sample_bytes = 3000;
  for (std::uint64_t i = 0; i < d.samples; ++i) d.stored_sizes.push_back(1000 + 8 * i % 2000);
  std::uint64_t total = 0;
  for (std::uint64_t v : d.stored_sizes) total += (v + 63) / 64 * 64;
  JobOptions o = basic();  // --solar-buffer 50%
  o.set(JobOptions::transparent, "");
  const PlanConfig t = plan_config_for_step(o, pc, d, 1, 2, 1ULL << 30);
  ASSERT_TRUE(t.sized());
  EXPECT_EQ(t.policy, Policy::sampler);
  EXPECT_EQ(t.buffer_bytes, total / 2 - sized_staging_bytes(t));
  // Shared between nodes: slots of the largest, as before (agents share one slot size only).
  o.set(JobOptions::peers, "");
  const PlanConfig p = plan_config_for_step(o, pc, d, 2, 2, 1ULL << 30);
  EXPECT_FALSE(p.sized());
  EXPECT_EQ(p.sample_bytes, 3000u);
  const auto parsed = DatasetShape::parse(
      R"({"samples":3,"sample_bytes":90,"stored_sample_bytes":90,"label_bytes":0,)"
      R"("whole_files":true,"stored_sizes":[10,90,40],"identity":"i"})");
  EXPECT_EQ(parsed.stored_sizes, (std::vector<std::uint64_t>{10, 90, 40}));
  // Batch mode over whole files: planned by bytes as well (libsolar hands each sample's
  // length; the agents serve them zero copy), policy solar; not shared between nodes.
  JobOptions b = basic();
  d.whole_files = true;
  const PlanConfig w = plan_config_for_step(b, pc, d, 2, 2, 1ULL << 30);
  ASSERT_TRUE(w.sized());
  EXPECT_EQ(w.policy, Policy::solar);
  b.set(JobOptions::peers, "");
  try {
    plan_config_for_step(b, pc, d, 2, 2, 1ULL << 30);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--solar-peers");
  }
  for (const char* bad : {R"("stored_sizes":[10,90])", R"("stored_sizes":[10,0,4])",
                          R"("stored_sizes":[10,-1,4])", R"("stored_sizes":"x")"})
    EXPECT_THROW(DatasetShape::parse(std::string(R"({"samples":3,"sample_bytes":90,)") + bad +
                                     R"(,"label_bytes":0,"identity":"i"})"),
                 ConfigError)
        << bad;
}

TEST(StepPlan, ErrorsNameTheSrunOption) {
  const PluginConfig pc;
  JobOptions o = basic();
  o.set(JobOptions::batch, "1000");
  try {
    plan_config_for_step(o, pc, tiny(), 1, 1, 1ULL << 30);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--solar-batch");
  }
  o = basic();
  o.set(JobOptions::buffer, "1K");
  try {
    plan_config_for_step(o, pc, tiny(), 1, 1, 1ULL << 30);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--solar-buffer");
    EXPECT_NE(std::string(e.what()).find("at least"), std::string::npos);
  }
}

// --solar-order-file (issue 38): the step's plan follows the script's own order; a bad file or
// one given with --solar-order is named as the srun option.
TEST(StepPlan, OrderFileIsTheStepsOrder) {
  const PluginConfig pc;
  char dir[] = "/tmp/solar-order-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/order.txt";
  {
    std::ofstream f(path);
    for (int e = 0; e < 3; ++e)
      for (int i = 0; i < 256; ++i) f << (i * 5 + e) % 256 << "\n";
  }
  JobOptions o = basic();
  o.set(JobOptions::order_file, path);
  const PlanConfig c = plan_config_for_step(o, pc, tiny(), 2, 2, 1ULL << 30);
  EXPECT_EQ(c.order, OrderMode::file);
  ASSERT_TRUE(c.order_list);
  EXPECT_EQ(c.order_list->size(), 3u * 256u);
  EXPECT_EQ((*c.order_list)[256 + 1], 6u);
  o.set(JobOptions::order, "torch");
  try {
    plan_config_for_step(o, pc, tiny(), 2, 2, 1ULL << 30);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--solar-order-file");
  }
  JobOptions bad = basic();
  bad.set(JobOptions::order_file, std::string(dir) + "/missing.npy");
  try {
    plan_config_for_step(bad, pc, tiny(), 2, 2, 1ULL << 30);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--solar-order-file");
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

// --solar-order unknown (issue 38): an unmodified script of its own order; the plan lays the
// buffer out in DistributedSampler's order and the agents keep what the ranks read. Only with
// --solar-transparent, and not with a local tier yet.
TEST(StepPlan, OrderUnknownIsForTransparentScripts) {
  JobOptions o = basic();
  o.set(JobOptions::order, "unknown");
  EXPECT_TRUE(o.order_unknown());
  try {
    plan_config_for_step(o, PluginConfig{}, tiny(), 2, 2, 1ULL << 30);
    ADD_FAILURE() << "unknown without --solar-transparent: refused";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--solar-order");
    EXPECT_NE(std::string(e.what()).find("--solar-transparent"), std::string::npos) << e.what();
  }
  o.set(JobOptions::transparent, "");
  o.set(JobOptions::peers, "");
  const PlanConfig c = plan_config_for_step(o, PluginConfig{}, tiny(), 2, 2, 1ULL << 30);
  EXPECT_EQ(c.order, OrderMode::torch);
  EXPECT_TRUE(c.peer_fetch);
  o.set(JobOptions::local_buffer, "40%");
  try {
    plan_config_for_step(o, PluginConfig::parse({"local_dir=/local/nvme"}), tiny(), 1, 2,
                         1ULL << 30);
    ADD_FAILURE() << "unknown with a local tier: refused";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--solar-order");
  }
  JobOptions bad;
  EXPECT_THROW(bad.set(JobOptions::order, "random"), ConfigError);
}

TEST(StepPlan, SiteLimitClamps) {
  PluginConfig pc = PluginConfig::parse({"max_buffer=400K"});
  std::string note;
  JobOptions o = basic();
  o.set(JobOptions::buffer, "1G");
  const PlanConfig c = plan_config_for_step(o, pc, tiny(), 1, 2, 1ULL << 30, &note);
  EXPECT_LE(c.buffer_bytes, 400u * 1024u);
  EXPECT_NE(note.find("limit"), std::string::npos);
  pc = PluginConfig::parse({"max_buffer=0.01%"});  // of 1 GiB: ~107 KB, too small
  EXPECT_THROW(plan_config_for_step(o, pc, tiny(), 1, 2, 1ULL << 30), ConfigError);
}

// --solar-local-buffer (issue 37): the site's local_dir= is needed, max_local_buffer= clamps
// (bytes only), the batch mode only, and the plan keeps both tiers resident.
TEST(StepPlan, LocalTierNeedsTheSitesLocalDirAndItsLimit) {
  JobOptions o = basic();
  o.set(JobOptions::local_buffer, "40%");
  try {
    plan_config_for_step(o, PluginConfig{}, tiny(), 2, 2, 1ULL << 30);
    ADD_FAILURE() << "no local_dir=: refused";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.flag(), "--solar-local-buffer");
    EXPECT_NE(std::string(e.what()).find("local_dir="), std::string::npos) << e.what();
  }
  PluginConfig pc = PluginConfig::parse({"local_dir=/local/nvme"});
  const PlanConfig c = plan_config_for_step(o, pc, tiny(), 2, 2, 1ULL << 30);
  EXPECT_TRUE(c.tiered());
  EXPECT_NEAR(static_cast<double>(c.local_samples()), 0.4 * 256, 1.0);  // 40% of the slots
  pc = PluginConfig::parse({"local_dir=/local/nvme", "max_local_buffer=100K"});
  std::string note;
  const PlanConfig clamped = plan_config_for_step(o, pc, tiny(), 2, 2, 1ULL << 30, &note);
  EXPECT_EQ(clamped.local_bytes, 100u * 1024u);
  EXPECT_NE(note.find("--solar-local-buffer"), std::string::npos) << note;
  EXPECT_THROW(PluginConfig::parse({"max_local_buffer=10%"}), ConfigError);
  EXPECT_THROW(PluginConfig::parse({"local_dir=nvme"}), ConfigError);  // not absolute
  JobOptions t = o;
  t.set(JobOptions::peers, "1");
  try {
    plan_config_for_step(t, PluginConfig::parse({"local_dir=/l"}), tiny(), 2, 2, 1ULL << 30);
    ADD_FAILURE() << "peers with a local tier: refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--solar-peers"), std::string::npos) << e.what();
  }
  t = o;  // the transparent mode keeps the tier too
  t.set(JobOptions::transparent, "1");
  EXPECT_TRUE(
      plan_config_for_step(t, PluginConfig::parse({"local_dir=/l"}), tiny(), 2, 2, 1ULL << 30)
          .tiered());
  EXPECT_THROW(o.set(JobOptions::local_buffer, "lots"), ConfigError);
}

TEST(Paths, PerJobStepAndNode) {
  const PluginConfig pc = PluginConfig::parse({"plan_dir=/p", "runtime_dir=/r", "local_dir=/l/"});
  EXPECT_EQ(step_runtime_dir(pc, 12, 3, 1), "/r/solar-12.3.1");
  EXPECT_EQ(step_local_dir(pc, 12, 3, 1), "/l/solar-12.3.1");
  EXPECT_EQ(job_prefix(12), "solar-12.");
}

}  // namespace
}  // namespace solar::spank

namespace solar::spank {
namespace {

TEST(DatasetShape, ParsesTheSolarToolsReplyAndRejectsGarbage) {
  const auto d = DatasetShape::parse(
      R"({"samples":48,"sample_bytes":262144,"label_bytes":4,"identity":"file inode 1 size 2 )"
      R"(mtime 3.000000004","shape":"4x32x32x32","dtype":"int16","layout":"contiguous"})");
  EXPECT_EQ(d.samples, 48U);
  EXPECT_EQ(d.sample_bytes, 262144U);
  EXPECT_EQ(d.label_bytes, 4U);
  EXPECT_EQ(d.identity, "file inode 1 size 2 mtime 3.000000004");
  // Counts that are not non-negative integers: get<std::uint64_t> of -1.5 or 1e300 was
  // undefined behaviour (fuzz.spank_settings).
  for (const char* bad : {"", "not json", R"({"samples":48})", R"({"samples":"x"})",
                          R"({"samples":-1.5,"sample_bytes":1,"label_bytes":0,"identity":"i"})",
                          R"({"samples":1,"sample_bytes":1e300,"label_bytes":0,"identity":"i"})",
                          R"({"samples":1,"sample_bytes":1,"label_bytes":-4,"identity":"i"})"}) {
    try {
      DatasetShape::parse(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.flag(), "--solar-dataset");
      EXPECT_NE(std::string(e.what()).find("solar dataset-info"), std::string::npos) << e.what();
    }
  }
}

TEST(PluginConfig, SolarToolPathIsAbsolute) {
  EXPECT_EQ(PluginConfig::parse({"solar=/opt/solar/bin/solar"}).solar, "/opt/solar/bin/solar");
  EXPECT_THROW(PluginConfig::parse({"solar=bin/solar"}), ConfigError);
}

}  // namespace
}  // namespace solar::spank

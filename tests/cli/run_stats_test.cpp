// SPDX-License-Identifier: Apache-2.0
// solar run --stats-out's document (cli/run_stats.cpp): the agents' files merged, a reason
// where a node has none; from files alone (no agent, no processes).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "run_stats.h"

namespace solar::cli {
namespace {
namespace fs = std::filesystem;

class RunStats : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "solar-run-stats-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  fs::path dir_;
};

TEST_F(RunStats, EveryNodeIsThereWithItsFileOrWhyItHasNone) {
  write("node0.stats.json", R"({"node": 0, "hits": 7})");
  write("node2.stats.json", "{not json");
  const nlohmann::json doc = run_stats_document(dir_, 3, true);
  EXPECT_EQ(doc["format_version"], 1);
  EXPECT_EQ(doc["source"], "solar run");
  ASSERT_EQ(doc["nodes"].size(), 3U);
  EXPECT_EQ(doc["nodes"][0], nlohmann::json::parse(R"({"node": 0, "hits": 7})"));
  EXPECT_EQ(doc["nodes"][1]["node"], 1);
  EXPECT_EQ(doc["nodes"][1]["missing"], "the agent wrote no statistics (it failed or was killed)");
  EXPECT_EQ(doc["nodes"][2]["node"], 2);
  EXPECT_EQ(doc["nodes"][2]["missing"].get<std::string>().rfind("unreadable statistics: ", 0),
            0U)
      << doc["nodes"][2];
}

TEST_F(RunStats, WithoutAgentsEveryNodeSaysSo) {
  write("node0.stats.json", R"({"node": 0})");  // ignored: no agents ran
  const nlohmann::json doc = run_stats_document(dir_, 2, false);
  ASSERT_EQ(doc["nodes"].size(), 2U);
  for (int m = 0; m < 2; ++m) {
    EXPECT_EQ(doc["nodes"][m]["node"], m);
    EXPECT_EQ(doc["nodes"][m]["missing"], "no agent (--no-agent): ranks read directly");
  }
}

TEST_F(RunStats, WritesTheDocumentOrNamesTheOption) {
  write("node0.stats.json", R"({"node": 0})");
  const std::string out = (dir_ / "run.json").string();
  write_run_stats(out, dir_, 1, true);
  std::ifstream f(out);
  EXPECT_EQ(nlohmann::json::parse(f), run_stats_document(dir_, 1, true));
  try {
    write_run_stats((dir_ / "no-such-folder" / "run.json").string(), dir_, 1, true);
    ADD_FAILURE() << "wrote into a folder that does not exist";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--stats-out ", 0), 0U) << e.what();
  }
}

}  // namespace
}  // namespace solar::cli

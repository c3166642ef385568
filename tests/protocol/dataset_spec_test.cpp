// SPDX-License-Identifier: Apache-2.0
// The dataset-spec parser (protocol/include/solar/dataset_spec.h) against the golden table
// every copy is tested with (dataset_spec_cases.json).
#include "solar/dataset_spec.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

namespace solar::protocol {
namespace {

nlohmann::json cases() {
  std::ifstream f(SOLAR_DATASET_SPEC_CASES);
  return nlohmann::json::parse(f)["cases"];
}

TEST(DatasetSpec, EveryCaseOfTheTable) {
  const nlohmann::json all = cases();
  ASSERT_GT(all.size(), 10U);
  for (const auto& c : all) {
    const std::string spec = c["spec"];
    const DatasetSpec d = parse_dataset_spec(spec);
    if (c.contains("file")) {
      EXPECT_EQ(d.kind, DatasetSpec::Kind::file) << spec;
      EXPECT_EQ(d.where.file, c["file"]) << spec;
      EXPECT_EQ(d.where.dataset, c["dataset"]) << spec;
      EXPECT_EQ(d.list, c.value("list", false)) << spec;
      EXPECT_EQ(d.glob, c.value("glob", false)) << spec;
      EXPECT_EQ(d.rows, c.value("rows", false)) << spec;
      // solar-stored's --export NAME=FILE[:/DATASET] splits the same way (before the @ and
      // the [] come off).
      if (!d.list && !d.rows) {
        EXPECT_EQ(split_file_dataset(spec), d.where) << spec;
      }
    } else if (c.contains("fabric")) {
      EXPECT_EQ(d.kind, DatasetSpec::Kind::fabric) << spec;
    } else if (c["error"] == "unknown_scheme") {
      EXPECT_EQ(d.kind, DatasetSpec::Kind::unknown_scheme) << spec;
    } else {
      ASSERT_EQ(c["error"], "no_file") << spec;
      EXPECT_EQ(d.kind, DatasetSpec::Kind::no_file) << spec;
    }
  }
}

}  // namespace
}  // namespace solar::protocol

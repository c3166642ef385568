// SPDX-License-Identifier: Apache-2.0
// solar report's reading and drawing (cli/report.h) on inputs the fuzzer (fuzz.report) found
// mishandled: each must give a picture or one BadInput naming the file.
#include <gtest/gtest.h>

#include <string>

#include "report.h"

namespace solar::cli {
namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The element of `svg`'s series `name` (its <g> group), or "" where there is none.
std::string series_group(const std::string& svg, const std::string& name) {
  const auto at = svg.find("data-series=\"" + name + "\"");
  if (at == std::string::npos) return "";
  return svg.substr(at, svg.find("</g>", at) - at);
}

std::string bad_input(const std::string& text) {
  try {
    report_svg({{"in.json", text}}, "t");
  } catch (const BadInput& e) {
    return e.what();
  }
  return "no BadInput";
}

TEST(Report, NumberTooLargeForADoubleIsBadInput) {
  // json::parse throws out_of_range (not parse_error) for it: it escaped as a plain failure,
  // exit 1, without the file's name.
  const std::string why = bad_input(R"({"epochs": [{"hits": 0.00552E0964}]})");
  EXPECT_NE(why.find("in.json: not JSON"), std::string::npos) << why;
}

TEST(Report, ExtremeValuesAreDrawnInBoundedTime) {
  // 1.7e308 rounded the axis up to infinity and 5e-324 gave a zero tick step: endless ticks.
  for (const char* v : {"1.7e308", "1.7976931348623157e308", "5e-324", "1e-310"}) {
    const std::string stats =
        std::string(R"({"epochs": [{"hits": 1, "fetched_samples": 1, "stall_max_rank_seconds": )") +
        v + "}]}";
    const Report r = report_svg({{"in.json", stats}}, "t");
    EXPECT_EQ(r.panels, 2u) << v;
    const std::string bench = std::string(R"({"modes": {"baseline": {"per_epoch_s": [)") + v +
                              R"(, 1]}, "solar": {"per_epoch_s": [1, 2], "limit": 1e-300}}})";
    EXPECT_EQ(report_svg({{"in.json", bench}}, "t").panels, 1u) << v;
    const std::string sweep =
        std::string(R"({"points": [{"label": "a", "speedup": )") + v + R"(, "limit": 2}]})";
    EXPECT_EQ(report_svg({{"in.json", sweep}}, "t").panels, 1u) << v;
  }
}

TEST(Report, ValidInputsGiveTheirPanels) {
  const Report r = report_svg({{"a.json", R"({"nodes": [{"node": 0, "epochs": [{"hits": 3,
                                 "fetched_samples": 1}]}]})"},
                               {"b.json", R"({"points": [{"label": "x", "speedup": 2}]})"}},
                              "title <&>");
  EXPECT_EQ(r.panels, 2u);
  EXPECT_NE(r.svg.find("title &lt;&amp;&gt;"), std::string::npos);
  EXPECT_NE(r.svg.find("data-value=\"75\""), std::string::npos);
}

// bench/au.py --json: AU against N, one series per loader (missing N: no point), the threshold.
TEST(Report, AcceleratorUtilisationIsDrawnAgainstN) {
  const Report r = report_svg(
      {{"au.json", R"({"kind": "au", "workload": "cosmoflow", "threshold": 0.7,
          "accelerators": [1, 2, 4], "largest": {"baseline": 2, "solar": 4},
          "loaders": {"baseline": {"1": {"au": 0.9}, "2": {"au": 0.75}, "4": {"au": 0.5}},
                      "solar": {"1": {"au": 0.99}, "4": {"au": 0.8}}}})"}},
      "t");
  EXPECT_EQ(r.panels, 1u);
  EXPECT_NE(r.svg.find("Accelerator utilisation, cosmoflow (au.json)"), std::string::npos);
  EXPECT_NE(r.svg.find("PyTorch DataLoader (sustains 2)"), std::string::npos);
  EXPECT_NE(r.svg.find("solar.torch.Loader (sustains 4)"), std::string::npos);
  EXPECT_NE(r.svg.find("MLPerf threshold (70%)"), std::string::npos);
  for (const char* v : {"data-value=\"75\"", "data-value=\"99\"", "data-value=\"80\"",
                        ">4</text>"})
    EXPECT_NE(r.svg.find(v), std::string::npos) << v;
  // solar has no N=2 point: 2 of its 3 values drawn, the DataLoader's 3; the threshold is a
  // reference (no markers, its values on its line).
  EXPECT_EQ(count(r.svg, "class=\"marker\" fill=\"white\" stroke=\"#d62728\" stroke-width=\"1.5\" data-value"), 3u);
  EXPECT_EQ(count(r.svg, "class=\"marker\" fill=\"white\" stroke=\"#1f77b4\" stroke-width=\"1.5\" data-value"), 2u);
  EXPECT_NE(r.svg.find("data-values=\"70 70 70\""), std::string::npos);
  EXPECT_NE(bad_input(R"({"kind": "au", "accelerators": [], "loaders": {}})").find(
                "in.json: an AU result needs"),
            std::string::npos);
}

// Issue 41: two nodes with the same hit rates (one line over the other) stay apart: their own
// dash pattern and marker shape; each legend gives the node's total; the plan's figures draw
// the planned hit rate and the lower bound's best; the default title summarises the run.
TEST(Report, OverlappingLinesStayDistinguishableWithTotalsAndTheLowerBound) {
  const std::string epochs = R"([{"hits": 0, "fetched_samples": 10}, {"hits": 5, "fetched_samples": 5}])";
  const std::string stats = R"({"source": "solar run", "nodes": [{"node": 0, "epochs": )" + epochs +
                            R"(}, {"node": 1, "epochs": )" + epochs +
                            R"(}], "plan": {"accesses": 40, "hits": 10, "hit_rate": 0.25,
                            "lower_bound_fetches": 30, "ratio_to_lower_bound": 1.0,
                            "per_epoch": [{"accesses": 20, "hits": 0}, {"accesses": 20, "hits": 10}]}})";
  const Report r = report_svg({{"s.json", stats}}, "");
  EXPECT_EQ(r.panels, 1u);
  const std::string n0 = series_group(r.svg, "node 0"), n1 = series_group(r.svg, "node 1");
  ASSERT_FALSE(n0.empty());
  ASSERT_FALSE(n1.empty());
  // The same values, drawn differently: a solid line with circles, a dashed one with squares.
  EXPECT_EQ(count(n0, "data-value=\"0\""), 1u);
  EXPECT_EQ(count(n1, "data-value=\"50\""), 1u);
  EXPECT_EQ(count(n0, "<circle"), 2u);
  EXPECT_EQ(count(n1, "<rect"), 2u);
  EXPECT_EQ(n0.find("stroke-dasharray"), std::string::npos);
  EXPECT_NE(n1.find("stroke-dasharray=\"9,4\""), std::string::npos);
  // Totals: 5 hits of 20 per node, 10 of 40 in all.
  EXPECT_EQ(count(r.svg, "(25.0% in all)"), 3u);  // node 0, node 1, the plan
  EXPECT_NE(r.svg.find("Hit rate per epoch (s.json): 25.0% over all nodes"), std::string::npos);
  EXPECT_NE(series_group(r.svg, "planned (all nodes)").find("data-values=\"0 50\""),
            std::string::npos);
  // 30 of 40 accesses must come from storage: at best 25% hits.
  const std::string lb = series_group(r.svg, "lower bound's best");
  EXPECT_NE(lb.find("data-values=\"25 25\""), std::string::npos) << lb;
  EXPECT_NE(r.svg.find("(25.0% in all, at best)"), std::string::npos);
  EXPECT_NE(r.svg.find(">solar run: 2 nodes, 2 epochs, hit rate 25.0%, plan 1.000x the lower "
                       "bound</text>"),
            std::string::npos);
  // A title given is used as it is.
  EXPECT_NE(report_svg({{"s.json", stats}}, "mine").svg.find(">mine</text>"), std::string::npos);
}

TEST(Report, ALocalTierCountsAsTheBufferAndGetsItsOwnPanel) {
  // Node 0 read 6 of its second epoch's 10 samples back from the local disk and 2 from memory;
  // node 1 has no tier. The hit rate counts both tiers (as the plan does), the tier's panel
  // the disk's share.
  const std::string stats = R"({"source": "solar run", "nodes": [
      {"node": 0, "epochs": [{"hits": 0, "fetched_samples": 10, "local_samples": 0},
                             {"hits": 2, "fetched_samples": 2, "local_samples": 6}]},
      {"node": 1, "epochs": [{"hits": 0, "fetched_samples": 10},
                             {"hits": 5, "fetched_samples": 5}]}]})";
  const Report r = report_svg({{"s.json", stats}}, "");
  EXPECT_EQ(r.panels, 2u);
  EXPECT_NE(r.svg.find("data-title=\"Local tier per epoch (s.json)\""), std::string::npos);
  EXPECT_NE(r.svg.find("Hit rate per epoch (s.json): 32.5% over all nodes"), std::string::npos);
  EXPECT_NE(r.svg.find("(40.0% in all)"), std::string::npos);  // node 0's hits: 8 of 20
  EXPECT_NE(r.svg.find("(30.0% in all)"), std::string::npos);  // node 0's tier: 6 of 20
  EXPECT_NE(r.svg.find(">solar run: 2 nodes, 2 epochs, hit rate 32.5%</text>"),
            std::string::npos);
  // Without a tier (or with one that read nothing back) there is no such panel.
  const Report none = report_svg({{"s.json", R"({"nodes": [{"node": 0, "epochs": [
      {"hits": 1, "fetched_samples": 1, "local_samples": 0}]}]})"}}, "");
  EXPECT_EQ(none.panels, 1u);
  EXPECT_EQ(none.svg.find("Local tier"), std::string::npos);
}

TEST(Report, DefaultTitleNamesEachInputsHeadline) {
  const Report r = report_svg(
      {{"b.json", R"({"modes": {"baseline": {"per_epoch_s": [1, 1]},
                      "solar": {"per_epoch_s": [1, 0.5], "speedup": 1.33, "limit": 1.5}}})"},
       {"a.json", R"({"kind": "au", "workload": "unet3d", "accelerators": [1],
                      "largest": {"baseline": 1}, "loaders": {"baseline": {"1": {"au": 0.9}}}})"}},
      "");
  EXPECT_NE(r.svg.find(">solar 1.33x the PyTorch DataLoader (the storage allows 1.50x); MLPerf "
                       "Storage AU, unet3d: PyTorch DataLoader sustains 1</text>"),
            std::string::npos);
  EXPECT_NE(r.svg.find("PyTorch DataLoader (2.00 s in all)"), std::string::npos);
  EXPECT_NE(r.svg.find("(1.50 s in all)"), std::string::npos);
}

}  // namespace
}  // namespace solar::cli

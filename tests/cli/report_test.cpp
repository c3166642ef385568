// solar report's reading and drawing (cli/report.h) on inputs the fuzzer (fuzz.report) found
// mishandled: each must give a picture or one BadInput naming the file.
#include <gtest/gtest.h>

#include <string>

#include "report.h"

namespace solar::cli {
namespace {

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

}  // namespace
}  // namespace solar::cli

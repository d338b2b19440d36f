// Report rendering: every chart and page is parsed by an independent XML parser (expat), text with
// markup characters survives escaping exactly, marks are placed monotonically in their values, tick
// labels are readable and distinct, and bad data is an error naming the series while empty data is
// a "no data" chart.
#include <expat.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "hanpu/tensor.hpp"
#include "report/html_report.hpp"
#include "report/svg_chart.hpp"
#include "test_support.hpp"
#include "xml_testing.hpp"

namespace hanpu::report {
namespace {

using hanpu::testing::error_of;

BarChartSpec sample_bars() {
  BarChartSpec s;
  s.title = "latency <T & H>";
  s.x_label = "T";
  s.y = {"latency (ms)", false, NumberFormat::kSi};
  s.categories = {"512", "1K", "2K", "4K"};
  s.series = {{"fla", {1, 2, 4, 8}}, {"hanpu <best> & co", {0.5, 1, 2, 3}}};
  return s;
}

TEST(Chart, GroupedBarsAreWellFormedAndEscaped) {
  const std::string svg = grouped_bar_chart(sample_bars());
  const Parsed p = parse_ok(svg);
  ASSERT_FALSE(p.elements.empty());
  EXPECT_EQ(p.elements[0].name, "svg");
  EXPECT_TRUE(has_text(p, "latency <T & H>"));      // the title, exactly, after unescaping
  EXPECT_TRUE(has_text(p, "hanpu <best> & co"));    // the legend label
  EXPECT_EQ(svg.find("<best>"), std::string::npos);  // never raw in the markup
  EXPECT_EQ(p.with_class("bar").size(), 8u);
  EXPECT_EQ(p.with_class("category").size(), 4u);
}

TEST(Chart, BarHeightsFollowValues) {
  const Parsed p = parse_ok(grouped_bar_chart(sample_bars()));
  const auto bars = p.with_class("bar");
  ASSERT_EQ(bars.size(), 8u);
  // Linear axis from 0: height / value is the same for every bar, and all share a baseline.
  const double ratio = bars[0]->num("height") / bars[0]->num("data-value");
  const double baseline = bars[0]->num("y") + bars[0]->num("height");
  for (const Element* b : bars) {
    EXPECT_NEAR(b->num("height"), ratio * b->num("data-value"), 0.02);
    EXPECT_NEAR(b->num("y") + b->num("height"), baseline, 0.02);
  }
  // Categories left to right, series side by side inside a category.
  for (size_t i = 1; i < bars.size(); ++i) EXPECT_GT(bars[i]->num("x"), bars[i - 1]->num("x"));
}

TEST(Chart, LogAxisSpacesDecadesEqually) {
  BarChartSpec s;
  s.title = "log";
  s.y = {"bytes", true, NumberFormat::kSi};
  s.categories = {"a", "b", "c", "d", "e"};
  s.series = {{"s", {1, 10, 100, 1000, 0}}};
  const Parsed p = parse_ok(grouped_bar_chart(s));
  const auto bars = p.with_class("bar");
  ASSERT_EQ(bars.size(), 4u);  // the zero has no bar on a log axis
  const double d1 = bars[1]->num("height") - bars[0]->num("height");
  const double d2 = bars[2]->num("height") - bars[1]->num("height");
  const double d3 = bars[3]->num("height") - bars[2]->num("height");
  EXPECT_GT(d1, 1);
  EXPECT_NEAR(d1, d2, 0.05);
  EXPECT_NEAR(d2, d3, 0.05);
  // Ticks are powers of ten.
  for (const Element* t : p.with_class("ytick")) {
    const double v = t->num("data-value");
    EXPECT_NEAR(std::log10(v), std::round(std::log10(v)), 1e-9) << v;
  }
}

TEST(Chart, StackedSegmentsAreContiguous) {
  BarChartSpec s = sample_bars();
  s.series.push_back({"third", {0, 1, 0, 2}});
  const Parsed p = parse_ok(stacked_bar_chart(s));
  const auto bars = p.with_class("bar");
  ASSERT_EQ(bars.size(), 12u);  // categories x series, zero-height segments included
  for (size_t c = 0; c < 4; ++c) {
    double total = 0;
    for (size_t k = 0; k < 3; ++k) {
      const Element* seg = bars[c * 3 + k];
      total += seg->num("height");
      if (k > 0) {
        const Element* below = bars[c * 3 + k - 1];
        EXPECT_NEAR(seg->num("y") + seg->num("height"), below->num("y"), 0.02);
      }
    }
    const double value_total = s.series[0].values[c] + s.series[1].values[c] + s.series[2].values[c];
    const double h0 = bars[0]->num("height");
    const double ratio = h0 / bars[0]->num("data-value");
    // Coordinates are printed to 0.01 px: each of the 3 heights is off by <= 0.005, and the ratio
    // taken from one rounded height is off by <= 0.005 / h0 relative.
    const double tolerance = 3 * 0.005 + ratio * value_total * 0.005 / h0 + 1e-9;
    EXPECT_NEAR(total, ratio * value_total, tolerance);
  }
  EXPECT_NE(error_of([&] {
              BarChartSpec l = s;
              l.y.log = true;
              stacked_bar_chart(l);
            }).find("log y axis"),
            std::string::npos);
}

TEST(Chart, TicksAreMonotonicDistinctAndReadable) {
  BarChartSpec s;
  s.title = "ticks";
  s.categories = {"a", "b"};
  s.series = {{"s", {1000, 1010}}};
  s.y.format = NumberFormat::kSi;
  // A narrow range far from zero (as a line chart would show it) still gets distinct labels.
  LineChartSpec l;
  l.title = "narrow";
  l.y = {"v", false, NumberFormat::kSi};
  l.series = {{"s", {1, 2, 3}, {-1003, -1001, -1009}}};  // negative: the axis does not start at 0
  for (const std::string& svg : {grouped_bar_chart(s), line_chart(l)}) {
    const Parsed p = parse_ok(svg);
    const auto ticks = p.with_class("ytick");
    ASSERT_GE(ticks.size(), 3u);
    std::set<std::string> labels;
    for (size_t i = 0; i < ticks.size(); ++i) {
      labels.insert(ticks[i]->text);
      if (i > 0) {
        EXPECT_GT(ticks[i]->num("data-value"), ticks[i - 1]->num("data-value"));
        EXPECT_LT(ticks[i]->num("y"), ticks[i - 1]->num("y"));  // larger values higher up
      }
    }
    EXPECT_EQ(labels.size(), ticks.size()) << svg;
  }
  EXPECT_EQ(format_number(1500), "1.5k");
  EXPECT_EQ(format_number(0.25), "0.25");
  EXPECT_EQ(format_number(2e6), "2M");
  EXPECT_EQ(format_number(65536, NumberFormat::kBytes), "64 KiB");
  EXPECT_EQ(format_number(1.5 * 1048576, NumberFormat::kBytes), "1.5 MiB");
  EXPECT_EQ(format_number(65536, NumberFormat::kCount2), "64K");
  EXPECT_EQ(format_number(1536, NumberFormat::kCount2), "1.5K");
  EXPECT_EQ(format_number(512, NumberFormat::kCount2), "512");
  EXPECT_EQ(format_number(1000 * 1048576.0, NumberFormat::kBytes), "1000 MiB");  // not "1e+03 MiB"
  EXPECT_EQ(format_number(999999), "1000k");
  EXPECT_EQ(format_number(NAN), "NaN");
}

TEST(Chart, LineChartLog2XPlacesPowersOfTwoEvenly) {
  LineChartSpec s;
  s.title = "peak memory vs T";
  s.x = {"T (tokens)", true, NumberFormat::kCount2};
  s.y = {"peak GM", true, NumberFormat::kBytes};
  // Unsorted input: the line is drawn in increasing x.
  s.series = {{"fla", {4096, 512, 65536, 1024}, {4e7, 5e6, 6.4e8, 1e7}}, {"hanpu", {512, 65536}, {1e6, 1.3e8}}};
  const Parsed p = parse_ok(line_chart(s));
  const auto lines = p.with_class("line");
  ASSERT_EQ(lines.size(), 2u);
  std::vector<double> xs;
  std::istringstream pts(lines[0]->attrs.at("points"));
  std::string pt;
  while (pts >> pt) xs.push_back(std::stod(pt.substr(0, pt.find(','))));
  ASSERT_EQ(xs.size(), 4u);
  for (size_t i = 1; i < xs.size(); ++i) EXPECT_GT(xs[i], xs[i - 1]);
  // 512 -> 1024 is one octave, 1024 -> 4096 two: equal spacing per octave.
  EXPECT_NEAR(xs[2] - xs[1], 2 * (xs[1] - xs[0]), 0.05);
  // x ticks are powers of two with K labels; y ticks binary units.
  std::vector<std::string> xl;
  for (const Element* t : p.with_class("xtick")) xl.push_back(t->text);
  EXPECT_NE(std::find(xl.begin(), xl.end(), "1K"), xl.end());
  EXPECT_NE(std::find(xl.begin(), xl.end(), "64K"), xl.end());
  bool mib = false;
  for (const Element* t : p.with_class("ytick")) mib = mib || t->text.find("MiB") != std::string::npos;
  EXPECT_TRUE(mib);
  EXPECT_EQ(p.with_class("point").size(), 6u);
}

TEST(Chart, TimelinePlacesIntervalsInTime) {
  TimelineSpec s;
  s.title = "core timeline";
  s.x = {"time (us)"};
  s.lanes = {{"core 0 matrix", {{0, 10, "#1 kkt", "A<0>"}, {12, 30, "#4 h&o", "o"}}},
             {"core 0 MTE2", {{0, 5, "load", ""}, {5, 5, "load", "instant"}}},
             {"core 1 vector", {}}};
  const Parsed p = parse_ok(timeline_chart(s));
  const auto iv = p.with_class("interval");
  ASSERT_EQ(iv.size(), 4u);
  const double per_us = (iv[1]->num("x") - iv[0]->num("x")) / 12.0;
  EXPECT_GT(per_us, 0);
  EXPECT_NEAR(iv[0]->num("width"), 10 * per_us, 0.05);
  EXPECT_NEAR(iv[1]->num("width"), 18 * per_us, 0.05);
  EXPECT_GT(iv[3]->num("width"), 0);  // zero-length: still visible
  EXPECT_GT(iv[2]->num("y"), iv[0]->num("y"));  // second lane below the first
  EXPECT_TRUE(has_text(p, "#4 h&o"));       // legend by group, escaped correctly
  EXPECT_EQ(p.with_class("lane-label").size(), 3u);
  EXPECT_EQ(iv[0]->attrs.at("fill"), ColorMap::palette(0));
  EXPECT_EQ(iv[2]->attrs.at("fill"), ColorMap::palette(2));
}

TEST(Chart, BadDataIsAnErrorNamingTheSeries) {
  BarChartSpec b = sample_bars();
  b.series[0].values[2] = NAN;
  std::string e = error_of([&] { grouped_bar_chart(b); });
  EXPECT_NE(e.find("chart \"latency <T & H>\""), std::string::npos) << e;
  EXPECT_NE(e.find("series \"fla\" value 2 (category \"2K\") is NaN"), std::string::npos) << e;

  b = sample_bars();
  b.series[1].values.pop_back();
  e = error_of([&] { grouped_bar_chart(b); });
  EXPECT_NE(e.find("has 3 values, expected 4"), std::string::npos) << e;

  b = sample_bars();
  b.y.log = true;
  b.series[0].values[0] = -1;
  e = error_of([&] { grouped_bar_chart(b); });
  EXPECT_NE(e.find("expected >= 0 on a log axis"), std::string::npos) << e;

  b = sample_bars();
  b.series[0].values[0] = INFINITY;
  e = error_of([&] { stacked_bar_chart(b); });
  EXPECT_NE(e.find("is infinite"), std::string::npos) << e;

  LineChartSpec l;
  l.title = "l";
  l.series = {{"s", {1, 2}, {1}}};
  e = error_of([&] { line_chart(l); });
  EXPECT_NE(e.find("2 x values and 1 y values"), std::string::npos) << e;
  l.series = {{"s", {0, 2}, {1, 2}}};
  l.x.log = true;
  e = error_of([&] { line_chart(l); });
  EXPECT_NE(e.find("series \"s\" point 0 x is 0, expected > 0 on a log axis"), std::string::npos) << e;

  TimelineSpec t;
  t.title = "t";
  t.lanes = {{"lane", {{5, 3, "g", "backwards"}}}};
  e = error_of([&] { timeline_chart(t); });
  EXPECT_NE(e.find("lane \"lane\" interval 0 (\"backwards\") ends at 3 before its start 5"), std::string::npos) << e;

  b = sample_bars();
  b.width = 10;
  EXPECT_NE(error_of([&] { grouped_bar_chart(b); }).find("width 10"), std::string::npos);
}

TEST(Chart, EmptyDataSaysNoData) {
  BarChartSpec b;
  b.title = "empty";
  LineChartSpec l;
  l.title = "empty";
  l.series = {{"s", {}, {}}};
  TimelineSpec t;
  t.title = "empty";
  t.lanes = {{"core 0", {}}};
  BarChartSpec zeros = sample_bars();
  zeros.y.log = true;
  for (double& v : zeros.series[0].values) v = 0;
  for (double& v : zeros.series[1].values) v = 0;
  for (const std::string& svg : {grouped_bar_chart(b), stacked_bar_chart(b), line_chart(l), timeline_chart(t),
                                 grouped_bar_chart(zeros)}) {
    const Parsed p = parse_ok(svg);
    EXPECT_TRUE(has_text(p, "no data")) << svg;
    EXPECT_TRUE(p.with_class("bar").empty());
  }
}

TEST(Chart, SharedColorMapKeepsColoursAcrossCharts) {
  ColorMap colors;
  BarChartSpec a = sample_bars();
  a.colors = &colors;
  BarChartSpec b = sample_bars();
  std::swap(b.series[0], b.series[1]);  // another order
  b.colors = &colors;
  const Parsed pa = parse_ok(grouped_bar_chart(a));
  const Parsed pb = parse_ok(grouped_bar_chart(b));
  // First bar of a is "fla"; the second bar of b is "fla".
  EXPECT_EQ(pa.with_class("bar")[0]->attrs.at("fill"), pb.with_class("bar")[1]->attrs.at("fill"));
  EXPECT_NE(pa.with_class("bar")[0]->attrs.at("fill"), pa.with_class("bar")[1]->attrs.at("fill"));
}

TEST(Chart, LongCategoryLabelsAreRotated) {
  BarChartSpec s = sample_bars();
  s.categories = {"fla+mapping+reordering+layout", "fla+mapping+reordering", "fla+mapping", "fla"};
  s.width = 400;
  const Parsed p = parse_ok(grouped_bar_chart(s));
  for (const Element* c : p.with_class("category")) EXPECT_NE(c->attrs.count("transform"), 0u);
}

TEST(Html, ReportIsOneWellFormedPage) {
  HtmlReport r("hanpu report <310P & 310B>");
  r.heading("Latency");
  r.paragraph("Strategies compared on \"ascend310p\" & friends <draft>.");
  r.list({"a < b", "c & d"});
  r.table({"strategy", "latency (ms)", "speedup"}, {{"fla", "1.25", "1x"}, {"hanpu <new>", "0.5", "2.5x"}}, "caption & co");
  r.svg(grouped_bar_chart(sample_bars()), "figure 1 <bars>");
  r.preformatted("hanpu simulate --device devices/ascend310p.json <args> & more");
  const std::string html = r.html();
  const Parsed p = parse_ok(html);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_TRUE(has_text(p, "hanpu report <310P & 310B>"));
  EXPECT_TRUE(has_text(p, "hanpu <new>"));
  EXPECT_TRUE(has_text(p, "figure 1 <bars>"));
  EXPECT_EQ(p.named("svg").size(), 1u);
  EXPECT_EQ(p.named("tr").size(), 3u);
  EXPECT_EQ(p.named("script").size(), 0u);  // self-contained, no scripts
  // Numbers right-aligned, text not.
  const auto cells = p.named("td");
  ASSERT_EQ(cells.size(), 6u);
  EXPECT_EQ(cells[0]->attrs.count("class"), 0u);
  EXPECT_EQ(cells[1]->attrs.at("class"), "num");
  EXPECT_EQ(cells[5]->attrs.at("class"), "num");
  // No external references.
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
}

TEST(Html, ErrorsNameTheProblem) {
  HtmlReport r("x");
  EXPECT_NE(error_of([&] { r.table({"a", "b"}, {{"1", "2"}, {"3"}}); }).find("row 1 has 1 cells, expected 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { r.svg("<g/>"); }).find("does not start with <svg"), std::string::npos);
  EXPECT_NE(error_of([&] { r.heading("h", 7); }).find("heading level 7"), std::string::npos);
  hanpu::testing::TempDir tmp;
  const std::string missing_dir = tmp.file("no/such/dir/report.html");
  EXPECT_NE(error_of([&] { r.write(missing_dir); }).find(missing_dir + ": cannot open"), std::string::npos);
  const std::string ok = tmp.file("report.html");
  r.paragraph("written");
  r.write(ok);
  std::ifstream in(ok);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), r.html());
}

}  // namespace
}  // namespace hanpu::report

// `hanpu report`: a small sweep renders well-formed XHTML (parsed by expat) naming every strategy
// and carrying every chart; the numbers in its tables and its JSON are those simulate() and
// plan_peak_gm_bytes() give for the same shape, computed here independently; bad lists and files
// are one-line errors with exit code 1.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "hanpu/plan.hpp"
#include "hanpu/simulate.hpp"
#include "plan_testing.hpp"
#include "report/report_builder.hpp"
#include "test_support.hpp"
#include "xml_testing.hpp"

#ifndef HANPU_EXE
#error "HANPU_EXE must be defined to the path of the hanpu executable"
#endif

namespace hanpu::report {
namespace {

using hanpu::testing::ascend310p;
using hanpu::testing::TempDir;

/// One variant, one T, one H: every chart family once, in about a second.
ReportOptions small_options() {
  ReportOptions o;
  o.variants = {Variant::GDN};
  o.T = {512};
  o.heads = {16};
  o.max_T = 1024;  // two peak-memory points
  return o;
}

/// The table rows of a parsed page: cells (td or th text) per tr, in document order.
std::vector<std::vector<std::string>> table_rows(const Parsed& p) {
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < p.elements.size(); ++i) {
    if (p.elements[i].name != "tr") continue;
    std::vector<std::string> cells;
    const int depth = p.elements[i].depth;
    for (size_t j = i + 1; j < p.elements.size() && p.elements[j].depth > depth; ++j)
      if (p.elements[j].depth == depth + 1) cells.push_back(p.elements[j].text);
    rows.push_back(cells);
  }
  return rows;
}

/// The row whose first cells are `key` and which has `width` cells (one table's rows).
const std::vector<std::string>* find_row(const std::vector<std::vector<std::string>>& rows,
                                         const std::vector<std::string>& key, size_t width) {
  for (const auto& r : rows)
    if (r.size() == width && std::equal(key.begin(), key.end(), r.begin())) return &r;
  return nullptr;
}

/// A table cell printed with `decimals` decimals equals `expected` to that precision.
void expect_cell(const std::string& cell, double expected, int decimals, const std::string& what) {
  const double tol = 0.5 * std::pow(10.0, -decimals) * (1 + 1e-9);
  EXPECT_NEAR(std::stod(cell), expected, tol) << what << ": cell \"" << cell << "\"";
}

TEST(ReportBuilder, SmallSweepIsWellFormedAndComplete) {
  const Device dev = ascend310p();
  std::vector<std::pair<int, int>> calls;
  std::vector<std::string> whats;
  const ReportData data = run_report_sweep(dev, small_options(), [&](int done, int total, const std::string& what) {
    calls.push_back({done, total});
    whats.push_back(what);
  });
  const size_t S = strategy_names().size(), A = ablation_names().size();
  // sweep + ablation + peak GM at T = 512, 1024 + two timelines
  const int expected_total = static_cast<int>(S + A + 2 * S + 2);
  ASSERT_EQ(calls.size(), static_cast<size_t>(expected_total));
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].first, static_cast<int>(i));
    EXPECT_EQ(calls[i].second, expected_total);
  }
  EXPECT_EQ(whats.front(), "gdn T=512 H=16 " + strategy_names().front());
  EXPECT_EQ(data.simulations, static_cast<int>(S + A + 2));
  EXPECT_EQ(data.plans, static_cast<int>(2 * S));

  const std::string html = render_report(dev, small_options(), data);
  const Parsed p = parse_ok(html);
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src=\""), std::string::npos);  // no external resources
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);

  for (const std::string& s : strategy_names()) EXPECT_TRUE(has_text(p, s)) << "strategy " << s << " missing";
  for (const std::string& s : ablation_names()) EXPECT_TRUE(has_text(p, s)) << "ablation step " << s << " missing";
  for (const std::string title :
       {"GDN latency, H = 16", "GDN energy, H = 16", "GDN traffic per path, T = 512, H = 16", "GDN peak GM memory, H = 16",
        "GDN peak buffer use, T = 512, H = 16", "GDN matrix utilization, H = 16", "Ablation latency, T = 512, H = 16",
        "Ablation GM traffic (read + write), T = 512, H = 16"})
    EXPECT_TRUE(has_text(p, title)) << "chart \"" << title << "\" missing";
  // One timeline per kernel of the hanpu and the fla plan, each with matrix, vector and DMA lanes.
  int hanpu_timelines = 0, fla_timelines = 0;
  for (const Element& e : p.elements) {
    if (e.name != "title") continue;
    hanpu_timelines += e.text.rfind("hanpu, GDN T = 512, H = 16: kernel ", 0) == 0;
    fla_timelines += e.text.rfind("fla, GDN T = 512, H = 16: kernel ", 0) == 0;
  }
  const Problem prob = testing::problem(Variant::GDN, {512}, 16);
  EXPECT_EQ(hanpu_timelines, static_cast<int>(make_plan(prob, dev, "hanpu").kernels.size()));
  EXPECT_EQ(fla_timelines, static_cast<int>(make_plan(prob, dev, "fla").kernels.size()));
  for (const char* lane : {"core 0 matrix", "core 0 vector", "core 1 DMA MTE2"}) EXPECT_TRUE(has_text(p, lane)) << lane;
  // The device's open conflicts are shown.
  for (const std::string& note : dev.notes) EXPECT_TRUE(has_text(p, note)) << note;
  EXPECT_TRUE(has_text(p, "How to read this"));
}

TEST(ReportBuilder, RunsOnAnotherNpuFamily) {
  // AMD XDNA (AIE-ML): matrix and vector work share one data memory, no result buffer.
  const Device dev = load_device(testing::device_path("xdna-phoenix"));
  const ReportData data = run_report_sweep(dev, small_options(), nullptr);
  const std::string html = render_report(dev, small_options(), data);
  const Parsed p = parse_ok(html);
  ASSERT_EQ(p.error, "");
  for (const std::string& s : strategy_names()) EXPECT_TRUE(has_text(p, s)) << "strategy " << s << " missing";
  for (const std::string& note : dev.notes) EXPECT_TRUE(has_text(p, note)) << note;
}

TEST(ReportBuilder, TableNumbersAreThoseOfTheSimulator) {
  const Device dev = ascend310p();
  const ReportData data = run_report_sweep(dev, small_options());
  const Parsed p = parse_ok(render_report(dev, small_options(), data));
  const auto rows = table_rows(p);
  const Problem prob = testing::problem(Variant::GDN, {512}, 16);
  const SimResult fla = simulate(make_plan(prob, dev, "fla"), dev);
  const nlohmann::json j = report_data_to_json(data);
  const std::vector<std::string> strategies = strategy_names();
  ASSERT_EQ(j["sweep"].size(), strategies.size());
  for (size_t i = 0; i < strategies.size(); ++i) {
    const std::string& s = strategies[i];
    const SimResult r = simulate(make_plan(prob, dev, s), dev);
    EXPECT_EQ(j["sweep"][i], sim_result_to_json(r)) << s;  // the JSON is exactly simulate()'s
    const auto* row = find_row(rows, {"GDN", "512", "16", s}, 14);
    ASSERT_NE(row, nullptr) << "no table row for " << s;
    const auto& c = *row;
    const double MiB = 1024.0 * 1024.0;
    expect_cell(c[4], r.latency_s * 1e3, 4, s + " latency");
    expect_cell(c[5], r.energy_j * 1e3, 3, s + " energy");
    expect_cell(c[6], static_cast<double>(r.gm_read_bytes) / MiB, 3, s + " GM read");
    expect_cell(c[7], static_cast<double>(r.gm_write_bytes) / MiB, 3, s + " GM write");
    expect_cell(c[8], static_cast<double>(r.l1_to_l0_bytes) / MiB, 3, s + " L1->L0");
    expect_cell(c[9], static_cast<double>(r.ub_l1_bytes) / MiB, 3, s + " UB<->L1");
    expect_cell(c[10], r.matrix_utilization * 100, 2, s + " utilization");
    expect_cell(c[11], static_cast<double>(r.peak_bytes.at("UB")) / 1024.0, 1, s + " peak UB");
    expect_cell(c[12], static_cast<double>(r.peak_gm_bytes) / MiB, 3, s + " peak GM");
    expect_cell(c[13].substr(0, c[13].size() - 1), fla.latency_s / r.latency_s, 2, s + " speedup");
  }
  // Peak GM memory at T = 1024 (planned only): the table row "1K" has one cell per strategy.
  const auto* peak_row = find_row(rows, {"1K"}, 1 + strategy_names().size());
  ASSERT_NE(peak_row, nullptr);
  for (size_t i = 0; i < strategy_names().size(); ++i) {
    const Plan plan = make_plan(testing::problem(Variant::GDN, {1024}, 16), dev, strategy_names()[i]);
    expect_cell((*peak_row)[i + 1], static_cast<double>(plan_peak_gm_bytes(plan)) / (1024.0 * 1024.0), 3,
                "peak GM " + strategy_names()[i]);
  }
  // The ablation's JSON is simulate()'s for each step.
  ASSERT_EQ(j["ablation"].size(), ablation_names().size());
  for (size_t i = 0; i < ablation_names().size(); ++i)
    EXPECT_EQ(j["ablation"][i], sim_result_to_json(simulate(make_plan(prob, dev, ablation_names()[i]), dev)));
}

using hanpu::testing::error_of;

TEST(ReportBuilder, BadListsAndOptionsAreErrorsNamingTheOption) {
  EXPECT_EQ(parse_size_list("512,1K,2k", "--T"), (std::vector<int64_t>{512, 1024, 2048}));
  EXPECT_NE(error_of([] { parse_size_list("512,abc", "--T"); }).find("--T: got \"abc\""), std::string::npos);
  EXPECT_NE(error_of([] { parse_size_list("512,0", "--heads"); }).find("--heads: got \"0\""), std::string::npos);
  EXPECT_NE(error_of([] { parse_size_list("512,", "--T"); }).find("--T"), std::string::npos);
  EXPECT_NE(error_of([] { parse_size_list("", "--T"); }).find("--T"), std::string::npos);
  EXPECT_NE(error_of([] { parse_size_list("-5", "--T"); }).find("\"-5\""), std::string::npos);
  EXPECT_EQ(parse_variant_list("kda,gdn", "--variants"), (std::vector<Variant>{Variant::KDA, Variant::GDN}));
  EXPECT_NE(error_of([] { parse_variant_list("gdn,mamba", "--variants"); }).find("--variants: got \"mamba\""),
            std::string::npos);
  ReportOptions o = small_options();
  o.max_T = 256;
  EXPECT_NE(error_of([&] { validate_report_options(o); }).find("max-T: got 256"), std::string::npos);
  o = small_options();
  o.heads.clear();
  EXPECT_NE(error_of([&] { validate_report_options(o); }).find("heads list is empty"), std::string::npos);
  o = small_options();
  o.T = {512, 1024, 512};
  EXPECT_NE(error_of([&] { validate_report_options(o); }).find("T: 512 given twice"), std::string::npos);
  o = small_options();
  o.max_T = int64_t{1} << 21;
  EXPECT_NE(error_of([&] { validate_report_options(o); }).find("max-T: got 2097152"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// The command line

using hanpu::testing::read_text;
using RunResult = hanpu::testing::CommandResult;

RunResult run_hanpu(const TempDir& dir, const std::string& args) {
  return hanpu::testing::run_command(dir, hanpu::testing::shell_quote(HANPU_EXE) + " " + args);
}

TEST(ReportCli, WritesReportJsonAndProgress) {
  TempDir dir;
  const std::string html = dir.file("r.html"), rows = dir.file("rows.json");
  const RunResult r = run_hanpu(dir, "report --device '" + testing::device_path("ascend310p") +
                                         "' --variants kda --T 512 --heads 8 --max-T 512 -o '" + html + "' --json-out '" + rows + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("[1/"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("kda T=512 H=8 hanpu"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" s "), std::string::npos) << "no total time: " << r.err;
  EXPECT_EQ(parse_xml(read_text(html)).error, "");
  const nlohmann::json j = nlohmann::json::parse(read_text(rows));
  EXPECT_EQ(j["sweep"].size(), strategy_names().size());
  EXPECT_EQ(j["sweep"][0]["variant"], "kda");
  EXPECT_EQ(j["peak_gm"].size(), strategy_names().size());
}

TEST(ReportCli, ErrorsAreOneLineWithExitCodeOne) {
  TempDir dir;
  const std::string out = "-o '" + dir.file("r.html") + "'";
  for (const std::string& args :
       {"report --device '" + dir.file("missing.json") + "' " + out,
        "report --device '" + testing::device_path("ascend310p") + "' --T 512,x " + out,
        "report --device '" + testing::device_path("ascend310p") + "' --variants gdn,rwkv " + out,
        "report --device '" + testing::device_path("ascend310p") + "' --T 1024 --max-T 512 " + out}) {
    const RunResult r = run_hanpu(dir, args);
    EXPECT_EQ(r.code, 1) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("hanpu: error: ", 0), 0u) << r.err;
  }
}

}  // namespace
}  // namespace hanpu::report

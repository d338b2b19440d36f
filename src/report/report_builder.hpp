// `hanpu report`'s engine: sweeps GDN/KDA x sequence length x heads x strategies on one device
// model with the planner and the simulator, adds the peak GM memory of every strategy up to long
// sequences (planned only, not timed), the ablation fla -> +mapping -> +reordering -> +layout and
// per-core timelines of a few chunks, and renders everything into one self-contained HTML page
// (html_report.hpp, svg_chart.hpp): charts, the numbers behind them as tables, the device's open
// conflicts and how to read the page.
//
// Running and rendering are separate (run_report_sweep, render_report) so tests can compare the
// rendered tables with the SimResults they came from; build_report does both.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hanpu/device.hpp"
#include "hanpu/la.hpp"
#include "hanpu/simulate.hpp"

namespace hanpu::report {

/// What to sweep. Defaults are the paper's evaluation grid.
struct ReportOptions {
  std::vector<Variant> variants = {Variant::GDN, Variant::KDA};
  std::vector<int64_t> T = {512, 1024, 2048, 4096};  // tokens of the one sequence
  std::vector<int64_t> heads = {16, 32, 48};          // H = HV
  /// Peak GM memory is planned for T = min(T) doubling up to max_T (the paper goes to 64K).
  int64_t max_T = 65536;
  /// Timelines record this many chunks per core and kernel: enough to see the pipeline fill and
  /// reach its steady state, few enough that every bar stays wide enough to read.
  int timeline_chunks = 3;
  /// Cores drawn in each timeline (the cores run the same program; two show whether they line up).
  int timeline_cores = 2;
  /// The planning rules of the backend that runs a CPU device's plans (PlanOptions::backend);
  /// needed for a CPU device only (the CLI passes cpu_plan_backend()).
  const PlanBackend* backend = nullptr;
};

/// One simulated point of the sweep (or of the ablation).
struct SweepPoint {
  Variant variant = Variant::GDN;
  int64_t T = 0, heads = 0;
  std::string strategy;
  SimResult result;
};

/// The peak GM footprint of one planned (not simulated) point.
struct PeakGmPoint {
  Variant variant = Variant::GDN;
  int64_t T = 0, heads = 0;
  std::string strategy;
  int64_t peak_gm_bytes = 0;
};

struct ReportData {
  std::string device;
  /// The shape of the single-shape charts (traffic per path, buffer occupancy, ablation,
  /// timelines, peak memory): the longest swept T and the middle head count.
  int64_t rep_T = 0, rep_heads = 0;
  std::vector<SweepPoint> sweep;     // variant x T x heads x strategy_names()
  std::vector<SweepPoint> ablation;  // variant x T at rep_heads x ablation_names()
  std::vector<PeakGmPoint> peak_gm;  // variant x T (doubling to max_T) at rep_heads x strategy_names()
  std::vector<SweepPoint> timelines;  // hanpu and fla of the first variant at the representative shape
  int simulations = 0, plans = 0;    // work done (simulate calls, plan-only calls)
  double seconds = 0;                // wall time of the sweep
};

/// Called before each unit of work: done units so far, total units, what comes next
/// ("gdn T=512 H=16 fla").
using ProgressFn = std::function<void(int done, int total, const std::string& what)>;

/// Throws hanpu::Error for an empty or non-positive list, max_T below the smallest T, timeline
/// settings out of range, or a plan the planner refuses (naming the shape and strategy).
void validate_report_options(const ReportOptions& opt);

/// Runs every plan and simulation the report needs. progress may be empty.
ReportData run_report_sweep(const Device& dev, const ReportOptions& opt, const ProgressFn& progress = {});

/// The HTML page (well-formed XHTML, no scripts, no external resources).
std::string render_report(const Device& dev, const ReportOptions& opt, const ReportData& data);

/// run_report_sweep + render_report.
std::string build_report(const Device& dev, const ReportOptions& opt, const ProgressFn& progress = {});

/// Every number of the report as JSON: {"device", "rep_T", "rep_heads", "sweep": [...],
/// "ablation": [...], "peak_gm": [{variant, T, heads, strategy, peak_gm_bytes}], "seconds"};
/// sweep and ablation entries are sim_result_to_json objects.
nlohmann::json report_data_to_json(const ReportData& data);

/// Parses "512,1024,2K" style lists for the CLI: positive integers, an optional K suffix (x1024).
/// Throws hanpu::Error naming `option` and the bad item.
std::vector<int64_t> parse_size_list(const std::string& text, const std::string& option);
/// Parses "gdn,kda"; throws hanpu::Error naming `option` and the bad item.
std::vector<Variant> parse_variant_list(const std::string& text, const std::string& option);

}  // namespace hanpu::report

// `hanpu report`: the sweep (planner + simulator) and its rendering into one HTML page (see
// report_builder.hpp).
#include "report/report_builder.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "hanpu/plan.hpp"
#include "hanpu/tensor.hpp"
#include "report/html_report.hpp"
#include "report/svg_chart.hpp"

namespace hanpu::report {

namespace {

// Charts that come in families (one per variant or head count) are drawn two per row; 540 px keeps
// two side by side within the page's 1100 px while leaving ~90 px per category for 4-6 bars.
constexpr int kHalfWidth = 540;
constexpr int kHalfHeight = 320;
constexpr int kTimelineWidth = 1060;

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kKiB = 1024.0;

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string vname(Variant v) { return upper(variant_name(v)); }

/// Fixed-point text for tables: enough digits that the table can be checked against the JSON.
std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string count2(int64_t v) { return format_number(static_cast<double>(v), NumberFormat::kCount2); }

std::string shape_name(Variant v, int64_t T, int64_t H) {
  return std::string(variant_name(v)) + " T=" + std::to_string(T) + " H=" + std::to_string(H);
}

Problem make_problem(Variant v, int64_t T, int64_t H) {
  Problem p;
  p.variant = v;
  p.seqlens = {T};
  p.H = p.HV = H;
  return p;
}

Plan plan_or_explain(const Problem& p, const Device& dev, const std::string& strategy, const PlanBackend* backend) {
  try {
    PlanOptions po;
    po.backend = backend;
    return make_plan(p, dev, strategy, po);
  } catch (const Error& e) {
    throw Error("report: " + shape_name(p.variant, p.total_tokens(), p.HV) + " " + strategy + ": " + e.what());
  }
}

/// Short labels for the ablation steps on chart axes ("fla+mapping+reordering" -> "+reordering").
std::string ablation_label(const std::string& step) {
  const size_t plus = step.rfind('+');
  return plus == std::string::npos ? step : step.substr(plus);
}

std::vector<int64_t> peak_gm_lengths(const ReportOptions& opt) {
  std::vector<int64_t> out;
  for (int64_t t = *std::min_element(opt.T.begin(), opt.T.end()); t <= opt.max_T; t *= 2) out.push_back(t);
  return out;
}

int64_t representative_T(const ReportOptions& opt) { return *std::max_element(opt.T.begin(), opt.T.end()); }
int64_t representative_heads(const ReportOptions& opt) { return opt.heads[opt.heads.size() / 2]; }

const SweepPoint& find_point(const std::vector<SweepPoint>& pts, Variant v, int64_t T, int64_t H, const std::string& s) {
  for (const SweepPoint& p : pts)
    if (p.variant == v && p.T == T && p.heads == H && p.strategy == s) return p;
  throw Error("report: no result for " + shape_name(v, T, H) + " " + s);
}

int64_t peak_of(const SimResult& r, const std::string& buffer) {
  auto it = r.peak_bytes.find(buffer);
  return it == r.peak_bytes.end() ? 0 : it->second;
}

/// Tables that belong under a row of charts are collected while the charts are drawn.
struct PendingTable {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::string caption;
};

void emit_tables(HtmlReport& page, const std::vector<PendingTable>& tables) {
  for (const PendingTable& t : tables) page.table(t.header, t.rows, t.caption);
}

ColorMap strategy_colors() {
  ColorMap c;
  for (const std::string& s : strategy_names()) c.color(s);  // fixed order: fixed colours
  return c;
}

// ---------------------------------------------------------------------------------------------
// Page sections

void intro(HtmlReport& page, const Device& dev, const ReportOptions& opt, const ReportData& d) {
  std::string vs, ts, hs;
  for (Variant v : opt.variants) vs += (vs.empty() ? "" : ", ") + vname(v);
  for (int64_t t : opt.T) ts += (ts.empty() ? "" : ", ") + count2(t);
  for (int64_t h : opt.heads) hs += (hs.empty() ? "" : ", ") + std::to_string(h);
  page.paragraph("Simulated linear-attention prefill on " + dev.name + " (" + dev.description + "; " +
                 std::to_string(dev.core_count()) + " cores at " + fixed(dev.clock_ghz.value, 2) + " GHz). Sweep: " + vs +
                 " x T in {" + ts + "} x H in {" + hs + "} (H = HV, one sequence, K = V = 128, chunk 64, fp16 q/k/v/o, " +
                 "fp32 gates and states, an initial state read and a final state written) x every strategy; peak GM memory up to T = " +
                 count2(opt.max_T) + "; the ablation; timelines. Single-shape charts use T = " + count2(d.rep_T) +
                 ", H = " + std::to_string(d.rep_heads) + ". " + std::to_string(d.simulations) + " simulations and " +
                 std::to_string(d.plans) + " plan-only runs took " + fixed(d.seconds, 1) + " s.");
  page.heading("How to read this");
  page.paragraph(
      "Every number here comes from hanpu's planner and simulator running on the device description " + dev.name +
      ", not from hardware: each strategy is a plan of the same computation (vllm-ascend: one kernel per operator, every "
      "intermediate through GM; fla: chunk-parallel Map kernels around a head-parallel state pass, A/W/U/states/v_new in GM; "
      "fla-megakernel: the same in one launch; flashqla: segment-parallel states after an extra pass; hanpu: head-level mapping "
      "with fused operators, lifetime-aware order and planned layouts, only compulsory GM traffic). The simulator overlaps "
      "the matrix unit, the vector unit and the DMA engines as far as each plan's dependencies and buffers allow and shares "
      "the GM bandwidth between busy cores. Lower latency, energy, traffic and memory are better; higher matrix utilization "
      "is better. Energy is static power x latency plus per-byte and per-operation estimates, so it mostly follows latency. "
      "Hover over a bar or point for its exact value; the tables below each chart hold the same numbers. The device's numbers "
      "carry a status (confirmed, derived, paper, estimate): the last section lists the open conflicts, which bound how far "
      "absolute values can be trusted; ratios between strategies are the robust part.");
}

void latency_energy_sections(HtmlReport& page, const ReportOptions& opt, const ReportData& d, ColorMap& colors) {
  const std::vector<std::string> strategies = strategy_names();
  std::vector<std::string> categories;
  for (int64_t t : opt.T) categories.push_back(count2(t));
  struct Metric {
    const char* heading;
    const char* name;
    const char* axis;
    double (*get)(const SimResult&);
  };
  const Metric metrics[] = {
      {"Latency per strategy", "latency", "latency (ms)", [](const SimResult& r) { return r.latency_s * 1e3; }},
      {"Energy per strategy", "energy", "energy (mJ)", [](const SimResult& r) { return r.energy_j * 1e3; }},
  };
  for (const Metric& m : metrics) {
    page.heading(m.heading);
    std::vector<std::string> charts;
    for (Variant v : opt.variants)
      for (int64_t H : opt.heads) {
        BarChartSpec spec;
        spec.title = vname(v) + " " + m.name + ", H = " + std::to_string(H);
        spec.x_label = "sequence length T";
        spec.y = {m.axis, false, NumberFormat::kSi};
        spec.categories = categories;
        for (const std::string& s : strategies) {
          Series ser{s, {}};
          for (int64_t T : opt.T) ser.values.push_back(m.get(find_point(d.sweep, v, T, H, s).result));
          spec.series.push_back(ser);
        }
        spec.width = kHalfWidth, spec.height = kHalfHeight;
        spec.colors = &colors;
        charts.push_back(grouped_bar_chart(spec));
      }
    page.svg_row(charts);
  }
}

void sweep_table(HtmlReport& page, const ReportData& d) {
  page.heading("All simulated points", 3);
  std::vector<std::vector<std::string>> rows;
  for (const SweepPoint& p : d.sweep) {
    const SimResult& r = p.result;
    const SimResult& fla = find_point(d.sweep, p.variant, p.T, p.heads, "fla").result;
    rows.push_back({vname(p.variant), std::to_string(p.T), std::to_string(p.heads), p.strategy, fixed(r.latency_s * 1e3, 4),
                    fixed(r.energy_j * 1e3, 3), fixed(static_cast<double>(r.gm_read_bytes) / kMiB, 3),
                    fixed(static_cast<double>(r.gm_write_bytes) / kMiB, 3), fixed(static_cast<double>(r.l1_to_l0_bytes) / kMiB, 3),
                    fixed(static_cast<double>(r.ub_l1_bytes) / kMiB, 3), fixed(r.matrix_utilization * 100, 2),
                    fixed(static_cast<double>(peak_of(r, "UB")) / kKiB, 1), fixed(static_cast<double>(r.peak_gm_bytes) / kMiB, 3),
                    fixed(fla.latency_s / r.latency_s, 2) + "x"});
  }
  page.table({"variant", "T", "H", "strategy", "latency (ms)", "energy (mJ)", "GM read (MiB)", "GM write (MiB)", "L1->L0 (MiB)",
              "UB<->L1 (MiB)", "matrix util (%)", "peak UB (KiB)", "peak GM (MiB)", "speedup vs fla"},
             rows, "MiB = 2^20 bytes. Speedup = fla latency / this latency at the same shape.");
}

void traffic_section(HtmlReport& page, const ReportOptions& opt, const ReportData& d) {
  page.heading("Traffic per memory path");
  page.paragraph("Bytes moved along each data path of the device (summed over cores) at T = " + count2(d.rep_T) + ", H = " +
                 std::to_string(d.rep_heads) + ". GM paths are what the chip's DRAM interface carries; L1->L0A/B feed the "
                 "matrix unit; L0C->UB brings its results to the vector unit; UB->L1 carries vector results back to it.");
  const std::vector<std::string> strategies = strategy_names();
  ColorMap path_colors;
  std::vector<PendingTable> tables;
  std::vector<std::string> charts;
  for (Variant v : opt.variants) {
    std::set<std::string> paths;
    for (const std::string& s : strategies)
      for (const auto& [path, bytes] : find_point(d.sweep, v, d.rep_T, d.rep_heads, s).result.bytes_per_path) paths.insert(path);
    BarChartSpec spec;
    spec.title = vname(v) + " traffic per path, T = " + count2(d.rep_T) + ", H = " + std::to_string(d.rep_heads);
    spec.x_label = "strategy";
    spec.y = {"bytes moved", false, NumberFormat::kBytes};
    spec.categories = strategies;
    std::vector<std::vector<std::string>> rows;
    for (const std::string& path : paths) {
      Series ser{path, {}};
      std::vector<std::string> row{path};
      for (const std::string& s : strategies) {
        const auto& bp = find_point(d.sweep, v, d.rep_T, d.rep_heads, s).result.bytes_per_path;
        auto it = bp.find(path);
        const int64_t b = it == bp.end() ? 0 : it->second;
        ser.values.push_back(static_cast<double>(b));
        row.push_back(fixed(static_cast<double>(b) / kMiB, 3));
      }
      spec.series.push_back(ser);
      rows.push_back(row);
    }
    spec.width = kHalfWidth, spec.height = 360;
    spec.colors = &path_colors;
    charts.push_back(stacked_bar_chart(spec));
    std::vector<std::string> header{"path (MiB)"};
    header.insert(header.end(), strategies.begin(), strategies.end());
    tables.push_back({header, rows, vname(v) + ", T = " + std::to_string(d.rep_T) + ", H = " + std::to_string(d.rep_heads)});
  }
  page.svg_row(charts);
  emit_tables(page, tables);
}

void peak_gm_section(HtmlReport& page, const ReportOptions& opt, const ReportData& d, ColorMap& colors) {
  page.heading("Peak GM memory vs sequence length");
  page.paragraph("Device memory the kernel(s) need at their peak: inputs, outputs, states and every intermediate a plan "
                 "materializes in GM (per-chunk A, W, U, states, v_new for the FLA family), planned for T up to " +
                 count2(opt.max_T) + " at H = " + std::to_string(d.rep_heads) + ". Both axes are logarithmic.");
  const std::vector<std::string> strategies = strategy_names();
  const std::vector<int64_t> lengths = peak_gm_lengths(opt);
  std::vector<PendingTable> tables;
  std::vector<std::string> charts, overlaps;
  for (Variant v : opt.variants) {
    LineChartSpec spec;
    spec.title = vname(v) + " peak GM memory, H = " + std::to_string(d.rep_heads);
    spec.x = {"sequence length T", true, NumberFormat::kCount2};
    spec.y = {"peak GM bytes", true, NumberFormat::kBytes};
    std::vector<std::vector<std::string>> rows;
    for (int64_t T : lengths) rows.push_back({count2(T)});
    for (const std::string& s : strategies) {
      LineSeries ser{s, {}, {}};
      size_t i = 0;
      for (int64_t T : lengths)
        for (const PeakGmPoint& p : d.peak_gm)
          if (p.variant == v && p.T == T && p.strategy == s) {
            ser.x.push_back(static_cast<double>(T));
            ser.y.push_back(static_cast<double>(p.peak_gm_bytes));
            rows[i++].push_back(fixed(static_cast<double>(p.peak_gm_bytes) / kMiB, 3));
          }
      spec.series.push_back(ser);
    }
    spec.width = kHalfWidth, spec.height = kHalfHeight;
    spec.colors = &colors;
    charts.push_back(line_chart(spec));
    // Lines with identical values hide each other; say so rather than let a strategy vanish.
    for (size_t a = 0; a < spec.series.size(); ++a)
      for (size_t b = a + 1; b < spec.series.size(); ++b)
        if (spec.series[a].y == spec.series[b].y)
          overlaps.push_back(vname(v) + ": " + spec.series[b].name + " lies exactly on " + spec.series[a].name);
    std::vector<std::string> header{"T"};
    for (const std::string& s : strategies) header.push_back(s + " (MiB)");
    tables.push_back({header, rows, vname(v) + " peak GM memory, H = " + std::to_string(d.rep_heads)});
  }
  page.svg_row(charts);
  emit_tables(page, tables);
  if (!overlaps.empty()) {
    std::string text = "Hidden lines: ";
    for (size_t i = 0; i < overlaps.size(); ++i) text += (i ? "; " : "") + overlaps[i];
    page.paragraph(text + " (same peak at every T).");
  }
}

void buffer_section(HtmlReport& page, const Device& dev, const ReportOptions& opt, const ReportData& d, ColorMap& colors) {
  page.heading("Peak on-core buffer occupancy");
  page.paragraph("The largest live set of each on-core buffer over the plan's chunk program (double-buffered tensors counted "
                 "twice), as a share of the buffer's capacity, at T = " +
                 count2(d.rep_T) + ", H = " + std::to_string(d.rep_heads) +
                 ". 100 % is full: a plan that would exceed it must spill (or is refused).");
  const std::vector<std::string> strategies = strategy_names();
  std::vector<std::string> buffers;
  for (const BufferSpec& b : dev.buffers) buffers.push_back(b.name);
  std::vector<PendingTable> tables;
  std::vector<std::string> charts;
  for (Variant v : opt.variants) {
    BarChartSpec spec;
    spec.title = vname(v) + " peak buffer use, T = " + count2(d.rep_T) + ", H = " + std::to_string(d.rep_heads);
    spec.x_label = "buffer";
    spec.y = {"peak live bytes (% of capacity)", false, NumberFormat::kSi};
    spec.categories = buffers;
    std::vector<std::vector<std::string>> rows;
    for (const std::string& b : buffers)
      rows.push_back({b, fixed(dev.buffer(b).capacity_bytes.value / kKiB, 1)});
    for (const std::string& s : strategies) {
      const SimResult& r = find_point(d.sweep, v, d.rep_T, d.rep_heads, s).result;
      Series ser{s, {}};
      for (size_t i = 0; i < buffers.size(); ++i) {
        const double bytes = static_cast<double>(peak_of(r, buffers[i]));
        ser.values.push_back(100.0 * bytes / dev.buffer(buffers[i]).capacity_bytes.value);
        rows[i].push_back(fixed(bytes / kKiB, 1));
      }
      spec.series.push_back(ser);
    }
    spec.width = kHalfWidth, spec.height = kHalfHeight;
    spec.colors = &colors;
    charts.push_back(grouped_bar_chart(spec));
    std::vector<std::string> header{"buffer", "capacity (KiB)"};
    for (const std::string& s : strategies) header.push_back(s + " (KiB)");
    tables.push_back({header, rows, vname(v) + ", T = " + std::to_string(d.rep_T) + ", H = " + std::to_string(d.rep_heads)});
  }
  page.svg_row(charts);
  emit_tables(page, tables);
}

void utilization_section(HtmlReport& page, const ReportOptions& opt, const ReportData& d, ColorMap& colors) {
  page.heading("Matrix-unit utilization");
  page.paragraph("Executed multiply-adds (what the matrix unit runs: full masked tiles for the general-purpose baseline kernels, "
                 "16x16-block triangles for HA-NPU's routines; the paper's hardware-recorded MACs) over latency x cores x the "
                 "matrix unit's peak rate, at H = " +
                 std::to_string(d.rep_heads) + ". Chunkwise LA is bandwidth- and vector-bound on this class of device, so "
                 "every strategy stays far below 100 %; what matters is how much of the matrix unit each plan leaves idle.");
  const std::vector<std::string> strategies = strategy_names();
  std::vector<std::string> categories;
  for (int64_t t : opt.T) categories.push_back(count2(t));
  std::vector<std::string> charts;
  for (Variant v : opt.variants) {
    BarChartSpec spec;
    spec.title = vname(v) + " matrix utilization, H = " + std::to_string(d.rep_heads);
    spec.x_label = "sequence length T";
    spec.y = {"matrix utilization (%)", false, NumberFormat::kSi};
    spec.categories = categories;
    for (const std::string& s : strategies) {
      Series ser{s, {}};
      for (int64_t T : opt.T) ser.values.push_back(find_point(d.sweep, v, T, d.rep_heads, s).result.matrix_utilization * 100);
      spec.series.push_back(ser);
    }
    spec.width = kHalfWidth, spec.height = kHalfHeight;
    spec.colors = &colors;
    charts.push_back(grouped_bar_chart(spec));
  }
  page.svg_row(charts);
}

void ablation_section(HtmlReport& page, const ReportOptions& opt, const ReportData& d) {
  page.heading("Ablation: fla -> +mapping -> +reordering -> +layout");
  page.paragraph("Each step adds one HA-NPU technique to the FLA plan: head-level mapping with cross-operator fusion "
                 "(intermediates stay on core), lifetime-aware operator reordering (GEMM-first, split state update), "
                 "dataflow-aware layout planning. Charts at T = " +
                 count2(d.rep_T) + ", H = " + std::to_string(d.rep_heads) + "; the table has every swept T.");
  const std::vector<std::string> steps = ablation_names();
  std::vector<std::string> labels;
  for (const std::string& s : steps) labels.push_back(ablation_label(s));
  ColorMap variant_colors;
  std::vector<std::string> charts;
  struct Metric {
    const char* title;
    AxisSpec axis;
    double (*get)(const SimResult&);
  };
  const Metric metrics[] = {
      {"Ablation latency", {"latency (ms)", false, NumberFormat::kSi}, [](const SimResult& r) { return r.latency_s * 1e3; }},
      {"Ablation GM traffic (read + write)",
       {"GM bytes", false, NumberFormat::kBytes},
       [](const SimResult& r) { return static_cast<double>(r.gm_read_bytes + r.gm_write_bytes); }},
  };
  for (const Metric& m : metrics) {
    BarChartSpec spec;
    spec.title = std::string(m.title) + ", T = " + count2(d.rep_T) + ", H = " + std::to_string(d.rep_heads);
    spec.x_label = "ablation step";
    spec.y = m.axis;
    spec.categories = labels;
    for (Variant v : opt.variants) {
      Series ser{vname(v), {}};
      for (const std::string& s : steps) ser.values.push_back(m.get(find_point(d.ablation, v, d.rep_T, d.rep_heads, s).result));
      spec.series.push_back(ser);
    }
    spec.width = kHalfWidth, spec.height = kHalfHeight;
    spec.colors = &variant_colors;
    charts.push_back(grouped_bar_chart(spec));
  }
  page.svg_row(charts);
  std::vector<std::vector<std::string>> rows;
  for (const SweepPoint& p : d.ablation) {
    const SimResult& r = p.result;
    const SimResult& base = find_point(d.ablation, p.variant, p.T, p.heads, steps.front()).result;
    rows.push_back({vname(p.variant), std::to_string(p.T), std::to_string(p.heads), p.strategy, fixed(r.latency_s * 1e3, 4),
                    fixed(base.latency_s / r.latency_s, 2) + "x", fixed(r.energy_j * 1e3, 3),
                    fixed(static_cast<double>(r.gm_read_bytes + r.gm_write_bytes) / kMiB, 3),
                    fixed(static_cast<double>(r.l1_to_l0_bytes) / kMiB, 3), fixed(r.matrix_utilization * 100, 2),
                    fixed(static_cast<double>(peak_of(r, "UB")) / kKiB, 1)});
  }
  page.table({"variant", "T", "H", "step", "latency (ms)", "speedup vs fla", "energy (mJ)", "GM traffic (MiB)", "L1->L0 (MiB)",
              "matrix util (%)", "peak UB (KiB)"},
             rows);
}

/// "1" -> "#1", "5r" -> "#5 read", "" -> "state movement": the paper's operator (#1-#6) of a fine op.
std::string paper_group(const std::string& paper_op) {
  if (paper_op.empty()) return "state load/store";
  if (paper_op == "5r") return "#5 read (v_new)";
  if (paper_op == "5u") return "#5 update (S)";
  static const std::map<std::string, std::string> names = {{"1", "#1 gate"}, {"2", "#2 KKT"}, {"3", "#3 solve"},
                                                           {"4", "#4 W/U"},  {"5", "#5 state"}, {"6", "#6 output"}};
  auto it = names.find(paper_op);
  return it == names.end() ? "#" + paper_op : it->second;
}

void timeline_section(HtmlReport& page, const Device& dev, const ReportOptions& opt, const ReportData& d) {
  page.heading("Per-core timelines");
  std::map<std::string, std::set<std::string>> engine_paths;
  for (const PathSpec& p : dev.paths) engine_paths[p.engine].insert(p.name());
  std::string engines;
  for (const auto& [e, ps] : engine_paths) {
    engines += (engines.empty() ? "" : "; ") + e + ": ";
    std::string list;
    for (const std::string& p : ps) list += (list.empty() ? "" : ", ") + p;
    engines += list;
  }
  page.paragraph("The first " + std::to_string(opt.timeline_chunks) + " chunks each of cores 0.." +
                 std::to_string(opt.timeline_cores - 1) +
                 " runs in each kernel: one lane per unit (matrix, vector) and per DMA engine (" + engines +
                 "). Colours are the operators of the paper's chunkwise computation; hover over a bar for the step. Time starts at each kernel's "
                 "start (after its launch); the fla plan runs its kernels one after another.");
  ColorMap group_colors;
  for (const SweepPoint& tp : d.timelines) {
    const SimResult& r = tp.result;
    std::map<std::string, std::string> paper_of;
    for (const OperatorStats& o : r.per_operator) paper_of[o.op] = o.paper_op;
    double kernel_start = 0;
    for (size_t ki = 0; ki < r.kernels.size(); ++ki) {
      const KernelStats& k = r.kernels[ki];
      std::vector<std::string> lane_kinds = {"matrix", "vector"};
      for (const auto& [e, ps] : engine_paths) lane_kinds.push_back(e);
      std::vector<TimelineLane> lanes;
      for (int core = 0; core < opt.timeline_cores; ++core)
        for (const std::string& lk : lane_kinds) {
          TimelineLane lane;
          lane.name = "core " + std::to_string(core) + " " + (lk == "matrix" || lk == "vector" ? lk : "DMA " + lk);
          for (const TimelineEvent& e : r.timeline) {
            if (e.kernel != k.name || e.core != core || e.lane != lk) continue;
            TimelineInterval iv;
            iv.start = (e.start_s - kernel_start) * 1e6;
            iv.end = (e.end_s - kernel_start) * 1e6;
            auto po = paper_of.find(e.op);
            iv.group = paper_group(po == paper_of.end() ? "" : po->second);
            iv.label = e.kind == StepKind::Compute ? e.op : std::string(step_kind_name(e.kind)) + " " + e.tensor + " (" + e.op + ")";
            iv.label += ", chunk " + std::to_string(e.chunk);
            lane.intervals.push_back(iv);
          }
          if (!lane.intervals.empty()) lanes.push_back(lane);
        }
      kernel_start += k.latency_s;
      if (lanes.empty()) continue;
      TimelineSpec spec;
      spec.title = tp.strategy + ", " + vname(tp.variant) + " T = " + count2(tp.T) + ", H = " + std::to_string(tp.heads) +
                   ": kernel " + std::to_string(ki + 1) + " of " + std::to_string(r.kernels.size()) + " (" + k.name + ")";
      spec.x = {"time from kernel start (us)", false, NumberFormat::kSi};
      spec.lanes = lanes;
      spec.width = kTimelineWidth;
      spec.colors = &group_colors;
      page.svg(timeline_chart(spec), "Kernel " + k.name + ": " + fixed(k.latency_s * 1e3, 4) + " ms on " +
                                         std::to_string(k.busy_cores) + " busy cores, launch " +
                                         fixed(k.launch_s * 1e6, 1) + " us.");
    }
  }
}

/// A device number as written in its file (%.10g: byte counts stay integers, 1.068 stays 1.068).
std::string plain(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

/// Walks device_to_json for Quantities that carry alternatives (conflicting sources).
void collect_conflicts(const nlohmann::json& j, const std::string& where, std::vector<std::vector<std::string>>& rows) {
  if (j.is_object()) {
    if (j.contains("value") && j.contains("status") && j.contains("alternatives") && !j["alternatives"].empty()) {
      std::string alts;
      for (const auto& a : j["alternatives"])
        alts += (alts.empty() ? "" : "; ") + plain(a.value("value", 0.0)) + " (" + a.value("status", "") + ": " +
                a.value("source", "") + ")";
      rows.push_back({where, plain(j["value"].get<double>()), j.value("status", "") + ": " + j.value("source", ""), alts});
    }
    for (const auto& [key, val] : j.items()) collect_conflicts(val, where.empty() ? key : where + "." + key, rows);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      const auto& e = j[i];
      std::string name = "[" + std::to_string(i) + "]";
      if (e.is_object() && e.contains("name") && e["name"].is_string()) name = "[" + e["name"].get<std::string>() + "]";
      else if (e.is_object() && e.contains("from") && e.contains("to") && e["from"].is_string() && e["to"].is_string())
        name = "[" + e["from"].get<std::string>() + "->" + e["to"].get<std::string>() + "]";
      collect_conflicts(e, where + name, rows);
    }
  }
}

void count_statuses(const nlohmann::json& j, std::map<std::string, int>& counts) {
  if (j.is_object()) {
    if (j.contains("value") && j.contains("status") && j["status"].is_string()) ++counts[j["status"].get<std::string>()];
    for (const auto& [key, val] : j.items())
      if (key != "alternatives") count_statuses(val, counts);
  } else if (j.is_array()) {
    for (const auto& e : j) count_statuses(e, counts);
  }
}

void device_section(HtmlReport& page, const Device& dev) {
  page.heading("Device model: open conflicts and caveats");
  const nlohmann::json j = device_to_json(dev);
  std::map<std::string, int> counts;
  count_statuses(j, counts);
  std::string c;
  for (const auto& [status, n] : counts) c += (c.empty() ? "" : ", ") + std::to_string(n) + " " + status;
  page.paragraph("The numbers of " + dev.name + " by status: " + c +
                 ". Only 'confirmed' numbers come from vendor documentation; see docs/DEVICES.md for every source.");
  if (!dev.notes.empty()) page.list(dev.notes);
  std::vector<std::vector<std::string>> rows;
  collect_conflicts(j, "", rows);
  if (!rows.empty())
    page.table({"quantity", "value used", "its source", "alternatives"}, rows,
               "Quantities whose sources disagree: the simulator uses 'value used'; the alternatives stay visible.");
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::vector<int64_t> parse_size_list(const std::string& text, const std::string& option) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int64_t mult = 1;
    std::string digits = item;
    if (!digits.empty() && (digits.back() == 'K' || digits.back() == 'k')) mult = 1024, digits.pop_back();
    bool ok = !digits.empty() && digits.size() <= 12 &&
              std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
    const int64_t v = ok ? std::stoll(digits) * mult : 0;
    if (!ok || v <= 0)
      throw Error(option + ": got \"" + item + "\" in \"" + text + "\", expected comma-separated positive integers (K = x1024)");
    out.push_back(v);
  }
  if (out.empty() || text.back() == ',') throw Error(option + ": got \"" + text + "\", expected comma-separated positive integers");
  return out;
}

std::vector<Variant> parse_variant_list(const std::string& text, const std::string& option) {
  std::vector<Variant> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const std::optional<Variant> v = variant_from_name(item);
    if (!v) throw Error(option + ": got \"" + item + "\" in \"" + text + "\", expected a comma-separated list of " + variant_names(", "));
    out.push_back(*v);
  }
  if (out.empty() || text.back() == ',')
    throw Error(option + ": got \"" + text + "\", expected a comma-separated list of " + variant_names(", "));
  return out;
}

void validate_report_options(const ReportOptions& opt) {
  auto positive = [](const std::vector<int64_t>& v, const char* what) {
    if (v.empty()) throw Error(std::string("report: ") + what + " list is empty, expected at least one value");
    for (int64_t x : v)
      if (x <= 0) throw Error(std::string("report: ") + what + ": got " + std::to_string(x) + ", expected a positive value");
  };
  if (opt.variants.empty()) throw Error("report: variant list is empty, expected " + variant_names(" and/or "));
  positive(opt.T, "T");
  positive(opt.heads, "heads");
  for (const auto* list : {&opt.T, &opt.heads}) {
    std::set<int64_t> seen;
    for (int64_t x : *list)
      if (!seen.insert(x).second)
        throw Error(std::string("report: ") + (list == &opt.T ? "T" : "heads") + ": " + std::to_string(x) +
                    " given twice, expected distinct values");
  }
  if (std::set<Variant>(opt.variants.begin(), opt.variants.end()).size() != opt.variants.size())
    throw Error("report: a variant is given twice, expected distinct variants");
  const int64_t tmin = *std::min_element(opt.T.begin(), opt.T.end());
  if (opt.max_T < tmin)
    throw Error("report: max-T: got " + std::to_string(opt.max_T) + ", expected at least the smallest T (" + std::to_string(tmin) + ")");
  // Plans grow linearly with T (per-chunk work items); beyond 1M tokens the peak-memory sweep
  // would take minutes for a regime this report does not discuss.
  if (opt.max_T > (int64_t{1} << 20))
    throw Error("report: max-T: got " + std::to_string(opt.max_T) + ", expected at most 1048576 (1M tokens)");
  if (opt.timeline_chunks < 1 || opt.timeline_chunks > 64)
    throw Error("report: timeline chunks: got " + std::to_string(opt.timeline_chunks) + ", expected 1..64");
  if (opt.timeline_cores < 1 || opt.timeline_cores > 64)
    throw Error("report: timeline cores: got " + std::to_string(opt.timeline_cores) + ", expected 1..64");
}

ReportData run_report_sweep(const Device& dev, const ReportOptions& opt, const ProgressFn& progress) {
  validate_report_options(opt);
  const auto t0 = std::chrono::steady_clock::now();
  ReportData d;
  d.device = dev.name;
  d.rep_T = representative_T(opt);
  d.rep_heads = representative_heads(opt);
  const std::vector<std::string> strategies = strategy_names(), steps = ablation_names();
  const std::vector<int64_t> lengths = peak_gm_lengths(opt);
  const size_t nv = opt.variants.size();
  const int total = static_cast<int>(nv * opt.T.size() * opt.heads.size() * strategies.size() + nv * opt.T.size() * steps.size() +
                                     nv * lengths.size() * strategies.size() + 2);
  int done = 0;
  auto step = [&](const std::string& what) {
    if (progress) progress(done, total, what);
    ++done;
  };
  auto simulate_point = [&](Variant v, int64_t T, int64_t H, const std::string& s, const SimOptions& so) {
    step(shape_name(v, T, H) + " " + s);
    const Plan plan = plan_or_explain(make_problem(v, T, H), dev, s, opt.backend);
    ++d.simulations;
    return SweepPoint{v, T, H, s, simulate(plan, dev, so)};
  };
  for (Variant v : opt.variants)
    for (int64_t T : opt.T)
      for (int64_t H : opt.heads)
        for (const std::string& s : strategies) d.sweep.push_back(simulate_point(v, T, H, s, {}));
  for (Variant v : opt.variants)
    for (int64_t T : opt.T)
      for (const std::string& s : steps) d.ablation.push_back(simulate_point(v, T, d.rep_heads, s, {}));
  for (Variant v : opt.variants)
    for (int64_t T : lengths)
      for (const std::string& s : strategies) {
        step(shape_name(v, T, d.rep_heads) + " " + s + " (peak GM)");
        ++d.plans;
        d.peak_gm.push_back({v, T, d.rep_heads, s, plan_peak_gm_bytes(plan_or_explain(make_problem(v, T, d.rep_heads), dev, s, opt.backend))});
      }
  SimOptions timeline;
  timeline.timeline = true;
  timeline.timeline_chunks = opt.timeline_chunks;
  for (const char* s : {"hanpu", "fla"})
    d.timelines.push_back(simulate_point(opt.variants.front(), d.rep_T, d.rep_heads, s, timeline));
  d.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return d;
}

std::string render_report(const Device& dev, const ReportOptions& opt, const ReportData& d) {
  HtmlReport page("hanpu report: linear-attention prefill on " + dev.name);
  ColorMap colors = strategy_colors();
  intro(page, dev, opt, d);
  latency_energy_sections(page, opt, d, colors);
  sweep_table(page, d);
  traffic_section(page, opt, d);
  peak_gm_section(page, opt, d, colors);
  buffer_section(page, dev, opt, d, colors);
  utilization_section(page, opt, d, colors);
  ablation_section(page, opt, d);
  timeline_section(page, dev, opt, d);
  device_section(page, dev);
  return page.html();
}

std::string build_report(const Device& dev, const ReportOptions& opt, const ProgressFn& progress) {
  return render_report(dev, opt, run_report_sweep(dev, opt, progress));
}

nlohmann::json report_data_to_json(const ReportData& d) {
  nlohmann::json j;
  j["device"] = d.device;
  j["rep_T"] = d.rep_T;
  j["rep_heads"] = d.rep_heads;
  j["sweep"] = nlohmann::json::array();
  for (const SweepPoint& p : d.sweep) j["sweep"].push_back(sim_result_to_json(p.result));
  j["ablation"] = nlohmann::json::array();
  for (const SweepPoint& p : d.ablation) j["ablation"].push_back(sim_result_to_json(p.result));
  j["peak_gm"] = nlohmann::json::array();
  for (const PeakGmPoint& p : d.peak_gm)
    j["peak_gm"].push_back({{"variant", variant_name(p.variant)}, {"T", p.T}, {"heads", p.heads}, {"strategy", p.strategy},
                            {"peak_gm_bytes", p.peak_gm_bytes}});
  j["simulations"] = d.simulations;
  j["plans"] = d.plans;
  j["seconds"] = d.seconds;
  return j;
}

}  // namespace hanpu::report

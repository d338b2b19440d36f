// Self-contained SVG charts for reports (no JavaScript, no external files, no fonts to fetch): grouped
// and stacked bar charts, line charts, and a timeline (Gantt) of labelled intervals on lanes. Every
// chart is a plain data struct in, one <svg> string out, so `hanpu report` can put them into an
// HtmlReport (html_report.hpp) and tests can parse them as XML.
//
// Conventions: axes get "nice" ticks (1, 2, 5 x 10^k; powers of ten or two on log axes) with
// readable labels (1.5k, 2M; 64 KiB; 1K, 64K for power-of-two counts); every mark carries a <title>
// tooltip with its exact value; colours come from one palette (ColorMap), so passing the same
// ColorMap to several charts keeps "fla" the same colour in all of them; all text is XML-escaped.
// Empty data gives a chart saying "no data"; a non-finite value, a length mismatch or a value a
// log axis cannot show is a hanpu::Error naming the chart, the series and the point.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace hanpu::report {

/// How tick labels and tooltips print numbers.
enum class NumberFormat {
  kSi,      // 0.25, 12, 1.5k, 2M, 3G
  kBytes,   // 512 B, 64 KiB, 1.5 MiB (ticks at round binary units)
  kCount2,  // sequence lengths and sizes: 512, 1K, 2K, 64K (K = 1024) where exact, kSi otherwise
};

/// One axis: label (with its unit, e.g. "latency (ms)"), scale and number format.
struct AxisSpec {
  std::string label;
  bool log = false;  // y: powers of ten (bytes: powers of two); line-chart x: powers of two
  NumberFormat format = NumberFormat::kSi;
};

/// Assigns colours from a fixed palette (Tableau 10, distinguishable and print-safe) to names in the
/// order they are first asked for; share one between charts to keep a name's colour everywhere.
class ColorMap {
 public:
  const std::string& color(const std::string& name);
  /// The palette's i-th colour (cycling).
  static const std::string& palette(size_t i);

 private:
  std::map<std::string, std::string> assigned_;
};

struct Series {
  std::string name;
  std::vector<double> values;  // one per category
};

struct BarChartSpec {
  std::string title;
  std::string x_label;                // what the categories are, e.g. "strategy"
  AxisSpec y;                         // y.log: log scale (grouped charts only)
  std::vector<std::string> categories;
  std::vector<Series> series;         // each with one value per category
  int width = 760, height = 380;      // pixels
  ColorMap* colors = nullptr;         // nullptr: a fresh palette for this chart
};

/// Bars of each category side by side, one per series.
std::string grouped_bar_chart(const BarChartSpec& spec);
/// One bar per category, the series stacked (values must be >= 0; a log y axis is refused because
/// stacked segments have no meaning on it).
std::string stacked_bar_chart(const BarChartSpec& spec);

struct LineSeries {
  std::string name;
  std::vector<double> x, y;  // same length; drawn in increasing x (omit points you have no value for)
};

struct LineChartSpec {
  std::string title;
  AxisSpec x;  // x.log: log2 axis (sequence lengths, sizes)
  AxisSpec y;  // y.log: log10 axis (powers of two for bytes)
  std::vector<LineSeries> series;
  int width = 760, height = 380;
  ColorMap* colors = nullptr;
};

std::string line_chart(const LineChartSpec& spec);

struct TimelineInterval {
  double start = 0, end = 0;  // in the x axis' unit; end >= start
  std::string group;          // colour and legend entry (e.g. the operator)
  std::string label;          // drawn inside the bar if it fits, and in the tooltip
};

struct TimelineLane {
  std::string name;  // e.g. "core 0 matrix", "core 0 MTE2"
  std::vector<TimelineInterval> intervals;
};

struct TimelineSpec {
  std::string title;
  AxisSpec x;  // time, e.g. {"time (us)"}; log is refused
  std::vector<TimelineLane> lanes;
  int width = 960;
  int lane_height = 22;  // pixels per lane: room for one line of 11 px text inside a bar
  ColorMap* colors = nullptr;
};

std::string timeline_chart(const TimelineSpec& spec);

/// Prints a number the way the axes do (exposed for tables next to the charts).
std::string format_number(double v, NumberFormat f = NumberFormat::kSi);

/// Escapes &, <, >, " and ' for XML text and attribute values.
std::string xml_escape(const std::string& s);

}  // namespace hanpu::report

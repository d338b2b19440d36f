// SVG chart rendering (see svg_chart.hpp). Layout is computed from estimated text widths (no font
// metrics are available without a renderer): 12 px sans-serif averages ~7 px per character, which
// is what the margins below budget for.
#include "report/svg_chart.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "hanpu/tensor.hpp"

namespace hanpu::report {

namespace {

constexpr double kCharWidth = 7.0;      // average advance of a 12 px sans-serif character
constexpr double kTitleHeight = 34.0;   // title baseline at 22 px plus a gap above the plot
constexpr double kLegendRow = 18.0;     // 12 px swatch + 6 px gap
constexpr double kLegendMaxWidth = 240; // longer series names are cut (the tooltip keeps them whole)
constexpr int kTargetTicks = 5;         // ~5 labelled ticks read well at 300-400 px

double text_width(const std::string& s, double char_width = kCharWidth) {
  return char_width * static_cast<double>(s.size());
}

/// Coordinates with two decimals and no trailing zeros: compact and exact enough for pixels.
std::string px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

std::string with_digits(double v, int digits) {
  // Never fewer digits than the integer part has: %g would otherwise print 1000 as "1e+03".
  if (std::fabs(v) >= 1 && std::isfinite(v))
    digits = std::max(digits, static_cast<int>(std::floor(std::log10(std::fabs(v)))) + 1);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

/// Significant digits that keep ticks `step` apart distinguishable at magnitude |v| (at least 3).
int digits_for(double v, double step) {
  if (step <= 0 || v == 0) return 3;
  const int need = static_cast<int>(std::floor(std::log10(std::fabs(v)))) -
                   static_cast<int>(std::floor(std::log10(step))) + 1;
  return std::clamp(need, 3, 12);
}

std::string format_si(double v, int digits) {
  if (v == 0) return "0";
  static const char* suffix[] = {"", "k", "M", "G", "T", "P"};
  const double a = std::fabs(v);
  int k = 0;
  while (k < 5 && a >= std::pow(1000.0, k + 1) * (1 - 1e-12)) ++k;
  return with_digits(v / std::pow(1000.0, k), digits) + suffix[k];
}

std::string format_bytes(double v, int digits) {
  static const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  const double a = std::fabs(v);
  int k = 0;
  while (k < 5 && a >= std::pow(1024.0, k + 1)) ++k;
  return with_digits(v / std::pow(1024.0, k), digits) + " " + unit[k];
}

std::string format_count2(double v, int digits) {
  // Multiples of 256 read as binary K/M (1536 -> 1.5K) because lengths here are powers of two.
  const double a = std::fabs(v);
  if (a >= 1024 && std::fmod(a, 256) == 0) {
    if (a >= 1048576 && std::fmod(a, 262144) == 0) return with_digits(v / 1048576, 6) + "M";
    return with_digits(v / 1024, 6) + "K";
  }
  return format_si(v, digits);
}

std::string format_with(double v, NumberFormat f, int digits) {
  switch (f) {
    case NumberFormat::kSi: return format_si(v, digits);
    case NumberFormat::kBytes: return format_bytes(v, digits);
    case NumberFormat::kCount2: return format_count2(v, digits);
  }
  return format_si(v, digits);
}

/// A 1, 2 or 5 x 10^k step at least `raw`.
double nice_step(double raw) {
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

struct Ticks {
  double lo = 0, hi = 1;        // the axis domain (ticks lie within it)
  std::vector<double> values;
  std::vector<std::string> labels;
  bool log = false;
};

/// Linear ticks covering [lo, hi], the domain widened to whole steps. Bytes step in binary units.
Ticks linear_ticks(double lo, double hi, NumberFormat f) {
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    hi += pad;
    if (lo != 0) lo -= pad;
  }
  double unit = 1;
  if (f == NumberFormat::kBytes) {
    const double a = std::max(std::fabs(lo), std::fabs(hi));
    while (unit * 1024 <= a) unit *= 1024;
  }
  const double step = nice_step((hi - lo) / unit / kTargetTicks) * unit;
  Ticks t;
  t.lo = std::floor(lo / step + 1e-9) * step;
  t.hi = std::ceil(hi / step - 1e-9) * step;
  const int n = static_cast<int>(std::llround((t.hi - t.lo) / step));
  for (int i = 0; i <= n; ++i) {
    double v = t.lo + i * step;
    v = std::round(v / step) * step;  // no 0.30000000000000004
    if (std::fabs(v) < step * 1e-9) v = 0;
    t.values.push_back(v);
    t.labels.push_back(format_with(v, f, digits_for(v, step)));  // a ratio: the same in any unit
  }
  return t;
}

/// Log ticks over [lo, hi] (both > 0), domain widened to whole powers of `base` (10, or 2 for
/// bytes and power-of-two x axes); at most ~10 labelled ticks, 2x and 5x added within two decades.
Ticks log_ticks(double lo, double hi, NumberFormat f, double base) {
  const double lb = std::log(base);
  int e0 = static_cast<int>(std::floor(std::log(lo) / lb + 1e-9));
  int e1 = static_cast<int>(std::ceil(std::log(hi) / lb - 1e-9));
  if (e1 <= e0) e1 = e0 + 1;
  Ticks t;
  t.log = true;
  t.lo = std::pow(base, e0);
  t.hi = std::pow(base, e1);
  const int every = std::max(1, (e1 - e0 + 9) / 10);
  for (int e = e0; e <= e1; e += every) {
    const double v = std::pow(base, e);
    t.values.push_back(v);
    t.labels.push_back(format_with(v, f, 3));
    if (base == 10 && e1 - e0 <= 2 && e < e1) {
      for (double m : {2.0, 5.0}) {
        t.values.push_back(m * v);
        t.labels.push_back(format_with(m * v, f, 3));
      }
    }
  }
  // Keep values sorted (the 2x/5x insertions are already in order within each decade).
  return t;
}

struct Scale {
  double d0 = 0, d1 = 1, r0 = 0, r1 = 1;
  bool log = false;
  double operator()(double v) const {
    const double t = log ? (std::log(v) - std::log(d0)) / (std::log(d1) - std::log(d0)) : (v - d0) / (d1 - d0);
    return r0 + t * (r1 - r0);
  }
};

/// Builds the SVG text; all strings pass through xml_escape here.
class Svg {
 public:
  Svg(double width, double height, const std::string& title) : w_(width), h_(height) {
    out_ << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << px(width) << "\" height=\"" << px(height)
         << "\" viewBox=\"0 0 " << px(width) << ' ' << px(height)
         << "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\" class=\"chart\">\n";
    out_ << "<title>" << xml_escape(title) << "</title>\n";
    out_ << "<rect x=\"0\" y=\"0\" width=\"" << px(width) << "\" height=\"" << px(height) << "\" fill=\"#ffffff\"/>\n";
    text(width / 2, 22, title, "middle", "title", "font-size=\"15\" font-weight=\"bold\"");
  }

  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& cls,
            const std::string& tooltip, const std::string& extra = "") {
    out_ << "<rect class=\"" << cls << "\" x=\"" << px(x) << "\" y=\"" << px(y) << "\" width=\"" << px(w)
         << "\" height=\"" << px(h) << "\" fill=\"" << fill << '"' << (extra.empty() ? "" : " " + extra);
    if (tooltip.empty())
      out_ << "/>\n";
    else
      out_ << "><title>" << xml_escape(tooltip) << "</title></rect>\n";
  }

  void line(double x1, double y1, double x2, double y2, const std::string& stroke, const std::string& cls,
            double width = 1) {
    out_ << "<line class=\"" << cls << "\" x1=\"" << px(x1) << "\" y1=\"" << px(y1) << "\" x2=\"" << px(x2)
         << "\" y2=\"" << px(y2) << "\" stroke=\"" << stroke << "\" stroke-width=\"" << px(width) << "\"/>\n";
  }

  /// `extra` is trusted attribute text built by this file (never user data).
  void text(double x, double y, const std::string& content, const char* anchor, const std::string& cls,
            const std::string& extra = "") {
    out_ << "<text class=\"" << cls << "\" x=\"" << px(x) << "\" y=\"" << px(y) << "\" text-anchor=\"" << anchor
         << '"' << (extra.empty() ? "" : " " + extra) << '>' << xml_escape(content) << "</text>\n";
  }

  void raw(const std::string& s) { out_ << s; }

  std::string finish() {
    out_ << "</svg>\n";
    return out_.str();
  }

  double width() const { return w_; }
  double height() const { return h_; }

 private:
  std::ostringstream out_;
  double w_, h_;
};

[[noreturn]] void fail(const std::string& title, const std::string& msg) {
  throw Error("chart \"" + title + "\": " + msg);
}

void check_size(const std::string& title, double w, double h) {
  // Below ~200 px nothing fits beside the axis labels; above 20000 px it is a mistake.
  if (!(w >= 200 && w <= 20000)) fail(title, "width " + px(w) + ", expected 200..20000 pixels");
  if (!(h >= 120 && h <= 20000)) fail(title, "height " + px(h) + ", expected 120..20000 pixels");
}

std::string no_data_chart(const std::string& title, double w, double h) {
  Svg svg(w, h, title);
  svg.text(w / 2, h / 2, "no data", "middle", "empty", "fill=\"#777777\" font-size=\"14\"");
  return svg.finish();
}

std::string cut(const std::string& s, double max_width) {
  const auto max_chars = static_cast<size_t>(std::max(4.0, max_width / kCharWidth));
  return s.size() <= max_chars ? s : s.substr(0, max_chars - 3) + "...";
}

double legend_width(const std::vector<std::string>& names) {
  double w = 0;
  for (const std::string& n : names) w = std::max(w, text_width(n));
  return std::min(kLegendMaxWidth, w) + 34;  // swatch 12 + gaps
}

void draw_legend(Svg& svg, double x, double y, const std::vector<std::string>& names,
                 const std::vector<std::string>& colors) {
  svg.raw("<g class=\"legend\">\n");
  for (size_t i = 0; i < names.size(); ++i) {
    const double row = y + static_cast<double>(i) * kLegendRow;
    svg.rect(x, row, 12, 12, colors[i], "swatch", names[i]);
    svg.text(x + 18, row + 10.5, cut(names[i], kLegendMaxWidth), "start", "legend-label");
  }
  svg.raw("</g>\n");
}

double max_label_width(const std::vector<std::string>& labels) {
  double w = 0;
  for (const std::string& l : labels) w = std::max(w, text_width(l));
  return w;
}

/// Y axis: grid lines, tick labels (with the tick's value as data-value for tests and tools), the
/// rotated axis label.
void draw_y_axis(Svg& svg, const Ticks& t, const Scale& y, double left, double right, const std::string& label,
                 double top, double bottom) {
  svg.raw("<g class=\"y-axis\">\n");
  for (size_t i = 0; i < t.values.size(); ++i) {
    const double py = y(t.values[i]);
    svg.line(left, py, right, py, "#e3e3e3", "grid");
    svg.text(left - 6, py + 4, t.labels[i], "end", "ytick", "data-value=\"" + with_digits(t.values[i], 17) + "\"");
  }
  svg.line(left, top, left, bottom, "#333333", "axis");
  if (!label.empty()) {
    const double cy = (top + bottom) / 2;
    svg.text(-cy, 15, label, "middle", "axis-label", "transform=\"rotate(-90)\"");
  }
  svg.raw("</g>\n");
}

void draw_x_ticks(Svg& svg, const Ticks& t, const Scale& x, double top, double bottom, const std::string& label,
                  double label_y) {
  svg.raw("<g class=\"x-axis\">\n");
  for (size_t i = 0; i < t.values.size(); ++i) {
    const double pxv = x(t.values[i]);
    svg.line(pxv, top, pxv, bottom, "#eeeeee", "grid");
    svg.line(pxv, bottom, pxv, bottom + 4, "#333333", "tick");
    svg.text(pxv, bottom + 17, t.labels[i], "middle", "xtick", "data-value=\"" + with_digits(t.values[i], 17) + "\"");
  }
  svg.line(x.r0, bottom, x.r1, bottom, "#333333", "axis");
  if (!label.empty()) svg.text((x.r0 + x.r1) / 2, label_y, label, "middle", "axis-label");
  svg.raw("</g>\n");
}

void check_finite(const std::string& title, double v, const std::string& where) {
  if (!std::isfinite(v))
    fail(title, where + " is " + (std::isnan(v) ? std::string("NaN") : std::string("infinite")) +
                    ", expected a finite number");
}

enum class BarMode { kGrouped, kStacked };

std::string bar_chart(const BarChartSpec& s, BarMode mode) {
  check_size(s.title, s.width, s.height);
  if (mode == BarMode::kStacked && s.y.log)
    fail(s.title, "a stacked bar chart cannot use a log y axis (segments of a log bar have no meaning)");
  const size_t nc = s.categories.size();
  for (const Series& ser : s.series) {
    if (ser.values.size() != nc)
      fail(s.title, "series \"" + ser.name + "\" has " + std::to_string(ser.values.size()) + " values, expected " +
                        std::to_string(nc) + " (one per category)");
    for (size_t c = 0; c < nc; ++c) {
      const double v = ser.values[c];
      const std::string where =
          "series \"" + ser.name + "\" value " + std::to_string(c) + " (category \"" + s.categories[c] + "\")";
      check_finite(s.title, v, where);
      if (v < 0 && (mode == BarMode::kStacked || s.y.log))
        fail(s.title, where + " is " + format_number(v) + ", expected >= 0 on a " +
                          (s.y.log ? "log axis" : "stacked chart"));
    }
  }
  if (nc == 0 || s.series.empty()) return no_data_chart(s.title, s.width, s.height);

  // Data range: bars grow from 0 on a linear axis; on a log axis from the domain's floor.
  double lo = 0, hi = 0, min_pos = INFINITY;
  for (size_t c = 0; c < nc; ++c) {
    double stack = 0;
    for (const Series& ser : s.series) {
      const double v = ser.values[c];
      if (mode == BarMode::kStacked) {
        stack += v;
        hi = std::max(hi, stack);
      } else {
        lo = std::min(lo, v), hi = std::max(hi, v);
      }
      if (v > 0) min_pos = std::min(min_pos, v);
    }
  }
  if (s.y.log && !std::isfinite(min_pos)) return no_data_chart(s.title, s.width, s.height);
  const Ticks yt = s.y.log ? log_ticks(min_pos, hi, s.y.format, s.y.format == NumberFormat::kBytes ? 2 : 10)
                           : linear_ticks(lo, hi, s.y.format);

  ColorMap local;
  ColorMap& colors = s.colors ? *s.colors : local;
  std::vector<std::string> names, fills;
  for (const Series& ser : s.series) names.push_back(ser.name), fills.push_back(colors.color(ser.name));

  // Margins: y tick labels and the rotated label on the left, legend on the right, category labels
  // below (rotated when they do not fit under their group).
  const double left = 30 + max_label_width(yt.labels) + 8;
  const double right = s.width - legend_width(names) - 8;
  const double group_w = (right - left) / static_cast<double>(nc);
  const double cat_w = max_label_width(s.categories);
  const bool rotate = cat_w > group_w - 6;
  // A label rotated by 35 degrees descends width * sin(35) ~ 0.57 width (capped so the plot survives).
  const double cat_h = rotate ? std::min(0.57 * cat_w + 10, 140.0) : 18;
  const double height = std::max<double>(s.height, kTitleHeight + static_cast<double>(names.size()) * kLegendRow + 20);
  const double top = kTitleHeight;
  const double bottom = height - cat_h - (s.x_label.empty() ? 10 : 30);
  if (bottom - top < 60) fail(s.title, "height " + px(s.height) + " leaves no room for the plot; make it taller");

  Svg svg(s.width, height, s.title);
  const Scale y{yt.lo, yt.hi, bottom, top, yt.log};
  draw_y_axis(svg, yt, y, left, right, s.y.label, top, bottom);

  // Bars: 80% of each group's width holds the bars (gaps separate categories).
  const double inner = group_w * 0.8;
  const double bar_w = mode == BarMode::kGrouped ? inner / static_cast<double>(s.series.size()) : inner;
  const double base = yt.log ? bottom : y(0);
  svg.raw("<g class=\"bars\">\n");
  for (size_t c = 0; c < nc; ++c) {
    const double gx = left + group_w * static_cast<double>(c) + (group_w - inner) / 2;
    double stack = 0;
    for (size_t k = 0; k < s.series.size(); ++k) {
      const double v = s.series[k].values[c];
      const std::string tip = s.series[k].name + " / " + s.categories[c] + ": " + format_with(v, s.y.format, 4);
      const std::string data = "data-value=\"" + with_digits(v, 17) + "\"";
      if (mode == BarMode::kGrouped) {
        if (s.y.log && v <= 0) continue;  // zero has no place on a log axis; the tooltip-less gap shows it
        const double top_y = y(v);
        svg.rect(gx + bar_w * static_cast<double>(k), std::min(top_y, base), bar_w, std::fabs(base - top_y), fills[k],
                 "bar", tip, data);
      } else {
        const double y0 = y(stack), y1 = y(stack + v);
        stack += v;
        svg.rect(gx, y1, bar_w, y0 - y1, fills[k], "bar", tip, data);
      }
    }
  }
  svg.raw("</g>\n");

  // Category labels and the x axis line.
  svg.raw("<g class=\"x-axis\">\n");
  svg.line(left, base, right, base, "#333333", "axis");
  for (size_t c = 0; c < nc; ++c) {
    const double cx = left + group_w * (static_cast<double>(c) + 0.5);
    if (rotate)
      svg.text(cx, bottom + 14, s.categories[c], "end", "category",
               "transform=\"rotate(-35 " + px(cx) + " " + px(bottom + 14) + ")\"");
    else
      svg.text(cx, bottom + 16, s.categories[c], "middle", "category");
  }
  if (!s.x_label.empty()) svg.text((left + right) / 2, height - 10, s.x_label, "middle", "axis-label");
  svg.raw("</g>\n");
  draw_legend(svg, right + 16, top, names, fills);
  return svg.finish();
}

}  // namespace

const std::string& ColorMap::palette(size_t i) {
  // Tableau 10: ten hues that stay apart for common colour-vision deficiencies and in greyscale.
  static const std::vector<std::string> colors{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                               "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  return colors[i % colors.size()];
}

const std::string& ColorMap::color(const std::string& name) {
  auto it = assigned_.find(name);
  if (it != assigned_.end()) return it->second;
  return assigned_.emplace(name, palette(assigned_.size())).first->second;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control characters other than tab/newline are not allowed in XML 1.0 at all.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r')
          out += ' ';
        else
          out += c;
    }
  }
  return out;
}

std::string format_number(double v, NumberFormat f) {
  if (!std::isfinite(v)) return std::isnan(v) ? "NaN" : (v > 0 ? "inf" : "-inf");
  return format_with(v, f, 4);
}

std::string grouped_bar_chart(const BarChartSpec& spec) { return bar_chart(spec, BarMode::kGrouped); }
std::string stacked_bar_chart(const BarChartSpec& spec) { return bar_chart(spec, BarMode::kStacked); }

std::string line_chart(const LineChartSpec& s) {
  check_size(s.title, s.width, s.height);
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  for (const LineSeries& ser : s.series) {
    if (ser.x.size() != ser.y.size())
      fail(s.title, "series \"" + ser.name + "\" has " + std::to_string(ser.x.size()) + " x values and " +
                        std::to_string(ser.y.size()) + " y values, expected the same number");
    for (size_t i = 0; i < ser.x.size(); ++i) {
      const std::string where = "series \"" + ser.name + "\" point " + std::to_string(i);
      check_finite(s.title, ser.x[i], where + " x");
      check_finite(s.title, ser.y[i], where + " y");
      if (s.x.log && ser.x[i] <= 0)
        fail(s.title, where + " x is " + format_number(ser.x[i]) + ", expected > 0 on a log axis");
      if (s.y.log && ser.y[i] <= 0)
        fail(s.title, where + " y is " + format_number(ser.y[i]) + ", expected > 0 on a log axis");
      xlo = std::min(xlo, ser.x[i]), xhi = std::max(xhi, ser.x[i]);
      ylo = std::min(ylo, ser.y[i]), yhi = std::max(yhi, ser.y[i]);
    }
  }
  if (!std::isfinite(xlo)) return no_data_chart(s.title, s.width, s.height);
  // A linear y axis of non-negative data starts at 0 so line heights compare honestly.
  if (!s.y.log && ylo >= 0) ylo = 0;
  const Ticks xt = s.x.log ? log_ticks(xlo, xhi, s.x.format, 2) : linear_ticks(xlo, xhi, s.x.format);
  const Ticks yt = s.y.log ? log_ticks(ylo, yhi, s.y.format, s.y.format == NumberFormat::kBytes ? 2 : 10)
                           : linear_ticks(ylo, yhi, s.y.format);

  ColorMap local;
  ColorMap& colors = s.colors ? *s.colors : local;
  std::vector<std::string> names, strokes;
  for (const LineSeries& ser : s.series) names.push_back(ser.name), strokes.push_back(colors.color(ser.name));

  const double left = 30 + max_label_width(yt.labels) + 8;
  const double right = s.width - legend_width(names) - 8 - text_width(xt.labels.back()) / 2;
  const double height = std::max<double>(s.height, kTitleHeight + static_cast<double>(names.size()) * kLegendRow + 20);
  const double top = kTitleHeight;
  const double bottom = height - (s.x.label.empty() ? 28 : 46);
  if (right - left < 60) fail(s.title, "width " + px(s.width) + " leaves no room for the plot; make it wider");

  Svg svg(s.width, height, s.title);
  const Scale x{xt.lo, xt.hi, left, right, xt.log};
  const Scale y{yt.lo, yt.hi, bottom, top, yt.log};
  draw_y_axis(svg, yt, y, left, right, s.y.label, top, bottom);
  draw_x_ticks(svg, xt, x, top, bottom, s.x.label, height - 10);

  svg.raw("<g class=\"lines\">\n");
  for (size_t k = 0; k < s.series.size(); ++k) {
    const LineSeries& ser = s.series[k];
    std::vector<size_t> order(ser.x.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ser.x[a] < ser.x[b]; });
    if (order.size() >= 2) {
      std::string pts;
      for (size_t i : order) pts += (pts.empty() ? "" : " ") + px(x(ser.x[i])) + "," + px(y(ser.y[i]));
      svg.raw("<polyline class=\"line\" fill=\"none\" stroke=\"" + strokes[k] + "\" stroke-width=\"2\" points=\"" +
              pts + "\"><title>" + xml_escape(ser.name) + "</title></polyline>\n");
    }
    for (size_t i : order) {
      svg.raw("<circle class=\"point\" cx=\"" + px(x(ser.x[i])) + "\" cy=\"" + px(y(ser.y[i])) + "\" r=\"3\" fill=\"" +
              strokes[k] + "\"><title>" +
              xml_escape(ser.name + ": " + format_with(ser.x[i], s.x.format, 4) + ", " +
                         format_with(ser.y[i], s.y.format, 4)) +
              "</title></circle>\n");
    }
  }
  svg.raw("</g>\n");
  draw_legend(svg, s.width - legend_width(names) + 8, top, names, strokes);
  return svg.finish();
}

std::string timeline_chart(const TimelineSpec& s) {
  if (s.x.log) fail(s.title, "a timeline cannot use a log time axis");
  if (!(s.lane_height >= 8 && s.lane_height <= 200))
    fail(s.title, "lane_height " + std::to_string(s.lane_height) + ", expected 8..200 pixels");
  double lo = INFINITY, hi = -INFINITY;
  std::vector<std::string> groups;  // legend order: first appearance
  for (const TimelineLane& lane : s.lanes) {
    for (size_t i = 0; i < lane.intervals.size(); ++i) {
      const TimelineInterval& iv = lane.intervals[i];
      const std::string where = "lane \"" + lane.name + "\" interval " + std::to_string(i) + " (\"" + iv.label + "\")";
      check_finite(s.title, iv.start, where + " start");
      check_finite(s.title, iv.end, where + " end");
      if (iv.end < iv.start)
        fail(s.title, where + " ends at " + format_number(iv.end) + " before its start " + format_number(iv.start));
      lo = std::min(lo, iv.start), hi = std::max(hi, iv.end);
      if (std::find(groups.begin(), groups.end(), iv.group) == groups.end()) groups.push_back(iv.group);
    }
  }
  const double lanes_h = static_cast<double>(s.lanes.size()) * s.lane_height;
  const double natural_h = kTitleHeight + lanes_h + 50;
  check_size(s.title, s.width, std::max(120.0, natural_h));
  if (!std::isfinite(lo)) return no_data_chart(s.title, s.width, std::max(120.0, natural_h));
  if (lo >= 0) lo = 0;  // times are offsets from the start of the run
  const Ticks xt = linear_ticks(lo, hi, s.x.format);

  ColorMap local;
  ColorMap& colors = s.colors ? *s.colors : local;
  std::vector<std::string> fills;
  for (const std::string& g : groups) fills.push_back(colors.color(g));

  std::vector<std::string> lane_names;
  for (const TimelineLane& lane : s.lanes) lane_names.push_back(lane.name);
  const double left = 12 + std::min(200.0, max_label_width(lane_names)) + 8;
  const double right = s.width - legend_width(groups) - 8 - text_width(xt.labels.back()) / 2;
  if (right - left < 60) fail(s.title, "width " + std::to_string(s.width) + " leaves no room for the plot; make it wider");
  const double top = kTitleHeight;
  const double bottom = top + lanes_h;
  const double height = std::max(natural_h, top + static_cast<double>(groups.size()) * kLegendRow + 20);

  Svg svg(s.width, height, s.title);
  const Scale x{xt.lo, xt.hi, left, right, false};
  draw_x_ticks(svg, xt, x, top, bottom, s.x.label, height - 10);

  svg.raw("<g class=\"lanes\">\n");
  for (size_t l = 0; l < s.lanes.size(); ++l) {
    const double ly = top + static_cast<double>(l) * s.lane_height;
    if (l % 2 == 1) svg.rect(left, ly, right - left, s.lane_height, "#f5f5f5", "stripe", "", "fill-opacity=\"0.8\"");
    svg.text(left - 8, ly + s.lane_height / 2.0 + 4, cut(s.lanes[l].name, 200), "end", "lane-label");
  }
  svg.raw("</g>\n<g class=\"intervals\">\n");
  // Labels in 10 px text (~6 px per character) go inside a bar only when they fit.
  const double label_char_w = 6.0;
  for (size_t l = 0; l < s.lanes.size(); ++l) {
    const double ly = top + static_cast<double>(l) * s.lane_height;
    for (const TimelineInterval& iv : s.lanes[l].intervals) {
      const size_t g = static_cast<size_t>(std::find(groups.begin(), groups.end(), iv.group) - groups.begin());
      const double x0 = x(iv.start);
      const double w = std::max(x(iv.end) - x0, 0.5);  // zero-length events stay visible as a hairline
      const std::string tip = s.lanes[l].name + ": " + (iv.label.empty() ? iv.group : iv.label) + " [" + iv.group +
                              "] " + format_with(iv.start, s.x.format, 5) + " - " + format_with(iv.end, s.x.format, 5);
      svg.rect(x0, ly + 2, w, s.lane_height - 4, fills[g], "interval", tip,
               "data-start=\"" + with_digits(iv.start, 17) + "\" data-end=\"" + with_digits(iv.end, 17) + "\"");
      if (!iv.label.empty() && text_width(iv.label, label_char_w) + 4 <= w && s.lane_height >= 14)
        svg.text(x0 + w / 2, ly + s.lane_height / 2.0 + 3.5, iv.label, "middle", "interval-label",
                 "font-size=\"10\" fill=\"#1a1a1a\"");
    }
  }
  svg.raw("</g>\n");
  draw_legend(svg, s.width - legend_width(groups) + 8, top, groups, fills);
  return svg.finish();
}

}  // namespace hanpu::report
